"""Privacy through the engine on Ray: a DP-FedAvg run logs epsilon every round and is reproducible; with no noise it
is the uniform mean, and with a clip that bites the mean of the updates clipped by hand; a target epsilon is met;
under secure aggregation the coordinator receives no update in the clear and the result is plain FedAvg's, also
when a client fails mid-round; rules that see individual states refuse privacy."""
import math
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from conftest import small_run
from mlflow import MlflowClient
from scipy import stats
from test_faults import fault_in_round

from fedvlp.config import load_spec
from fedvlp.errors import ConfigError
from fedvlp.platform.aggregation.privacy import epsilon
from fedvlp.platform.aggregation.secagg import SCALE, TOLERANCE
from fedvlp.platform.runtime import engine
from fedvlp.platform.runtime.engine import run_federated

pytestmark = pytest.mark.usefixtures("tiny_clip")
FAST = ("method.local_epochs=1", "resources.workers=1", "federation.participation=0.5")
ONE_FULL_ROUND = ("method.local_epochs=1", "resources.workers=1", "federation.participation=1.0",
                  "federation.rounds=1")


def _close(a: dict, b: dict, atol: float, rtol: float = 0.0) -> bool:
    return all(torch.allclose(a[k].double(), b[k].double(), atol=atol, rtol=rtol) for k in a)


# Secure and plain aggregation agree up to the fixed point's step per client, plus the float32 rounding of the
# averaged state: one unit in the last place is 4.8e-7 on a bias of -5, above the fixed point's 10 * 2^-25.
FLOAT32_ROUNDING = 2 * torch.finfo(torch.float32).eps


def spy_on_aggregation(monkeypatch) -> None:
    """From now on the engine's coordinator also saves what each `aggregate` call receives, in its run's directory
    (`_seen`): the global state before the round, the server rules, the cohort and the ClientUpdates as they
    arrived. The actor runs in another process; a class defined in a function is shipped to it by value."""

    class Spy(engine.Coordinator.__ray_actor_class__):  # the class behind the Ray actor class
        def aggregate(self, round_index, cohort, *client_updates):
            record = self.client_states.spill_dir.parent / "aggregate-inputs"  # beside the run's spilled states
            record.mkdir(parents=True, exist_ok=True)
            torch.save({"previous": self.state, "rules": self.rules, "cohort": cohort, "updates": client_updates},
                       record / f"round{round_index}.pt")
            return super().aggregate(round_index, cohort, *client_updates)

    monkeypatch.setattr(engine, "Coordinator", ray.remote(max_restarts=0)(Spy))


def _seen(spec, result, round_index: int = 1) -> dict:
    """What the spying coordinator of `result`'s run received in that round."""
    path = Path(spec.output_dir) / result.run_id / "aggregate-inputs" / f"round{round_index}.pt"
    return torch.load(path, weights_only=False)


def test_a_private_run_logs_epsilon_every_round_and_repeats_exactly(ray_cluster, tracking_uri, tmp_path):
    spec = small_run(tracking_uri, tmp_path, *FAST, "privacy.noise_multiplier=0.8", "privacy.clip_norm=0.5")
    one, two = run_federated(spec, progress=False), run_federated(spec, progress=False)
    assert all(torch.equal(one.final_state[k], two.final_state[k]) for k in one.final_state)  # the noise is seeded
    history = MlflowClient(tracking_uri).get_metric_history(one.run_id, "privacy_epsilon")
    spent = {m.step: m.value for m in history}
    assert sorted(spent) == [0, 1, 2] and spent[0] == 0.0
    assert spent[2] == pytest.approx(epsilon(0.8, 4, 2, 2, 1e-5)) and spent[2] > spent[1] > 0
    other = run_federated(small_run(tracking_uri, tmp_path, *FAST, "privacy.noise_multiplier=0.8",
                                    "privacy.clip_norm=0.5", "seed=1"), progress=False)
    assert not _close(other.final_state, one.final_state, 1e-6)


def test_without_noise_and_clipping_dp_fedavg_is_the_uniform_mean(ray_cluster, tracking_uri, tmp_path):
    private = run_federated(small_run(tracking_uri, tmp_path, *FAST, "privacy.noise_multiplier=0",
                                      "privacy.clip_norm=1e6"), progress=False)
    mean = run_federated(small_run(tracking_uri, tmp_path, *FAST, "server.rules={'': mean}"), progress=False)
    assert _close(private.final_state, mean.final_state, 1e-6)


