"""Privacy through the engine on Ray: a DP-FedAvg run logs epsilon every round and is reproducible; with no noise it
is the uniform mean; a target epsilon is met; secure aggregation gives plain FedAvg's result, also when a client
fails mid-round; rules that see individual states refuse privacy."""
import pytest
import torch
from conftest import small_run
from mlflow import MlflowClient
from test_faults import fault_in_round

from fedvlp.config import load_spec
from fedvlp.errors import ConfigError
from fedvlp.platform.engine import run_federated
from fedvlp.platform.privacy import epsilon
from fedvlp.platform.secagg import TOLERANCE

pytestmark = pytest.mark.usefixtures("tiny_clip")
FAST = ("method.local_epochs=1", "resources.workers=1", "federation.participation=0.5")


def _close(a: dict, b: dict, atol: float) -> bool:
    return all(torch.allclose(a[k].double(), b[k].double(), atol=atol, rtol=0) for k in a)


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


def test_a_target_epsilon_is_met_at_the_last_round(ray_cluster, tracking_uri, tmp_path):
    result = run_federated(small_run(tracking_uri, tmp_path, *FAST, "privacy.target_epsilon=8"), progress=False)
    assert result.history[-1]["privacy_epsilon"] == pytest.approx(8.0, rel=0.02)


@pytest.mark.slow
def test_secure_aggregation_gives_fedavg_also_when_a_client_fails_mid_round(ray_cluster, tracking_uri, tmp_path):
    base = (*FAST, "federation.participation=1.0", "federation.rounds=3")
    plain = run_federated(small_run(tracking_uri, tmp_path, *base), progress=False)
    secure = run_federated(small_run(tracking_uri, tmp_path, *base, "privacy.secure_aggregation=true"),
                           progress=False)
    # each coordinate of the masked sum is exact up to 2^-25 per client, relative to the total weight
    assert _close(secure.final_state, plain.final_state, atol=10 * TOLERANCE)
    # client 1 raises in round 2 after the cohort's masks were drawn: the survivors' sum is recovered
    plain_fault = run_federated(small_run(tracking_uri, tmp_path, *base), progress=False,
                                on_round=fault_in_round(2, 0, 1, "raise"))
    secure_fault = run_federated(small_run(tracking_uri, tmp_path, *base, "privacy.secure_aggregation=true"),
                                 progress=False, on_round=fault_in_round(2, 0, 1, "raise"))
    assert [h["clients"] for h in secure_fault.history] == [4, 3, 4]
    assert _close(secure_fault.final_state, plain_fault.final_state, atol=10 * TOLERANCE)
    assert not _close(secure_fault.final_state, secure.final_state, 1e-4)  # the failure did change the round


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
    secure_dp = run_federated(small_run(tracking_uri, tmp_path, *FAST, *both), progress=False)
    mean = run_federated(small_run(tracking_uri, tmp_path, *FAST, "server.rules={'': mean}"), progress=False)
    assert _close(secure_dp.final_state, mean.final_state, atol=10 * TOLERANCE)
    noisy = ("privacy.secure_aggregation=true", "privacy.noise_multiplier=1", "privacy.clip_norm=0.1")
    one = run_federated(small_run(tracking_uri, tmp_path, *FAST, *noisy), progress=False)
    two = run_federated(small_run(tracking_uri, tmp_path, *FAST, *noisy), progress=False)
    assert all(torch.equal(one.final_state[k], two.final_state[k]) for k in one.final_state)
    assert not _close(one.final_state, secure_dp.final_state, 1e-3)
