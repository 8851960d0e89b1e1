"""The replay's own figures (frames sent / buffered / answered, latency) and its section of
report.md."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def write_replay_figures(out: Path, summaries: Mapping[str, Mapping[str, Any]]) -> None:
    """replay_frames.png (frames sent / buffered / answered) and replay_latency.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = next(iter(summaries.values()))["replay"]
    robots = list(first["frames_sent"])
    tests = [t for t, v in first["tests"].items() if t != "bench_frames" and "frames_sent" in v]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [2, 1]})
    x = np.arange(len(robots))
    axes[0].bar(x - 0.2, [first["frames_sent"][r] for r in robots], 0.4, label="sent (bag)")
    axes[0].bar(x + 0.2, [first["frames_buffered"][r] for r in robots], 0.4, label="buffered")
    axes[0].set_xticks(x, [r[:14] for r in robots], rotation=90, fontsize=6)
    axes[0].set_title("robots: frames sent by the player / buffered by robot_node")
    axes[0].legend(fontsize=7)
    xt = np.arange(len(tests))
    width = 0.8 / (1 + len(summaries))
    axes[1].bar(
        xt - 0.4 + width / 2,
        [first["tests"][t]["frames_sent"] for t in tests],
        width,
        label="sent",
    )
    for j, (m, s) in enumerate(summaries.items()):
        axes[1].bar(
            xt - 0.4 + width * (j + 1.5),
            [s["replay"]["tests"].get(t, {}).get("frames_answered", 0) for t in tests],
            width,
            label=f"answered ({m})",
        )
    axes[1].set_xticks(xt, [t[:14] for t in tests], rotation=90, fontsize=6)
    axes[1].set_title("test sequences: frames sent / depth answered")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "replay_frames.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for m, s in summaries.items():
        lat = [v for t in tests for v in s["replay"]["tests"].get(t, {}).get("latency_s", [])]
        if lat:
            v = np.sort(np.asarray(lat) * 1e3)
            ax.plot(v, np.arange(1, v.size + 1) / v.size, label=m)
    ax.set(
        xlabel="image -> depth latency (ms)",
        ylabel="fraction of frames",
        title="depth_node latency (seen by the scorer)",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "replay_latency.png", dpi=110)
    plt.close(fig)


def replay_report(results: Mapping[str, Any]) -> str:
    """The replay's section of report.md."""
    r = results["replay"]
    mode = (
        "loss-free (reliable, keep-all QoS end to end)"
        if r["lossless"]
        else "sensor-data QoS (lossy)"
    )
    lines = [
        "",
        "## Fleet replay through the ROS nodes",
        "",
        f"Transport `ros-replay`: bags in `{r['bags']}`, at most {r['max_robots']} robot "
        f"processes at once, {mode}. "
        "The tables above score every depth image `depth_node` published after the last "
        "round at its published size against the bag's depth; `bench frames` below are the "
        "benchmark's evaluation frames at the model's size, comparable with `fedepth bench`.",
        "",
        "| Method | rounds wall (s) | restarts | dropped | robot peak RSS max (MiB) | "
        "Abs Rel (bench frames) | frames answered | latency median (ms) |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for m, entry in results["methods"].items():
        s = entry["seeds"][next(iter(entry["seeds"]))] if "seeds" in entry else entry
        rp = s["replay"]
        tests = {k: v for k, v in rp["tests"].items() if k != "bench_frames"}
        answered = sum(v.get("frames_answered", 0) for v in tests.values())
        sent = sum(v.get("frames_sent", 0) for v in tests.values())
        lat = [x for v in tests.values() for x in v.get("latency_s", [])]
        bench = (rp["tests"].get("bench_frames") or {}).get("all") or {}
        lines.append(
            f"| {m} | {rp['rounds_wall_seconds']:.1f} | {rp['robot_restarts']} | "
            f"{', '.join(rp['dropped']) or '-'} | "
            f"{rp['robot_peak_rss_bytes_max'] / 2**20:.0f} | "
            f"{bench.get('abs_rel', float('nan')):.3f} | {answered}/{sent} | "
            f"{(np.median(lat) * 1e3 if lat else float('nan')):.0f} |"
        )
    lines += ["", "![frames](replay_frames.png) ![latency](replay_latency.png)", ""]
    if r["missing"]:
        lines += ["Missing from the replay:", ""] + [f"- {x}" for x in r["missing"]] + [""]
    return "\n".join(lines)
