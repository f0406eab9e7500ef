"""The data layer wired together: dataset selection, label masks, partitions, missing tables, stats, feature cache."""
import numpy as np
import pytest

from fedvlp.config import load_spec
from fedvlp.data import prepare_data
from fedvlp.data.feature_cache import FeatureCache, feature_key
from fedvlp.data.label_masking import mask_labels
from fedvlp.errors import ConfigError


def test_label_mask_hides_annotations_as_unknown_or_negative():
    labels = (np.random.default_rng(0).random((2000, 20)) < 0.2).astype(np.int8)
    unknown = mask_labels(labels, 0.3, seed=0)
    hidden = unknown == -1
    assert abs(hidden.mean() - 0.3) < 0.01
    assert np.array_equal(unknown[~hidden], labels[~hidden])
    negative = mask_labels(labels, 0.3, seed=0, mask_as="negative")
    assert set(np.unique(negative)) <= {0, 1}
    assert np.array_equal(negative, np.where(hidden, 0, labels))  # same draws, hidden positives dropped to 0
    assert np.array_equal(mask_labels(labels, 0.3, seed=0), unknown)
    assert not np.array_equal(mask_labels(labels, 0.3, seed=1), unknown)
    assert np.array_equal(mask_labels(labels, 0.0, seed=0), labels)


def test_prepare_data_masks_train_only_and_partitions_every_sample():
    spec = load_spec(None, ["data.num_train=500", "data.num_test=200", "data.num_val=100", "data.num_holdout=300",
                            "data.label_mask=0.5"])
    data = prepare_data(spec)
    assert abs((data.train_labels == -1).mean() - 0.5) < 0.02
    assert (data.test_labels >= 0).all() and (data.dataset.val.labels >= 0).all()  # only train labels are masked
    assert sorted(np.concatenate(data.parts).tolist()) == list(range(500))
    # each client's part of the held-out pool: half its local val set, half its local test set, disjoint
    assert sorted(np.concatenate(data.local_tests + data.local_vals).tolist()) == list(range(300))
    assert sum(map(len, data.local_vals)) == 150 and not set(np.concatenate(data.local_vals)) & set(
        np.concatenate(data.local_tests))
    no_val = prepare_data(load_spec(None, ["data.num_train=500", "data.num_holdout=300", "data.local_val_fraction=0"]))
    assert sum(map(len, no_val.local_vals)) == 0 and sorted(np.concatenate(no_val.local_tests)) == list(range(300))
    assert data.train_missing is None and len(data.dataset.val) == 100


def test_a_clients_local_test_set_follows_its_own_label_distribution():
    """One partition rule over train + held-out pool: at t = 1 each client's local test labels look like its
    training labels and unlike the other clients'."""
    from fedvlp.data.partition import label_distribution_js

    data = prepare_data(load_spec(None, ["data.num_train=1000", "data.num_holdout=1000", "federation.clients=4",
                                         "federation.heterogeneity=1.0"]))
    train, holdout = data.dataset.train.labels, data.dataset.holdout.labels
    own = [label_distribution_js(np.concatenate([train, holdout]), [p, len(train) + t])
           for p, t in zip(data.parts, data.local_tests)]
    other = [label_distribution_js(np.concatenate([train, holdout]), [data.parts[0], len(train) + t])
             for t in data.local_tests[1:]]
    assert max(own) < min(other) / 2 and min(other) > 0.5, (own, other)


def test_single_label_recipes_use_dirichlet_and_get_missing_tables():
    spec = load_spec(None, ["data.name=synthetic-recipes", "data.num_train=600", "data.num_test=300",
                            "data.missing_rate=0.7", "data.missing_type=both"])
    data = prepare_data(spec)
    assert not data.dataset.multilabel and data.dataset.train.texts is not None
    # one table over the training set and the held-out pool: exactly 70 % of them miss a modality
    assert (data.train_missing > 0).sum() + (data.holdout_missing > 0).sum() == int((600 + 500) * 0.7)
    assert set(data.eval_missing) == {"train_setting", "full", "miss_image", "miss_text", "miss_both",
                                      "image_only", "text_only"}
    assert (data.val_missing > 0).sum() == int(len(data.dataset.val) * 0.7)  # val under the training setting
    assert len(data.holdout_missing) == len(data.dataset.holdout)
    skewed = prepare_data(load_spec(None, ["data.name=synthetic-recipes", "data.num_train=600",
                                           "federation.dirichlet_alpha=0.05"]))
    from fedvlp.data.partition import label_distribution_js
    assert label_distribution_js(skewed.dataset.train.labels, skewed.parts) > \
        label_distribution_js(data.dataset.train.labels, data.parts)


