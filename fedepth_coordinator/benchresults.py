"""What a method's run through the coordinator produced: the robots' reports, the final strategy
read back from the coordinator's state, and the :class:`GrpcMethodRun` assembled from them."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedepth.sim import MethodRun, RoundRecord, SimConfig, final_metrics, strategy_outputs
from fedepth.strategies import ClientInfo, Strategy, create_strategy
from fedepth_coordinator.benchfiles import BenchRunError
from fedepth_coordinator.blobs import BlobReader
from fedepth_coordinator.state import open_store
from fedepth_coordinator.tensors import STATE


@dataclass
class GrpcMethodRun(MethodRun):
    """A method's run through the coordinator, with what the transport measured."""

    transport: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "transport": "grpc", "grpc": self.transport}


@dataclass
class ObservedRun:
    """What the parent saw of one run: when the fleet formed, evaluations, round history."""

    formed_at: float | None = None
    tests: dict[int, tuple[Any, Any, float]] = field(default_factory=dict)
    samples: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = field(
        default_factory=dict
    )
    history: list[Any] = field(default_factory=list)


def read_reports(result_dir: Path, ids: Sequence[str]) -> dict[str, dict[int, dict[str, Any]]]:
    """Each robot's per-round report of one run (``results/<k>/<id>.json``)."""
    reports = {}
    for rid in ids:
        rows = json.loads((result_dir / f"{rid}.json").read_text(encoding="utf-8"))
        reports[rid] = {int(r): row for r, row in rows.items()}
    return reports


def load_final_strategy(
    state_dir: str | os.PathLike[str], method: str, params: Mapping[str, Any]
) -> tuple[Strategy, int]:
    """The strategy of a stopped coordinator as of its last checkpoint, and the rounds done
    (rebuilt the way the coordinator restores itself after a restart)."""
    store = open_store("sqlite", Path(state_dir))
    try:
        snap = store.load()
        if snap.run is None:
            raise BenchRunError(f"{state_dir}: the coordinator never started a run")
        ck = snap.run.checkpoint
        robots = {r.robot_id: r for r in snap.robots}
        infos = [
            ClientInfo(r.robot_id, r.num_samples, r.descriptor, dict(r.labels), dict(r.summaries))
            for r in (robots[m] for m in ck.members)
        ]
        initial = BlobReader(store, snap.run.initial_blob).read_all()[STATE]
        strategy = create_strategy(method, **dict(params))
        strategy.initialize(infos[: ck.num_initial], initial)
        for info in infos[ck.num_initial :]:
            strategy.add_client(info)
        strategy.load_state_dict(ck.meta, BlobReader(store, ck.blob).read_all())
        return strategy, ck.rounds_done
    finally:
        store.close()


def method_run(
    config: SimConfig,
    ids: Sequence[str],
    cids: Mapping[str, str],
    descriptor_seconds: float,
    method: str,
    params: Mapping[str, Any],
    strategy: Strategy,
    reports: dict[str, dict[int, dict[str, Any]]],
    observed: ObservedRun,
    setup: float,
    peak_rss: int,
) -> GrpcMethodRun:
    """The method's run from the robots' reports and what the parent observed."""
    cfg, history, tests = config, observed.history, observed.tests
    records: list[RoundRecord] = []
    for rnd in range(cfg.rounds):
        per = [reports[rid][rnd] for rid in ids]  # scenario order, as in-process
        wall = float(history[rnd].duration_s)
        busy = max(p["train_s"] for p in per)
        rec = RoundRecord(
            round=rnd,
            train_seconds=float(sum(p["train_s"] for p in per)),
            # the round was open but no robot was training (a round held for the parent's
            # evaluation opens when released, so the evaluation is not in it):
            # transfers, checks, aggregation, long-poll wake-ups; from outside the
            # coordinator they cannot be told apart, so all of it counts as wire time
            aggregate_seconds=0.0,
            wire_seconds=max(0.0, wall - busy),
            mean_loss=float(np.mean([p["loss"] for p in per])),
            download_bytes={cids[rid]: reports[rid][rnd]["down_bytes"] for rid in ids},
            upload_bytes={cids[rid]: reports[rid][rnd]["up_bytes"] for rid in ids},
        )
        if rnd in tests:
            rec.test, rec.routes, _ = tests[rnd]
        records.append(rec)
    final, groups, per_seq = final_metrics(records, cfg.last_rounds)
    clusters, out_params = strategy_outputs(strategy, params)

    def stat(key: str, fn: Callable[[list[float]], Any]) -> list[float]:
        return [float(fn([reports[rid][r][key] for rid in ids])) for r in range(cfg.rounds)]

    transport = {
        "robots": len(ids),
        "processes": len(ids),
        "round_wall_seconds": [float(h.duration_s) for h in history],
        "closed_by": [str(h.closed_by) for h in history],
        "download_seconds_mean": stat("download_s", np.mean),
        "upload_seconds_mean": stat("upload_s", np.mean),
        "upload_seconds_max": stat("upload_s", np.max),
        "eval_seconds": {str(r): t[2] for r, t in sorted(tests.items())},
        "evaluated_rounds": sorted(tests),
        "coordinator_peak_rss_bytes": peak_rss,
    }
    return GrpcMethodRun(
        method,
        records,
        final,
        per_seq,
        groups,
        clusters,
        descriptor_seconds,
        setup,
        observed.samples,
        out_params,
        strategy,
        transport=transport,
    )
