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


def interrupt_child(
    source: str, env: dict[str, str], tmp_path: Path, settle_s: float = 0.0
) -> tuple[int, str]:
    """Run ``source``, Ctrl-C it ``settle_s`` after it prints "started"; (status, output)."""
    script = tmp_path / "child.py"
    script.write_text(source)
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
    time.sleep(settle_s)
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"still running 30 s after Ctrl-C\n{out}") from None
    return proc.returncode, out


def test_a_worker_that_does_not_stop_exits_without_interpreter_finalization(
    ros_env: dict[str, str], tmp_path: Path
) -> None:
    code, out = interrupt_child(CHILD, ros_env, tmp_path)
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


# Ctrl-C inside rclpy's bindings: the executor's take_message calls the message's Python
# constructor; a KeyboardInterrupt raised there comes out of the bindings as RuntimeError
# ("Unable to convert call argument '0' to Python object", seen in CI), and rclpy's own
# shutdown of the context, on another thread, may not have landed yet. The child holds that
# state still: rclpy installs no signal handler (its context stays valid), and a callback
# turns the interrupt into the bindings' error.
INTERRUPTED_IN_BINDINGS = textwrap.dedent(
    """
    import signal, sys, time, rclpy
    from rclpy.signals import SignalHandlerOptions
    from fedepth_ros.node_common import WorkerNode, run_node

    # Python's own Ctrl-C handling, also when the suite runs in a background job (SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    init = rclpy.init
    rclpy.init = lambda args=None: init(args=args, signal_handler_options=SignalHandlerOptions.NO)

    class Node(WorkerNode):
        def start(self):
            self.create_timer(0.01, self.take)
            print("started", flush=True)

        def take(self):
            try:  # Python bytecode nearly all the time: the interrupt is raised here
                end = time.monotonic() + 1.0
                while time.monotonic() < end:
                    pass
            except KeyboardInterrupt:
                assert rclpy.ok()
                raise RuntimeError("Unable to convert call argument '0' to Python object")

    code = run_node("test_interrupted_node", lambda: Node("test_interrupted_node"), ["test"])
    print(f"returned {code}", flush=True)
    sys.exit(code)
    """
)


def test_ctrl_c_inside_the_bindings_is_an_interrupt_not_a_crash(
    ros_env: dict[str, str], tmp_path: Path
) -> None:
    # 0.5 s: inside the callback by now
    code, out = interrupt_child(INTERRUPTED_IN_BINDINGS, ros_env, tmp_path, settle_s=0.5)
    assert code == 0, out
    assert "interrupted; shutting down" in out and "returned 0" in out, out
    assert "Traceback" not in out, out


def test_a_real_error_in_the_executor_still_propagates(
    ros_env: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "failing.py"
    script.write_text(
        textwrap.dedent(
            """
            from fedepth_ros.node_common import WorkerNode, run_node

            class Node(WorkerNode):
                def start(self):
                    self.create_timer(0.01, self.fail)

                def fail(self):
                    raise RuntimeError("a real defect")

            run_node("test_failing_node", lambda: Node("test_failing_node"), ["test"])
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)], env=ros_env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "RuntimeError: a real defect" in proc.stderr, proc.stderr
