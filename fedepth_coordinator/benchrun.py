"""``fedepth bench --transport grpc``: the benchmark through a real coordinator and robots.

:class:`GrpcBench` runs the methods of one prepared :class:`~fedepth.sim.Fleet` the way a fleet
would: for each method it starts ``fedepth-coordinator`` as a child process (loopback, port 0,
a fresh SQLite state directory, the strategy and initial weights the in-process run uses, the
``SimConfig``'s training recipe as its ``training`` section, every robot selected every round,
quorum = all robots, no deadline), and every client of the scenario is a robot in its own OS
process (``python -m fedepth_coordinator.benchrun``). A robot registers with its labels and
sample count, uploads the descriptor (and PACFL basis) the parent computed once in
:func:`~fedepth.sim.prepare_fleet`, then for every round downloads its task (the model and the
recipe, over the wire), trains it with :func:`fedepth.sim.run_job` (so
:func:`fedepth.client.train_round`, the function every client runs; same seed, same hook memory
kept by the robot) and uploads the update with its extra state. Robot processes are started
once and take part in each method's run in turn.

Evaluation asks the coordinator: each test sequence's descriptor goes through ``Route`` (as an
operator principal) and the routed model is scored by :meth:`fedepth.sim.Simulation.evaluate`,
the in-process evaluation code. To evaluate the rounds the in-process run evaluates (the last
``last_rounds`` and every ``eval_every``-th), the robots wait before training the round after
such a round until the parent has evaluated it (a gate file), so the coordinator's models
cannot move on meanwhile. The final strategy is read back from the coordinator's durable state
(its last checkpoint), so ``MethodRun.strategy`` holds the coordinator's cluster models.

For the same seed the results equal the in-process run's exactly (see
``tests/coordinator/test_bench_grpc.py``): descriptors, weights and hook state travel as raw
float64/float32 bytes, the coordinator initializes the strategy with robots sorted by id and
aggregates updates sorted by id, and robot ids are numbered in scenario order so that both
orders are the in-process ones.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tqdm import tqdm

from fedepth.descriptor import Descriptor
from fedepth.models.card import CARD_KEY, ModelCard
from fedepth.sim import (
    ClientJob,
    Fleet,
    MethodRun,
    RoundRecord,
    SimConfig,
    Simulation,
    config_dict,
    final_metrics,
    run_job,
    state_nbytes,
    strategy_outputs,
)
from fedepth.strategies import (
    ClientInfo,
    ClientUpdate,
    RouteDecision,
    State,
    Strategy,
    TrainTask,
    create_strategy,
)
from fedepth_coordinator.auth import add_principal
from fedepth_coordinator.blobs import BlobReader
from fedepth_coordinator.client import CoordinatorClient, DownloadedModel, open_channel
from fedepth_coordinator.config import CoordinatorConfig, config_from_dict
from fedepth_coordinator.domain import Phase, UploadReceipt
from fedepth_coordinator.robot import RobotLoop, RobotProfile
from fedepth_coordinator.simulate import CoordinatorProcess
from fedepth_coordinator.state import open_store
from fedepth_coordinator.tensors import STATE

log = logging.getLogger(__name__)

#: The principal the parent routes test sequences as.
OPERATOR = "bench-operator"
_NO_DEADLINE_S = 30 * 24 * 3600.0
_POLL_S = 0.1


def robot_id(index: int, name: str, count: int) -> str:
    """The coordinator id of scenario client ``index``: numbered so that sorting the ids (the
    coordinator's order) gives the scenario order, and restricted to the id alphabet."""
    width = max(3, len(str(count - 1)))
    return f"c{index:0{width}d}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}"[:64]


@dataclass
class GrpcMethodRun(MethodRun):
    """A method's run through the coordinator, with what the transport measured."""

    transport: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "transport": "grpc", "grpc": self.transport}


