"""The server optimisers' `variant: flower` against Flower's formulas written out here (flwr 1.42's FedAdam,
FedYogi and FedAdagrad), and the default (Reddi et al., 2021) where it should differ from them.

Flower's own strategies (flwr.server.strategy) are driven too, with the same inputs as fedvlp's rules.
"""
import dataclasses
import io

import numpy as np
import pytest
import torch

from fedvlp.config import load_spec
from fedvlp.errors import ConfigError
from fedvlp.platform.aggregation import RULES, RuleInputs, apply_rule

OPTIONS = dict(lr=0.05, beta1=0.8, beta2=0.95, tau=0.01)
SIZES = [2, 5, 3]


def flower_reference(kind: str, x0: np.ndarray, averages: list[np.ndarray], lr, beta1, beta2, tau) -> np.ndarray:
    """Flower's aggregate_fit, round r = 1, 2, ... (its server_round): delta = average - x;
    m = b1 m + (1 - b1) delta with m0 = 0 (b1 = 0 for FedAdagrad); v from v0 = 0 (not tau^2);
    x = x + eta_r m / (sqrt(v) + tau), eta_r = eta sqrt(1 - b2^(r+1)) / (1 - b1^(r+1)) for FedAdam, else eta."""
    beta1 = 0.0 if kind == "fedadagrad" else beta1
    x, m, v = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
    for r, average in enumerate(averages, start=1):
        delta = average - x
        m = beta1 * m + (1 - beta1) * delta
        if kind == "fedadagrad":
            v = v + delta * delta
        elif kind == "fedadam":
            v = beta2 * v + (1 - beta2) * delta * delta
        else:
            v = v - (1 - beta2) * delta * delta * np.sign(v - delta * delta)
        eta = lr * np.sqrt(1 - beta2 ** (r + 1.0)) / (1 - beta1 ** (r + 1.0)) if kind == "fedadam" else lr
        x = x + eta * m / (np.sqrt(v) + tau)
    return x


def step(kind: str, states, previous, state, **options):
    built = dataclasses.replace(RULES.get(kind).options(), **options)
    return apply_rule(kind, RuleInputs(states, SIZES, previous, state, None, built))[:2]


def cohorts(rounds: int, seed: int = 3):
    """(start, each round's client states): fixed pseudo-random float64 parameters."""
    gen = torch.Generator().manual_seed(seed)
    start = {"w": torch.randn(4, 3, generator=gen, dtype=torch.float64)}
    return start, [[{"w": torch.randn(4, 3, generator=gen, dtype=torch.float64)} for _ in SIZES]
                   for _ in range(rounds)]


def run_rounds(kind: str, start, rounds, state=None, **options):
    x, state = start, state or {}
    for states in rounds:
        x, state = step(kind, states, x, state, **options)
    return x, state


def averages_of(rounds) -> list[np.ndarray]:
    return [(sum(s["w"] * n for s, n in zip(states, SIZES)) / sum(SIZES)).numpy() for states in rounds]


@pytest.mark.parametrize("kind", ["fedadam", "fedyogi", "fedadagrad"])
def test_flower_variant_follows_flowers_formulas_over_five_rounds(kind):
    start, rounds = cohorts(5)
    x, state = run_rounds(kind, start, rounds, variant="flower", **OPTIONS)
    expected = flower_reference(kind, start["w"].numpy(), averages_of(rounds), **OPTIONS)
    np.testing.assert_allclose(x["w"].numpy(), expected, rtol=0, atol=1e-13)
    assert state["step"] == 5


def test_flower_fedadam_one_step_by_hand():
    """x = 1, cohort average 3 (delta 2); beta1 0.9, beta2 0.99, tau 0.1, eta 0.5: m = 0.1 * 2 = 0.2;
    v = 0 + 0.01 * 4 = 0.04 (v0 = 0); Flower's round 1 bias-corrects with exponent 2:
    eta_1 = 0.5 sqrt(1 - 0.99^2) / (1 - 0.9^2) = 0.5 sqrt(0.0199) / 0.19; x' = 1 + eta_1 * 0.2 / (0.2 + 0.1)."""
    states = [{"w": torch.tensor([0.0])}, {"w": torch.tensor([3.0])}, {"w": torch.tensor([5.0])}]  # sizes 2, 5, 3
    new, state = step("fedadam", states, {"w": torch.tensor([1.0])}, {}, lr=0.5, beta1=0.9, beta2=0.99, tau=0.1,
                      variant="flower")
    assert state["m"]["w"].item() == pytest.approx(0.2, abs=1e-15)
    assert state["v"]["w"].item() == pytest.approx(0.04, abs=1e-15)
    assert new["w"].item() == pytest.approx(1 + 0.5 * 0.0199 ** 0.5 / 0.19 * 0.2 / 0.3, rel=1e-6)  # float32 weights


@pytest.mark.parametrize("kind", ["fedadam", "fedyogi", "fedadagrad"])
def test_the_default_is_reddi_and_differs_from_flower(kind):
    """Reddi et al. start v at tau^2 (Flower at 0): the first round's v is the paper's update of tau^2, and after
    five rounds the parameters are off Flower's."""
    start, rounds = cohorts(5)
    _, first = run_rounds(kind, start, rounds[:1], **OPTIONS)
    d2 = (torch.from_numpy(averages_of(rounds[:1])[0]) - start["w"]) ** 2
    tau2, beta2 = OPTIONS["tau"] ** 2, OPTIONS["beta2"]
    v1 = {"fedadam": beta2 * tau2 + (1 - beta2) * d2, "fedadagrad": tau2 + d2,
          "fedyogi": tau2 - (1 - beta2) * d2 * torch.sign(tau2 - d2)}[kind]
    assert torch.allclose(first["v"]["w"], v1, rtol=0, atol=1e-15)
    assert set(first) == {"m", "v"}  # the default's checkpoint keeps the moments only, as before
    x, _ = run_rounds(kind, start, rounds, **OPTIONS)
    flower = flower_reference(kind, start["w"].numpy(), averages_of(rounds), **OPTIONS)
    assert np.abs(x["w"].numpy() - flower).max() > 1e-3


