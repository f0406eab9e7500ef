"""Server rules against hand-computed references: FedAvg, the uniform mean, and the server optimisers of
Reddi et al. (2021) (FedAvgM, FedAdagrad, FedAdam, FedYogi); cohort sampling."""
import dataclasses

import pytest
import torch

from fedvlp.errors import ConfigError
from fedvlp.platform.aggregation import RULES, RuleInputs, ServerRule, apply_rule, register_rule, state_nbytes
from fedvlp.platform.runtime.cohorts import cohort_size, sample_cohort


def run(rule_name: str, states, sizes, previous=None, state=None, **options):
    rule = RULES.get(rule_name)
    built = dataclasses.replace(rule.options(), **options) if rule.options else None
    previous = previous if previous is not None else {k: torch.zeros_like(v) for k, v in states[0].items()}
    return apply_rule(rule, RuleInputs(states, sizes, previous, state or {}, None, built))[:2]


def test_fedavg_weights_by_data_size():
    states = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([4.0, -1.0])}]
    # (1*1 + 3*4)/4 = 3.25 ; (1*2 + 3*-1)/4 = -0.25
    assert torch.equal(run("fedavg", states, [1, 3])[0]["w"], torch.tensor([3.25, -0.25]))
    assert torch.equal(run("mean", states, [1, 3])[0]["w"], torch.tensor([2.5, 0.5]))


def test_fedavg_matches_a_float64_reference_and_keeps_dtype():
    gen = torch.Generator().manual_seed(0)
    states = [{"a": torch.randn(5, 3, generator=gen), "b": torch.randn(7, generator=gen)} for _ in range(6)]
    sizes = [3, 10, 1, 7, 2, 5]
    out, _ = run("fedavg", states, sizes)
    for key in ("a", "b"):
        ref = sum(s[key].double() * n for s, n in zip(states, sizes)) / sum(sizes)
        assert out[key].dtype == torch.float32
        assert torch.allclose(out[key].double(), ref, atol=1e-7)


def test_fedavg_rejects_empty_input():
    with pytest.raises(ValueError):
        run("fedavg", [], [], previous={})
    with pytest.raises(ValueError):
        run("fedavg", [{"w": torch.ones(1)}], [0])


def test_state_nbytes():
    assert state_nbytes({"a": torch.zeros(4, 4), "b": torch.zeros(3, dtype=torch.float16)}) == 64 + 6


# ---------------------------------------------------------------- server optimisers

def test_fedadam_one_step_by_hand():
    """x = 1, cohort average 3 (delta 2); beta1 0.9, beta2 0.99, tau 0.1, eta 0.5:
    m = 0.1 * 2 = 0.2; v = 0.99 * 0.01 + 0.01 * 4 = 0.0499; x' = 1 + 0.5 * 0.2 / (sqrt(0.0499) + 0.1)."""
    states = [{"w": torch.tensor([2.0])}, {"w": torch.tensor([4.0])}]
    new, state = run("fedadam", states, [1, 1], previous={"w": torch.tensor([1.0])}, lr=0.5, beta1=0.9, beta2=0.99,
                     tau=0.1)
    expected = 1 + 0.5 * 0.2 / (0.0499 ** 0.5 + 0.1)
    assert new["w"].item() == pytest.approx(expected, rel=1e-6)
    assert state["m"]["w"].item() == pytest.approx(0.2) and state["v"]["w"].item() == pytest.approx(0.0499)


def test_fedavgm_one_step_by_hand():
    """x = 1, average 3: v = 0.9 * 0 + 2; x' = 1 + 1.0 * 2 = 3;
    next round average 2 (delta -1): v = 0.9 * 2 - 1 = 0.8."""
    states = [{"w": torch.tensor([3.0])}]
    new, state = run("fedavgm", states, [5], previous={"w": torch.tensor([1.0])}, lr=1.0, momentum=0.9)
    assert new["w"].item() == pytest.approx(3.0) and state["velocity"]["w"].item() == pytest.approx(2.0)
    new, state = run("fedavgm", [{"w": torch.tensor([2.0])}], [5], previous=new, state=state, lr=1.0, momentum=0.9)
    assert state["velocity"]["w"].item() == pytest.approx(0.8) and new["w"].item() == pytest.approx(3.8)