class _CoordinatorRouter:
    """:class:`fedepth.sim.Router` over the coordinator's ``Route`` call."""

    def __init__(self, client: CoordinatorClient) -> None:
        self.client = client

    def route(
        self,
        descriptor: Descriptor | None,
        *,
        labels: Mapping[str, str] | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> RouteDecision:
        return self.client.route(descriptor, labels=labels, summaries=extra)


class BenchRunError(RuntimeError):
    """A robot process or the coordinator failed; the message points at its log."""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(path)


def eval_rounds(config: SimConfig) -> list[int]:
    """The rounds the in-process simulation evaluates after."""
    return [
        r
        for r in range(config.rounds)
        if r >= config.rounds - config.last_rounds
        or (config.eval_every and (r + 1) % config.eval_every == 0)
    ]


def _launch_key(method: str, params: Mapping[str, Any]) -> str:
    return json.dumps([method, dict(params)], sort_keys=True, default=str)


class _CoordinatorStart:
    """A coordinator process being started in the background (a thread waits for its port)."""

    def __init__(self, key: str, coordinator: CoordinatorProcess, sdir: Path) -> None:
        self.key, self.coordinator, self.sdir = key, coordinator, sdir
        self._port = 0
        self._seconds = 0.0
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._start, name="coordinator-start", daemon=True)

    def _start(self) -> None:
        t0 = time.perf_counter()
        try:
            self._port = self.coordinator.start()
        except BaseException as exc:
            self._error = exc
        self._seconds = time.perf_counter() - t0

    def result(self) -> tuple[int, float]:
        """(port, seconds the start-up took), once it has started; raises what start raised."""
        self.thread.join()
        if self._error is not None:
            raise self._error
        return self._port, self._seconds


@dataclass
class _ObservedRun:
    """What the parent saw of one run: when the fleet formed, evaluations, round history."""

    formed_at: float | None = None
    tests: dict[int, tuple[Any, Any, float]] = field(default_factory=dict)
    samples: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = field(
        default_factory=dict
    )
    history: list[Any] = field(default_factory=list)