@pytest.mark.parametrize("kind", ["fedyogi", "fedadagrad"])
def test_flower_fedyogi_and_fedadagrad_differ_from_reddi_only_by_v0_and_beta1(kind):
    """Started from Reddi's v0 = tau^2 (and, for FedAdagrad, with beta1 = 0), the flower variant is the default."""
    start, rounds = cohorts(5)
    options = {**OPTIONS, "beta1": 0.0} if kind == "fedadagrad" else OPTIONS
    reddi, _ = run_rounds(kind, start, rounds, **options)
    seeded = {"v": {"w": torch.full_like(start["w"], OPTIONS["tau"] ** 2)}}
    flower, _ = run_rounds(kind, start, rounds, state=seeded, variant="flower", **options)
    assert torch.equal(reddi["w"], flower["w"])


def test_flower_fedadam_resumes_its_bias_correction_from_a_checkpoint():
    """The step count travels in the rule's state: 2 rounds, a checkpoint round trip, 3 more = 5 straight."""
    start, rounds = cohorts(5)
    straight, _ = run_rounds("fedadam", start, rounds, variant="flower", **OPTIONS)
    x, state = run_rounds("fedadam", start, rounds[:2], variant="flower", **OPTIONS)
    buffer = io.BytesIO()
    torch.save({"global": x, "rule_states": {"fedadam": state}}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)  # as the engine loads a checkpoint
    resumed, _ = run_rounds("fedadam", saved["global"], rounds[2:], saved["rule_states"]["fedadam"],
                            variant="flower", **OPTIONS)
    assert torch.equal(resumed["w"], straight["w"])


def test_the_variant_is_a_validated_option():
    spec = load_spec(None, ["server.rules={'': fedadam}", "server.options={fedadam: {variant: flower, lr: 0.1}}"])
    assert spec.server.options == {"fedadam": {"variant": "flower", "lr": 0.1}}
    assert RULES.get("fedyogi").options().variant == "reddi"
    with pytest.raises(ConfigError, match=r"^server.options.fedadam.variant: expected one of 'reddi', 'flower', "
                                          r"got 'flwr'$"):
        load_spec(None, ["server.rules={'': fedadam}", "server.options={fedadam: {variant: flwr}}"])
    with pytest.raises(ConfigError, match=r"^server.options.fedadam.flower: unknown key"):
        load_spec(None, ["server.rules={'': fedadam}", "server.options={fedadam: {flower: true}}"])


# ---------------------------------------------------------------- against flwr itself

def compare_with_flower(rounds: int = 5) -> dict[str, float]:
    """{rule: the largest |fedvlp - Flower| after `rounds` rounds}: Flower's own strategies (flwr.server.strategy)
    fed the same client parameters and sample counts; fedvlp's adaptive rules with variant=flower, the reference
    above beside them, and FedAvgM as it is (it needs no variant)."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import strategy

    start, cohort_rounds = cohorts(rounds)
    flower_options = dict(eta=OPTIONS["lr"], beta_1=OPTIONS["beta1"], beta_2=OPTIONS["beta2"], tau=OPTIONS["tau"])
    cases = {"fedadam": (strategy.FedAdam, flower_options, dict(variant="flower", **OPTIONS)),
             "fedyogi": (strategy.FedYogi, flower_options, dict(variant="flower", **OPTIONS)),
             "fedadagrad": (strategy.FedAdagrad, dict(eta=OPTIONS["lr"], tau=OPTIONS["tau"]),
                            dict(variant="flower", **OPTIONS)),
             "fedavgm": (strategy.FedAvgM, dict(server_learning_rate=0.7, server_momentum=0.9),
                         dict(lr=0.7, momentum=0.9))}
    gaps = {}
    for kind, (cls, flower_kwargs, ours) in cases.items():
        flower = cls(initial_parameters=ndarrays_to_parameters([start["w"].numpy()]), **flower_kwargs)
        for server_round, states in enumerate(cohort_rounds, start=1):
            results = [(None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters([s["w"].numpy()]), n, {}))
                       for s, n in zip(states, SIZES)]
            parameters, _ = flower.aggregate_fit(server_round, results, [])
        theirs = parameters_to_ndarrays(parameters)[0]
        x, _ = run_rounds(kind, start, cohort_rounds, **ours)
        gaps[kind] = float(np.abs(x["w"].numpy() - theirs).max())
        if kind != "fedavgm":
            reference = flower_reference(kind, start["w"].numpy(), averages_of(cohort_rounds), **OPTIONS)
            gaps[f"{kind} (the reference above)"] = float(np.abs(reference - theirs).max())
    return gaps


def test_fedvlp_equals_flowers_own_strategies_over_five_rounds():
    import logging

    logging.getLogger("flwr").setLevel(logging.ERROR)  # its warning that no metrics aggregation is given
    gaps = compare_with_flower()
    # float64 inputs: measured 1.1e-16 (FedAdam), 0 (FedYogi, FedAdagrad), 2.2e-16 (FedAvgM)
    assert max(gaps.values()) <= 1e-15, gaps