@pytest.mark.parametrize("overrides, message", [
    (["data.name=voc2007"], r"data\.root: required for voc2007"),
    (["data.name=coco2014", "data.root=/no/such/dir"], r"data\.root: /no/such/dir is not a directory"),
    (["data.label_mask=1.0"], r"data\.label_mask: expected a value < 1"),
    (["data.missing_rate=0.5"], r"data\.missing_rate: synthetic-scenes has no text modality"),
    (["data.name=synthetic-recipes", "data.label_mask=0.2"], r"data\.label_mask: partial labels need multi-label"),
    (["federation.partition=dirichlet"], r"federation\.partition: dirichlet needs single-label data"),
    (["federation.clients=5000"], r"federation\.clients: 5000 clients but only 2500"),
])
def test_bad_data_settings_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        prepare_data(load_spec(None, overrides))


def test_stats_command_prints_js_rising_with_t_and_plots(tmp_path, capsys):
    from fedvlp.cli import main

    figures = []
    for t in (0, 0.25, 0.5, 0.75, 1):
        assert main(["data", "stats", "--set", f"federation.heterogeneity={t}"]) == 0
        out = capsys.readouterr().out
        assert out.splitlines()[1].split()[:6] == ["client", "samples", "local", "val", "local", "test"]
        assert len([line for line in out.splitlines() if line.strip().split(" ")[0].isdigit()]) == 10
        figures.append(float(out.strip().splitlines()[-1].rsplit("=", 1)[1]))
    assert figures == sorted(figures) and figures[-1] - figures[0] > 0.4
    plot = tmp_path / "counts.png"
    assert main(["data", "stats", "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_feature_cache_keys_and_partial_entries(tmp_path):
    cache = FeatureCache(tmp_path)
    parts = {"backbone": "tiny-clip:fedvlp:abc", "dataset": "synthetic-scenes", "split": "train",
             "images": "h1", "transform": "32x32", "kind": "global"}
    key = feature_key(**parts)
    assert cache.get(key) is None
    features = np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32)
    cache.put(key, features, parts)
    hit = cache.get(key)
    assert hit.dtype == np.float16 and isinstance(hit, np.memmap)
    assert np.array_equal(hit, features.astype(np.float16))
    for part in parts:  # any change of any part of the key is a different entry, never a stale hit
        assert cache.get(feature_key(**{**parts, part: parts[part] + "'"})) is None
    # a killed writer: data without its completion marker, or a truncated data file, is never valid
    other = feature_key(**{**parts, "split": "test"})
    np.save(tmp_path / f"{other}.npy", features.astype(np.float16))
    assert cache.get(other) is None
    (tmp_path / f"{key}.npy").write_bytes((tmp_path / f"{key}.npy").read_bytes()[:100])
    assert cache.get(key) is None


# ---------------------------------------------------------------- centralised arms: a federated partition, pooled

def _pooled(parts: list[np.ndarray]) -> np.ndarray:
    return np.sort(np.concatenate(parts))


@pytest.mark.parametrize("kind", ["text", "image", "both"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_centralized_p_trains_on_fedavg_p_clients_pooled(seed, kind):
    """Centralized-P's one client holds FedAvg-P's ten clients' samples with the very missing codes each client had
    (drawn with the missing-client skew for the federated partition, then pooled), not a draw of its own."""
    overrides = [f"seed={seed}", f"data.missing_type={kind}"]
    central = prepare_data(load_spec("centralized_p_recipes", overrides))
    federated = prepare_data(load_spec("fedavg_p_recipes", overrides))
    assert len(central.parts) == 1 and len(federated.parts) == 10
    samples = _pooled(federated.parts)
    assert np.array_equal(central.parts[0], samples)
    assert np.array_equal(central.train_missing[central.parts[0]], federated.train_missing[samples])
    for part in federated.parts:  # each federated client's codes stand at its own samples in the pool
        assert np.array_equal(central.train_missing[part], federated.train_missing[part])
    assert np.array_equal(central.dataset.train.labels, federated.dataset.train.labels)
    assert central.dataset.train.texts == federated.dataset.train.texts
    assert np.array_equal(central.holdout_missing, federated.holdout_missing)
    assert np.array_equal(central.local_tests[0], _pooled(federated.local_tests))
    assert np.array_equal(central.local_vals[0], _pooled(federated.local_vals))
    assert np.array_equal(central.val_missing, federated.val_missing)  # val and test never depend on the clients


@pytest.mark.parametrize("space", ["fedprime_settings", "missing_rate"])
def test_studies_centralised_variant_pools_its_federated_counterpart(space):
    from fedvlp.platform.studies.spaces import load_sweep, trial_spec

    sweep = load_sweep(space)
    point = next(iter(p for p in [{"data.missing_type": "both"}, {"data.missing_rate": 0.5}] if set(p) <= set(
        sweep.space)))
    central, federated = (prepare_data(trial_spec(sweep, {"seed": 1, "variant": v, **point}, "test"))
                          for v in ("centralized_p", "fedavg_p"))
    assert np.array_equal(central.parts[0], _pooled(federated.parts))
    assert np.array_equal(central.train_missing, federated.train_missing)


@pytest.mark.parametrize("config, overrides", [
    ("quickstart", ["data.label_mask=0.5"]),                                 # central PromptFL, hidden labels
    ("dualcoop_scenes", ["federation.heterogeneity=1.0"]),                   # central DualCoOp
])
def test_one_client_multilabel_arm_holds_the_federated_clients_data(config, overrides):
    """The multi-label world's centralised arms (scenes_world's one-client PromptFL and DualCoOp), pooled or plain:
    the ten clients' samples (the same generated images, so the same scene conditions and styles, which belong to a
    sample) with the same label masks."""
    small = ["data.num_train=400", "data.num_val=50", "data.num_test=50", "data.num_holdout=100", *overrides]
    federated = prepare_data(load_spec(config, small))
    samples = _pooled(federated.parts)
    for central_overrides in (["federation.clients=1", "federation.pooled_from=10"], ["federation.clients=1"]):
        central = prepare_data(load_spec(config, small + central_overrides))
        assert len(central.parts) == 1 and np.array_equal(central.parts[0], samples)
        assert np.array_equal(central.train_labels, federated.train_labels)   # label masks included
        assert central.dataset.train.images.cache_key() == federated.dataset.train.images.cache_key()
        assert np.array_equal(central.local_tests[0], _pooled(federated.local_tests))
        assert np.array_equal(central.local_vals[0], _pooled(federated.local_vals))
        if "data.label_mask=0.5" in overrides:
            assert (central.train_labels == -1).mean() > 0.4


@pytest.mark.parametrize("overrides, message", [
    (["federation.clients=1"], r"data\.missing_client_skew: 0\.5 makes clients differ .* expected "
                               r"federation\.pooled_from"),
    (["federation.pooled_from=10"], r"federation\.pooled_from: pools a federated partition into one client; "
                                    r"expected federation\.clients: 1, got 10"),
    (["federation.clients=1", "federation.pooled_from=1"], r"federation\.pooled_from: expected a value >= 2"),
    (["federation.clients=1", "federation.pooled_from=5000"], r"federation\.pooled_from: 5000 clients but only"),
])
def test_a_one_client_arm_must_say_it_pools_a_partition(overrides, message):
    with pytest.raises(ConfigError, match=message):
        prepare_data(load_spec("fedavg_p_recipes", overrides))
