"""The public path of `fedvlp report`'s entry points, which live in the package `fedvlp.platform.studies.report`."""
from fedvlp.platform.studies.report import *  # noqa: F403
from fedvlp.platform.studies.report import __all__  # noqa: F401
