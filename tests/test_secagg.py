"""Simulated secure aggregation (fedvlp.platform.aggregation.secagg): masks by hand, exact cancellation in the ring,
the plain weighted average within the quantisation bound, dropouts recovered, and masked vectors that look random."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from fedvlp.platform.aggregation import secagg, weighted_average
from fedvlp.seeding import numpy_rng

RING = 2 ** 64
DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _states(cohort, seed=0, dtypes=DTYPES):
    """A random state per client: a matrix, a vector and a scalar, one dtype each, inserted unsorted."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"z.weight": (3, 4), "b.bias": (5,), "m.scale": ()}
    return {c: {key: (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)
                for (key, shape), dtype in zip(shapes.items(), dtypes)} for c in cohort}


def _weights(cohort, seed=0):
    rng = np.random.default_rng(seed)
    return {c: float(rng.integers(1, 200)) for c in cohort}  # sample counts


def _fixed_point_average(updates, weights, clients):
    """The exact fixed-point result by hand: sum_k round(w_k x_k 2^F) / 2^F / sum_k w_k, in float64."""
    keys = sorted(updates[clients[0]])
    total = sum(float(weights[c]) for c in clients)
    out = {}
    for key in keys:
        ints = sum(np.rint(weights[c] * updates[c][key].double().numpy() * secagg.SCALE).astype(np.int64)
                   for c in clients)
        out[key] = torch.from_numpy(np.asarray(ints / secagg.SCALE / total, dtype=np.float64))
    return out


def _assert_within_quantisation(got, plain, num_clients, total_weight):
    """|got - plain| <= n 2^-(F+1) / W (each client's weighted value rounds by at most half a step) plus the
    rounding of both float64 results into the parameter's dtype (at most eps(dtype) |value|)."""
    bound = num_clients * secagg.TOLERANCE / total_weight
    assert bound < 1e-6
    for key in plain:
        assert got[key].dtype == plain[key].dtype and got[key].shape == plain[key].shape
        error = (got[key].double() - plain[key].double()).abs()
        allowed = bound + torch.finfo(plain[key].dtype).eps * plain[key].double().abs() + 1e-300
        assert (error <= allowed).all(), (key, error.max().item(), bound)


# ---------------------------------------------------------------- flat vectors and fixed point

def test_flatten_round_trip_sorted_keys_shapes_and_dtypes():
    state = _states([0])[0]
    vector, layout = secagg.flatten(state)
    assert [key for key, _, _ in layout] == ["b.bias", "m.scale", "z.weight"]
    assert vector.dtype == np.float64 and len(vector) == 5 + 1 + 12 == secagg.layout_size(layout)
    np.testing.assert_array_equal(vector[:5], state["b.bias"].double().numpy())
    back = secagg.unflatten(vector, layout)
    assert all(torch.equal(back[k], state[k]) and back[k].dtype == state[k].dtype for k in state)
    assert all(t.dtype == torch.float64 for t in secagg.unflatten(vector, layout, torch.float64).values())
    with pytest.raises(ValueError, match="vector"):
        secagg.unflatten(vector[:-1], layout)


def test_quantise_by_hand():
    step = 2.0 ** -secagg.FRACTION_BITS
    ring = secagg.quantise(np.array([1.5, -step, step / 4, 1.5 * step, 2.5 * step]))
    # round to nearest (ties to even): 1.5 * 2^24, -1 -> 2^64 - 1, 0, 2 and 2 steps
    assert ring.dtype == np.uint64
    assert [int(v) for v in ring] == [3 * 2 ** 23, RING - 1, 0, 2, 2]
    np.testing.assert_array_equal(secagg.dequantise(ring), [1.5, -step, 0.0, 2 * step, 2 * step])
    for bad in ([np.nan], [np.inf], [secagg.LIMIT], [-secagg.LIMIT]):
        with pytest.raises(ValueError, match="vector"):
            secagg.quantise(np.array(bad))


