"""The platform, in four rooms and a leaf; imports between the rooms run one way only
(`tests/test_packaging.py::test_platform_imports_run_one_way`):

    studies  ->  runtime  ->  aggregation
       records and metrics: leaves every room may import

* `runtime/`: one federated run on Ray (`engine.run_federated`: placement, the coordinator and the worker pool,
  features, evaluation, client states, the warm pool, the virtual clock, cohorts, updates; `submit`).
* `aggregation/`: the server rules (`RULES`), the server optimisers, FED-PRIME's Hungarian rule and its prompt
  clustering, client-level privacy and secure aggregation. It never imports the runtime or the studies.
* `studies/`: many runs (space files, `fedvlp sweep`, `fedvlp tune`, `fedvlp report`). The runtime never imports
  them.
* `records/`: round checkpoints and MLflow tracking. `metrics.py`: the scores, which backbones and reports use too.

`engine`, `checkpoint`, `sweep`, `tune` and `report` here are the public paths of their modules, kept as re-exports.
"""
