"""``fedepth bench --transport grpc``: the benchmark through a real coordinator and robots.

:class:`GrpcBench` runs the methods of one prepared :class:`~fedepth.sim.Fleet` the way a fleet
would: for each method it starts ``fedepth-coordinator`` as a child process (loopback, port 0,
a fresh SQLite state directory, the strategy and initial weights the in-process run uses, the
``SimConfig``'s training recipe as its ``training`` section, every robot selected every round,
quorum = all robots, no deadline), and every client of the scenario is a robot in its own OS
process (``python -m fedepth_coordinator.benchrobot``). A robot registers with its labels and
sample count, uploads the descriptor (and PACFL basis) the parent computed once in
:func:`~fedepth.sim.prepare_fleet`, then for every round downloads its task (the model and the
recipe, over the wire), trains it with :func:`fedepth.sim.run_job` (so
:func:`fedepth.client.train_round`, the function every client runs; same seed, same hook memory
kept by the robot) and uploads the update with its extra state. Robot processes are started
once and take part in each method's run in turn.

Evaluation asks the coordinator: each test sequence's descriptor goes through ``Route`` (as an
operator principal) and the routed model is scored by :meth:`fedepth.sim.Simulation.evaluate`,
the in-process evaluation code. To evaluate the rounds the in-process run evaluates (the last
``last_rounds`` and every ``eval_every``-th), the coordinator holds the round after such a
round (``rounds.hold_after``) until the parent has evaluated it and calls ``ReleaseRound``, so
its models cannot move on meanwhile; the robots just wait for their next plan, as robots do.
The final strategy is read back from the coordinator's durable state (its last checkpoint), so
``MethodRun.strategy`` holds the coordinator's cluster models.

For the same seed the results equal the in-process run's exactly (see
``tests/coordinator/test_bench_grpc.py``): descriptors, weights and hook state travel as raw
float64/float32 bytes, the coordinator initializes the strategy with robots sorted by id and
aggregates updates sorted by id, and robot ids are numbered in scenario order so that both
orders are the in-process ones.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from tqdm import tqdm

from fedepth.descriptor import Descriptor
from fedepth.sim import (
    Fleet,
    SimConfig,
    Simulation,
)
from fedepth.strategies import (
    RouteDecision,
    State,
    create_strategy,
)
from fedepth_coordinator.auth import add_principal
from fedepth_coordinator.benchfiles import (
    OPERATOR,
    BenchRunError,
    eval_rounds,
    robot_id,
    tail,
    write_fleet,
    write_json,
)
from fedepth_coordinator.benchresults import (
    GrpcMethodRun,
    ObservedRun,
    load_final_strategy,
    method_run,
    read_reports,
)
from fedepth_coordinator.benchrobot import main, robot_main
from fedepth_coordinator.client import CoordinatorClient, open_channel
from fedepth_coordinator.config import CoordinatorConfig, config_from_dict
from fedepth_coordinator.domain import Phase
from fedepth_coordinator.simulate import CoordinatorProcess, CoordinatorStart

__all__ = [
    "OPERATOR",
    "BenchRunError",
    "GrpcBench",
    "GrpcMethodRun",
    "eval_rounds",
    "load_final_strategy",
    "main",
    "robot_id",
    "robot_main",
]

log = logging.getLogger(__name__)

_NO_DEADLINE_S = 30 * 24 * 3600.0
_POLL_S = 0.1


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


def _launch_key(method: str, params: Mapping[str, Any]) -> str:
    return json.dumps([method, dict(params)], sort_keys=True, default=str)


#: Seconds a finished coordinator gets to exit after SIGTERM before it is killed (and the run
#: reported as failed): its interpreter's shutdown took over 20 s on a loaded 2-core machine.
STOP_TIMEOUT_S = 120.0


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
        self._next: CoordinatorStart | None = None
        self._ready = False
        self._broken = False

    # -- robot processes ---------------------------------------------------------------------
    def _spawn_robots(self) -> None:
        w = self.workdir
        for sub in ("robots", "sessions", "results"):  # nothing of an earlier bench
            shutil.rmtree(w / sub, ignore_errors=True)
            (w / sub).mkdir(parents=True)
        creds = w / "credentials.yaml"
        creds.unlink(missing_ok=True)
        for rid in [*self.ids, OPERATOR]:
            self._tokens[rid] = add_principal(
                creds, rid, "operator" if rid == OPERATOR else "robot"
            )
        write_fleet(w, self.fleet, self.initial, self.config, self.ids, self._tokens)
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        for rid in self.ids:
            cmd = [sys.executable, "-m", "fedepth_coordinator.benchrobot"]
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
                    f"{log_path}:\n{tail(log_path)}"
                )
        child = None if coordinator is None else coordinator.proc
        if coordinator is not None and child is not None and child.poll() is not None:
            raise BenchRunError(
                f"the coordinator exited with status {child.returncode}; "
                f"{coordinator.log_path}:\n{tail(coordinator.log_path)}"
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
        n, n_rounds = len(self.ids), self.config.rounds
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
                    # the round after an evaluated one waits for the parent's evaluation
                    "hold_after": [r for r in eval_rounds(self.config) if r < n_rounds - 1],
                },
                "strategy": {"name": method, "params": dict(params)},
                "training": recipes.pop().to_dict(),
                "model": {"initial_weights": str(self.workdir / "initial.safetensors")},
                "validation": {  # the in-process run's update bounds (default: none)
                    "max_update_norm": self.config.max_update_norm,
                    "max_group_norms": dict(self.config.max_group_norms),
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

    def _launch(self, method: str, params: dict[str, Any]) -> CoordinatorStart:
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
        launch = CoordinatorStart(_launch_key(method, params), coordinator, sdir)
        launch.thread.start()
        return launch

    def _discard(self, launch: CoordinatorStart | None) -> None:
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
            write_json(
                w / "sessions" / f"{k:03d}.json",
                {"method": method, "target": target, "rounds": cfg.rounds},
            )
            if then is not None:
                self._next = self._launch(then[0], self._params(*then))
            observed = self._observe_run(method, target, coordinator, bar)
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
            status = (
                coordinator.stop(timeout_s=STOP_TIMEOUT_S) if coordinator.proc is not None else -1
            )
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
        reports = read_reports(result_dir, self.ids)
        # setup: coordinator start-up, then registration, descriptors and clustering
        formed = observed.formed_at if observed.formed_at is not None else t_session
        setup = start_s + (formed - t_session)
        return method_run(
            cfg,
            self.ids,
            self.cids,
            self.fleet.descriptor_seconds,
            method,
            params,
            strategy,
            reports,
            observed,
            setup,
            peak_rss,
        )

    def _observe_run(
        self,
        method: str,
        target: str,
        coordinator: CoordinatorProcess,
        bar: tqdm[Any],
    ) -> ObservedRun:
        """Follow the run as an operator: evaluate the routed models after each evaluated round
        (then release the round after it, which the coordinator holds), until the last round
        closed."""
        cfg = self.config
        evals = eval_rounds(cfg)
        out = ObservedRun()
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
                if r < cfg.rounds - 1:  # held (rounds.hold_after) until evaluated
                    op.release_round(r + 1)
            out.history = list(op.fleet_status().history)
        return out


if __name__ == "__main__":  # the robot processes' former entry point
    from fedepth_coordinator.benchrobot import run_as_main

    run_as_main()
