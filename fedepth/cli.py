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
            raise CliError(
                f"{path}: missing array(s) {', '.join(missing)} "
                f"(found: {', '.join(data.files) or 'none'})"
            )
        means = np.asarray(data["means"], dtype=np.float64)
        variances = np.asarray(data["variances"], dtype=np.float64)
        names = [str(x) for x in data["names"]] if "names" in data.files else None
    if means.ndim != 2 or variances.ndim != 2 or means.shape != variances.shape:
        raise CliError(
            f"{path}: means {means.shape} and variances {variances.shape} must both "
            "be N x D with the same shape"
        )
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


def cmd_bag_info(args: argparse.Namespace) -> int:
    from fedepth_ros.bags import BagError, bag_info

    try:
        info = bag_info(Path(args.bag))
    except BagError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        json.dump(info.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    lines = [
        f"bag:       {info.path}",
        f"storage:   {info.storage}",
        f"messages:  {info.message_count}",
        f"duration:  {info.duration_ns / 1e9:.3f} s",
        f"start:     {info.start_ns} ns",
        f"end:       {info.end_ns} ns",
        "topics:",
    ]
    width = max((len(t.name) for t in info.topics), default=0)
    lines += [f"  {t.name:<{width}}  {t.count:>8}  {t.msgtype}" for t in info.topics]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _add_bag_writer_options(p: argparse.ArgumentParser) -> None:
    """Options shared by every command that writes an RGB-D bag (see ``_write_bag``)."""
    p.add_argument("--out", required=True, metavar="DIR", help="new rosbag2 directory")
    p.add_argument("--storage", choices=["mcap", "sqlite3"], default="mcap")
    p.add_argument("--frame-id", default="camera", help="header frame_id of every message")
    p.add_argument(
        "--depth-encoding",
        choices=["32FC1", "16UC1"],
        default="32FC1",
        help="32FC1 metres with NaN = invalid, or 16UC1 millimetres with 0 = invalid",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _write_bag(
    frames: Any, args: argparse.Namespace, custom_data: dict[str, str] | None = None
) -> int:
    """Write ``frames`` (objects with rgb, depth, K, stamp_ns) to ``args.out``; print a summary.

    The one path from a frame sequence to a bag: ``bag from-sequence`` / ``bag from-m3ed``
    build a ``fedepth.data`` Sequence and call this.
    """
    from fedepth_ros.bag_writer import BagWriteError, write_rgbd_bag

    try:
        summary = write_rgbd_bag(
            frames,
            Path(args.out),
            storage=args.storage,
            frame_id=args.frame_id,
            depth_encoding=args.depth_encoding,
            custom_data=custom_data,
            progress=not args.no_progress,
            description=Path(args.out).name,
        )
    except (BagWriteError, ValueError) as exc:
        raise CliError(str(exc)) from None
    span = (summary.end_ns - summary.start_ns) / 1e9
    sys.stdout.write(
        f"wrote {summary.frames} frames ({span:.3f} s) to {summary.path} ({summary.storage})\n"
    )
    return 0


def cmd_bag_test_scene(args: argparse.Namespace) -> int:
    from fedepth_ros.bag_writer import synthetic_frames

    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
        frames = synthetic_frames(
            args.frames, width=width, height=height, rate_hz=args.rate, seed=args.seed
        )
    except ValueError as exc:
        raise CliError(f"--size WxH, --frames, --rate: {exc}") from None
    return _write_bag(frames, args, {"fedepth.source": "test-scene"})


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
    g.add_argument(
        "--overlap",
        type=float,
        help="target overlap ratio in [0, 1]; tau is calibrated to reach it",
    )
    p.set_defaults(func=cmd_cluster)

    p = sub.add_parser("demo", help="the embedded default job")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="output directory (default: runs/demo)")
    p.set_defaults(func=cmd_demo)

    bag = sub.add_parser(
        "bag",
        help="rosbag2 tools: inspect bags, write RGB-D sequences as bags",
        description="rosbag2 (mcap or sqlite3) tools. Written bags hold /image (rgb8), "
        "/depth (32FC1 metres, NaN = invalid; or 16UC1 mm, 0 = invalid) and /camera_info, "
        "replayed on robots by the bag_player node.",
    )
    bag_sub = bag.add_subparsers(dest="bag_command", metavar="BAG_COMMAND", required=True)
    p = bag_sub.add_parser("info", help="topics, types, counts and duration of a bag")
    p.add_argument("bag", help="rosbag2 directory or single .mcap / .db3 file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_bag_info)
    p = bag_sub.add_parser(
        "test-scene",
        help="write a small moving RGB-D test scene as a bag (smoke tests of the ROS side)",
    )
    _add_bag_writer_options(p)
    p.add_argument("--frames", type=int, default=50)
    p.add_argument("--size", default="64x48", metavar="WxH")
    p.add_argument("--rate", type=float, default=10.0, help="frame rate in Hz")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_bag_test_scene)
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
