"""The extension guide's custom server rule (examples/fedvlp_examples/trimmed_mean.py): its numbers are
scipy.stats.trim_mean's, an outlying client moves nothing, the Coordinator applies it to the parameter group its
prefix aims at beside FedAvg on the rest, and in a run on Ray the Coordinator actor trims what the clients sent."""
import os

import numpy as np
import pytest
import torch
from conftest import REPO, small_run
from mlflow import MlflowClient
from scipy import stats
from test_private_runs import _seen, spy_on_aggregation

from fedvlp.platform.aggregation import RULES, RuleInputs, apply_rule
from fedvlp.platform.runtime.updates import ClientUpdate
from fedvlp.plugins import load_plugins

EXAMPLES = REPO / "examples"


@pytest.fixture(autouse=True)
def trimmed_mean_registered(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")]))
    load_plugins(["fedvlp_examples"])
    return RULES.get("trimmed_mean")


def client_states(count: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [{"ctx": torch.randn(4, 8, generator=generator), "scale": torch.randn((), generator=generator)}
            for _ in range(count)]


@pytest.mark.parametrize("count, proportion", [(4, 0.0), (4, 0.25), (5, 0.2), (5, 0.3), (7, 0.3), (7, 0.49)])
def test_the_trimmed_mean_is_scipys_trim_mean_per_coordinate(trimmed_mean_registered, count, proportion):
    states = client_states(count)
    previous = {k: torch.zeros_like(v) for k, v in states[0].items()}
    new, rule_state, diagnostics = apply_rule("trimmed_mean", RuleInputs(
        states, [10 * (k + 1) for k in range(count)], previous, {}, torch.Generator(),
        trimmed_mean_registered.options(proportion=proportion)))
    for key in previous:
        by_hand = stats.trim_mean(np.stack([s[key].double().numpy() for s in states]), proportion, axis=0)
        assert new[key].dtype == torch.float32
        np.testing.assert_allclose(new[key].numpy(), by_hand.astype(np.float32), rtol=0, atol=1e-7)
    assert rule_state == {} and diagnostics == {"trimmed": float(int(proportion * count))}


def test_an_outlying_client_moves_the_average_but_not_the_trimmed_mean(trimmed_mean_registered):
    states = client_states(5)
    states[3] = {k: torch.full_like(v, 1e6) for k, v in states[3].items()}  # a broken or malicious client
    honest = torch.stack([s["ctx"] for i, s in enumerate(states) if i != 3])
    inputs = RuleInputs(states, [1] * 5, {k: torch.zeros_like(v) for k, v in states[0].items()}, {},
                        torch.Generator(), trimmed_mean_registered.options(proportion=0.2))
    trimmed = apply_rule("trimmed_mean", inputs)[0]["ctx"]
    assert bool((trimmed >= honest.min(0).values).all() and (trimmed <= honest.max(0).values).all())
    assert float(apply_rule("mean", inputs)[0]["ctx"].min()) > 1e5


def test_the_coordinator_trims_the_group_its_prefix_aims_at_and_averages_the_rest(trimmed_mean_registered, tmp_path):
    """The Coordinator class itself (no Ray): `ctx` by the trimmed mean, `scale` by FedAvg (sample weights), the
    updates taken in client-id order whatever order they arrive in, the rule's number reported per round."""
    from fedvlp.platform.runtime.coordinator import Coordinator

    states, sizes = client_states(5, seed=1), [30, 10, 50, 20, 40]
    coordinator = Coordinator.__ray_actor_class__(0, (str(tmp_path / "states"), 2**20), None, ("fedvlp_examples",))
    coordinator.begin({k: torch.zeros_like(v) for k, v in states[0].items()}, {"ctx": "trimmed_mean",
                                                                               "scale": "fedavg"},
                      {"trimmed_mean": trimmed_mean_registered.options(proportion=0.2)})
    updates = [ClientUpdate(k, sizes[k], states[k], {}, 0.0, 1) for k in (3, 0, 4, 1, 2)]
    report = coordinator.aggregate(1, [0, 1, 2, 3, 4], *updates)
    new = coordinator.global_state()
    by_hand = stats.trim_mean(np.stack([s["ctx"].numpy() for s in states]).astype(np.float64), 0.2, axis=0)
    np.testing.assert_allclose(new["ctx"].numpy(), by_hand.astype(np.float32), rtol=0, atol=1e-7)
    fedavg = sum(float(s["scale"]) * n for s, n in zip(states, sizes)) / sum(sizes)
    assert float(new["scale"]) == pytest.approx(fedavg, abs=1e-6)
    assert report["server"] == {"server/trimmed_mean/trimmed": 1.0} and report["clients"] == [0, 1, 2, 3, 4]


@pytest.mark.usefixtures("tiny_clip")
def test_a_run_on_ray_trims_what_the_clients_sent_in_the_coordinator_actor(ray_cluster, tracking_uri, tmp_path,
                                                                            monkeypatch):
    """One round of 4 clients on Ray, the plugin shipped to the Coordinator actor: the new `ctx` is the trimmed
    mean (a quarter cut from each end) of the 4 contexts the coordinator received, the rest FedAvg's."""
    from fedvlp.platform.runtime.engine import run_federated

    spy_on_aggregation(monkeypatch)
    spec = small_run(tracking_uri, tmp_path, "plugins=[fedvlp_examples]", "server.rules={ctx: trimmed_mean}",
                     "server.options={trimmed_mean: {proportion: 0.25}}", "federation.rounds=1",
                     "method.local_epochs=1", "resources.workers=1")
    result = run_federated(spec, progress=False)
    seen = _seen(spec, result)
    assert seen["rules"] == {"ctx": "trimmed_mean", "log_scale": "fedavg", "bias": "fedavg"}
    updates = sorted(seen["updates"], key=lambda u: u.client_id)
    assert [u.client_id for u in updates] == [0, 1, 2, 3]
    contexts = np.stack([u.global_state["ctx"].double().numpy() for u in updates])
    np.testing.assert_allclose(result.final_state["ctx"].numpy(),
                               stats.trim_mean(contexts, 0.25, axis=0).astype(np.float32), rtol=1e-6, atol=1e-7)
    assert not np.allclose(result.final_state["ctx"].numpy(), contexts.mean(0), atol=1e-6)  # not the plain mean
    sizes = [u.num_samples for u in updates]
    for key in ("log_scale", "bias"):
        fedavg = sum(float(u.global_state[key]) * n for u, n in zip(updates, sizes)) / sum(sizes)
        assert float(result.final_state[key]) == pytest.approx(fedavg, rel=1e-6)
    client = MlflowClient(tracking_uri)
    assert client.get_run(result.run_id).info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(result.run_id, "server/trimmed_mean/trimmed")] == \
        [(1, 1.0)]
