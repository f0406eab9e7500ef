"""fedvlp: a Ray-distributed platform for federated prompt tuning of frozen vision-language models."""

__version__ = "0.1.0"
