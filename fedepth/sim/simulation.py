"""The in-process federation: :class:`Simulation` runs a strategy and its clients round by round.

Each round is :meth:`fedepth.rounds.RoundDriver.run_round`, the round driver the coordinator
runs too (select, plan, collect, validate, close, aggregate), over an in-process transport: the
clients train as jobs of an executor, and the coordinator's wire format is measured by doing it.
The simulation records the round, evaluates, and hands the state that resumes an interrupted
run (:class:`RunState`) to a :class:`Checkpointer`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from collections.abc import Sequence as AbcSequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from fedepth.data.sequence import Sequence as RGBDSequence
from fedepth.models import set_state
from fedepth.models.state import State
from fedepth.recipe import TrainRecipe, round_lr
from fedepth.rounds import RoundDriver, RoundRules
from fedepth.sim.config import SimConfig
from fedepth.sim.evaluation import Router, Sample, evaluate_sequence
from fedepth.sim.executors import ClientJob, Executor, JobResult, SequentialExecutor
from fedepth.sim.fleet import Fleet
from fedepth.sim.records import (
    MethodRun,
    RoundRecord,
    _mean_dicts,
    final_metrics,
    final_validation,
    strategy_outputs,
)
from fedepth.sim.wire import state_nbytes, wire_seconds
from fedepth.strategies import (
    ClientInfo,
    ClientUpdate,
    ClusteredStrategy,
    FeDepth,
    Strategy,
    TrainTask,
    create_strategy,
)

log = logging.getLogger(__name__)


@dataclass
class RunState:
    """A method's run after ``rounds_done`` rounds: everything resuming it exactly needs."""

    method: str
    rounds_done: int
    #: :meth:`Strategy.state_dict` (JSON-able metadata, named states) of the server side
    strategy_meta: dict[str, Any]
    strategy_states: dict[str, State]
    #: every participant's client-hook memory (SCAFFOLD's c_i, FedDyn's g_i), by client id
    memory: dict[str, dict[str, State]]
    records: list[RoundRecord]
    #: the pictures of the latest evaluation
    samples: dict[str, list[Sample]]


class Checkpointer(Protocol):
    """Where :meth:`Simulation.run` keeps a method's state after every round (see
    :class:`fedepth.runstate.RunCheckpoint` for the one on disk)."""

    def load(self) -> RunState | None: ...

    def save(self, state: RunState) -> None: ...


