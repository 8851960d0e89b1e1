"""The benchmark's methods through Flower: a :class:`fedepth.transport.Transport` over a Grid.

:func:`fedepth.bench.run_benchmark` prepares each seed (scenario, initial checkpoint, the
fleet's descriptors for its report, the test sequences' descriptors for routing) and hands each
method to :class:`FlowerRunner`, which runs it as a :class:`~fedepth_flower.strategy.
FedepthStrategy` on the ServerApp's Grid: the nodes describe their own data, train their own
models, and after every round the benchmark evaluates where the in-process run does
(:meth:`fedepth.sim.Simulation.evaluate_round`: each unseen test sequence routed by the
strategy, scored on the server). The :class:`~fedepth.sim.MethodRun` it returns is the one
results.json and report.md are written from, so they have the benchmark's format; each
method's final server state is kept in ``<out>/flower/seed<S>/<method>.safetensors``.

Timing per round: ``train_seconds`` is the sum of the seconds the nodes report training,
``aggregate_seconds`` the strategy's configure and aggregate, ``wire_seconds`` the rest of the
round's wall time in Flower (messages to and from the nodes, serialization, scheduling, nodes
waiting for a free simulation worker) after the longest node's training.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp import Grid
from safetensors.numpy import save_file

from fedepth.atomic import atomic_path
from fedepth.sim import (
    Fleet,
    MethodRun,
    RoundRecord,
    Sample,
    SimConfig,
    Simulation,
    final_metrics,
    state_nbytes,
    strategy_outputs,
)
from fedepth.strategies import State, aggregates_clusterwise, create_strategy
from fedepth.strategies.aggregate import robust_mean
from fedepth_flower.records import state_to_record
from fedepth_flower.settings import TRANSPORT, AppSettings
from fedepth_flower.strategy import FedepthStrategy, RoundLog, log

_POLL_S = 0.5


@dataclass
class FlowerMethodRun(MethodRun):
    """A method's run through Flower, with what the transport saw."""

    transport: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "transport": TRANSPORT, TRANSPORT: self.transport}


def round_record(out: RoundLog) -> RoundRecord:
    """The benchmark's record of a training round through Flower (see the module's timing)."""
    busy = max(out.train_s.values(), default=0.0)
    losses = [u.metrics["loss"] for u in out.accepted if "loss" in u.metrics]
    return RoundRecord(
        round=out.round,
        train_seconds=float(sum(out.train_s.values())),
        aggregate_seconds=out.configure_s + out.aggregate_s,
        wire_seconds=max(0.0, out.collect_s - busy),
        mean_loss=float(np.mean(losses)) if losses else float("nan"),
        download_bytes={
            cid: state_nbytes(t.state) + sum(state_nbytes(s) for s in t.hook_state.values())
            for cid, t in out.tasks.items()
        },
        upload_bytes={
            u.cid: state_nbytes(u.state) + sum(state_nbytes(s) for s in u.extra.values())
            for u in out.accepted
        },
    )


def wait_for_nodes(grid: Grid, wanted: int, wait_s: float) -> int:
    """Wait until ``wanted`` nodes are connected or ``wait_s`` passed; the number there."""
    end = time.monotonic() + wait_s
    n = len(list(grid.get_node_ids()))
    while n < wanted and time.monotonic() < end:
        time.sleep(_POLL_S)
        n = len(list(grid.get_node_ids()))
    if n < wanted:
        log.warning("%d of %d nodes connected after %.0f s; going on with them", n, wanted, wait_s)
    return n