# ---------------------------------------------------------------- masks

def test_pair_seed_is_shared_and_drawn_from_the_secagg_stream():
    low, high = numpy_rng(11, "secagg", 3, 2, 5).integers(0, RING, size=2, dtype=np.uint64)
    assert secagg.pair_seed(11, 3, 2, 5) == secagg.pair_seed(11, 3, 5, 2) == int(low) + (int(high) << 64)
    assert secagg.pair_seed(11, 3, 2, 5) != secagg.pair_seed(11, 4, 2, 5)


def test_mask_by_hand():
    """Client 5 of the cohort [2, 5, 8] subtracts PRG(s_25) and adds PRG(s_58), mod 2^64 (Python integers)."""
    cohort, seed, round_index, weight = [8, 2, 5], 3, 9, 7.0
    update = _states([5])[5]
    size = secagg.layout_size(secagg.flatten(update)[1])
    quantised = [int(v) for v in secagg.quantise(weight * secagg.flatten(update)[0])]
    below = [int(v) for v in secagg.prg(secagg.pair_seed(seed, round_index, 2, 5), size)]
    above = [int(v) for v in secagg.prg(secagg.pair_seed(seed, round_index, 5, 8), size)]
    expected = [(q - b + a) % RING for q, b, a in zip(quantised, below, above)]
    got = secagg.mask(update, weight, 5, cohort, seed, round_index)
    assert got.dtype == np.uint64 and [int(v) for v in got] == expected
    with pytest.raises(ValueError, match="client"):
        secagg.mask(update, weight, 4, cohort, seed, round_index)


def test_a_masked_vector_looks_random_and_hides_the_update():
    cohort, weight = [0, 1, 2], 3.0
    update = {"w": torch.randn(4096, generator=torch.Generator().manual_seed(1), dtype=torch.float64)}
    quantised = secagg.quantise(weight * secagg.flatten(update)[0])
    masked = secagg.mask(update, weight, 1, cohort, seed=0, round_index=0)
    assert (masked != quantised).all()
    # the same update in another round or under another run seed: unrelated vectors
    assert (masked != secagg.mask(update, weight, 1, cohort, seed=0, round_index=1)).all()
    assert (masked != secagg.mask(update, weight, 1, cohort, seed=1, round_index=0)).all()
    # a one-time pad: the mask does not depend on the update (masked(x) - masked(0) = quantise(w x) exactly) ...
    zero = secagg.mask({"w": torch.zeros(4096, dtype=torch.float64)}, weight, 1, cohort, 0, 0)
    assert np.array_equal(masked - zero, quantised)
    # ... and is uniform over the ring: its top 53 bits as [0, 1) fractions pass Kolmogorov-Smirnov
    assert stats.kstest((zero >> np.uint64(11)).astype(np.float64) / 2.0 ** 53, "uniform").pvalue > 1e-3


# ---------------------------------------------------------------- sums

@pytest.mark.parametrize("cohort", [[0, 1], [4, 1, 7], [0, 2, 3, 5, 9], list(range(10, 18))])
def test_masks_cancel_and_match_the_plain_weighted_average(cohort):
    updates, weights = _states(cohort, seed=len(cohort)), _weights(cohort, seed=len(cohort))
    got = secagg.secure_weighted_average(updates, weights, cohort, seed=5, round_index=2)
    clients = sorted(cohort)
    plain = weighted_average([updates[c] for c in clients], [weights[c] for c in clients])
    _assert_within_quantisation(got, plain, len(cohort), sum(weights.values()))
    # in float64 the masks cancel exactly: the result is the fixed-point sum by hand, bit for bit
    doubles = {c: {k: v.double() for k, v in s.items()} for c, s in updates.items()}
    exact = secagg.secure_weighted_average(doubles, weights, cohort, seed=5, round_index=2)
    by_hand = _fixed_point_average(doubles, weights, clients)
    assert all(torch.equal(exact[k], by_hand[k]) for k in by_hand)