class Simulation:
    """Runs methods on one prepared fleet from one initial state."""

    def __init__(
        self, fleet: Fleet, initial: State, config: SimConfig, executor: Executor | None = None
    ) -> None:
        self.fleet = fleet
        self.initial = dict(initial)
        self.config = config
        self.executor = executor or SequentialExecutor()
        self._eval_model = config.build_model()

    def _strategy(self, method: str) -> Strategy:
        return create_strategy(method, **dict(self.config.method_params.get(method, {})))

    def run(
        self,
        method: str,
        *,
        progress: bool = True,
        on_round: Callable[[RoundRecord], None] | None = None,
        checkpoint: Checkpointer | None = None,
    ) -> MethodRun:
        """Run ``method`` for the configured rounds.

        With a ``checkpoint``, the run starts from the state it holds (if any: the strategy's
        server state, the clients' hook memory, the rounds recorded so far and the latest
        pictures) and saves that state after every round, so that an interrupted run resumes
        from its last finished round and ends with the numbers of an uninterrupted one.
        ``on_round`` is called after each round, once its state is saved.
        """
        cfg = self.config
        t0 = time.perf_counter()
        strategy = self._strategy(method)
        pooled = bool(getattr(strategy, "pooled", False))
        clients = self.fleet.clients
        if pooled:
            pooled_info = ClientInfo("pooled", sum(c.num_samples for c in clients))
            strategy.initialize([pooled_info], self.initial)
            participants: list[tuple[str, list[RGBDSequence]]] = [
                ("pooled", [s for c in clients for s in c.sequences])
            ]
        else:
            strategy.initialize(self.fleet.infos, self.initial)
            participants = [(c.name, c.sequences) for c in clients]
        setup = time.perf_counter() - t0
        memory: dict[str, dict[str, State]] = {cid: {} for cid, _ in participants}
        records: list[RoundRecord] = []
        samples: dict[str, list[Sample]] = {}
        saved = checkpoint.load() if checkpoint is not None else None
        if saved is not None:
            if saved.method != method or set(saved.memory) != set(memory):
                raise ValueError(
                    f"the checkpoint holds a run of {saved.method} over {len(saved.memory)} "
                    f"participants; cannot resume {method} over {len(memory)} from it"
                )
            strategy.load_state_dict(saved.strategy_meta, saved.strategy_states)
            memory.update(saved.memory)
            records, samples = list(saved.records), dict(saved.samples)
        start = saved.rounds_done if saved is not None else 0
        bar = tqdm(
            range(start, cfg.rounds),
            desc=method,
            unit="round",
            initial=start,
            total=cfg.rounds,
            disable=not progress,
        )
        driver = RoundDriver(
            strategy,
            RoundRules(cfg.rounds),  # every participant, every round; no deadline
            recipe=(
                (lambda r: pooled_recipe(cfg, strategy, r, len(clients))) if pooled else cfg.recipe
            ),
            bounds=cfg.update_bounds(),
        )
        jobs = _ClientJobs(self.executor, cfg, dict(participants), memory)
        for rnd in bar:
            out = driver.run_round(rnd, [cid for cid, _ in participants], jobs)
            for cid, why in out.rejected.items():
                log.warning(
                    "%s round %d: the update of %s is left out of the round, as a coordinator "
                    "rejects it: %s",
                    method,
                    rnd,
                    cid,
                    why,
                )
            rec = RoundRecord(
                round=rnd,
                train_seconds=jobs.train_s,
                aggregate_seconds=out.aggregate_s + out.configure_s,
                wire_seconds=jobs.wire_s,
                mean_loss=_mean_loss(out.accepted),
                download_bytes={
                    cid: state_nbytes(t.state)
                    + sum(state_nbytes(s) for s in t.hook_state.values())
                    for cid, t in out.tasks.items()
                },
                upload_bytes={
                    r.update.cid: state_nbytes(r.update.state)
                    + sum(state_nbytes(s) for s in r.update.extra.values())
                    for r in jobs.results
                },
            )
            pictures = self.evaluate_round(strategy, rec)
            if pictures is not None:
                samples = pictures
            records.append(rec)
            if checkpoint is not None:
                meta, states = strategy.state_dict()
                checkpoint.save(RunState(method, rnd + 1, meta, states, memory, records, samples))
            if rec.test is not None:
                bar.set_postfix(
                    abs_rel=f"{rec.test['all']['abs_rel']:.3f}", loss=f"{rec.mean_loss:.3f}"
                )
            else:
                bar.set_postfix(loss=f"{rec.mean_loss:.3f}")
            if on_round:
                on_round(rec)
        final, groups, per_seq = final_metrics(records, cfg.last_rounds)
        clusters, params = strategy_outputs(
            strategy, self.config.method_params.get(method, {}), pooled=pooled
        )
        return MethodRun(
            method,
            records,
            final,
            per_seq,
            groups,
            clusters,
            self.fleet.descriptor_seconds,
            setup,
            samples,
            params,
            strategy,
            final_validation(records, cfg.last_rounds),
        )

    def evaluate_round(
        self, strategy: Strategy, rec: RoundRecord
    ) -> dict[str, list[Sample]] | None:
        """Evaluate after round ``rec.round`` where a run does (its last ``last_rounds`` rounds
        and every ``eval_every``-th): fills ``rec``'s test metrics and routes and, in the
        averaged rounds, its route candidates and, with a validation split, its validation
        metrics (:meth:`validate`); returns the pictures (None: not evaluated).
        What every transport that drives ``strategy`` round by round calls after a round."""
        cfg = self.config
        last = rec.round >= cfg.rounds - cfg.last_rounds
        if not (last or (cfg.eval_every and (rec.round + 1) % cfg.eval_every == 0)):
            return None
        rec.test, rec.routes, samples = self.evaluate(strategy)
        if last:
            rec.candidates = self.score_candidates(strategy, rec.routes) or None
        if self.fleet.validation:
            rec.validation = self.validate(strategy)
        return samples

    def validate(self, strategy: Strategy) -> dict[str, dict[str, float]]:
        """Every training client's held-out frames (``fleet.validation``) scored with the
        model it downloads (:meth:`Strategy.model_for`: a clustered method's mean of the
        client's clusters, a global method's model, CL's pooled one): ``client:<name>`` (the
        mean over its validation sequences) and ``all``, the mean over clients. The test
        sequences play no part."""
        pooled = bool(getattr(strategy, "pooled", False))
        per_client: dict[str, dict[str, float]] = {}
        for client in self.fleet.clients:
            sequences = self.fleet.validation.get(client.name, [])
            if not sequences:
                continue
            set_state(self._eval_model, strategy.model_for("pooled" if pooled else client.name))
            rows = [evaluate_sequence(self._eval_model, s, self.config)[0] for s in sequences]
            per_client[client.name] = _mean_dicts(rows)
        out = {"all": _mean_dicts(list(per_client.values()))}
        out.update({f"client:{k}": v for k, v in per_client.items()})
        return out

    def evaluate(
        self, strategy: Router
    ) -> tuple[
        dict[str, dict[str, float]],
        dict[str, list[int]],
        dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]],
    ]:
        """Metrics of every test sequence with its routed model (no test-time training):
        overall (mean over sequences), per platform and environment group, per sequence."""
        per_seq: dict[str, dict[str, float]] = {}
        routes: dict[str, list[int]] = {}
        samples = {}
        groups: dict[str, list[dict[str, float]]] = {}
        for seq, desc, extra in self.fleet.test_queries:
            labels = {"platform": seq.meta.platform, "environment": seq.meta.environment}
            decision = strategy.route(desc, labels=labels, extra=extra)
            routes[seq.name] = decision.clusters
            set_state(self._eval_model, decision.state)
            metrics, sample = evaluate_sequence(self._eval_model, seq, self.config)
            per_seq[seq.name] = metrics
            samples[seq.name] = sample
            groups.setdefault(f"platform:{seq.meta.platform}", []).append(metrics)
            groups.setdefault(f"environment:{seq.meta.environment}", []).append(metrics)
        out = {"all": _mean_dicts(list(per_seq.values()))}
        out.update({g: _mean_dicts(rows) for g, rows in groups.items()})
        out.update({f"seq:{k}": v for k, v in per_seq.items()})
        return out, routes, samples

    def score_candidates(
        self, strategy: Strategy, routes: Mapping[str, list[int]]
    ) -> dict[str, dict[str, dict[str, float]]]:
        """Each test sequence that is served by an average of several clusters, scored with
        every one of those clusters' models alone (cluster index as a string -> metrics, with
        FeDepth's ``S_k`` of the sequence as ``jeffreys``): does averaging the candidates
        help, or would one of them, the nearest say, have served the sequence better? Empty
        for strategies without cluster models and for single-cluster routes."""
        if not isinstance(strategy, ClusteredStrategy):
            return {}
        out: dict[str, dict[str, dict[str, float]]] = {}
        for seq, desc, _ in self.fleet.test_queries:
            clusters = routes.get(seq.name, [])
            if len(clusters) < 2:
                continue
            scores = (
                strategy.cluster_scores(desc)
                if isinstance(strategy, FeDepth) and desc is not None
                else None
            )
            out[seq.name] = {}
            for k in clusters:
                set_state(self._eval_model, strategy.average_of([k]))
                metrics, _ = evaluate_sequence(self._eval_model, seq, self.config)
                if scores is not None:
                    metrics["jeffreys"] = float(scores[k])
                out[seq.name][str(k)] = metrics
        return out


