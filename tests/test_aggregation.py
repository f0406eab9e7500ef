"""Aggregation rules against hand-computed references; sampling per DESIGN §4."""
import pytest
import torch

from fedvlp.platform.aggregation import fedavg, state_nbytes, uniform_average
from fedvlp.platform.sampling import cohort_size, sample_cohort


def test_fedavg_weights_by_data_size():
    states = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([4.0, -1.0])}]
    # (1*1 + 3*4)/4 = 3.25 ; (1*2 + 3*-1)/4 = -0.25
    assert torch.equal(fedavg(states, [1, 3])["w"], torch.tensor([3.25, -0.25]))
    assert torch.equal(uniform_average(states, [1, 3])["w"], torch.tensor([2.5, 0.5]))


def test_fedavg_matches_a_float64_reference_and_keeps_dtype():
    gen = torch.Generator().manual_seed(0)
    states = [{"a": torch.randn(5, 3, generator=gen), "b": torch.randn(7, generator=gen)} for _ in range(6)]
    sizes = [3, 10, 1, 7, 2, 5]
    out = fedavg(states, sizes)
    for key in ("a", "b"):
        ref = sum(s[key].double() * n for s, n in zip(states, sizes)) / sum(sizes)
        assert out[key].dtype == torch.float32
        assert torch.allclose(out[key].double(), ref, atol=1e-7)


def test_fedavg_rejects_empty_input():
    with pytest.raises(ValueError):
        fedavg([], [])
    with pytest.raises(ValueError):
        fedavg([{"w": torch.ones(1)}], [0])


def test_state_nbytes():
    assert state_nbytes({"a": torch.zeros(4, 4), "b": torch.zeros(3, dtype=torch.float16)}) == 64 + 6


def test_cohort_size_and_sampling():
    assert cohort_size(10, 1.0) == 10 and cohort_size(10, 0.25) == 2 and cohort_size(10, 0.01) == 1
    cohort = sample_cohort(0, 3, 50, 0.2)
    assert cohort == sorted(cohort) and len(set(cohort)) == 10 and all(0 <= c < 50 for c in cohort)
    assert sample_cohort(0, 3, 50, 0.2) == cohort  # same seed and round: same cohort for every method
    assert sample_cohort(0, 4, 50, 0.2) != cohort
    assert sample_cohort(1, 3, 50, 0.2) != cohort
    assert sample_cohort(0, 1, 10, 1.0) == list(range(10))
