"""Soak benchmark of the hardened coordinator (issue 14): honest robots and adversaries at once.

A child coordinator (durable SQLite state, loopback, FedAvg on the synthetic model) serves
``--honest`` honest robots (threads running the real robot loop) while ``--adversaries``
member robots run the attacks of issue 14 concurrently for the whole run:

- ``poison``: every round, an update far beyond ``validation.max_update_norm`` claiming 10**12
  samples, and one with NaN values;
- ``flood``: long polls with NaN / infinite ``wait_s`` and bursts of 8 concurrent long polls
  (more than ``server.max_calls_per_robot``);
- ``hold``: downloads read only up to their header and held (``max_transfers_per_robot``,
  ``stream_idle_s``); with a model smaller than the loopback socket buffers (the default
  ``--size-mb 0.5``) the whole download is already sent, so this one only bites with
  ``--size-mb 16`` or more;
- ``slowloris``: uploads that send one chunk and stall without a deadline;
- ``garbage``: oversized ids, extreme descriptors, oversized Route summaries.

Adversaries never deliver an update, so every round closes at its deadline on quorum. Then the
same run without adversaries (every round closes when all honest robots reported). Reported:
the honest updates accepted in every round, each round's lateness (time open minus
``rounds.deadline_s``; positive is late), the coordinator's RSS over time, the attackers' status
codes, and the largest difference between the two runs' final aggregates (expected: 0, the
adversaries' updates are all rejected).

    python benchmarks/coordinator_soak.py [--honest 50] [--adversaries 5] [--rounds 10]
        [--deadline-s 8] [--json out.json]

A short smoke check: ``--honest 8 --adversaries 5 --rounds 2 --deadline-s 4``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from fedepth.descriptor import Descriptor
from fedepth_coordinator import serde, wire
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2 as pb
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2_grpc as pb_grpc
from fedepth_coordinator.auth import add_principal, call_metadata
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient, open_channel
from fedepth_coordinator.config import CoordinatorConfig, config_from_dict
from fedepth_coordinator.domain import PlanAction, UpdateHeader
from fedepth_coordinator.robot import RobotLoop
from fedepth_coordinator.simulate import (
    CoordinatorProcess,
    deterministic_train,
    robot_ids,
    robot_profile,
)
from fedepth_coordinator.tensors import Layout, iter_chunks

ATTACKS = ("poison", "flood", "hold", "slowloris", "garbage")


def _config(work: Path, name: str, robots: int, args: argparse.Namespace) -> CoordinatorConfig:
    return config_from_dict(
        {
            "server": {
                "host": "127.0.0.1",
                "port": 0,
                "max_workers": robots + 32,
                "max_wait_s": 5.0,
                "stream_idle_s": 3.0,
                "max_calls_per_robot": 4,
                "max_transfers_per_robot": 2,
            },
            "auth": {"credentials_file": str(work / "credentials.yaml")},
            "rounds": {
                "num_rounds": args.rounds,
                "min_robots": robots,
                "quorum": 0.6,
                "deadline_s": args.deadline_s,
            },
            "strategy": {"name": "fedavg", "params": {}},
            "model": {"name": None, "synthetic": {"num_tensors": 4, "size_mb": args.size_mb}},
            "validation": {"max_update_norm": args.max_update_norm},
            "state": {"dir": str(work / name), "backend": "sqlite"},
            "log_level": "WARNING",
        }
    )


class Adversary:
    """One attacking member robot; counts the status codes its attacks got."""

    def __init__(self, target: str, rid: str, token: str, attack: str, stop: threading.Event):
        self.rid, self.attack, self.stop = rid, attack, stop
        self.channel = open_channel(target)
        self.client = CoordinatorClient(self.channel, rid, token, timeout_s=20.0)
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.md = call_metadata(rid, token)
        self.codes: Counter[str] = Counter()

    def _try(self, call: Callable[[], Any]) -> Any:
        try:
            out = call()
            self.codes["OK"] += 1
            return out
        except grpc.RpcError as err:
            self.codes[err.code().name] += 1
        except CoordinatorCallError as err:
            self.codes[err.code.name] += 1
        return None

    def run(self) -> None:
        p = robot_profile(self.rid)
        self._try(lambda: self.client.register(p.num_samples, p.labels))
        self._try(lambda: self.client.upload_descriptor(p.descriptor))
        step = getattr(self, f"_{self.attack}")
        while not self.stop.is_set():
            step()
            self.stop.wait(1.0)
        self.channel.close()

    def _round(self) -> int | None:
        plan = self._try(lambda: self.client.round_plan(-1, wait_s=1.0))
        return plan.round if plan is not None and plan.action is PlanAction.TRAIN else None

    def _upload(self, groups: dict[str, Any], rnd: int, num_samples: int, stall: bool) -> None:
        header = UpdateHeader(self.rid, rnd, num_samples, Layout.of(groups))
        chunks = list(iter_chunks(list(groups.values()), 4096, frame=wire.frame))

        def messages() -> Iterator[Any]:
            yield pb.UploadMessage(header=serde.update_header_to_pb(header))
            yield from chunks[:1] if stall else chunks
            if stall:
                self.stop.wait(30)

        upload = self.channel.stream_unary(
            "/fedepth.v1.Coordinator/UploadUpdate",
            request_serializer=wire.serialize,
            response_deserializer=pb.UploadUpdateReply.FromString,
        )
        self._try(lambda: upload(messages(), metadata=self.md, timeout=None if stall else 20))

    def _poison(self) -> None:
        rnd = self._round()
        if rnd is None:
            return
        model = self._try(lambda: self.client.download_model(rnd))
        if model is None:
            return
        state = dict(model.task.state)
        far = {k: v + np.float32(1e3) for k, v in state.items()}
        self._upload({"state": far}, rnd, 10**12, stall=False)
        nan = {k: np.full_like(v, np.nan) for k, v in state.items()}
        self._upload({"state": nan}, rnd, 10, stall=False)

    def _flood(self) -> None:
        for wait_s in (math.nan, math.inf):
            request = pb.GetRoundPlanRequest(robot_id=self.rid, after_round=10**6, wait_s=wait_s)
            self._try(partial(self.stub.GetRoundPlan, request, metadata=self.md, timeout=10))
        polls = [
            self.stub.GetRoundPlan.future(
                pb.GetRoundPlanRequest(robot_id=self.rid, after_round=10**6, wait_s=5.0),
                metadata=self.md,
                timeout=10,
            )
            for _ in range(8)
        ]
        for f in polls:
            self._try(f.result)

    def _hold(self) -> None:
        rnd = self._round()
        calls = []
        for _ in range(3):
            call = self.stub.DownloadModel(
                pb.DownloadModelRequest(robot_id=self.rid, round=rnd or 0, latest=rnd is None),
                metadata=self.md,
            )
            if self._try(partial(next, call)) is not None:
                calls.append(call)
        self.stop.wait(6.0)  # longer than server.stream_idle_s
        for call in calls:
            self._try(partial(list, call))

    def _slowloris(self) -> None:
        rnd = self._round()
        if rnd is None:
            return
        model = self._try(lambda: self.client.download_model(rnd))
        if model is not None:
            self._upload({"state": dict(model.task.state)}, rnd, 10, stall=True)

    def _garbage(self) -> None:
        huge = "x" * 5000 + "\nforged log line"
        self._try(
            lambda: self.stub.Register(
                pb.RegisterRequest(robot_id=huge, num_samples=5), metadata=self.md, timeout=10
            )
        )
        extreme = Descriptor(np.full(8, 1e300), np.full(8, 1e-300), 4)
        self._try(lambda: self.client.upload_descriptor(extreme))
        big = serde.inline_to_pb({"pacfl_basis": np.zeros((512, 512))})  # 2 MiB
        self._try(
            lambda: list(
                self.stub.Route(
                    pb.RouteRequest(
                        descriptor=serde.descriptor_to_pb(robot_profile(self.rid).descriptor),
                        summaries=big,
                    ),
                    metadata=self.md,
                    timeout=10,
                )
            )
        )


def run(
    work: Path, name: str, honest: list[str], adversaries: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """One run; its figures and final aggregate."""
    tokens = {r: add_principal(work / "credentials.yaml", r) for r in honest + adversaries}
    tokens["ops"] = add_principal(work / "credentials.yaml", "ops", "operator")
    config = _config(work, name, len(honest) + len(adversaries), args)
    child = CoordinatorProcess(config, log_path=work / f"{name}.log")
    port = child.start()
    target = f"127.0.0.1:{port}"
    stop = threading.Event()
    rss: list[tuple[float, int]] = []
    t0 = time.monotonic()

    def sample_rss() -> None:
        while not stop.is_set():
            rss.append((round(time.monotonic() - t0, 1), child.rss_bytes()))
            stop.wait(1.0)

    threads = [threading.Thread(target=sample_rss, daemon=True)]
    loops = []
    for rid in honest:
        client = CoordinatorClient(open_channel(target), rid, tokens[rid], timeout_s=60.0)
        p = robot_profile(rid)
        loop = RobotLoop(client, p, deterministic_train(rid, p.num_samples), poll_s=5.0)
        loops.append(loop)
        threads.append(threading.Thread(target=loop.run, daemon=True))
    attackers = [
        Adversary(target, rid, tokens[rid], ATTACKS[i % len(ATTACKS)], stop)
        for i, rid in enumerate(adversaries)
    ]
    threads += [threading.Thread(target=a.run, daemon=True) for a in attackers]
    try:
        for t in threads:
            t.start()
        end = time.monotonic() + args.timeout_s
        while not all(loop.report.finished for loop in loops):
            if time.monotonic() > end:
                raise RuntimeError(f"{name}: the run did not finish in {args.timeout_s:.0f} s")
            time.sleep(0.5)
        with CoordinatorClient(open_channel(target), "ops", tokens["ops"]) as ops:
            status = ops.fleet_status()
        with CoordinatorClient(open_channel(target), honest[0], tokens[honest[0]]) as c:
            final = c.download_model(latest=True).task.state
    finally:
        stop.set()
        for loop in loops:
            loop.stop.set()
        child.stop()
    honest_set = set(honest)
    rounds = [
        {
            "round": h.round,
            "accepted": h.accepted,
            "closed_by": h.closed_by,
            "duration_s": round(h.duration_s, 2),
            "lateness_s": round(h.duration_s - args.deadline_s, 2),
        }
        for h in status.history
    ]
    honest_accepted = {
        r.robot_id: r.updates_accepted for r in status.robots if r.robot_id in honest_set
    }
    return {
        "rounds": rounds,
        "honest_updates_accepted": sum(honest_accepted.values()),
        "honest_updates_expected": len(honest) * args.rounds,
        "every_honest_update_accepted": all(n == args.rounds for n in honest_accepted.values()),
        "adversary_updates_accepted": sum(
            r.updates_accepted for r in status.robots if r.robot_id not in honest_set
        ),
        "max_lateness_s": max((r["lateness_s"] for r in rounds), default=0.0),
        "rss_mb": [(t, round(b / 1e6, 1)) for t, b in rss],
        "attacks": {a.rid: {"attack": a.attack, "codes": dict(a.codes)} for a in attackers},
        "_final": final,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--honest", type=int, default=50)
    p.add_argument("--adversaries", type=int, default=5)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--deadline-s", type=float, default=8.0)
    p.add_argument("--size-mb", type=float, default=0.5)
    p.add_argument("--max-update-norm", type=float, default=1000.0)
    p.add_argument("--timeout-s", type=float, default=1800.0)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    honest = robot_ids(args.honest)
    adversaries = robot_ids(args.adversaries, prefix="mallory")
    with tempfile.TemporaryDirectory(prefix="fedepth-soak-") as tmp:
        work = Path(tmp)
        attacked = run(work, "attacked", honest, adversaries, args)
        clean = run(work, "honest-only", honest, [], replace_deadline(args))
    a, c = attacked.pop("_final"), clean.pop("_final")
    diff = max(float(np.max(np.abs(a[k].astype(np.float64) - c[k]))) for k in c)
    rss = [mb for _, mb in attacked["rss_mb"]]
    report = {
        "honest": args.honest,
        "adversaries": args.adversaries,
        "rounds": args.rounds,
        "deadline_s": args.deadline_s,
        "attacked": attacked,
        "honest_only": {k: v for k, v in clean.items() if k != "attacks"},
        "final_aggregate_max_abs_diff": diff,
        "verdict": {
            "every_honest_update_accepted": attacked["every_honest_update_accepted"],
            "no_adversary_update_accepted": attacked["adversary_updates_accepted"] == 0,
            "no_round_late_by_more_than_1.5_s": attacked["max_lateness_s"] <= 1.5,
            "rss_growth_mb": round(max(rss) - rss[0], 1) if rss else None,
            "aggregate_equals_honest_only": diff == 0.0,
        },
    }
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(json.dumps(report["verdict"], indent=2))
    print(text if not args.json else f"full report: {args.json}", file=sys.stderr)
    return 0 if all(v for k, v in report["verdict"].items() if k != "rss_growth_mb") else 1


def replace_deadline(args: argparse.Namespace) -> argparse.Namespace:
    """The honest-only run: the same, with a long deadline (every round closes on 'all')."""
    out = argparse.Namespace(**vars(args))
    out.deadline_s = max(args.deadline_s, 600.0)
    return out


if __name__ == "__main__":
    sys.exit(main())
