"""A robot process of ``fedepth bench --transport grpc`` (``python -m
fedepth_coordinator.benchrobot``, started by :class:`~fedepth_coordinator.benchrun.GrpcBench`).

It reads the fleet the benchmark handed over (:mod:`fedepth_coordinator.benchfiles`), loads its
data and the model once, and takes part in each method's run in turn: it registers with its
labels and sample count, uploads the descriptor (and PACFL basis) the parent computed, then for
every round downloads its task, trains it with :func:`fedepth.sim.run_job` (so
:func:`fedepth.client.train_round`; same seed, same hook memory kept by the robot) and uploads
the update with its extra state, timing its transfers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fedepth.descriptor import Descriptor
from fedepth.sim import ClientJob, SimConfig, run_job, state_nbytes
from fedepth.strategies import ClientUpdate, State, TrainTask
from fedepth_coordinator.benchfiles import BenchRunError, write_json
from fedepth_coordinator.client import CoordinatorClient, DownloadedModel, open_channel
from fedepth_coordinator.domain import UploadReceipt
from fedepth_coordinator.robot import RobotLoop, RobotProfile


class _TimedClient(CoordinatorClient):
    """A robot's client that times its transfers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.download_s: dict[int, float] = {}
        self.upload_s: dict[int, float] = {}

    def download_model(
        self, round: int = 0, *, latest: bool = False, initial: bool = False
    ) -> DownloadedModel:
        t0 = time.perf_counter()
        out = super().download_model(round, latest=latest, initial=initial)
        self.download_s[round] = time.perf_counter() - t0
        return out

    def upload_update(self, round: int, update: ClientUpdate) -> UploadReceipt:
        t0 = time.perf_counter()
        out = super().upload_update(round, update)
        self.upload_s[round] = time.perf_counter() - t0
        return out


class _ParentWatchdog:
    """Waits for a file the benchmark process writes; exits when that process is gone, and
    stops a run it takes part in then (:meth:`stop_when_gone`)."""

    def __init__(self) -> None:
        self.pid = os.getppid()

    def stop_when_gone(self, stop: threading.Event) -> None:
        """Set ``stop`` once the benchmark process is gone (a thread checks twice a second):
        a round it holds for its evaluation would never be released."""

        def check() -> None:
            while not stop.wait(0.5):
                if os.getppid() != self.pid:
                    stop.set()

        threading.Thread(target=check, name="parent-watchdog", daemon=True).start()

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
    """One robot's part in one method's run: training with :func:`run_job`, what it measured.
    (While the parent evaluates a round, the coordinator holds the next one: the robot's loop
    waits for its plan, as any robot's does.)"""

    rid: str
    cid: str
    sequences: list[Any]
    config: SimConfig
    model: Any
    memory: dict[str, State] = field(default_factory=dict)
    rounds: dict[int, dict[str, float]] = field(default_factory=dict)

    def train(self, rnd: int, task: TrainTask) -> ClientUpdate:
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
    gone = threading.Event()
    watchdog.stop_when_gone(gone)
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
            robot = _RobotSession(rid, cid, sequences, cfg, model)
            client = _TimedClient(open_channel(session["target"]), rid, token)
            with client:
                loop = RobotLoop(
                    client, profile, robot.train, stop=gone, poll_s=5.0, retry_for_s=60.0
                )
                if not loop.run().finished:
                    if gone.is_set():
                        raise SystemExit("the benchmark process is gone")
                    raise RuntimeError(f"robot {rid}: the {session['method']} run did not finish")
            for rnd, row in robot.rounds.items():
                row["download_s"] = client.download_s.get(rnd, 0.0)
                row["upload_s"] = client.upload_s.get(rnd, 0.0)
            out = workdir / "results" / f"{k:03d}"
            out.mkdir(parents=True, exist_ok=True)
            write_json(out / f"{rid}.json", robot.rounds)
            k += 1
    finally:
        scenario.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fedepth_coordinator.benchrobot",
        description="A robot process of `fedepth bench --transport grpc` (started by it).",
    )
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument("--robot", required=True)
    args = p.parse_args(argv)
    return robot_main(args.workdir, args.robot)


def run_as_main() -> None:
    """The process entry: :func:`main`, then exit without the interpreter's teardown."""
    code = main()
    # a worker with nothing left to flush: skip the interpreter's (slow, torch-laden) teardown
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_as_main()