def test_dp_fedavg_averages_the_updates_clipped_to_the_clip_norm(ray_cluster, tracking_uri, tmp_path, monkeypatch):
    """No noise and a clip well below the updates' norms, one round of all 4 clients: the result is
    previous + mean_k(delta_k min(1, C / ||delta_k||)) computed here from the updates the coordinator received,
    which are the clients' own (a plain run of the same seed receives the same ones and reaches their mean)."""
    clip = 0.05
    spy_on_aggregation(monkeypatch)
    private_spec = small_run(tracking_uri, tmp_path, *ONE_FULL_ROUND, "privacy.noise_multiplier=0",
                             f"privacy.clip_norm={clip}")
    plain_spec = small_run(tracking_uri, tmp_path, *ONE_FULL_ROUND, "server.rules={'': mean}")
    private, plain = run_federated(private_spec, progress=False), run_federated(plain_spec, progress=False)
    seen, plain_round = _seen(private_spec, private), _seen(plain_spec, plain)
    assert [u.client_id for u in seen["updates"]] == [0, 1, 2, 3]
    previous = {k: v.double() for k, v in seen["previous"].items()}
    assert set(previous) == set(seen["rules"])  # every global parameter is averaged: one clip over all of them
    for update, again in zip(seen["updates"], plain_round["updates"]):
        assert all(torch.equal(update.global_state[k], again.global_state[k]) for k in previous)
    deltas = [{k: u.global_state[k].double() - previous[k] for k in previous} for u in seen["updates"]]
    norms = [math.sqrt(sum(float(d.square().sum()) for d in delta.values())) for delta in deltas]
    assert min(norms) > 4 * clip  # the clip bites every update
    clipped_mean = {k: previous[k] + sum(d[k] * min(1.0, clip / n) for d, n in zip(deltas, norms)) / len(deltas)
                    for k in previous}
    mean = {k: previous[k] + sum(d[k] for d in deltas) / len(deltas) for k in previous}
    # float32 parameters: the clipped states and the result each round once
    atol = 4 * torch.finfo(torch.float32).eps * max(float(v.abs().max()) for v in previous.values())
    assert _close(private.final_state, clipped_mean, atol)
    assert _close(plain.final_state, mean, atol)
    assert not _close(private.final_state, plain.final_state, 100 * atol)


def test_under_secure_aggregation_no_update_reaches_the_coordinator_in_the_clear(ray_cluster, tracking_uri, tmp_path,
                                                                                 monkeypatch):
    """What the coordinator receives under secure aggregation, against the same round without it (the clients'
    updates are the same): no averaged parameter in the clear, masked vectors that look uniformly random and
    uncorrelated with the clients' fixed-point weighted states, and whose ring sum is the sum of those states."""
    spy_on_aggregation(monkeypatch)
    secure_spec = small_run(tracking_uri, tmp_path, *ONE_FULL_ROUND, "privacy.secure_aggregation=true")
    plain_spec = small_run(tracking_uri, tmp_path, *ONE_FULL_ROUND)
    secure, plain = run_federated(secure_spec, progress=False), run_federated(plain_spec, progress=False)
    seen, plain_round = _seen(secure_spec, secure), _seen(plain_spec, plain)
    averaged = sorted(plain_round["rules"])
    assert set(plain_round["rules"].values()) == {"fedavg"}  # sample-count weights
    clear = {u.client_id: u for u in plain_round["updates"]}
    assert sorted(clear) == [u.client_id for u in seen["updates"]] == [0, 1, 2, 3]
    ring_sum = fixed_point_sum = weighted_sum = 0
    for update in seen["updates"]:
        assert not set(update.global_state) & set(averaged), f"client {update.client_id} sent its state in the clear"
        own = clear[update.client_id]
        weighted = own.num_samples * np.concatenate([own.global_state[k].double().flatten().numpy() for k in averaged])
        fixed_point = np.rint(weighted * SCALE).astype(np.int64).view(np.uint64)  # what it would send unmasked
        masked = update.masked
        assert masked.dtype == np.uint64 and masked.shape == fixed_point.shape
        assert (masked != fixed_point).all()
        # a one-time pad: values spread uniformly over the ring, unrelated to the update
        assert stats.kstest(masked / 2.0 ** 64, "uniform").pvalue > 1e-3
        assert abs(np.corrcoef(masked.view(np.int64).astype(np.float64), weighted)[0, 1]) < 5 / math.sqrt(len(masked))
        ring_sum, fixed_point_sum = ring_sum + masked, fixed_point_sum + fixed_point  # uint64 wraps: the ring's sum
        weighted_sum = weighted_sum + weighted
    # the pairwise masks cancel: the ring sum is the sum of the fixed-point states, each off by at most half a step
    assert np.array_equal(ring_sum, fixed_point_sum)
    assert np.abs(ring_sum.view(np.int64) / SCALE - weighted_sum).max() <= len(clear) * TOLERANCE
    assert _close(secure.final_state, plain.final_state, atol=10 * TOLERANCE, rtol=FLOAT32_ROUNDING)


