"""Depth statistics of sequences and a contact sheet (RGB + colour-mapped depth) per sequence."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedepth.data.sequence import Sequence


@dataclass(frozen=True)
class DepthStats:
    """Depth statistics over ``sampled`` evenly spaced frames of a sequence."""

    frames: int
    sampled: int
    height: int
    width: int
    valid: float
    median: float
    p95: float
    max: float


def sample_indices(n: int, k: int) -> list[int]:
    """``k`` evenly spaced indices of ``n`` frames (all of them if k >= n)."""
    if n <= k:
        return list(range(n))
    return [round(float(x)) for x in np.linspace(0, n - 1, k)]


def depth_stats(seq: Sequence, max_frames: int = 16) -> DepthStats:
    idx = sample_indices(len(seq), max_frames)
    values = []
    n_valid = n_total = 0
    h = w = 0
    for i in idx:
        f = seq[i]
        h, w = f.size
        v = f.depth[f.depth > 0]
        values.append(v)
        n_valid += v.size
        n_total += f.depth.size
    d = np.concatenate(values) if values else np.zeros(0, np.float32)
    q = np.percentile(d, [50, 95]) if d.size else (np.nan, np.nan)
    return DepthStats(
        len(seq),
        len(idx),
        h,
        w,
        n_valid / max(n_total, 1),
        float(q[0]),
        float(q[1]),
        float(d.max()) if d.size else float("nan"),
    )


def stats_table(rows: Iterable[tuple[str, str, Sequence, DepthStats]]) -> str:
    """A fixed-width table: split, client, sequence, platform, environment and depth stats."""
    header = (
        "split",
        "client",
        "sequence",
        "platform",
        "environment",
        "source",
        "frames",
        "HxW",
        "valid%",
        "median_m",
        "p95_m",
        "max_m",
    )
    lines = [header]
    for split, client, seq, st in rows:
        lines.append(
            (
                split,
                client,
                seq.name,
                seq.meta.platform,
                seq.meta.environment,
                seq.meta.source,
                str(st.frames),
                f"{st.height}x{st.width}",
                f"{100 * st.valid:.1f}",
                f"{st.median:.2f}",
                f"{st.p95:.2f}",
                f"{st.max:.2f}",
            )
        )
    widths = [max(len(r[k]) for r in lines) for k in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(wd) for c, wd in zip(r, widths, strict=True)).rstrip() for r in lines
    )


def contact_sheet(items: list[tuple[str, Sequence]], out: str | Path, columns: int = 4) -> Path:
    """Save a sheet with, per (title, sequence), the middle frame's RGB and its depth (turbo
    colour map on a log scale from 0.5 m to the sequence's evaluation cap; black = invalid)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    if not items:
        raise ValueError("nothing to preview")
    cols = min(columns, len(items))
    rows = (len(items) + cols - 1) // cols
    fig, axes = plt.subplots(rows, 2 * cols, figsize=(4.2 * cols, 1.9 * rows), squeeze=False)
    cmap = plt.get_cmap("turbo").with_extremes(bad="black")
    for ax in axes.ravel():
        ax.axis("off")
    for k, (title, seq) in enumerate(items):
        r, c = divmod(k, cols)
        f = seq[len(seq) // 2]
        depth = np.where(f.depth > 0, f.depth, np.nan)
        axes[r, 2 * c].imshow(f.rgb)
        axes[r, 2 * c].set_title(title, fontsize=6, loc="left")
        axes[r, 2 * c + 1].imshow(
            depth, cmap=cmap, norm=LogNorm(vmin=0.5, vmax=max(seq.meta.max_depth, 1.0))
        )
        m = seq.meta
        axes[r, 2 * c + 1].set_title(
            f"{m.platform}/{m.environment}, 0.5-{m.max_depth:g} m", fontsize=6, loc="left"
        )
    fig.tight_layout(pad=0.3)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
