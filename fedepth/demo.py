"""The embedded default job of ``fedepth demo`` / ``make demo``.

Until the federated benchmark lands, the demo shows the clustering core on a fleet like the
paper's HPE scenario: 41 robots, each one (platform, environment) pair, whose descriptors are
drawn from a generative model in which the environment moves the feature mean most, the platform
moves it less (viewpoint, motion blur), and each trajectory adds its own spread. It calibrates
tau for a 20 % overlap ratio, prints the clusters and writes the Jeffreys matrix and the merged
cluster map as pictures plus a JSON summary.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from fedepth import clustering

log = logging.getLogger(__name__)

PLATFORMS = ("car", "falcon", "spot")
ENVIRONMENTS = ("forest", "urban-day", "urban-night", "indoor")


def synthetic_fleet(
    seed: int = 0, num_clients: int = 41, dim: int = 64
) -> tuple[np.ndarray, np.ndarray, list[tuple[str, str]]]:
    """Descriptors (means, variances) and (platform, environment) labels of a synthetic fleet.

    Factor model: mean = env_centre + platform_offset + trajectory noise, with environment
    offsets about twice the platform offsets; variances are log-normal around a per-environment
    level (night and forest frames vary more). Purely illustrative of the clustering: the real
    descriptors come from a frozen encoder on robot frames.
    """
    rng = np.random.default_rng(seed)
    env_centre = {e: rng.normal(0.0, 1.0, dim) for e in ENVIRONMENTS}
    plat_offset = {p: rng.normal(0.0, 0.5, dim) for p in PLATFORMS}
    env_spread = {"forest": 0.12, "urban-day": 0.08, "urban-night": 0.15, "indoor": 0.06}
    labels = [(PLATFORMS[i % 3], ENVIRONMENTS[(i // 3) % 4]) for i in range(num_clients)]
    means = np.stack(
        [env_centre[e] + plat_offset[p] + rng.normal(0.0, 0.25, dim) for p, e in labels]
    )
    variances = np.stack([env_spread[e] * np.exp(rng.normal(0.0, 0.2, dim)) for _, e in labels])
    return means, variances, labels


def run_clustering_demo(seed: int = 0, out: Path | None = None, overlap: float = 0.2) -> dict:
    """Cluster a synthetic fleet at the paper's 20 % overlap; print and save the result."""
    out = out or Path("runs/demo")
    out.mkdir(parents=True, exist_ok=True)
    means, variances, labels = synthetic_fleet(seed)
    A = clustering.jeffreys_matrix(means, variances)
    tau = clustering.calibrate_tau(A, overlap)
    result = clustering.soft_clustering(A, tau)

    print(
        f"FeDepth soft clustering of {len(labels)} synthetic robots "
        f"(target overlap {overlap:.0%}):"
    )
    print(f"  tau = {tau:.2f}  K = {result.num_clusters}  overlap = {result.overlap:.1%}")
    for k, members in enumerate(result.clusters()):
        tags = sorted({f"{labels[c][0]}/{labels[c][1]}" for c in members})
        print(f"  cluster {k}: {len(members):2d} robots  {', '.join(tags)}")
    hard = clustering.hard_clusters(A, tau)
    print(f"  hard (average-linkage) clustering at the same tau: K = {hard.shape[0]}")

    summary = {
        "seed": seed,
        "tau": tau,
        "K": result.num_clusters,
        "overlap_ratio": result.overlap,
        "clusters": result.clusters(),
        "labels": [list(lab) for lab in labels],
    }
    (out / "clustering.json").write_text(json.dumps(summary, indent=2))
    _plot(A, result.M_star, labels, out / "clustering.png")
    print(f"  wrote {out / 'clustering.json'} and {out / 'clustering.png'}")
    return summary


def _plot(A: np.ndarray, M_star: np.ndarray, labels: list[tuple[str, str]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{p[0]}-{e[:5]}" for p, e in labels]
    fig, axes = plt.subplots(1, 2, figsize=(14, 6), gridspec_kw={"width_ratios": [1, 1.2]})
    im = axes[0].imshow(A, cmap="viridis")
    axes[0].set_title("Jeffreys divergence A")
    fig.colorbar(im, ax=axes[0], fraction=0.046)
    axes[1].imshow(M_star, cmap="Greys", aspect="auto", interpolation="nearest")
    axes[1].set_title(f"merged cluster map M* (K={M_star.shape[0]})")
    axes[1].set_xticks(range(len(names)), names, rotation=90, fontsize=6)
    axes[1].set_ylabel("cluster")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
