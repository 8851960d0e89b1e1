"""``fedepth fleet``: tools that talk to a running coordinator (gRPC is imported only here)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from fedepth_cli.errors import CliError


def cmd_fleet_status(args: argparse.Namespace) -> int:
    """Print the coordinator's fleet table and cluster map (gRPC is imported only here)."""
    from fedepth_coordinator.client import (
        ClientTls,
        CoordinatorCallError,
        CoordinatorClient,
        open_channel,
    )
    from fedepth_coordinator.report import format_fleet

    token = os.environ.get("FEDEPTH_COORDINATOR_TOKEN")
    if args.token_file:
        try:
            token = Path(args.token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CliError(f"--token-file: {exc}") from exc
    if not token:
        raise CliError(
            "no token: pass --token-file FILE or set FEDEPTH_COORDINATOR_TOKEN (create one with "
            "`fedepth-coordinator --add-robot ID --role operator`)"
        )
    tls = None
    if args.ca_file or args.cert_file:
        tls = ClientTls(ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file)
    client = CoordinatorClient(
        open_channel(args.coordinator, tls=tls), args.principal, token, timeout_s=args.timeout
    )
    with client:
        try:
            status, clusters = client.fleet_status(), client.cluster_map()
        except CoordinatorCallError as exc:
            raise CliError(f"{args.coordinator}: {exc.status}: {exc.details}") from exc
    if args.json:
        out = {"fleet": dataclasses.asdict(status), "clusters": dataclasses.asdict(clusters)}
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_fleet(status, clusters) + "\n")
    return 0


def cmd_fleet_replay(args: argparse.Namespace) -> int:
    """Benchmark a fleet through the real ROS nodes (ROS and gRPC are imported only here)."""
    from fedepth_cli.bench_spec import image_size, method_names
    from fedepth_ros.replay import FleetReplay, ReplayError, ReplaySpec

    if (args.scenario_dir is None) == (args.bags is None):
        raise CliError("give --scenario-dir DIR (bags are written from it) or --bags DIR")
    if args.max_robots < 1:
        raise CliError(f"--max-robots must be >= 1, got {args.max_robots}")
    if args.rounds is not None and args.rounds < 1:
        raise CliError(f"--rounds must be >= 1, got {args.rounds}")
    if args.local_steps is not None and args.local_steps < 1:
        raise CliError(f"--local-steps must be >= 1, got {args.local_steps}")
    if not args.rate > 0:
        raise CliError(f"--rate must be > 0, got {args.rate}")
    if not 0 < args.quorum <= 1:
        raise CliError(f"--quorum must lie in (0, 1], got {args.quorum}")
    if args.scenario_dir and not (Path(args.scenario_dir) / "manifest.json").is_file():
        raise CliError(f"--scenario-dir {args.scenario_dir}: no manifest.json")
    if args.bags and not (Path(args.bags) / "bags.json").is_file():
        raise CliError(f"--bags {args.bags}: no bags.json (written by an earlier replay)")
    if not os.environ.get("ROS_DOMAIN_ID"):
        print(
            "fedepth fleet replay: ROS_DOMAIN_ID is not set: the nodes use domain 0 (set it, "
            "and ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST, to keep the replay to yourself)",
            file=sys.stderr,
        )
    spec = ReplaySpec(
        methods=method_names(args.methods),
        out=Path(args.out),
        max_robots=args.max_robots,
        rounds=args.rounds,
        scenario_dir=Path(args.scenario_dir) if args.scenario_dir else None,
        bag_dir=Path(args.bags) if args.bags else None,
        backbone=args.backbone,
        cache_dir=Path(args.cache),
        weights=Path(args.weights) if args.weights else None,
        image_size=image_size(args.image_size),
        local_steps=args.local_steps,
        rate=args.rate,
        lossless=not args.lossy,
        round_deadline_s=args.round_deadline,
        quorum=args.quorum,
        robot_retries=args.robot_retries,
        fork_nodes=not args.fresh_processes,
        progress=not args.quiet,
    )
    try:
        results = FleetReplay(spec, echo=lambda line: print(line, file=sys.stderr)).run()
    except ReplayError as exc:
        raise CliError(str(exc)) from None
    from fedepth.bench import format_table

    print(format_table(results))
    print(f"wrote {spec.out / 'results.json'}, {spec.out / 'report.md'} and figures")
    return 0