@pytest.mark.parametrize("delivered", [{0, 2, 3, 5}, {1, 4}, {2, 3, 4}])
def test_dropouts_after_masking_do_not_corrupt_the_sum(delivered):
    cohort = [0, 1, 2, 3, 4, 5]  # dropped clients below, between and above the survivors
    updates, weights = _states(cohort, dtypes=(torch.float64,) * 3), _weights(cohort)
    got = secagg.secure_weighted_average(updates, weights, cohort, 8, 1, delivered=delivered)
    clients = sorted(delivered)
    plain = weighted_average([updates[c] for c in clients], [weights[c] for c in clients])
    _assert_within_quantisation(got, plain, len(clients), sum(weights[c] for c in clients))
    assert all(torch.equal(got[k], v) for k, v in _fixed_point_average(updates, weights, clients).items())
    # a dropped client that never even produced an update is recovered the same way
    partial = {c: updates[c] for c in clients}
    again = secagg.secure_weighted_average(partial, weights, cohort, 8, 1)
    assert all(torch.equal(got[k], again[k]) for k in got)
    # without the server's recovery of the dropped clients' masks the sum would be noise
    layout = secagg.flatten(updates[0])[1]
    masked = {c: secagg.mask(updates[c], weights[c], c, cohort, 8, 1) for c in clients}
    naive = secagg.dequantise(sum(masked.values()))
    true_sum = secagg.flatten(secagg.unmask_sum(masked, cohort, 8, 1, layout))[0]
    assert (np.abs(naive - true_sum) > 1.0).all()


def test_unmask_sum_returns_the_plain_weighted_sum_in_float64():
    cohort = [3, 6, 9]
    updates, weights = _states(cohort), _weights(cohort)
    layout = secagg.flatten(updates[3])[1]
    masked = {c: secagg.mask(updates[c], weights[c], c, cohort, 2, 0) for c in cohort}
    total = secagg.unmask_sum(masked, cohort, 2, 0, layout)
    for key in updates[3]:
        assert total[key].dtype == torch.float64
        expected = sum(weights[c] * updates[c][key].double() for c in cohort)
        assert (total[key] - expected).abs().max().item() <= len(cohort) * secagg.TOLERANCE


def test_fewer_than_two_survivors_raise():
    cohort = [0, 1, 2]
    updates, weights = _states(cohort), _weights(cohort)
    layout = secagg.flatten(updates[0])[1]
    for delivered in ({1}, set()):
        with pytest.raises(ValueError, match="delivered"):
            secagg.secure_weighted_average(updates, weights, cohort, 0, 0, delivered=delivered)
    with pytest.raises(ValueError, match="at least 2"):
        secagg.unmask_sum({1: secagg.mask(updates[1], 1.0, 1, cohort, 0, 0)}, cohort, 0, 0, layout)
    with pytest.raises(ValueError, match="not in the cohort"):
        secagg.unmask_sum({c: secagg.mask(updates[c], 1.0, c, cohort, 0, 0) for c in cohort}, [0, 1], 0, 0, layout)
    with pytest.raises(ValueError, match="cohort"):
        secagg.secure_weighted_average(updates, weights, [0, 1, 1, 2], 0, 0)


def test_determinism_and_independence_of_the_seed():
    cohort = [1, 2, 3, 4]
    updates, weights = _states(cohort), _weights(cohort)
    run = lambda seed: secagg.secure_weighted_average(updates, weights, cohort, seed, 0, delivered={1, 3, 4})
    first, again, other_seed = run(0), run(0), run(1)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert all(torch.equal(first[k], other_seed[k]) for k in first)  # exact cancellation: the masks leave no trace
    masks = lambda seed: secagg.mask(updates[2], weights[2], 2, cohort, seed, 0)
    assert np.array_equal(masks(0), masks(0)) and (masks(0) != masks(1)).all()
