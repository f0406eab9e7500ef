"""Server rules: how the coordinator turns the cohort's updates of a parameter group into the next global state.

Every rule is a `ServerRule` registered by name in `RULES` (plugins register theirs the same way). Two kinds:

* **average** rules start from the cohort's weighted average (FedAvg weights: the clients' sample counts;
  or uniform) and then take a server step `step(previous, average, state, options) -> (new, state)`:
  plain FedAvg returns the average; the server optimisers of Reddi et al. (2021) treat
  delta = average - previous as a pseudo-gradient and keep moments in `state`, which the coordinator
  carries between rounds and writes into every checkpoint (so a resumed run stays bitwise identical).
  Because the average is taken by the coordinator, client-level privacy and secure aggregation
  (`privacy`, `secagg`) apply to every average rule alike.
* **custom** rules see the clients' states themselves: `combine(states, num_samples, previous, state,
  generator, options) -> (new, state)` (FED-PRIME's Hungarian clustering).

Updates always come in sorted client-id order and are summed in float64, so the result does not depend
on which worker produced which update or in what order they arrived. Options are a frozen dataclass
per rule (`options`), validated when the config is built (`server.options.<rule>.<key>`).

The registry imports without torch (the config and a run's driver read it); the rules import torch as they run.

Here: `rules` (the registry, the plain averages, `apply_rule`), `server_optimisers` (Reddi et al.),
`hungarian` (FED-PRIME's rule) and its clustering `prompt_clustering`; `privacy` (DP-FedAvg and its accounting)
and `secagg` (secure aggregation). Importing this package registers the built-in rules; it imports neither
torch nor scipy. Nothing here imports the runtime or the studies.
"""
from fedvlp.platform.aggregation.hungarian import HungarianOptions
from fedvlp.platform.aggregation.rules import (
    LOCAL,
    RULES,
    RuleInputs,
    ServerRule,
    apply_rule,
    is_average,
    register_rule,
    rule_weights,
    state_nbytes,
    weighted_average,
)
from fedvlp.platform.aggregation.server_optimisers import FedAvgMOptions, FedOptOptions

__all__ = ["LOCAL", "RULES", "FedAvgMOptions", "FedOptOptions", "HungarianOptions", "RuleInputs", "ServerRule",
           "apply_rule", "is_average", "register_rule", "rule_weights", "state_nbytes", "weighted_average"]