def save_server_state(path: Path, strategy: FedepthStrategy) -> None:
    """The final server state (every cluster's model, ...) and its metadata, as safetensors."""
    meta, states = strategy.algorithm.state_dict()
    flat = {  # C order for safetensors; np.asarray keeps 0-d tensors 0-d
        f"{group}/{name}": np.asarray(arr, order="C")
        for group, state in states.items()
        for name, arr in state.items()
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_file(flat, str(tmp), metadata={"meta": json.dumps(meta, default=str)})


class FlowerRunner:
    """Runs one seed's methods on the ServerApp's Grid (a :class:`fedepth.transport.
    FleetRunner`)."""

    def __init__(
        self,
        grid: Grid,
        settings: AppSettings,
        fleet: Fleet,
        initial: State,
        config: SimConfig,
    ) -> None:
        self.grid = grid
        self.settings = settings
        self.fleet = fleet
        self.initial = {k: np.asarray(v) for k, v in initial.items()}
        self.config = config
        self._sim = Simulation(fleet, initial, config)  # its evaluation, nothing else
        self._nodes_ready = False

    def start(self, first: tuple[str, Mapping[str, Any] | None] | None = None) -> None:
        """Wait for the nodes (once)."""
        if not self._nodes_ready:
            wanted = self.settings.min_nodes or len(self.fleet.clients)
            wait_for_nodes(self.grid, wanted, self.settings.node_wait_s)
            self._nodes_ready = True

    def run(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        then: tuple[str, Mapping[str, Any] | None] | None = None,
    ) -> FlowerMethodRun:
        """Run ``method`` (strategy ``params``; None: the config's) from round 0."""
        self.start()
        cfg = self.config
        params = dict(cfg.method_params.get(method, {}) if params is None else params)
        dims = {q[1].dim for q in self.fleet.test_queries if q[1] is not None}
        algorithm = create_strategy(method, **params)
        robust = self.settings.robust_aggregation
        if robust != "mean" and aggregates_clusterwise(algorithm):  # as the coordinator
            algorithm.cluster_rule = functools.partial(
                robust_mean, method=robust, trim=self.settings.trim_fraction
            )
        bridge = FedepthStrategy(
            algorithm,
            cfg,
            data_dir=str(Path(self.fleet.scenario.root).resolve()),
            order=[i.cid for i in self.fleet.infos],
            descriptor_dim=dims.pop() if len(dims) == 1 else None,
            fraction_evaluate=self.settings.fraction_evaluate,
        )
        records: list[RoundRecord] = []
        samples: dict[str, list[Sample]] = {}
        wall: list[float] = []
        t_round = [time.perf_counter()]

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            if server_round == 0:  # before the first round: the in-process run does not
                t_round[0] = time.perf_counter()
                return None
            rec = round_record(bridge.rounds[-1])
            pictures = self._sim.evaluate_round(bridge.algorithm, rec)
            if pictures is not None:
                samples.clear()
                samples.update(pictures)
            records.append(rec)
            now = time.perf_counter()
            wall.append(now - t_round[0])
            t_round[0] = now
            log.info(
                "%s round %d/%d: loss %.3f%s, %d update(s), %d left out",
                method,
                server_round,
                cfg.rounds,
                rec.mean_loss,
                "" if rec.test is None else f", test abs_rel {rec.test['all']['abs_rel']:.3f}",
                len(bridge.rounds[-1].accepted),
                len(bridge.rounds[-1].left_out),
            )
            return None if rec.test is None else MetricRecord(dict(rec.test["all"]))

        bridge.start(
            self.grid,
            state_to_record(self.initial),
            num_rounds=cfg.rounds,
            timeout=self.settings.round_timeout_s,
            evaluate_fn=evaluate,
        )
        strategy = bridge.algorithm
        save_server_state(
            self.settings.spec.out / TRANSPORT / f"seed{cfg.seed}" / f"{method}.safetensors",
            bridge,
        )
        final, groups, per_seq = final_metrics(records, cfg.last_rounds)
        clusters, out_params = strategy_outputs(strategy, params)
        transport = {
            "nodes": len(bridge.members),
            "clients": list(bridge.members),
            "left_out_of_run": {str(n): why for n, why in bridge.excluded.items()},
            "left_out_of_rounds": {
                str(r.round): dict(r.left_out) for r in bridge.rounds if r.left_out
            },
            "round_wall_seconds": wall,
            "describe_seconds": bridge.describe_s,
            "robust_aggregation": robust,
        }
        return FlowerMethodRun(
            method,
            records,
            final,
            per_seq,
            groups,
            clusters,
            self.fleet.descriptor_seconds,
            bridge.describe_s,
            samples,
            out_params,
            strategy,
            transport=transport,
        )

    def close(self) -> None:
        """Nothing to release: the nodes belong to Flower's runtime."""


class FlowerTransport:
    """The :class:`fedepth.transport.Transport` of a ServerApp: opens a :class:`FlowerRunner`
    on its Grid for each seed."""

    def __init__(self, grid: Grid, settings: AppSettings) -> None:
        self.grid = grid
        self.settings = settings

    def __call__(
        self,
        fleet: Fleet,
        initial: State,
        config: SimConfig,
        workdir: Path,
        *,
        progress: bool = False,
    ) -> FlowerRunner:
        return FlowerRunner(self.grid, self.settings, fleet, initial, config)
