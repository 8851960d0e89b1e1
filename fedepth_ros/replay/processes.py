"""The replay's child processes: started in their own session (dying with the driver),
logging to a file, sampled for peak memory, stopped with SIGINT then SIGKILL; the command
lines of the nodes they run; and the fork server that starts the nodes without paying for an
interpreter and its imports each time (:class:`NodeForkServer`)."""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Protocol

#: What a fork server imports once: the node modules (torch, rclpy, gRPC come with them) and
#: what torch imports only when a model is built and trained (about 1,050 modules: dynamo,
#: inductor, sympy, DTensor, torchvision's feature extraction; 2.7 s of CPU in each forked
#: robot otherwise). Importing them starts no thread. tests/ros/test_replay_processes.py
#: checks that a robot's first descriptor and round import nothing of torch beyond these.
PRELOAD = (
    "fedepth_ros.robot_node",
    "fedepth_ros.depth_node",
    "fedepth_ros.bag_player",
    "fedepth_ros.depth_scorer",
    "torch._dynamo",
    "torch.distributed.tensor",
    "torchvision.models.feature_extraction",
    "torch.utils.serialization",  # torch.load of the encoder's ImageNet checkpoint
)


def _peak_rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _die_with_parent() -> None:
    """In a child, before exec: SIGTERM when the driver dies (Linux), so that no node outlives
    a driver that was killed without the chance to stop it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Process(Protocol):
    """What :class:`Child` uses of a process (:class:`subprocess.Popen` has it)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


def _forked_node(module: str, argv: list[str], log: str, env: dict[str, str]) -> None:
    """The body of a forked node: what ``python -m module argv...`` would do after its imports
    (its own session, SIGTERM when the fork server dies, output into ``log``, ``env`` as its
    environment), with the modules already imported by the fork server."""
    os.setsid()
    if os.getppid() != 1:
        _die_with_parent()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for std in (1, 2):
        os.dup2(fd, std)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    main = importlib.import_module(module).main
    sys.exit(main([module, *argv]))


class ForkedProcess:
    """A node forked by a :class:`NodeForkServer`, with the part of the Popen API that
    :class:`Child` uses."""

    def __init__(self, proc: BaseProcess, cmd: Sequence[str]) -> None:
        self._proc, self._cmd = proc, list(cmd)

    @property
    def pid(self) -> int:
        return int(self._proc.pid or 0)

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        code = self._proc.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self._cmd, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self._proc.kill()


class NodeForkServer:
    """Starts the replay's nodes as forks of one interpreter that imported them once.

    A node started as ``python -m fedepth_ros.robot_node`` spends about 6 s of CPU importing
    torch, rclpy and gRPC before it does anything (measured here); a replay with more robots
    than ``--max-robots`` starts robots every round, so that start was most of a round's
    time. A forked node runs the same ``main`` with the same arguments in its own process
    (own pid, session, log, exit status, ROS context and DDS participant); only the
    interpreter start and the imports are shared, copy-on-write, with the fork server
    (:mod:`multiprocessing`'s ``forkserver``: it imports :data:`PRELOAD`, never initializes
    rclpy, starts no torch thread and opens no gRPC channel, so nothing that a fork breaks is
    running when it forks). Resident memory is counted per process as before (the shared
    pages in each). The fork server exits with the driver, its nodes with it
    (``PR_SET_PDEATHSIG``).
    """

    def __init__(self, preload: Sequence[str] = PRELOAD) -> None:
        multiprocessing.set_forkserver_preload(list(preload))
        self._ctx = multiprocessing.get_context("forkserver")
        self._started: list[ForkedProcess] = []

    def start(self, cmd: Sequence[str], log: Path, env: Mapping[str, str]) -> Process:
        """Start ``cmd`` (a :func:`node_cmd` command line) as a fork."""
        if list(cmd[:2]) != [sys.executable, "-m"] or len(cmd) < 3:
            raise ValueError(f"not a node command line: {list(cmd)[:3]}")
        module, argv = cmd[2], list(cmd[3:])
        proc = self._ctx.Process(
            target=_forked_node,
            args=(module, argv, str(log), dict(env)),
            name=module.rsplit(".", 1)[-1],
            daemon=True,  # terminated if the driver exits with it still running
        )
        proc.start()
        self._started = [p for p in self._started if p.poll() is None]
        self._started.append(ForkedProcess(proc, cmd))
        return self._started[-1]

    def close(self) -> None:
        """Stop the fork server (about 600 MB resident) once its nodes have stopped; the next
        :meth:`start` starts a new one. It exits only when the last process it forked has
        (each holds its liveness pipe), so a node still running is killed first."""
        for proc in self._started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._started = []
        server = getattr(multiprocessing.forkserver, "_forkserver", None)
        stop = getattr(server, "_stop", None)  # CPython's, private (its tests use it)
        if callable(stop):
            stop()


class Child:
    """One child process (its own session: a terminal's Ctrl-C reaches only the driver, which
    stops the children in order), logging to a file; forked by ``forks`` when given (see
    :class:`NodeForkServer`), else a fresh interpreter."""

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        log: Path,
        env: Mapping[str, str],
        forks: NodeForkServer | None = None,
    ) -> None:
        self.name, self.log = name, log
        log.parent.mkdir(parents=True, exist_ok=True)
        self.proc: Process
        with log.open("ab") as out:
            if forks is not None:
                self.proc = forks.start(cmd, log, env)
            else:
                self.proc = subprocess.Popen(
                    list(cmd),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=dict(env),
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
        self.peak_rss = 0
        self.stopping = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def sample_memory(self) -> None:
        if self.alive():
            self.peak_rss = max(self.peak_rss, _peak_rss(self.proc.pid))

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGINT (the nodes shut down cleanly), SIGKILL after ``timeout_s``."""
        self.stopping = True
        self.sample_memory()
        if self.alive():
            try:
                self.proc.send_signal(signal.SIGINT)
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            except ProcessLookupError:
                pass
        return int(self.proc.returncode if self.proc.returncode is not None else -1)


def stop_all(children: Sequence[Child], timeout_s: float = 20.0) -> None:
    """SIGINT to every child at once, then wait for each (SIGKILL after ``timeout_s``)."""
    for child in children:
        child.stopping = True
        child.sample_memory()
        if child.alive():
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGINT)
    end = time.monotonic() + timeout_s
    for child in children:
        try:
            child.proc.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()


def node_cmd(module: str) -> list[str]:
    return [sys.executable, "-m", f"fedepth_ros.{module}"]


def ros_params(params: Mapping[str, Any]) -> list[str]:
    out = []
    for k, v in params.items():
        if isinstance(v, bool):
            text = "true" if v else "false"
        elif isinstance(v, str) and v == "":
            text = "''"
        else:
            text = str(v)
        out += ["-p", f"{k}:={text}"]
    return out
