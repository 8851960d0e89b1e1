"""The ``fedepth-coordinator`` command: run the coordinator, or manage its robot credentials.

fedepth-coordinator --config config/coordinator.yaml [--port N] [--state-dir DIR]
fedepth-coordinator --config config/coordinator.yaml --add-robot robot-01
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

import yaml

from fedepth.atomic import atomic_write_text
from fedepth_coordinator.auth import ROLES, add_principal
from fedepth_coordinator.config import (
    ConfigError,
    CoordinatorConfig,
    load_config,
    parse_override,
    to_dict,
)
from fedepth_coordinator.server import CoordinatorServer

log = logging.getLogger("fedepth_coordinator")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedepth-coordinator",
        description="Federated coordinator of a FeDepth robot fleet (gRPC service "
        "fedepth.v1.Coordinator, with health checking and reflection).",
    )
    p.add_argument("--config", metavar="FILE", help="coordinator YAML (defaults when omitted)")
    p.add_argument("--port", type=int, help="override server.port (0: any free port)")
    p.add_argument("--host", help="override server.host")
    p.add_argument("--state-dir", metavar="DIR", help="override state.dir")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set rounds.num_rounds=5 (value parsed as YAML)",
    )
    p.add_argument("--port-file", metavar="FILE", help="write the bound port here once serving")
    p.add_argument("--log-level", help="override log_level (DEBUG, INFO, WARNING)")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--add-robot",
        metavar="ID",
        help="add (or re-key) a principal in auth.credentials_file and print its token",
    )
    g.add_argument("--print-config", action="store_true", help="print the resolved config")
    p.add_argument(
        "--role", choices=ROLES, default="robot", help="role of --add-robot (default robot)"
    )
    return p


def _overrides(args: argparse.Namespace) -> list[tuple[str, object]]:
    out = [parse_override(s) for s in args.set]
    for key, value in (
        ("server.port", args.port),
        ("server.host", args.host),
        ("state.dir", args.state_dir),
        ("log_level", args.log_level),
    ):
        if value is not None:
            out.append((key, value))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config, _overrides(args))
    except ConfigError as exc:
        print(f"fedepth-coordinator: config error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.print_config:
        sys.stdout.write(yaml.safe_dump(to_dict(config), sort_keys=False))
        return 0
    if args.add_robot:
        path = config.auth.credentials_file
        try:
            token = add_principal(path, args.add_robot, args.role)
        except ValueError as exc:
            print(f"fedepth-coordinator: {exc}", file=sys.stderr)
            return 2
        print(
            f"added {args.role} {args.add_robot!r} to {path}; its token (shown once, give it "
            "to the robot):",
            file=sys.stderr,
        )
        sys.stdout.write(token + "\n")
        return 0
    return _serve(config, args.port_file)


def _serve(config: CoordinatorConfig, port_file: str | None) -> int:
    try:
        server = CoordinatorServer(config)
    except (OSError, ValueError, RuntimeError, MemoryError) as exc:
        # StateError (a RuntimeError) included: one line naming the files and the way out
        log.debug("start-up failed", exc_info=True)
        log.error("cannot start: %s", " ".join(str(exc).split()) or type(exc).__name__)
        return 1
    done = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    port = server.start()
    if port_file:
        atomic_write_text(port_file, f"{port}\n")
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
