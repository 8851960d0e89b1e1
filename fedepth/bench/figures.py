"""The report's figures: curves.png, clusters.png and predictions.png (:func:`write_figures`).

Curves: training loss and test Abs Rel per round (mean ± one sample std over the seeds);
clusters: the Jeffreys matrix and FeDepth's cluster map, each cluster labelled by its members'
platform/environment (:func:`cluster_labels`); predictions: RGB, ground truth and
each method's prediction for six test sequences spread over the test set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedepth import clustering, composition
from fedepth.bench.fleet_summary import FleetSummary
from fedepth.sim import Sample


def write_figures(
    out: Path,
    fleet: FleetSummary,
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    pictures: Mapping[str, Mapping[str, list[Sample]]],
) -> None:
    """curves.png, clusters.png and predictions.png.

    ``runs``: every method's per-seed summaries (first seed first); the curves show their
    mean, shaded ± one sample standard deviation when there are several. ``fleet`` and
    ``pictures`` (per method, the pictures of the last evaluation) are the first seed's.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    write_curves(out, runs)

    A = clustering.jeffreys_matrix(fleet.means, fleet.variances)
    fed = runs.get("fedepth")
    tau = fed[0]["params"].get("tau") if fed else None
    merge = str(fed[0]["params"].get("merge", "subsets")) if fed else "subsets"
    if tau is None:
        tau = clustering.calibrate_tau(A, 0.2, merge=merge)
    m_star = clustering.soft_clustering(A, float(tau), merge=merge).M_star
    names = [f"{c['platform'][:4]}/{c['environment'][:7]}" for c in fleet.clients]
    fig, axes = plt.subplots(1, 2, figsize=(15, 6), gridspec_kw={"width_ratios": [1, 1.3]})
    # log colours: one outlier robot (a near-constant channel gives divergences 100x the
    # rest) would otherwise leave every other pair the same colour; the diagonal (0) is grey
    positive = A[A > 0]
    low = float(positive.min()) if positive.size else 1.0
    high = max(float(A.max()), low * 10.0)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")
    im = axes[0].imshow(
        np.ma.masked_less_equal(A, 0.0),
        cmap=cmap,
        norm=LogNorm(vmin=low, vmax=high),
        interpolation="nearest",
    )
    axes[0].set_title("Jeffreys divergence between clients (log scale)")
    axes[0].set_yticks(range(len(names)), names, fontsize=5)
    bar = fig.colorbar(im, ax=axes[0], fraction=0.046)
    if low <= float(tau) <= high:
        bar.ax.axhline(float(tau), color="red", linewidth=1.5)
        bar.ax.text(1.6, float(tau), "tau", color="red", va="center", fontsize=7)
    axes[1].imshow(m_star, cmap="Greys", aspect="auto", interpolation="nearest")
    k = m_star.shape[0]
    axes[1].set_title(
        f"FeDepth cluster map M* (tau={float(tau):.3g}, K={k})\n"
        "each cluster: its members' platform/environment"
    )
    axes[1].set_xticks(range(len(names)), names, rotation=90, fontsize=5)
    # as large as the rows leave room for (about 360 pt of axis height)
    size = min(8.0, max(4.0, 200.0 / max(k, 1)))
    axes[1].set_yticks(range(k), cluster_labels(m_star, fleet.clients), fontsize=size)
    fig.tight_layout()
    fig.savefig(out / "clusters.png", dpi=110)
    plt.close(fig)

    shown = shown_methods([name for name in runs if name in pictures])
    seqs = shown_sequences(fleet.test)
    if not shown or not seqs:
        return
    cols = 2 + len(shown)
    fig, axes = plt.subplots(len(seqs), cols, figsize=(2.2 * cols, 1.8 * len(seqs)), squeeze=False)
    for r, seq in enumerate(seqs):
        first = pictures[shown[0]].get(seq)
        if not first:
            continue
        rgb, gt, _ = first[0]
        vmax = float(np.percentile(gt[gt > 0], 95)) if (gt > 0).any() else 1.0
        axes[r, 0].imshow(rgb)
        axes[r, 1].imshow(np.where(gt > 0, gt, np.nan), cmap="magma_r", vmin=0, vmax=vmax)
        for c, name in enumerate(shown):
            sample = pictures[name].get(seq)
            if sample:
                axes[r, 2 + c].imshow(sample[0][2], cmap="magma_r", vmin=0, vmax=vmax)
        axes[r, 0].set_ylabel(seq[:18], fontsize=6)
    for c, title in enumerate(["RGB", "ground truth", *shown]):
        axes[0, c].set_title(title, fontsize=8)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(out / "predictions.png", dpi=110)
    plt.close(fig)


def cluster_labels(
    M: np.ndarray, clients: Sequence[Mapping[str, str]], *, most: int = 3
) -> list[str]:
    """clusters.png's label of each cluster (row of ``M``): its index and composition,
    ``"0: spot/forest x3, car/forest x1"`` (the ``most`` largest groups, then ``+n more``)."""
    return [
        f"{k}: "
        + composition.composition_label(
            composition.composition_counts(np.flatnonzero(row), clients), most=most
        )
        for k, row in enumerate(np.asarray(M, dtype=bool))
    ]


def shown_methods(names: Sequence[str], columns: int = 4) -> list[str]:
    """The methods predictions.png shows: the first ``columns`` in table order, FeDepth always
    among them (in the last column when it comes later, as behind CL and the baselines)."""
    shown = list(names[:columns])
    if "fedepth" in names and "fedepth" not in shown:
        shown[-1] = "fedepth"
    return shown


def shown_sequences(names: Sequence[str], rows: int = 6) -> list[str]:
    """The test sequences predictions.png shows: ``rows`` of them spread evenly over the list
    (which the scenarios order by domain), so that every part of the test set is seen (BMR's
    drives come after its eight rooms) and not only its first sequences."""
    if len(names) <= rows:
        return list(names)
    picks = np.unique(np.linspace(0, len(names) - 1, rows).round().astype(int))
    return [names[i] for i in picks]


def write_curves(out: Path, runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """curves.png: every method's training loss and test Abs Rel per round (see
    :func:`write_figures`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    for name, per_seed in runs.items():
        curves = [s["curves"] for s in per_seed]
        rounds = np.asarray(curves[0]["round"]) + 1
        loss = np.asarray([c["train_loss"] for c in curves], dtype=float)
        _plot_mean_band(axes[0], rounds, loss, label=name)
        at = [i for i in range(len(rounds)) if all(c["abs_rel"][i] is not None for c in curves)]
        if at:
            err = np.asarray([[c["abs_rel"][i] for i in at] for c in curves], dtype=float)
            _plot_mean_band(axes[1], rounds[at], err, label=name, marker="o")
    seeds = max((len(s) for s in runs.values()), default=1)
    spread = f", mean of {seeds} seeds ± 1 std" if seeds > 1 else ""
    axes[0].set(title="mean local training loss" + spread, xlabel="round")
    axes[1].set(title="test Abs Rel (routed models)" + spread, xlabel="round")
    # outside the axes: the seed bands fill the plot, and a legend inside hides one of them
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)


def _plot_mean_band(ax: Any, x: np.ndarray, y: np.ndarray, **line_kw: Any) -> None:
    """The mean over seeds (the rows of ``y``) and, for several seeds, a band of 1 sample std."""
    mean = y.mean(axis=0)
    (line,) = ax.plot(x, mean, **line_kw)
    if y.shape[0] > 1:
        band = y.std(axis=0, ddof=1)
        ax.fill_between(x, mean - band, mean + band, color=line.get_color(), alpha=0.2)
