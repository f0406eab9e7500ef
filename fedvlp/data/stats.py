"""`fedvlp data stats`: what each client holds, and how different the clients are."""
from __future__ import annotations

import numpy as np

from fedvlp.data import FederatedData
from fedvlp.data.missing import missing_summary
from fedvlp.data.partition import label_distribution_js


def class_counts(data: FederatedData) -> np.ndarray:
    """[clients, classes] count of (true) positive labels per client."""
    labels = data.dataset.train.labels
    num_classes = len(data.dataset.class_names)
    if labels.ndim == 2:
        return np.stack([(labels[idx] > 0).sum(0) for idx in data.parts])
    return np.stack([np.bincount(labels[idx], minlength=num_classes) for idx in data.parts])


def format_stats(data: FederatedData, top: int = 3) -> str:
    names = data.dataset.class_names
    counts = class_counts(data)
    header = (f"{'client':>6} {'samples':>8} {'local val':>9} {'local test':>10} {'classes':>7}  "
              f"top classes (share of the client's labels)")
    if data.train_missing is not None:
        header += "   missing: text / image"
    dataset = data.dataset
    shift = "" if dataset.shift is None else f"{len(dataset.shift)} shift / "
    lines = [f"{dataset.name}: {len(dataset.train)} train / {len(data.val)} val / {len(dataset.test)} test / {shift}"
             f"{len(data.holdout)} held-out samples, {len(names)} classes, {len(data.parts)} clients", header]
    for cid, idx in enumerate(data.parts):
        row = counts[cid]
        total = max(int(row.sum()), 1)
        best = np.argsort(-row, kind="stable")[:top]
        tops = ", ".join(f"{names[c]} {row[c] / total:.2f}" for c in best if row[c] > 0)
        line = (f"{cid:>6} {len(idx):>8} {len(data.local_vals[cid]):>9} {len(data.local_tests[cid]):>10} "
                f"{int((row > 0).sum()):>7}  {tops}")
        if data.train_missing is not None:
            summary = missing_summary(data.train_missing[idx])
            line += f"   {summary['missing_text']:.2f} / {summary['missing_image']:.2f}"
        lines.append(line)
    known = data.train_labels[data.train_labels >= 0] if data.train_labels.ndim == 2 else None
    if known is not None and data.train_labels.size:
        lines.append(f"label mask: {1 - known.size / data.train_labels.size:.3f} of training annotations hidden")
    js = label_distribution_js(data.dataset.train.labels, data.parts)
    lines.append(f"heterogeneity: mean pairwise Jensen-Shannon distance between client label distributions = {js:.4f}")
    return "\n".join(lines)


def plot_counts(data: FederatedData, path: str) -> None:
    """Heatmap of clients x classes label counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = class_counts(data)
    names = data.dataset.class_names
    width = min(24, 3 + 0.35 * len(names))
    height = min(18, 2.5 + 0.3 * len(data.parts))
    fig, ax = plt.subplots(figsize=(width, height), constrained_layout=True)
    image = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if len(names) <= 40:
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
    if len(data.parts) <= 40:
        ax.set_yticks(range(len(data.parts)))
    ax.set_title(f"{data.dataset.name}: labels per client (JS distance "
                 f"{label_distribution_js(data.dataset.train.labels, data.parts):.3f})")
    fig.colorbar(image, ax=ax, label="samples with the label")
    fig.savefig(path, dpi=120)
    plt.close(fig)