def _add_replay_parser(fsub: Any) -> None:
    p = fsub.add_parser(
        "replay",
        help="benchmark a fleet by replaying bags through the real ROS nodes",
        description="Write each client's sequences and each test sequence as bags (cached in "
        "OUT/bags), start a real coordinator per method, run one robot_node fed by a "
        "bag_player per client with at most --max-robots robot processes alive (robots "
        "without work in the current round make room for those with; see docs/replay.md), "
        "then replay every test sequence into a routed depth_node and score every published "
        "depth image against the bag's depth. Writes OUT/results.json, OUT/report.md and "
        "figures in the benchmark's format, plus replay_frames.png and replay_latency.png. "
        "Loss-free by default (reliable keep-all QoS end to end; every frame reaches the "
        "robot's buffer). Ctrl-C stops every child; the same command resumes.",
    )
    p.add_argument("--scenario-dir", metavar="DIR", help="a scenario (manifest.json)")
    p.add_argument("--bags", metavar="DIR", help="bags with bags.json (instead of a scenario)")
    p.add_argument("--methods", default="fedavg,fedepth", help="comma-separated methods")
    p.add_argument("--max-robots", type=int, default=8, help="robot processes at once")
    p.add_argument("--rounds", type=int, help="rounds (default: the profile's)")
    p.add_argument("--out", required=True, metavar="OUT")
    p.add_argument("--backbone", default="newcrfs-lite", help="model (default newcrfs-lite)")
    p.add_argument("--cache", default=".cache/fedepth", metavar="DIR", help="pretrained weights")
    p.add_argument("--weights", help="initial weights instead of the cached pretraining")
    p.add_argument("--image-size", metavar="HxW", help="training/eval resolution")
    p.add_argument("--local-steps", type=int, help="local steps per round")
    p.add_argument("--rate", type=float, default=20.0, help="playback rate factor (default 20)")
    p.add_argument(
        "--lossy", action="store_true", help="sensor-data QoS instead of the loss-free mode"
    )
    p.add_argument(
        "--round-deadline",
        type=float,
        default=0.0,
        metavar="S",
        help="a round may close S s after it opened with --quorum of its robots (drop-outs); "
        "default 0: every round waits for all its robots, as fedepth bench",
    )
    p.add_argument("--quorum", type=float, default=0.5, help="with --round-deadline")
    p.add_argument(
        "--robot-retries", type=int, default=1, help="restarts of a robot that died (default 1)"
    )
    p.add_argument(
        "--fresh-processes",
        action="store_true",
        help="start every node in a fresh interpreter, as a deployed node starts (about 6 s "
        "of CPU more per start); default: fork the nodes from one that imported them once",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_fleet_replay)


def add_parsers(sub: Any) -> None:
    """`fedepth fleet ...`: tools that talk to a running coordinator, and the replay."""
    fleet = sub.add_parser("fleet", help="inspect a running coordinator; replay a fleet")
    fsub = fleet.add_subparsers(dest="fleet_command", metavar="FLEET_COMMAND", required=True)
    p = fsub.add_parser(
        "status",
        help="print the fleet table and the cluster map",
        description="Ask a coordinator for its fleet status and cluster map and print them. "
        "Credentials: --principal and --token-file (or FEDEPTH_COORDINATOR_TOKEN).",
    )
    p.add_argument("--coordinator", required=True, metavar="HOST:PORT")
    p.add_argument(
        "--principal",
        default=os.environ.get("FEDEPTH_COORDINATOR_PRINCIPAL", "ops"),
        help="id to authenticate as (default: $FEDEPTH_COORDINATOR_PRINCIPAL or 'ops')",
    )
    p.add_argument("--token-file", help="file holding the principal's token")
    p.add_argument("--ca-file", help="PEM CA of the coordinator's certificate (TLS)")
    p.add_argument("--cert-file", help="PEM client certificate (mutual TLS)")
    p.add_argument("--key-file", help="PEM client key (mutual TLS)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per call (default 10)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.set_defaults(func=cmd_fleet_status)
    _add_replay_parser(fsub)