def pooled_recipe(cfg: SimConfig, strategy: Strategy, rnd: int, num_clients: int) -> TrainRecipe:
    """The recipe of CL's pooled participant in round ``rnd``: as many local steps as the
    ``num_clients`` clients together (the upper bound sees the same number of gradient steps
    and samples as every federated method), and the strategy's own learning rate, schedule
    across rounds and warmup where it sets them (:class:`~fedepth.strategies.cl.Centralized`),
    the run's where it does not."""

    def own(name: str, default: Any) -> Any:
        value = getattr(strategy, name, None)
        return default if value is None else value

    lr = round_lr(
        own("lr", cfg.lr),
        rnd,
        cfg.rounds,
        own("round_schedule", cfg.round_schedule),
        own("final_lr_fraction", cfg.round_final_lr_fraction),
    )
    return replace(
        cfg.recipe(rnd),
        local_steps=cfg.local_steps * num_clients,
        lr=lr,
        warmup_steps=own("warmup_steps", cfg.warmup_steps),
    )


def _mean_loss(updates: AbcSequence[ClientUpdate]) -> float:
    """The mean training loss of a round's accepted updates (NaN when none was accepted)."""
    if not updates:
        return float("nan")
    return float(np.mean([u.metrics["loss"] for u in updates]))


class _ClientJobs:
    """The simulation's transport (:class:`fedepth.rounds.Participants`): a round's tasks as
    client jobs through the executor, each participant keeping its hook memory; it measures
    what the coordinator's wire format would cost the round (:func:`wire_seconds`)."""

    def __init__(
        self,
        executor: Executor,
        config: SimConfig,
        sequences: dict[str, list[RGBDSequence]],
        memory: dict[str, dict[str, State]],
    ) -> None:
        self.executor = executor
        self.config = config
        self.sequences = sequences
        self.memory = memory
        #: the latest round's results, seconds in training and on the wire
        self.results: list[JobResult] = []
        self.train_s = 0.0
        self.wire_s = 0.0

    def collect(self, rnd: int, tasks: Mapping[str, TrainTask]) -> list[ClientUpdate]:
        jobs = [
            ClientJob(cid, self.sequences[cid], task, self.memory[cid], rnd=rnd)
            for cid, task in tasks.items()
        ]
        t0 = time.perf_counter()
        self.results = self.executor.map(self.config, jobs)
        self.train_s = time.perf_counter() - t0
        for res in self.results:
            self.memory[res.update.cid] = res.memory
        # the wire's own verdict on non-finite uploads is the driver's too (fedepth.updates),
        # which decides with the norm bounds as well
        self.wire_s, _ = wire_seconds(
            [[t.state, *t.hook_state.values()] for t in tasks.values()],
            [[r.update.state, *r.update.extra.values()] for r in self.results],
        )
        return [r.update for r in self.results]
