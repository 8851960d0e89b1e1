"""The replay's child processes: started in their own session (dying with the driver),
logging to a file, sampled for peak memory, stopped with SIGINT then SIGKILL; and the
command lines of the nodes they run."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


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


class Child:
    """One child process (its own session: a terminal's Ctrl-C reaches only the driver, which
    stops the children in order), logging to a file."""

    def __init__(self, name: str, cmd: Sequence[str], log: Path, env: Mapping[str, str]) -> None:
        self.name, self.log = name, log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
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
