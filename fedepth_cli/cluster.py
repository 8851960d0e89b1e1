"""``fedepth cluster``: soft clusters of clients from their descriptors, as JSON on stdout."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedepth.descriptor import check_descriptors
from fedepth_cli.errors import CliError


def _load_descriptors(path: Path) -> tuple[np.ndarray, np.ndarray, list[str] | None]:
    if not path.is_file():
        raise CliError(f"{path}: no such file")
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy raises several types for a corrupt archive
        raise CliError(f"{path}: not a readable .npz archive ({exc})") from exc
    with data:
        missing = [k for k in ("means", "variances") if k not in data.files]
        if missing:
            raise CliError(
                f"{path}: missing array(s) {', '.join(missing)} "
                f"(found: {', '.join(data.files) or 'none'})"
            )
        means = np.asarray(data["means"], dtype=np.float64)
        variances = np.asarray(data["variances"], dtype=np.float64)
        names = [str(x) for x in data["names"]] if "names" in data.files else None
    try:  # the descriptors' rule is fedepth.descriptor's
        means, variances = check_descriptors(means, variances, str(path), empty=False)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if names is not None and len(names) != means.shape[0]:
        raise CliError(f"{path}: {len(names)} names for {means.shape[0]} clients")
    return means, variances, names


def cmd_cluster(args: argparse.Namespace) -> int:
    from fedepth import clustering
    from fedepth.cluster_rules import MERGE_RULES

    if args.tau is not None and (not np.isfinite(args.tau) or args.tau < 0):
        raise CliError(f"--tau must be a finite number >= 0, got {args.tau}")
    if args.overlap is not None and not 0.0 <= args.overlap < 1.0:
        raise CliError(
            f"--overlap must lie in [0, 1], 1 excluded (one cluster of everyone, the paper's "
            f"100 %, is a --tau above every divergence), got {args.overlap}"
        )
    if args.merge not in MERGE_RULES:
        raise CliError(f"unknown merge rule {args.merge!r}; known: {', '.join(MERGE_RULES)}")
    means, variances, names = _load_descriptors(Path(args.descriptors))
    A = clustering.jeffreys_matrix(means, variances)
    result = (
        clustering.soft_clustering(A, args.tau, merge=args.merge)
        if args.tau is not None
        else clustering.calibrate(A, args.overlap, merge=args.merge)
    )
    label: Callable[[int], Any] = (lambda i: names[i]) if names else (lambda i: i)
    out = {
        "tau": result.tau,
        "num_clients": int(means.shape[0]),
        "K": result.num_clusters,
        "overlap_ratio": result.overlap,
        "target_overlap": args.overlap,
        "merge": args.merge,
        "clusters": [[label(i) for i in c] for c in result.clusters()],
        "memberships": {str(label(i)): m for i, m in enumerate(result.memberships())},
    }
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def add_parsers(sub: Any) -> None:
    """`fedepth cluster`."""
    p = sub.add_parser(
        "cluster",
        help="soft-cluster clients from their descriptors (Jeffreys divergence + merging)",
        description="Cluster clients from an .npz holding `means` and `variances` (N x D) and "
        "optionally `names` (N). Prints JSON: tau, K, overlap ratio, clusters, memberships.",
    )
    p.add_argument("--descriptors", required=True, metavar="F.npz", help="descriptor archive")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tau", type=float, help="clustering threshold on the Jeffreys divergence")
    g.add_argument(
        "--overlap",
        type=float,
        help="target overlap ratio in [0, 1); tau is calibrated to reach it",
    )
    p.add_argument(
        "--merge",
        default="subsets",
        metavar="RULE",
        help="how redundant neighbourhoods merge: subsets (default, the paper's: a subset of "
        "another is absorbed), duplicates (only equal ones), cliques (clusters of clients "
        "mutually within tau); see fedepth.cluster_rules",
    )
    p.set_defaults(func=cmd_cluster)
