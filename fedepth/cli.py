"""The ``fedepth`` command: clustering, data, benchmark and fleet tools behind one entry point."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
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


def _add_fleet_parser(sub: Any) -> None:
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

    _add_fleet_parser(sub)
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