class GrpcBench:
    """Methods of one fleet through real coordinators, one OS process per robot (loopback).

    ``workdir`` receives the logs (``robots/<id>.log``, ``<session>/coordinator.log``), the
    credentials and, with ``keep_state``, each run's coordinator state directory. Use as a
    context manager (or call :meth:`close`): the robot processes live until then.
    """

    def __init__(
        self,
        fleet: Fleet,
        initial: State,
        config: SimConfig,
        workdir: str | os.PathLike[str],
        *,
        progress: bool = False,
        keep_state: bool = False,
        stall_timeout_s: float = 3600.0,
    ) -> None:
        self.fleet = fleet
        # C order for safetensors; np.asarray keeps 0-d tensors 0-d (ascontiguousarray does not)
        self.initial = {k: np.asarray(v, order="C") for k, v in initial.items()}
        self.config = config
        self.workdir = Path(workdir).resolve()
        self.progress = progress
        self.keep_state = keep_state
        self.stall_timeout_s = stall_timeout_s
        self._sim = Simulation(fleet, initial, config)  # its evaluate(), nothing else
        clients = fleet.clients
        self.ids = [robot_id(i, c.name, len(clients)) for i, c in enumerate(clients)]
        self.cids = {rid: c.name for rid, c in zip(self.ids, clients, strict=True)}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._tokens: dict[str, str] = {}
        self._sessions = 0
        self._launches = 0
        self._next: _CoordinatorStart | None = None
        self._ready = False
        self._broken = False

    # -- robot processes ---------------------------------------------------------------------
    def _spawn_robots(self) -> None:
        w = self.workdir
        for sub in ("robots", "sessions", "gates", "results"):  # nothing of an earlier bench
            shutil.rmtree(w / sub, ignore_errors=True)
            (w / sub).mkdir(parents=True)
        creds = w / "credentials.yaml"
        creds.unlink(missing_ok=True)
        for rid in [*self.ids, OPERATOR]:
            self._tokens[rid] = add_principal(
                creds, rid, "operator" if rid == OPERATOR else "robot"
            )
        c = self.config
        card = ModelCard(
            model=c.model,
            min_depth=c.min_depth,
            max_depth=c.max_depth,
            input_size=(int(c.image_size[0]), int(c.image_size[1])),
        )
        save_file(
            self.initial, str(w / "initial.safetensors"), metadata={CARD_KEY: card.to_json()}
        )
        arrays: dict[str, np.ndarray] = {}
        robots: dict[str, Any] = {}
        for rid, info in zip(self.ids, self.fleet.infos, strict=True):
            if info.descriptor is None:
                raise ValueError(f"client {info.cid!r} has no descriptor")
            d = info.descriptor
            arrays[f"{rid}/mean"] = d.mean
            arrays[f"{rid}/var"] = d.var
            arrays.update({f"{rid}/extra/{k}": np.asarray(v) for k, v in info.extra.items()})
            robots[rid] = {
                "cid": info.cid,
                "num_samples": info.num_samples,
                "num_frames": d.num_frames,
                "labels": dict(info.labels),
                "extra": sorted(info.extra),
            }
        # float64 in, float64 out: the robots send exactly the parent's descriptors
        np.savez(w / "fleet.npz", **arrays)  # type: ignore[arg-type]
        # the robots' tokens are throwaway (loopback, this run only); removed at close
        fd = os.open(w / "tokens.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self._tokens, f)
        _write_json(
            w / "fleet.json",
            {
                "data_root": str(Path(self.fleet.scenario.root).resolve()),
                "sim": config_dict(self.config),
                "robots": robots,
            },
        )
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        for rid in self.ids:
            cmd = [sys.executable, "-m", "fedepth_coordinator.benchrun"]
            cmd += ["--workdir", str(w), "--robot", rid]
            with open(w / "robots" / f"{rid}.log", "ab") as out:
                self._procs[rid] = subprocess.Popen(
                    cmd, stdout=out, stderr=subprocess.STDOUT, env=env
                )

    def _wait_ready(self, coordinator: CoordinatorProcess) -> None:
        """Until every robot has loaded torch, its data and the model."""
        ready = [self.workdir / "robots" / f"{rid}.ready" for rid in self.ids]
        self._wait(lambda: all(p.exists() for p in ready), "robot processes to start", coordinator)

    def _check_alive(self, coordinator: CoordinatorProcess | None = None) -> None:
        for rid, proc in self._procs.items():
            if proc.poll() is not None:
                log_path = self.workdir / "robots" / f"{rid}.log"
                raise BenchRunError(
                    f"robot process {rid} exited with status {proc.returncode}; "
                    f"{log_path}:\n{_tail(log_path)}"
                )
        child = None if coordinator is None else coordinator.proc
        if coordinator is not None and child is not None and child.poll() is not None:
            raise BenchRunError(
                f"the coordinator exited with status {child.returncode}; "
                f"{coordinator.log_path}:\n{_tail(coordinator.log_path)}"
            )

    def _wait(
        self,
        done: Callable[[], bool],
        what: str,
        coordinator: CoordinatorProcess | None = None,
        progress: Callable[[], object] | None = None,
    ) -> None:
        pause = threading.Event()
        last_change, last = time.monotonic(), None
        while not done():
            self._check_alive(coordinator)
            now = progress() if progress is not None else None
            if now != last:
                last_change, last = time.monotonic(), now
            if time.monotonic() - last_change > self.stall_timeout_s:
                raise BenchRunError(
                    f"no progress for {self.stall_timeout_s:.0f} s waiting for {what}"
                )
            pause.wait(_POLL_S)

    def close(self) -> None:
        """End the robot processes (asked to exit; terminated when they do not)."""
        w = self.workdir
        self._discard(self._next)
        self._next = None
        if self._procs:
            (w / "sessions" / "end").touch()
            # robots stuck in a failed run do not see the end marker: no grace for them
            end = time.monotonic() + (1.0 if self._broken else 30.0)
            for proc in self._procs.values():
                try:
                    proc.wait(max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.terminate()
            for proc in self._procs.values():
                try:
                    proc.wait(10.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            self._procs = {}
            self._ready = False
            self._broken = False
        for name in ("tokens.json", "fleet.json", "fleet.npz", "initial.safetensors"):
            (w / name).unlink(missing_ok=True)

    def __enter__(self) -> GrpcBench:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- one method --------------------------------------------------------------------------
    def _coordinator_config(
        self, method: str, params: Mapping[str, Any], state_dir: Path
    ) -> CoordinatorConfig:
        n = len(self.ids)
        dims = [i.descriptor.dim for i in self.fleet.infos if i.descriptor is not None]
        summary_bytes = max(
            (sum(np.asarray(v).nbytes for v in i.extra.values()) for i in self.fleet.infos),
            default=0,
        )
        recipes = {self.config.recipe(r) for r in range(self.config.rounds)}
        if len(recipes) != 1:
            raise ValueError(
                "the coordinator sends one training recipe for every round; this SimConfig's "
                "recipe changes between rounds"
            )
        return config_from_dict(
            {
                "server": {
                    "host": "127.0.0.1",
                    "port": 0,
                    "max_workers": max(32, 2 * n + 8),  # every robot long-polls on one
                    "max_wait_s": 5.0,
                    "grace_s": 1.0,
                },
                "auth": {"credentials_file": str(self.workdir / "credentials.yaml")},
                "rounds": {
                    "num_rounds": self.config.rounds,
                    "min_robots": n,
                    "fraction": 1.0,
                    "quorum": 1.0,
                    "deadline_s": _NO_DEADLINE_S,
                    "seed": self.config.seed,
                },
                "strategy": {"name": method, "params": dict(params)},
                "training": recipes.pop().to_dict(),
                "model": {"initial_weights": str(self.workdir / "initial.safetensors")},
                "validation": {
                    "max_descriptor_dim": max([8192, *dims]),
                    "max_summary_bytes": max(1 << 20, 2 * summary_bytes),
                },
                "state": {"dir": str(state_dir), "backend": "sqlite"},
                "log_level": "INFO",
            }
        )

    def start(self, first: tuple[str, Mapping[str, Any] | None] | None = None) -> None:
        """Start the robot processes, and the coordinator of the ``first`` run (method,
        params), in the background now (say, while in-process methods run); :meth:`run` does
        it otherwise."""
        if not self._procs:
            self._spawn_robots()
        if first is not None and self._next is None:
            self._next = self._launch(first[0], self._params(*first))

    def _params(self, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
        out = dict(self.config.method_params.get(method, {}) if params is None else params)
        if getattr(create_strategy(method, **out), "pooled", False):
            raise ValueError(
                f"method {method!r} trains one pooled participant, not a fleet of robots; "
                "run it in-process"
            )
        return out

    def _launch(self, method: str, params: dict[str, Any]) -> _CoordinatorStart:
        """Start a coordinator for ``method`` in the background (a thread waits for its port)."""
        sdir = self.workdir / f"{self._launches:03d}-{method}"
        self._launches += 1
        if sdir.exists():
            shutil.rmtree(sdir)
        sdir.mkdir(parents=True)
        coordinator = CoordinatorProcess(
            self._coordinator_config(method, params, sdir / "state"),
            log_path=sdir / "coordinator.log",
        )
        launch = _CoordinatorStart(_launch_key(method, params), coordinator, sdir)
        launch.thread.start()
        return launch

    def _discard(self, launch: _CoordinatorStart | None) -> None:
        if launch is not None:
            launch.thread.join()
            if launch.coordinator.proc is not None:
                launch.coordinator.stop()

    def run(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        then: tuple[str, Mapping[str, Any] | None] | None = None,
    ) -> GrpcMethodRun:
        """Run ``method`` (strategy ``params``; default: the config's) through a coordinator.

        ``then`` names the next run (method, params): its coordinator starts while this one
        trains, so its start-up is off the critical path.
        """
        params = self._params(method, params)
        if not self._procs:
            self._spawn_robots()
        launch, self._next = self._next, None
        if launch is None or launch.key != _launch_key(method, params):
            self._discard(launch)
            launch = self._launch(method, params)  # the first one: while the robots load
        cfg, w = self.config, self.workdir
        k = self._sessions
        self._sessions += 1
        coordinator = launch.coordinator
        bar = tqdm(
            total=cfg.rounds, desc=f"{method} (grpc)", unit="round", disable=not self.progress
        )
        try:
            port, start_s = launch.result()
            if not self._ready:
                self._wait_ready(coordinator)
                self._ready = True
            target = f"127.0.0.1:{port}"
            t_session = time.perf_counter()
            gates = [r for r in eval_rounds(cfg) if r < cfg.rounds - 1]
            _write_json(
                w / "sessions" / f"{k:03d}.json",
                {"method": method, "target": target, "gates": gates, "rounds": cfg.rounds},
            )
            if then is not None:
                self._next = self._launch(then[0], self._params(*then))
            observed = self._observe_run(k, method, target, coordinator, bar)
            result_dir = w / "results" / f"{k:03d}"
            self._wait(
                lambda: all((result_dir / f"{rid}.json").exists() for rid in self.ids),
                f"the robots to finish {method}",
                coordinator,
            )
            peak_rss = coordinator.peak_rss_bytes()
        except BaseException:
            self._broken = True
            raise
        finally:
            bar.close()
            status = coordinator.stop() if coordinator.proc is not None else -1
        if status != 0:
            raise BenchRunError(
                f"the coordinator of {method} exited with status {status}; see "
                f"{coordinator.log_path}"
            )
        strategy, rounds_done = load_final_strategy(launch.sdir / "state", method, params)
        if rounds_done != cfg.rounds:
            raise BenchRunError(f"the coordinator ran {rounds_done} of {cfg.rounds} rounds")
        if not self.keep_state:
            shutil.rmtree(launch.sdir / "state", ignore_errors=True)
        reports = {}
        for rid in self.ids:
            rows = json.loads((result_dir / f"{rid}.json").read_text(encoding="utf-8"))
            reports[rid] = {int(r): row for r, row in rows.items()}
        # setup: coordinator start-up, then registration, descriptors and clustering
        formed = observed.formed_at if observed.formed_at is not None else t_session
        setup = start_s + (formed - t_session)
        return self._method_run(method, params, strategy, reports, observed, setup, peak_rss)

    def _observe_run(
        self,
        k: int,
        method: str,
        target: str,
        coordinator: CoordinatorProcess,
        bar: tqdm[Any],
    ) -> _ObservedRun:
        """Follow the run as an operator: evaluate the routed models after each evaluated round
        (then open its gate), until the last round closed."""
        cfg = self.config
        evals = eval_rounds(cfg)
        out = _ObservedRun()
        with CoordinatorClient(open_channel(target), OPERATOR, self._tokens[OPERATOR]) as op:
            closed = [0]

            def reached(n: int) -> Callable[[], bool]:
                def check() -> bool:
                    status = op.fleet_status()
                    if out.formed_at is None and status.phase is not Phase.WAITING_FOR_FLEET:
                        out.formed_at = time.perf_counter()
                    closed[0] = len(status.history)
                    bar.update(closed[0] - bar.n)
                    return closed[0] >= n

                return check

            for r in sorted({*evals, cfg.rounds - 1}):
                what = f"round {r} of {method} to close"
                self._wait(reached(r + 1), what, coordinator, lambda: closed[0])
                if r not in evals:
                    continue
                t_eval = time.perf_counter()
                test, routes, out.samples = self._sim.evaluate(_CoordinatorRouter(op))
                out.tests[r] = (test, routes, time.perf_counter() - t_eval)
                if r < cfg.rounds - 1:  # the robots wait for this before training round r + 1
                    (self.workdir / "gates" / f"{k:03d}-{r}").touch()
            out.history = list(op.fleet_status().history)
        return out

    def _method_run(
        self,
        method: str,
        params: Mapping[str, Any],
        strategy: Strategy,
        reports: dict[str, dict[int, dict[str, Any]]],
        observed: _ObservedRun,
        setup: float,
        peak_rss: int,
    ) -> GrpcMethodRun:
        cfg, history, tests = self.config, observed.history, observed.tests
        records: list[RoundRecord] = []
        for rnd in range(cfg.rounds):
            per = [reports[rid][rnd] for rid in self.ids]  # scenario order, as in-process
            wall = float(history[rnd].duration_s)
            busy = max(p["gate_s"] + p["train_s"] for p in per)
            rec = RoundRecord(
                round=rnd,
                train_seconds=float(sum(p["train_s"] for p in per)),
                # the round was open but no robot was training (or waiting on evaluation):
                # transfers, checks, aggregation, long-poll wake-ups; from outside the
                # coordinator they cannot be told apart, so all of it counts as wire time
                aggregate_seconds=0.0,
                wire_seconds=max(0.0, wall - busy),
                mean_loss=float(np.mean([p["loss"] for p in per])),
                download_bytes={
                    self.cids[rid]: reports[rid][rnd]["down_bytes"] for rid in self.ids
                },
                upload_bytes={self.cids[rid]: reports[rid][rnd]["up_bytes"] for rid in self.ids},
            )
            if rnd in tests:
                rec.test, rec.routes, _ = tests[rnd]
            records.append(rec)
        final, groups, per_seq = final_metrics(records, cfg.last_rounds)
        clusters, out_params = strategy_outputs(strategy, params)

        def stat(key: str, fn: Callable[[list[float]], Any]) -> list[float]:
            return [
                float(fn([reports[rid][r][key] for rid in self.ids])) for r in range(cfg.rounds)
            ]

        transport = {
            "robots": len(self.ids),
            "processes": len(self.ids),
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
            self.fleet.descriptor_seconds,
            setup,
            observed.samples,
            out_params,
            strategy,
            transport=transport,
        )


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


# -- the robot process --------------------------------------------------------------------------
class _TimedClient(CoordinatorClient):
    """A robot's client that times its transfers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.download_s: dict[int, float] = {}
        self.upload_s: dict[int, float] = {}

    def download_model(self, round: int = 0, *, latest: bool = False) -> DownloadedModel:
        t0 = time.perf_counter()
        out = super().download_model(round, latest=latest)
        self.download_s[round] = time.perf_counter() - t0
        return out

    def upload_update(self, round: int, update: ClientUpdate) -> UploadReceipt:
        t0 = time.perf_counter()
        out = super().upload_update(round, update)
        self.upload_s[round] = time.perf_counter() - t0
        return out


class _ParentWatchdog:
    """Waits for a file the benchmark process writes; exits when that process is gone."""

    def __init__(self) -> None:
        self.pid = os.getppid()

    def wait_for(self, path: Path, alternative: Path | None = None) -> Path:
        pause = threading.Event()
        while True:
            for p in (path, alternative):
                if p is not None and p.exists():
                    return p
            if os.getppid() != self.pid:
                raise SystemExit("the benchmark process is gone")
            pause.wait(0.02)


@dataclass
class _RobotSession:
    """One robot's part in one method's run: training with :func:`run_job`, what it measured."""

    workdir: Path
    index: int
    gates: set[int]
    rid: str
    cid: str
    sequences: list[Any]
    config: SimConfig
    model: Any
    watchdog: _ParentWatchdog
    memory: dict[str, State] = field(default_factory=dict)
    rounds: dict[int, dict[str, float]] = field(default_factory=dict)

    def train(self, rnd: int, task: TrainTask) -> ClientUpdate:
        t0 = time.perf_counter()
        if rnd - 1 in self.gates:  # the parent evaluates round rnd - 1 first
            self.watchdog.wait_for(self.workdir / "gates" / f"{self.index:03d}-{rnd - 1}")
        gate_s = time.perf_counter() - t0
        if task.recipe != self.config.recipe(rnd):  # the in-process run's, over the wire
            raise BenchRunError(
                f"robot {self.rid}, round {rnd}: the coordinator sent the training recipe "
                f"{task.recipe}, the in-process run trains with {self.config.recipe(rnd)}"
            )
        job = ClientJob(self.cid, self.sequences, task, self.memory, rnd=rnd)
        res = run_job(self.config, job, self.model)
        self.memory = res.memory  # the robot keeps its hook state (SCAFFOLD c_i, FedDyn g_i)
        up = res.update
        self.rounds[rnd] = {
            "loss": float(up.metrics["loss"]),
            "train_s": float(res.seconds),
            "gate_s": gate_s,
            "down_bytes": state_nbytes(task.state)
            + sum(state_nbytes(s) for s in task.hook_state.values()),
            "up_bytes": state_nbytes(up.state) + sum(state_nbytes(s) for s in up.extra.values()),
        }
        return replace(up, cid=self.rid)


def robot_main(workdir: Path, rid: str) -> int:
    """One robot: join each method's coordinator in turn and train with :func:`run_job`."""
    import torch

    from fedepth.data.scenario import load_scenario

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    watchdog = _ParentWatchdog()
    spec = json.loads((workdir / "fleet.json").read_text(encoding="utf-8"))
    token = json.loads((workdir / "tokens.json").read_text(encoding="utf-8"))[rid]
    me = spec["robots"][rid]
    sim = dict(spec["sim"])
    sim["image_size"] = tuple(sim["image_size"])
    cfg = SimConfig(**sim)
    torch.set_num_threads(cfg.threads)  # as SequentialExecutor: same threads, same numbers
    with np.load(workdir / "fleet.npz") as arrays:
        profile = RobotProfile(
            num_samples=int(me["num_samples"]),
            descriptor=Descriptor(
                mean=arrays[f"{rid}/mean"],
                var=arrays[f"{rid}/var"],
                num_frames=int(me["num_frames"]),
            ),
            labels=dict(me["labels"]),
            summaries={k: arrays[f"{rid}/extra/{k}"] for k in me["extra"]},
        )
    cid = str(me["cid"])
    scenario = load_scenario(spec["data_root"])
    try:
        sequences = scenario.client(cid).sequences
        model = cfg.build_model()
        (workdir / "robots" / f"{rid}.ready").touch()
        k = 0
        while True:
            found = watchdog.wait_for(
                workdir / "sessions" / f"{k:03d}.json", workdir / "sessions" / "end"
            )
            if found.name == "end":
                return 0
            session = json.loads(found.read_text(encoding="utf-8"))
            robot = _RobotSession(
                workdir, k, set(session["gates"]), rid, cid, sequences, cfg, model, watchdog
            )
            client = _TimedClient(open_channel(session["target"]), rid, token)
            with client:
                loop = RobotLoop(client, profile, robot.train, poll_s=5.0, retry_for_s=60.0)
                if not loop.run().finished:
                    raise RuntimeError(f"robot {rid}: the {session['method']} run did not finish")
            for rnd, row in robot.rounds.items():
                row["download_s"] = client.download_s.get(rnd, 0.0)
                row["upload_s"] = client.upload_s.get(rnd, 0.0)
            out = workdir / "results" / f"{k:03d}"
            out.mkdir(parents=True, exist_ok=True)
            _write_json(out / f"{rid}.json", robot.rounds)
            k += 1
    finally:
        scenario.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fedepth_coordinator.benchrun",
        description="A robot process of `fedepth bench --transport grpc` (started by it).",
    )
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument("--robot", required=True)
    args = p.parse_args(argv)
    return robot_main(args.workdir, args.robot)


if __name__ == "__main__":
    code = main()
    # a worker with nothing left to flush: skip the interpreter's (slow, torch-laden) teardown
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
