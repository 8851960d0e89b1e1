"""Simulated robots for tests, benchmarks and dry runs of a coordinator.

A simulated robot has a descriptor drawn around one of a few domains and "trains" with a cheap
deterministic numpy function of the downloaded state, its id and the round, so two runs (one
interrupted by a crash, one not; one over gRPC, one in-process) can be compared exactly.
:func:`reference_run` drives the same strategy in-process through the coordinator's round
driver (:class:`fedepth.rounds.RoundDriver`), for such comparisons; :class:`SimulatedFleet`
runs robots as threads against a live coordinator.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import yaml

from fedepth.descriptor import Descriptor
from fedepth.models.state import State
from fedepth.rounds import RoundDriver, RoundRules
from fedepth.strategies import ClientInfo, ClientUpdate, TrainTask, create_strategy
from fedepth_coordinator.client import ClientTls, CoordinatorClient, open_channel
from fedepth_coordinator.config import CoordinatorConfig, to_dict
from fedepth_coordinator.robot import RobotLoop, RobotProfile, RobotReport, TrainFn

log = logging.getLogger(__name__)


def robot_ids(n: int, prefix: str = "robot") -> list[str]:
    return [f"{prefix}-{i:03d}" for i in range(n)]


def robot_profile(robot_id: str, *, dim: int = 8, domains: int = 3) -> RobotProfile:
    """A deterministic profile: descriptor near one of ``domains`` centres, 10-100 samples."""
    key = zlib.crc32(robot_id.encode())
    rng = np.random.default_rng(key)
    centre = np.random.default_rng(key % domains).normal(0.0, 2.0, dim)
    return RobotProfile(
        num_samples=int(10 + key % 91),
        descriptor=Descriptor(
            mean=centre + rng.normal(0.0, 0.3, dim),
            var=np.exp(rng.normal(0.0, 0.2, dim)),
            num_frames=32,
        ),
        labels={"platform": f"p{key % 2}", "environment": f"e{key % domains}"},
    )


def deterministic_train(robot_id: str, num_samples: int) -> TrainFn:
    """ "Training" that is a pure function of the downloaded state, the robot and the round."""
    key = zlib.crc32(robot_id.encode())

    def train(rnd: int, task: TrainTask) -> ClientUpdate:
        shift = 0.01 * ((key + 7 * rnd) % 101)
        state = {
            name: (0.9 * arr + shift).astype(arr.dtype, copy=False)
            if arr.dtype.kind == "f"
            else arr.copy()
            for name, arr in task.state.items()
        }
        return ClientUpdate(robot_id, state, num_samples, num_steps=1)

    return train


def reference_run(
    strategy: str,
    params: Mapping[str, object],
    initial: Mapping[str, np.ndarray],
    robots: Sequence[str],
    num_rounds: int,
    *,
    train_for: Callable[[str, int], TrainFn] = deterministic_train,
) -> dict[str, State]:
    """Every robot's final model when all robots report every round, computed in-process the
    way the coordinator runs the strategy (fleet sorted by id, updates sorted by id)."""
    ids = sorted(robots)
    profiles = {r: robot_profile(r) for r in ids}
    s = create_strategy(strategy, **dict(params))
    s.initialize(
        [ClientInfo(r, profiles[r].num_samples, profiles[r].descriptor) for r in ids],
        dict(initial),
    )
    trainers = {r: train_for(r, profiles[r].num_samples) for r in ids}
    # the coordinator's round driver (all selected, sorted by id), over in-process calls
    driver = RoundDriver(s, RoundRules(num_rounds, sorted_ids=True))
    participants = _Trainers(trainers)
    for rnd in range(num_rounds):
        driver.run_round(rnd, ids, participants)
    return {r: dict(s.model_for(r)) for r in ids}


@dataclass
class _Trainers:
    """In-process participants: each robot's training function, called with its task."""

    trainers: Mapping[str, TrainFn]

    def collect(self, rnd: int, tasks: Mapping[str, TrainTask]) -> list[ClientUpdate]:
        return [self.trainers[r](rnd, task) for r, task in tasks.items()]


@dataclass
class SimulatedFleet:
    """Robots as threads, each with its own channel and :class:`RobotLoop`."""

    target: str
    tokens: Mapping[str, str]
    tls: ClientTls | None = None
    poll_s: float = 2.0
    retry_for_s: float = 60.0
    train_for: Callable[[str, int], TrainFn] = deterministic_train
    #: gRPC client interceptors every robot's channel goes through (e.g. to record traffic).
    interceptors: Sequence[Any] = ()
    reports: dict[str, RobotReport] = field(default_factory=dict)
    errors: dict[str, BaseException] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    _threads: dict[str, threading.Thread] = field(default_factory=dict)

    def client(self, robot_id: str) -> CoordinatorClient:
        channel = open_channel(self.target, tls=self.tls)
        if self.interceptors:
            channel = grpc.intercept_channel(channel, *self.interceptors)
        return CoordinatorClient(channel, robot_id, self.tokens[robot_id])

    def start(self, robot_id: str, train: TrainFn | None = None) -> None:
        profile = robot_profile(robot_id)
        fn = train or self.train_for(robot_id, profile.num_samples)

        def body() -> None:
            with self.client(robot_id) as client:
                loop = RobotLoop(
                    client,
                    profile,
                    fn,
                    stop=self.stop,
                    poll_s=self.poll_s,
                    retry_for_s=self.retry_for_s,
                )
                try:
                    self.reports[robot_id] = loop.run()
                except BaseException as exc:
                    self.reports[robot_id] = loop.report
                    self.errors[robot_id] = exc

        t = threading.Thread(target=body, name=robot_id, daemon=True)
        self._threads[robot_id] = t
        t.start()

    def start_all(self, robot_ids: Sequence[str]) -> None:
        for rid in robot_ids:
            self.start(rid)

    def join(self, timeout_s: float) -> bool:
        """Wait for every robot thread; False when some are still running at the timeout."""
        return self.join_some(list(self._threads), timeout_s)

    def join_some(self, robot_ids: Sequence[str], timeout_s: float) -> bool:
        """Wait for the threads of some robots; False when some are still running."""
        end = time.monotonic() + timeout_s
        threads = [self._threads[r] for r in robot_ids]
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self.stop.set()
        self.join(timeout_s)


