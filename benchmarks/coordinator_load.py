"""Load benchmark of the coordinator: 100 concurrent simulated robots, a ~10 MB model.

The coordinator runs as a child process (durable SQLite state); the robots run as threads in a
few worker processes and go through full rounds (register, descriptor, wait for the round,
download, "train", upload). Reports errors, the time of each round (open to close) and the
coordinator's resident memory at start and at its peak. Target: no errors; peak memory
independent of the number of robots (no round's uploads held at once).
tests/coordinator/test_load.py is the light variant.

    python benchmarks/coordinator_load.py [--robots 100] [--size-mb 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from fedepth_coordinator.auth import add_principal
from fedepth_coordinator.config import config_from_dict
from fedepth_coordinator.simulate import load_run, robot_ids


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--robots", type=int, default=100)
    p.add_argument("--size-mb", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=4, help="robot processes (default 4)")
    p.add_argument("--strategy", default="fedavg", help="fedavg (one model) or fedepth")
    p.add_argument("--max-transfers", type=int, default=16)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fedepth-load-") as tmp:
        work = Path(tmp)
        creds = work / "credentials.yaml"
        robots = robot_ids(args.robots)
        tokens = {r: add_principal(creds, r) for r in robots}
        tokens["ops"] = add_principal(creds, "ops", "operator")
        config = config_from_dict(
            {
                "server": {
                    "host": "127.0.0.1",
                    "port": 0,
                    "max_workers": args.robots + 32,
                    "max_transfers": args.max_transfers,
                    "max_wait_s": 10.0,
                },
                "auth": {"credentials_file": str(creds)},
                "rounds": {
                    "num_rounds": args.rounds,
                    "min_robots": args.robots,
                    "deadline_s": 900.0,
                },
                "strategy": {
                    "name": args.strategy,
                    "params": {"overlap": 0.2} if args.strategy == "fedepth" else {},
                },
                "model": {"name": None, "synthetic": {"num_tensors": 16, "size_mb": args.size_mb}},
                "state": {"dir": str(work / "state")},
                "log_level": "INFO",
            }
        )
        result = load_run(
            config,
            tokens,
            robots,
            operator="ops",
            workers=args.workers,
            timeout_s=1800,
            log_path=work / "coordinator.log",
        )
        round_lines = [
            line
            for line in (work / "coordinator.log").read_text().splitlines()
            if " closed (" in line
        ]
    mb = 1e6
    growth = (result.rss_peak_bytes - result.rss_start_bytes) / mb
    errors = f" {dict(list(result.errors.items())[:3])}" if result.errors else ""
    lines = [
        f"{result.robots} robots, model {result.model_bytes / mb:.1f} MB, strategy "
        f"{args.strategy}, {args.workers} robot processes, max_transfers {args.max_transfers}",
        f"errors: {len(result.errors)}{errors}",
        "round times (s): "
        + ", ".join(f"{t:.1f}" for t in result.round_seconds)
        + f"   closed by: {', '.join(sorted(set(result.closed_by)))}",
        f"wall time {result.wall_seconds:.1f} s (fleet start to finish)",
        f"coordinator RSS: start {result.rss_start_bytes / mb:.0f} MB, peak "
        f"{result.rss_peak_bytes / mb:.0f} MB (+{growth:.0f} MB;"
        f" one round's uploads: {result.robots * result.model_bytes / mb:.0f} MB)",
        *("  " + line.split(": ", 1)[-1] for line in round_lines),
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n")
    return 0 if not result.errors else 1


if __name__ == "__main__":
    sys.exit(main())