def test_a_target_epsilon_is_met_at_the_last_round(ray_cluster, tracking_uri, tmp_path):
    result = run_federated(small_run(tracking_uri, tmp_path, *FAST, "privacy.target_epsilon=8"), progress=False)
    assert result.history[-1]["privacy_epsilon"] == pytest.approx(8.0, rel=0.02)


@pytest.mark.slow
def test_secure_aggregation_gives_fedavg_also_when_a_client_fails_mid_round(ray_cluster, tracking_uri, tmp_path):
    # The dropout comes in the last round: compared after it, secure and plain differ by the fixed point's rounding
    # of both rounds, round 1's carried through round 2's training. A small lr keeps that carry near 1: measured
    # 3.7e-7 (12 fixed-point steps) at lr 0.005, against 1.6e-6 at the quickstart's tuned Adam lr of 0.1.
    base = (*FAST, "federation.participation=1.0", "federation.rounds=2", "method.lr=0.005")
    plain = run_federated(small_run(tracking_uri, tmp_path, *base), progress=False)
    # client 1 raises in round 2 after the cohort's masks were drawn: the survivors' sum is recovered
    plain_fault = run_federated(small_run(tracking_uri, tmp_path, *base), progress=False,
                                on_round=fault_in_round(2, 0, 1, "raise"))
    secure_fault = run_federated(small_run(tracking_uri, tmp_path, *base, "privacy.secure_aggregation=true"),
                                 progress=False, on_round=fault_in_round(2, 0, 1, "raise"))
    assert [h["clients"] for h in secure_fault.history] == [4, 3]
    assert _close(secure_fault.final_state, plain_fault.final_state, atol=20 * TOLERANCE, rtol=FLOAT32_ROUNDING)
    assert not _close(secure_fault.final_state, plain.final_state, 1e-4)  # the failure did change the round


def test_rules_that_see_individual_states_refuse_privacy():
    with pytest.raises(ConfigError, match=r"privacy\.noise_multiplier: fedprime's parameters 'inter_pool\.prompts' "
                                          r"use the server rule hungarian"):
        load_spec("fedprime_recipes", ["privacy.noise_multiplier=1"])
    with pytest.raises(ConfigError, match=r"privacy\.secure_aggregation: .* hungarian"):
        load_spec("fedprime_recipes", ["privacy.secure_aggregation=true"])
    with pytest.raises(ConfigError, match=r"give either privacy\.noise_multiplier or privacy\.target_epsilon"):
        load_spec(None, ["privacy.noise_multiplier=1", "privacy.target_epsilon=2"])


@pytest.mark.slow
def test_dp_with_secure_aggregation_clips_on_the_clients_and_noises_the_sum(ray_cluster, tracking_uri, tmp_path):
    """Masked updates cannot be clipped by the server: the clients clip before masking; with no noise and no
    effective clipping the result is the uniform mean, and with noise it repeats exactly."""
    both = ("privacy.secure_aggregation=true", "privacy.noise_multiplier=0", "privacy.clip_norm=1e6")
    # compared after one round: a second round of training would amplify the rounding differences
    secure_dp = run_federated(small_run(tracking_uri, tmp_path, *FAST, *both, "federation.rounds=1"), progress=False)
    mean = run_federated(small_run(tracking_uri, tmp_path, *FAST, "federation.rounds=1", "server.rules={'': mean}"),
                         progress=False)
    assert _close(secure_dp.final_state, mean.final_state, atol=10 * TOLERANCE, rtol=FLOAT32_ROUNDING)
    noisy = ("privacy.secure_aggregation=true", "privacy.noise_multiplier=1", "privacy.clip_norm=0.1")
    one = run_federated(small_run(tracking_uri, tmp_path, *FAST, *noisy), progress=False)
    two = run_federated(small_run(tracking_uri, tmp_path, *FAST, *noisy), progress=False)
    assert all(torch.equal(one.final_state[k], two.final_state[k]) for k in one.final_state)
    assert not _close(one.final_state, secure_dp.final_state, 1e-3)
