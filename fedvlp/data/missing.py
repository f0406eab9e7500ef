"""Missing-modality simulation (the convention of Lee et al. CVPR'23 that FED-PRIME copies).

A *missing table* holds one int8 code per sample: ``FULL`` (0), ``MISSING_TEXT`` (1) or
``MISSING_IMAGE`` (2). No sample ever loses both modalities.

``missing_table(n, rate, kind, ...)`` draws exactly ``int(n * rate)`` distinct samples (as the
reference's ``random.sample(range(n), int(n * rate))``). Under ``kind="text"`` they all lose the
text, under ``"image"`` the image; under ``"both"`` ``int(m * both_ratio)`` of those ``m``
samples, chosen at random among them, lose the image and the rest the text (the reference's
``int(len(missing_index) * both_ratio)``).

A missing text is the empty string. A missing image is an all-ones tensor *after*
normalisation, so it cannot be written into uint8 pixels: ``apply_missing`` blanks the texts and
returns a boolean ``image_missing`` mask, and the backbone's input code calls
``fill_missing_images`` on the normalised pixels.

Client skew (``missing_client_skew``, inter-client heterogeneity), ``client_missing_tables``:

* ``skew = 0``: the table is exactly ``missing_table`` over the whole training set; clients
  differ only by which samples they received (the reference's behaviour).
* ``skew = s`` in (0, 1]: each client ``k`` draws its own share ``x_k`` from a Beta law with
  mean ``mu`` and variance ``s * mu * (1 - mu)`` (concentration ``1/s - 1``; at ``s = 1`` the
  limit, a Bernoulli(``mu``) draw of 0 or 1). So ``s`` is the fraction of the largest possible
  between-client variance, and the expected share is ``mu`` whatever ``s``.

  - ``kind="both"``: the set of missing samples is the ``skew = 0`` table's (exactly
    ``int(n * rate)`` samples, the same ones); ``mu = both_ratio`` and ``x_k`` is client ``k``'s
    share of its missing samples that lose the image, the rest lose the text. The count is
    ``m_k * x_k`` rounded stochastically (up with probability equal to its fractional part), so
    the expected global image share stays ``both_ratio``. At ``s = 1`` every client misses only
    images or only texts.
  - ``kind="text"`` / ``"image"``: ``mu = rate`` and ``x_k`` is client ``k``'s own missing rate;
    ``n_k * x_k``, rounded stochastically, of its samples, drawn without replacement, lose that
    modality. The expected global missing rate stays ``rate``; at ``s = 1`` each client is
    either complete or missing that modality everywhere.

All draws come from ``numpy_rng(seed, "missing", key, ...)``; keys: 0 the training table
(``TRAIN_KEY``), ``SKEW_KEY`` (and ``SKEW_KEY, client``) the skewed draws, ``EVAL_KEYS`` the test
tables, ``VAL_KEY`` the val table.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from fedvlp.seeding import numpy_rng

FULL, MISSING_TEXT, MISSING_IMAGE = 0, 1, 2
KINDS = ("text", "image", "both")
TRAIN_KEY = 0
SKEW_KEY = 100
MISSING_IMAGE_FILL = 1.0          # value of every element of a missing image, after normalisation

# The six fixed evaluation sets (FED-PRIME's protocol): name -> (rate, kind).
EVAL_SETTINGS: dict[str, tuple[float, str]] = {
    "full": (0.0, "both"),
    "miss_image": (0.7, "image"),
    "miss_text": (0.7, "text"),
    "miss_both": (0.7, "both"),
    "image_only": (1.0, "text"),
    "text_only": (1.0, "image"),
}
EVAL_BOTH_RATIO = 0.5
EVAL_KEYS: dict[str, int] = {"train_setting": 1, **{name: 2 + i for i, name in enumerate(EVAL_SETTINGS)}}
VAL_KEY = 50                      # the val split's table (the training setting)


def _check_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _check_unit(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not 0.0 <= float(value) <= 1.0:   # also rejects nan
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def _check_kind(kind) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return kind


def missing_table(num_samples: int, rate: float, kind: str, seed: int, key: int = TRAIN_KEY,
                  both_ratio: float = 0.5) -> np.ndarray:
    """int8 [num_samples] codes: exactly ``int(num_samples * rate)`` samples, drawn without
    replacement, lose a modality (see the module docstring for ``kind`` and ``both_ratio``)."""
    n = _check_count("num_samples", num_samples)
    rate = _check_unit("rate", rate)
    kind = _check_kind(kind)
    both_ratio = _check_unit("both_ratio", both_ratio)
    rng = numpy_rng(seed, "missing", key)
    table = np.full(n, FULL, np.int8)
    missing = rng.choice(n, int(n * rate), replace=False)
    if kind == "text":
        table[missing] = MISSING_TEXT
    elif kind == "image":
        table[missing] = MISSING_IMAGE
    else:
        table[missing] = MISSING_TEXT
        table[rng.choice(missing, int(len(missing) * both_ratio), replace=False)] = MISSING_IMAGE
    return table


def _client_shares(rng: np.random.Generator, num_clients: int, mean: float,
                   skew: float) -> np.ndarray:
    """Per-client shares with mean ``mean`` and variance ``skew * mean * (1 - mean)``."""
    if mean in (0.0, 1.0):
        return np.full(num_clients, mean)
    if skew >= 1.0:
        return (rng.random(num_clients) < mean).astype(np.float64)
    concentration = 1.0 / skew - 1.0
    return rng.beta(mean * concentration, (1 - mean) * concentration, num_clients)


def _stochastic_round(rng: np.random.Generator, x: float) -> int:
    low = math.floor(x)
    return low + int(rng.random() < x - low)


def client_missing_tables(parts: list[np.ndarray], num_samples: int, rate: float, kind: str,
                          skew: float, seed: int, both_ratio: float = 0.5) -> np.ndarray:
    """int8 [num_samples] codes for the whole training set, client ``k``'s being
    ``table[parts[k]]``. ``parts`` must hold every index of ``range(num_samples)`` exactly once.
    ``skew`` in [0, 1] sets how much clients differ in their missing pattern (module
    docstring); ``skew = 0`` gives ``missing_table(num_samples, rate, kind, seed)``."""
    n = _check_count("num_samples", num_samples)
    rate = _check_unit("rate", rate)
    kind = _check_kind(kind)
    skew = _check_unit("skew", skew)
    both_ratio = _check_unit("both_ratio", both_ratio)
    parts = [np.asarray(p) for p in parts]
    if any(p.ndim != 1 or (p.size and not np.issubdtype(p.dtype, np.integer)) for p in parts):
        raise ValueError("parts must be one-dimensional integer index arrays")
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if len(flat) != n or (n and (flat.min() < 0 or flat.max() >= n
                                 or np.bincount(flat, minlength=n).max() != 1)):
        raise ValueError(f"parts must hold every index of range(num_samples={n}) exactly once")
    table = missing_table(n, rate, kind, seed, TRAIN_KEY, both_ratio)
    if skew == 0.0:
        return table
    shares = _client_shares(numpy_rng(seed, "missing", SKEW_KEY), len(parts),
                            both_ratio if kind == "both" else rate, skew)
    code = MISSING_TEXT if kind == "text" else MISSING_IMAGE
    for k, (part, share) in enumerate(zip(parts, shares)):
        rng = numpy_rng(seed, "missing", SKEW_KEY, k)
        if kind == "both":
            missing = part[table[part] != FULL]
            table[missing] = MISSING_TEXT
            count = _stochastic_round(rng, len(missing) * share)
            table[rng.choice(missing, count, replace=False)] = MISSING_IMAGE
        else:
            table[part] = FULL
            count = _stochastic_round(rng, len(part) * share)
            table[rng.choice(part, count, replace=False)] = code
    return table


def apply_missing(texts: Sequence[str], table: np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
    """``(texts, image_missing)``: the texts with every missing one replaced by ``""``, and a
    bool [n] mask of the samples whose image is missing. Images are left untouched: the
    backbone replaces them after normalisation (``fill_missing_images``)."""
    table = np.asarray(table)
    if table.shape != (len(texts),):
        raise ValueError(f"table must have shape ({len(texts)},) to match texts, got {table.shape}")
    if table.size and not np.isin(table, (FULL, MISSING_TEXT, MISSING_IMAGE)).all():
        raise ValueError("table must hold only the codes 0 (full), 1 (text missing), 2 (image missing)")
    blank = table == MISSING_TEXT
    return tuple("" if b else t for t, b in zip(texts, blank)), table == MISSING_IMAGE


def fill_missing_images(pixels, image_missing):
    """A copy of normalised ``pixels`` [n, ...] (numpy array or torch tensor) with every image
    flagged in ``image_missing`` replaced by all ``MISSING_IMAGE_FILL`` (the reference's dummy
    all-ones image)."""
    out = pixels.clone() if hasattr(pixels, "clone") else np.array(pixels, copy=True)
    mask = image_missing
    if hasattr(out, "clone") and not hasattr(mask, "clone"):
        import torch

        mask = torch.as_tensor(np.asarray(mask, bool), device=out.device)
    out[mask] = MISSING_IMAGE_FILL
    return out


def eval_tables(num_test: int, train_rate: float, train_kind: str, seed: int,
                both_ratio: float = 0.5) -> dict[str, np.ndarray]:
    """The test split's missing tables: ``"train_setting"`` (the run's own rate and kind) and
    the six ``EVAL_SETTINGS`` (``miss_both`` with ``EVAL_BOTH_RATIO``; ``both_ratio`` applies
    to ``"train_setting"`` only), each from its own key (``EVAL_KEYS``), so the six are the same
    for every run and method with this seed whatever the training setting."""
    out = {"train_setting": missing_table(num_test, train_rate, train_kind, seed,
                                          EVAL_KEYS["train_setting"], both_ratio)}
    for name, (rate, kind) in EVAL_SETTINGS.items():
        out[name] = missing_table(num_test, rate, kind, seed, EVAL_KEYS[name], EVAL_BOTH_RATIO)
    return out


def missing_summary(table: np.ndarray) -> dict[str, float]:
    """Fractions of samples that are full, missing their text, missing their image (zeros for
    an empty table)."""
    table = np.asarray(table)
    n = max(table.size, 1)
    return {"full": float((table == FULL).sum() / n),
            "missing_text": float((table == MISSING_TEXT).sum() / n),
            "missing_image": float((table == MISSING_IMAGE).sum() / n)}
