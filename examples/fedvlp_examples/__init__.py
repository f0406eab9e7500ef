"""Example fedvlp plugins, one module per kind of extension (docs/extending.md walks through each):

* `fedprox`      a method: FedProx on PromptFL (`promptfl_prox`)
* `fedlion`      a server optimiser: Lion on the cohort's pseudo-gradient (`fedlion`)
* `trimmed_mean` a custom server rule: the coordinate-wise trimmed mean of the clients' states (`trimmed_mean`)
* `folder_csv`   a dataset reader: images in a folder, labels in a CSV (`folder-csv`)
* `shards`       a partitioner: McMahan et al.'s label shards (`shards`)

Importing the package registers all five, so `plugins: [fedvlp_examples]` in a config (with this folder on
the Python path, or the package pip-installed with its `fedvlp.plugins` entry point) is all a run needs.
"""
from fedvlp_examples import fedlion, fedprox, folder_csv, shards, trimmed_mean  # noqa: F401  (each registers on import)