def reference_fedopt(kind: str, xs0: torch.Tensor, averages: list[torch.Tensor], lr, beta1, beta2, tau):
    """Algorithm 2 of Reddi et al. (2021), written out for a list of rounds' cohort averages."""
    x, m = xs0.double(), torch.zeros_like(xs0, dtype=torch.float64)
    v = torch.full_like(xs0, tau ** 2, dtype=torch.float64)
    for average in averages:
        delta = average.double() - x
        m = beta1 * m + (1 - beta1) * delta
        if kind == "fedadagrad":
            v = v + delta ** 2
        elif kind == "fedadam":
            v = beta2 * v + (1 - beta2) * delta ** 2
        else:
            v = v - (1 - beta2) * delta ** 2 * torch.sign(v - delta ** 2)
        x = x + lr * m / (v.sqrt() + tau)
    return x


@pytest.mark.parametrize("kind", ["fedadagrad", "fedadam", "fedyogi"])
def test_server_optimisers_follow_the_paper_over_rounds(kind):
    gen = torch.Generator().manual_seed(3)
    start = {"w": torch.randn(4, 3, generator=gen, dtype=torch.float64)}
    options = dict(lr=0.05, beta1=0.8, beta2=0.95, tau=0.01)
    x, state, averages = start, {}, []
    for _ in range(6):
        states = [{"w": torch.randn(4, 3, generator=gen, dtype=torch.float64)} for _ in range(3)]
        sizes = [2, 5, 3]
        averages.append(sum(s["w"] * n for s, n in zip(states, sizes)) / sum(sizes))
        x, state = run(kind, states, sizes, previous=x, state=state, **options)
    assert torch.allclose(x["w"], reference_fedopt(kind, start["w"], averages, **options), atol=1e-12)


def test_a_plugin_rule_registers_and_a_misspelled_one_is_a_config_error():
    from fedvlp.config import load_spec

    def halve(previous, average, state, options):
        return {k: (previous[k] + average[k]) / 2 for k in average}, state

    register_rule(ServerRule("halfway", "average", halve, doc="test rule"))
    try:
        assert run("halfway", [{"w": torch.tensor([4.0])}], [1], previous={"w": torch.tensor([2.0])})[0]["w"] == 3.0
        assert load_spec(None, ["server.rules={'': halfway}"]).server.rules == {"": "halfway"}
        with pytest.raises(ValueError, match="registered twice"):
            register_rule(ServerRule("halfway", "average", halve))
    finally:
        RULES.remove("halfway")
    with pytest.raises(ConfigError, match=r"server.rules: unknown server rule 'fedadma' \(expected one of: .*fedadam"):
        load_spec(None, ["server.rules={'': fedadma}"])
    with pytest.raises(ConfigError, match=r"server.options.fedadam.eta: unknown key"):
        load_spec(None, ["server.rules={'': fedadam}", "server.options={fedadam: {eta: 1}}"])
    with pytest.raises(ConfigError, match=r"server.options.fedavg: the rule fedavg takes no options"):
        load_spec(None, ["server.options={fedavg: {lr: 1}}"])


def test_cohort_size_and_sampling():
    assert cohort_size(10, 1.0) == 10 and cohort_size(10, 0.25) == 2 and cohort_size(10, 0.01) == 1
    cohort = sample_cohort(0, 3, 50, 0.2)
    assert cohort == sorted(cohort) and len(set(cohort)) == 10 and all(0 <= c < 50 for c in cohort)
    assert sample_cohort(0, 3, 50, 0.2) == cohort  # same seed and round: same cohort for every method
    assert sample_cohort(0, 4, 50, 0.2) != cohort
    assert sample_cohort(1, 3, 50, 0.2) != cohort
    assert sample_cohort(0, 1, 10, 1.0) == list(range(10))
