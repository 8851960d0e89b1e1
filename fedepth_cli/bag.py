"""``fedepth bag``: inspect rosbag2 bags, write RGB-D sequences as bags (no ROS needed)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from fedepth_cli.errors import CliError


def cmd_bag_info(args: argparse.Namespace) -> int:
    from fedepth.data.bags import BagError, bag_info

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
    for t in info.topics:
        rate = f"{t.rate_hz:8.2f} Hz" if t.rate_hz is not None else " " * 11
        image = f"  {t.encoding} {t.resolution[0]}x{t.resolution[1]}" if t.resolution else ""
        lines.append(f"  {t.name:<{width}}  {t.count:>8}  {rate}  {t.msgtype}{image}")
    if info.metadata:
        lines.append("metadata:")
        lines += [f"  {k}: {v}" for k, v in sorted(info.metadata.items())]
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
    from fedepth.data.bag_writer import BagWriteError, write_rgbd_bag

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
    from fedepth.data.bag_writer import synthetic_frames

    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
        frames = synthetic_frames(
            args.frames, width=width, height=height, rate_hz=args.rate, seed=args.seed
        )
    except ValueError as exc:
        raise CliError(f"--size WxH, --frames, --rate: {exc}") from None
    return _write_bag(frames, args, {"fedepth.source": "test-scene"})


class _Stamped:
    """The frames of a sequence with strictly increasing stamps, read lazily.

    Readers without timestamps (NYUv2's labeled set numbers its images) or whose first stamps do
    not increase get ``index x period`` instead, so the bag replays at ``rate_hz``.
    """

    def __init__(self, seq: Any, rate_hz: float) -> None:
        if not rate_hz > 0:
            raise CliError(f"--rate must be > 0 Hz, got {rate_hz}")
        if len(seq) == 0:
            raise CliError(f"sequence {seq.name!r} has no frames")
        self.seq = seq
        self.period_ns = round(1e9 / rate_hz)
        self.synthetic = seq.meta.source == "nyu" or (
            len(seq) > 1 and seq[1].stamp_ns <= seq[0].stamp_ns
        )

    def __len__(self) -> int:
        return len(self.seq)

    def __iter__(self) -> Any:
        for i, frame in enumerate(self.seq):
            yield (
                dataclasses.replace(frame, stamp_ns=i * self.period_ns)
                if self.synthetic
                else frame
            )


def _write_sequence(seq: Any, args: argparse.Namespace, source: dict[str, str]) -> int:
    from fedepth.data import DataError

    try:
        with seq:
            frames = _Stamped(seq, args.rate)
            meta = seq.meta
            custom = {
                **source,
                "fedepth.sequence": seq.name,
                "fedepth.platform": meta.platform,
                "fedepth.environment": meta.environment,
                "fedepth.split": meta.split,
                "fedepth.min_depth": f"{meta.min_depth:g}",
                "fedepth.max_depth": f"{meta.max_depth:g}",
                "fedepth.synthetic_stamps": str(frames.synthetic).lower(),
            }
            return _write_bag(frames, args, custom)
    except DataError as exc:
        raise CliError(str(exc)) from None


def _m3ed_split(data: Path, given: str | None) -> str:
    """``--split``, else the split a scenario manifest next to the file gives the sequence,
    else ``train`` (with a note saying so)."""
    if given:
        return given
    name = data.name.removesuffix(".h5").removesuffix("_data")
    manifest = data.parent / "manifest.json"
    if manifest.is_file():
        try:
            entries = json.loads(manifest.read_text(encoding="utf-8")).get("sequences", [])
        except (OSError, ValueError, AttributeError):
            entries = []
        for entry in entries:
            if isinstance(entry, dict) and entry.get("name") == name and entry.get("split"):
                return str(entry["split"])
    print(
        f"fedepth bag from-m3ed: split of {name!r} unknown (no manifest entry): recorded as "
        "train; pass --split test for a test sequence",
        file=sys.stderr,
    )
    return "train"


def cmd_bag_from_m3ed(args: argparse.Namespace) -> int:
    from fedepth.data import DataError, M3EDSequence

    try:
        split = _m3ed_split(Path(args.data), args.split)
        seq = M3EDSequence(args.data, args.depth_gt, split=split)
    except (DataError, OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    return _write_sequence(seq, args, {"fedepth.source": "m3ed"})


def cmd_bag_from_sequence(args: argparse.Namespace) -> int:
    from fedepth.data import DataError
    from fedepth.data.scenario import MANIFEST, open_sequence, read_manifest

    root = Path(args.scenario_dir)
    try:
        manifest = read_manifest(root)
        entries = {e.get("name"): e for e in manifest["sequences"]}
        if args.sequence not in entries:
            known = ", ".join(sorted(str(n) for n in entries))
            raise CliError(f"{root / MANIFEST}: no sequence {args.sequence!r} (known: {known})")
        seq = open_sequence(root, entries[args.sequence], root / MANIFEST)
    except (DataError, OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    return _write_sequence(seq, args, {"fedepth.source": seq.meta.source})


def add_parsers(sub: Any) -> None:
    """`fedepth bag info|test-scene|from-m3ed|from-sequence`."""
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
    p = bag_sub.add_parser(
        "from-m3ed",
        help="write an M3ED sequence (RGB + depth reprojected into the RGB camera) as a bag",
    )
    p.add_argument("--data", required=True, metavar="X_data.h5", help="M3ED data file")
    p.add_argument(
        "--depth-gt", required=True, metavar="X_depth_gt.h5", help="M3ED depth ground truth"
    )
    p.add_argument(
        "--split",
        choices=("train", "test", "pretrain"),
        help="the sequence's split, recorded as fedepth.split (default: from a manifest.json "
        "next to --data, else train)",
    )
    _add_bag_writer_options(p)
    p.add_argument(
        "--rate", type=float, default=10.0, help="Hz of synthesised stamps (sequences without)"
    )
    p.set_defaults(func=cmd_bag_from_m3ed)
    p = bag_sub.add_parser(
        "from-sequence",
        help="write any sequence of a scenario manifest (M3ED, NYUv2, KITTI) as a bag",
    )
    p.add_argument("--scenario-dir", required=True, metavar="DIR", help="holds manifest.json")
    p.add_argument("--sequence", required=True, metavar="NAME", help="sequence name")
    _add_bag_writer_options(p)
    p.add_argument(
        "--rate", type=float, default=10.0, help="Hz of synthesised stamps (NYUv2 has none)"
    )
    p.set_defaults(func=cmd_bag_from_sequence)
