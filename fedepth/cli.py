"""The ``fedepth`` command: clustering, data, benchmark and fleet tools behind one entry point."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedepth import __version__


class CliError(Exception):
    """A user error: printed as one line on stderr, exit status 2."""


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
            raise CliError(f"{path}: missing array(s) {', '.join(missing)} "
                           f"(found: {', '.join(data.files) or 'none'})")
        means = np.asarray(data["means"], dtype=np.float64)
        variances = np.asarray(data["variances"], dtype=np.float64)
        names = [str(x) for x in data["names"]] if "names" in data.files else None
    if means.ndim != 2 or variances.ndim != 2 or means.shape != variances.shape:
        raise CliError(f"{path}: means {means.shape} and variances {variances.shape} must both "
                       "be N x D with the same shape")
    if means.shape[0] == 0 or means.shape[1] == 0:
        raise CliError(f"{path}: empty descriptors (shape {means.shape})")
    if not np.isfinite(means).all():
        raise CliError(f"{path}: means contain NaN or Inf")
    if not np.isfinite(variances).all():
        raise CliError(f"{path}: variances contain NaN or Inf")
    if (variances <= 0).any():
        n_bad = int((variances <= 0).sum())
        raise CliError(f"{path}: {n_bad} variance(s) are zero or negative; variances must be > 0")
    if names is not None and len(names) != means.shape[0]:
        raise CliError(f"{path}: {len(names)} names for {means.shape[0]} clients")
    return means, variances, names


def cmd_cluster(args: argparse.Namespace) -> int:
    from fedepth import clustering

    if args.tau is not None and (not np.isfinite(args.tau) or args.tau < 0):
        raise CliError(f"--tau must be a finite number >= 0, got {args.tau}")
    if args.overlap is not None and not 0.0 <= args.overlap <= 1.0:
        raise CliError(f"--overlap must lie in [0, 1], got {args.overlap}")
    means, variances, names = _load_descriptors(Path(args.descriptors))
    A = clustering.jeffreys_matrix(means, variances)
    tau = args.tau if args.tau is not None else clustering.calibrate_tau(A, args.overlap)
    result = clustering.soft_clustering(A, tau)
    label: Callable[[int], Any] = (lambda i: names[i]) if names else (lambda i: i)
    out = {
        "tau": result.tau,
        "num_clients": int(means.shape[0]),
        "K": result.num_clusters,
        "overlap_ratio": result.overlap,
        "target_overlap": args.overlap,
        "clusters": [[label(i) for i in c] for c in result.clusters()],
        "memberships": {str(label(i)): m for i, m in enumerate(result.memberships())},
    }
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from fedepth.demo import run_clustering_demo

    run_clustering_demo(seed=args.seed, out=Path(args.out) if args.out else None)
    return 0


def cmd_data_synth(args: argparse.Namespace) -> int:
    from fedepth.data.synth.generate import MANIFEST, synthesize

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise CliError(f"--out {out} is not empty; pass --force to write into it anyway")
    if args.seed < 0:
        raise CliError(f"--seed must be >= 0, got {args.seed}")
    if args.workers < 1:
        raise CliError(f"--workers must be >= 1, got {args.workers}")
    path = synthesize(
        args.scenario,
        args.profile,
        args.seed,
        out,
        progress=not args.quiet,
        workers=args.workers,
    )
    sys.stdout.write(f"{path if path.name == MANIFEST else out}\n")
    return 0


def _load_scenario(root: str) -> Any:
    from fedepth.data import DataError, load_scenario

    try:
        return load_scenario(root)
    except DataError as exc:
        raise CliError(str(exc)) from exc


def cmd_data_info(args: argparse.Namespace) -> int:
    from fedepth.data import DataError
    from fedepth.data.summary import depth_stats, stats_table

    if args.frames <= 0:
        raise CliError(f"--frames must be > 0, got {args.frames}")
    sc = _load_scenario(args.dir)
    rows = []
    try:
        for c in sc.clients:
            for s in c.sequences:
                rows.append(("train", c.name, s, depth_stats(s, args.frames)))
        for split, seqs in (("test", sc.test), ("pretrain", sc.pretrain)):
            for s in seqs:
                rows.append((split, "-", s, depth_stats(s, args.frames)))
    except DataError as exc:
        raise CliError(str(exc)) from exc
    finally:
        sc.close()
    sys.stdout.write(
        f"scenario {sc.name or '?'}  profile {sc.profile or '?'}  seed {sc.seed}  "
        f"{len(sc.clients)} clients, {len(sc.test)} test, {len(sc.pretrain)} "
        f"pretrain sequences (depth stats over up to {args.frames} frames each)\n"
    )
    sys.stdout.write(stats_table(rows) + "\n")
    return 0


def cmd_data_preview(args: argparse.Namespace) -> int:
    from fedepth.data import DataError
    from fedepth.data.summary import contact_sheet

    sc = _load_scenario(args.dir)
    items = []
    if args.split in ("train", "all"):
        items += [(c.name, c.sequences[0]) for c in sc.clients]
    for split, seqs in (("test", sc.test), ("pretrain", sc.pretrain)):
        if args.split in (split, "all"):
            items += [(f"{split}: {s.name}", s) for s in seqs]
    if not items:
        raise CliError(f"{args.dir}: no {args.split} sequences to preview")
    try:
        out = contact_sheet(items, args.out, columns=args.columns)
    except DataError as exc:
        raise CliError(str(exc)) from exc
    finally:
        sc.close()
    sys.stdout.write(f"{out}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedepth",
        description="Federated monocular depth estimation for heterogeneous robot fleets.",
    )
    parser.add_argument("--version", action="version", version=f"fedepth {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "cluster",
        help="soft-cluster clients from their descriptors (Jeffreys divergence + merging)",
        description="Cluster clients from an .npz holding `means` and `variances` (N x D) and "
        "optionally `names` (N). Prints JSON: tau, K, overlap ratio, clusters, memberships.",
    )
    p.add_argument("--descriptors", required=True, metavar="F.npz", help="descriptor archive")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tau", type=float, help="clustering threshold on the Jeffreys divergence")
    g.add_argument("--overlap", type=float,
                   help="target overlap ratio in [0, 1]; tau is calibrated to reach it")
    p.set_defaults(func=cmd_cluster)

    p = sub.add_parser(
        "data",
        help="robot RGB-D data: synthesise scenarios, inspect them",
        description="Synthesise the HPE (M3ED-like) and BMR (NYUv2 + KITTI-like) scenarios in "
        "the real datasets' formats, print their depth statistics, or draw a preview sheet.",
    )
    dsub = p.add_subparsers(dest="data_command", metavar="DATA_COMMAND", required=True)
    q = dsub.add_parser(
        "synth",
        help="generate a scenario (M3ED h5 pairs, NYUv2 .mat, KITTI tree) plus its manifest",
        description="Render a scenario with the procedural engine and write it in the real "
        "datasets' formats with DIR/manifest.json. The same seed gives the same data.",
    )
    q.add_argument(
        "--scenario",
        required=True,
        choices=("hpe", "bmr"),
        help="hpe: 41 M3ED-like clients + 11 test sequences; bmr: 15 NYUv2-like and "
        "17 KITTI-like clients + test splits (both with a pretraining split)",
    )
    q.add_argument(
        "--profile",
        default="smoke",
        choices=("smoke", "small", "paper"),
        help="smoke: seconds (CI); small: all clients at ~1/10 size (CPU, minutes); "
        "paper: full counts and sizes (hours)",
    )
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--out", required=True, metavar="DIR", help="output directory")
    q.add_argument("--force", action="store_true", help="write into a non-empty DIR")
    q.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes rendering places and drives in parallel (same data for any number)",
    )
    q.add_argument("--quiet", action="store_true", help="no progress bar")
    q.set_defaults(func=cmd_data_synth)
    q = dsub.add_parser(
        "info",
        help="table of a scenario's clients and depth statistics",
        description="Per sequence: split, client, platform, environment, "
        "frames, size, valid-depth share and depth median / p95 / max.",
    )
    q.add_argument("dir", metavar="DIR", help="scenario directory (holds manifest.json)")
    q.add_argument(
        "--frames",
        type=int,
        default=16,
        help="frames sampled per sequence for the statistics (default 16)",
    )
    q.set_defaults(func=cmd_data_info)
    q = dsub.add_parser(
        "preview",
        help="a PNG sheet of RGB and colour-mapped depth per client",
        description="One middle frame per client (and test / pretraining "
        "sequence): RGB beside its depth on a log colour scale.",
    )
    q.add_argument("dir", metavar="DIR", help="scenario directory (holds manifest.json)")
    q.add_argument("--out", required=True, metavar="sheet.png")
    q.add_argument("--split", default="all", choices=("train", "test", "pretrain", "all"))
    q.add_argument("--columns", type=int, default=4, help="sequences per row")
    q.set_defaults(func=cmd_data_preview)

    p = sub.add_parser("demo", help="the embedded default job")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="output directory (default: runs/demo)")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"fedepth {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
