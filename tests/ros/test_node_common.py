"""run_node in a child process: a worker that will not stop, faulthandler on a native crash
(plain Ctrl-C of the real nodes: test_nodes.py, test_end_to_end.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.ros

# A WorkerNode whose worker ignores the stop request (a long native call, say); its join
# timeout is short so that the test does not wait 30 s.
CHILD = textwrap.dedent(
    """
    import sys, threading, time
    from fedepth_ros.node_common import WorkerNode, run_node

    class Node(WorkerNode):
        def __init__(self):
            super().__init__("test_worker_node")
            self.stop = threading.Event()
            self.worker = threading.Thread(target=self._work, daemon=True)

        def _work(self):
            while True:  # never looks at self.stop
                time.sleep(0.05)

        def start(self):
            self.worker.start()
            print("started", flush=True)

        def shutdown(self):
            self.stop.set()
            self.worker.join(timeout=1.0)
            return not self.worker.is_alive()

    def make():
        return Node()

    code = run_node("test_worker_node", make, ["test"])
    print(f"returned {code}", flush=True)
    sys.exit(code)
    """
)


def run_stuck_child(env: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    end = time.monotonic() + 60
    line = proc.stdout.readline()
    while line and "started" not in line and time.monotonic() < end:
        line = proc.stdout.readline()
    assert "started" in line, f"child did not start: {line!r}"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out


def test_a_worker_that_does_not_stop_exits_without_interpreter_finalization(
    ros_env: dict[str, str], tmp_path: Path
) -> None:
    code, out = run_stuck_child(ros_env, tmp_path)
    assert code == 1, out
    assert "the worker thread did not stop; exiting without interpreter cleanup" in out, out
    assert "returned" not in out, out  # run_node left through os._exit, not by returning


def test_the_nodes_enable_faulthandler(ros_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(
        textwrap.dedent(
            """
            import ctypes, threading
            from fedepth_ros.node_common import WorkerNode, run_node

            class Node(WorkerNode):
                def start(self):
                    threading.Timer(0.2, lambda: ctypes.string_at(0)).start()

            run_node("test_crash_node", lambda: Node("test_crash_node"), ["test"])
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)], env=ros_env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -signal.SIGSEGV, proc.stdout + proc.stderr
    assert "Fatal Python error: Segmentation fault" in proc.stderr, proc.stderr
    assert "Current thread" in proc.stderr and "Thread 0x" in proc.stderr, proc.stderr
