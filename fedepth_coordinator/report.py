"""Human-readable fleet report: the robot table, the cluster map with each cluster's
composition, and the recent rounds."""

from __future__ import annotations

import time

from fedepth_coordinator.domain import ClusterMap, CoMemberShares, FleetStatus


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip(), *(fmt.format(*r).rstrip() for r in rows)]


def _age(seconds: float) -> str:
    if seconds < 0:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}m"


def _co_members(c: CoMemberShares) -> str:
    def share(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    # a robot's co-members: the other members of the clusters it belongs to
    return (
        f"co-members with the robot's label (mean over robots): platform {share(c.platform)}, "
        f"environment {share(c.environment)}, both {share(c.both)}; "
        f"{c.alone} robot{'s' if c.alone != 1 else ''} alone"
    )


def format_fleet(status: FleetStatus, clusters: ClusterMap, *, last_rounds: int = 5) -> str:
    """The text `fedepth fleet status` prints."""
    lines = [
        f"phase: {status.phase.value}   strategy: {status.strategy}   "
        f"round: {status.round}/{status.num_rounds}   robots: {len(status.robots)} "
        f"(min {status.min_robots} to start)"
    ]
    if status.deadline_unix:
        left = status.deadline_unix - time.time()
        lines.append(
            f"open round closes at quorum {status.quorum} after its deadline ({left:.0f} s)"
        )
    lines.append("")
    rows = [
        [
            r.robot_id,
            ",".join(f"{k}={v}" for k, v in sorted(r.labels.items())) or "-",
            str(r.num_samples),
            "yes" if r.member else ("descriptor" if r.has_descriptor else "registered"),
            ",".join(map(str, r.clusters)) or "-",
            "reported" if r.reported else ("training" if r.selected else "-"),
            str(r.updates_accepted),
            _age(r.last_seen_s),
        ]
        for r in status.robots
    ]
    header = ["robot", "labels", "samples", "member", "clusters", "this round", "updates", "seen"]
    lines += _table(header, rows)
    lines.append("")
    if clusters.clustered:
        tau = "" if clusters.tau is None else f" (tau = {clusters.tau:.4g})"
        lines.append(f"cluster map: {len(clusters.clusters)} clusters{tau}")
        # the composition of the fleet status, where it names the same members (the two
        # answers come from two calls: a robot that joined in between changes the map)
        made_of = {c.index: c for c in status.clusters}
        for k, m in enumerate(clusters.clusters):
            c = made_of.get(k)
            label = f"{c.label}: " if c is not None and c.label and c.members == m else ""
            lines.append(f"  cluster {k}: {label}{', '.join(m)}")
        if status.co_members is not None:
            lines.append(_co_members(status.co_members))
    else:
        lines.append("cluster map: not formed yet")
    if status.history:
        lines.append("")
        lines.append("recent rounds:")
        lines += [
            f"  round {h.round}: {h.accepted}/{h.selected} updates, {h.duration_s:.1f} s, "
            f"{h.closed_by}"
            for h in status.history[-last_rounds:]
        ]
    return "\n".join(lines)
