"""``fedepth data``: synthesise scenarios, print their depth statistics, draw preview sheets."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fedepth_cli.errors import CliError


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


def add_parsers(sub: Any) -> None:
    """`fedepth data synth|info|preview`."""
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