class CoordinatorProcess:
    """``python -m fedepth_coordinator`` as a child process (crash tests, benchmarks).

    The config is written next to the state; the child reports its port through a port file.
    """

    def __init__(self, config: CoordinatorConfig, *, log_path: str | os.PathLike[str]) -> None:
        self.config = config
        self.state_dir = Path(config.state.dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.state_dir / "coordinator.yaml"
        self.config_path.write_text(yaml.safe_dump(to_dict(config)), encoding="utf-8")
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = config.server.port

    def start(self, port: int | None = None, timeout_s: float = 180.0) -> int:
        """Start the child (on ``port``, default the config's) and wait until it serves.

        The default wait is generous: start-up is mostly importing torch, which takes over a
        minute on a loaded 2-core CI machine."""
        port_file = self.state_dir / "port"
        port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "fedepth_coordinator", "--config", str(self.config_path)]
        cmd += ["--port", str(self.port if port is None else port), "--port-file", str(port_file)]
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        waited = threading.Event()
        end = time.monotonic() + timeout_s
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(
                    f"coordinator did not start within {timeout_s:.0f} s (exit "
                    f"{self.proc.returncode}); see {self.log_path}"
                )
            waited.wait(0.05)
        self.port = int(port_file.read_text(encoding="utf-8"))
        return self.port

    def _proc_status(self, key: str) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    def rss_bytes(self) -> int:
        """Resident memory of the child now."""
        return self._proc_status("VmRSS")

    def peak_rss_bytes(self) -> int:
        """Peak resident memory of the child so far (VmHWM)."""
        return self._proc_status("VmHWM")

    def kill(self) -> None:
        """SIGKILL: no cleanup, no flush; what is on disk is all that survives."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM and wait (SIGKILL after the timeout); returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


class CoordinatorStart:
    """A :class:`CoordinatorProcess` being started in the background (a thread waits for its
    port), so that a caller can do other work meanwhile; ``key`` names what it was started for."""

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


@dataclass(frozen=True)
class LoadResult:
    """What a load run measured (coordinator in a child process, robots as threads)."""

    robots: int
    model_bytes: int
    round_seconds: list[float]
    closed_by: list[str]
    rss_start_bytes: int
    rss_peak_bytes: int
    errors: dict[str, str]
    wall_seconds: float


def _robot_worker(
    target: str, tokens: dict[str, str], ids: list[str], timeout_s: float
) -> dict[str, str]:
    fleet = SimulatedFleet(target, tokens, poll_s=5.0, retry_for_s=30.0)
    fleet.start_all(ids)
    if not fleet.join(timeout_s):
        fleet.shutdown()
        return {rid: "did not finish in time" for rid in ids if rid not in fleet.reports}
    errors = {rid: repr(e) for rid, e in fleet.errors.items()}
    for rid in ids:
        report = fleet.reports.get(rid)
        if rid not in errors and (report is None or not report.finished):
            errors[rid] = "did not finish"
    return errors


def load_run(
    config: CoordinatorConfig,
    tokens: Mapping[str, str],
    robots: Sequence[str],
    *,
    operator: str,
    workers: int = 1,
    timeout_s: float = 600.0,
    log_path: str | os.PathLike[str],
) -> LoadResult:
    """Run a full training run of ``robots`` against a child coordinator and measure it.

    Robots run as threads, split over ``workers`` processes (1: threads of this process);
    ``operator`` (a principal in ``tokens``) reads the round history at the end.
    """
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from fedepth_coordinator.server import load_initial_model

    child = CoordinatorProcess(config, log_path=log_path)
    port = child.start()
    target = f"127.0.0.1:{port}"
    token_map = dict(tokens)
    try:
        rss_start = child.rss_bytes()
        t0 = time.monotonic()
        groups = [list(robots[i::workers]) for i in range(workers)]
        errors: dict[str, str] = {}
        if workers == 1:
            errors.update(_robot_worker(target, token_map, groups[0], timeout_s))
        else:
            with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
                futures = [
                    pool.submit(_robot_worker, target, token_map, g, timeout_s) for g in groups
                ]
                for f in futures:
                    errors.update(f.result())
        wall = time.monotonic() - t0
        rss_peak = child.peak_rss_bytes()
        with CoordinatorClient(open_channel(target), operator, token_map[operator]) as c:
            history = list(c.fleet_status().history)
    finally:
        child.stop()
    model_bytes = sum(a.nbytes for a in load_initial_model(config.model).values())
    return LoadResult(
        robots=len(robots),
        model_bytes=model_bytes,
        round_seconds=[h.duration_s for h in history],
        closed_by=[h.closed_by for h in history],
        rss_start_bytes=rss_start,
        rss_peak_bytes=rss_peak,
        errors=errors,
        wall_seconds=wall,
    )
