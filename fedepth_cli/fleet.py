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


def add_parsers(sub: Any) -> None:
    """`fedepth fleet ...`: tools that talk to a running coordinator."""
    fleet = sub.add_parser("fleet", help="inspect a running coordinator")
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
