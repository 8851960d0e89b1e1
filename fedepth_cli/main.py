"""The ``fedepth`` command: clustering, data, benchmark and fleet tools behind one entry point.

It sits above the packages it drives: each subcommand's module imports what it needs
(``fedepth``, and only for ``bag`` / ``fleet`` / ``bench --transport grpc`` the bag,
coordinator-client and gRPC code) when it runs, so ``fedepth --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fedepth import __version__
from fedepth_cli import bag, bench, cluster, data, fleet, weights
from fedepth_cli.errors import CliError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedepth",
        description="Federated monocular depth estimation for heterogeneous robot fleets.",
    )
    parser.add_argument("--version", action="version", version=f"fedepth {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # in the order `fedepth --help` lists them
    cluster.add_parsers(sub)
    data.add_parsers(sub)
    bench.add_parsers(sub)
    bag.add_parsers(sub)
    fleet.add_parsers(sub)
    weights.add_parsers(sub)
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
