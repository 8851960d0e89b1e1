"""What robot_node and depth_node share: the coordinator connection and the main() loop."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.logging import get_logger
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data

from fedepth_coordinator.client import ClientTls, CoordinatorClient, open_channel
from fedepth_ros.dds import use_large_data_profile
from fedepth_ros.interrupts import stopping, watch_sigint
from fedepth_ros.params import NodeConfigError

__all__ = ["NodeConfigError"]  # defined beside the parameters, which raise it too


#: The QoS names of the nodes' ``input_qos`` / ``output_qos`` parameters.
STREAM_QOS = ("sensor_data", "reliable", "lossless")


def stream_qos(name: str, parameter: str) -> QoSProfile:
    """The QoS profile a stream parameter names: ``sensor_data`` (best effort, the camera
    default), ``reliable`` (reliable, keep last 10) or ``lossless`` (reliable, keep all: a
    sample is kept until taken, so a reader that falls behind is never overwritten; with a
    lossless publisher, flow control holds the writer back instead of dropping; what
    ``fedepth fleet replay`` uses end to end)."""
    if name == "sensor_data":
        return qos_profile_sensor_data
    if name == "reliable":
        return QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    if name == "lossless":
        return QoSProfile(
            history=HistoryPolicy.KEEP_ALL, depth=1000, reliability=ReliabilityPolicy.RELIABLE
        )
    raise NodeConfigError(f"{parameter} must be one of {', '.join(STREAM_QOS)}, got {name!r}")


def read_token(token_file: str) -> str:
    """The credential token in ``token_file`` ('' when no file is configured)."""
    if not token_file:
        return ""
    path = Path(token_file)
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise NodeConfigError(f"token_file {path}: cannot read it ({exc.strerror})") from None


def connect(address: str, principal: str, token_file: str, tls_ca_file: str) -> CoordinatorClient:
    """A client of the coordinator at ``address`` that waits for it while it (re)starts."""
    if not address or ":" not in address:
        raise NodeConfigError(f"coordinator must be host:port, got {address!r}")
    if tls_ca_file and not Path(tls_ca_file).is_file():
        raise NodeConfigError(f"tls_ca_file {tls_ca_file}: no such file")
    tls = ClientTls(ca_file=tls_ca_file) if tls_ca_file else None
    channel = open_channel(address, tls=tls)
    return CoordinatorClient(channel, principal, read_token(token_file), wait_for_ready=True)


class WorkerNode(Node):
    """A node with a worker thread: started after construction, stopped before destruction."""

    def start(self) -> None:
        """Start the worker (after the node is added to the executor)."""

    def shutdown(self) -> bool:
        """Stop and join the worker (before the node is destroyed); False if it is still
        running after the join timed out."""
        return True


# glibc mallopt parameters
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_allocator() -> bool:
    """Keep freed tensor memory in the heap instead of returning it to the OS (glibc only).

    A forward pass allocates and frees activations of megabytes each; by default glibc serves
    those with mmap/munmap (and trims the heap), so every pass page-faults its buffers in
    again, worse in a worker thread's arena. Raising the mmap threshold to its maximum (32 MiB)
    and the trim threshold to 1 GiB made regression-lite's CPU forward about 1.5-2x faster in
    a worker thread (benchmarks/depth_node.py). The process keeps its peak heap. Returns
    whether the settings were applied.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1
        return libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1 and ok
    except (OSError, AttributeError):
        return False


def empty_parameter_message(argv: list[str]) -> str | None:
    """A message for ``-p NAME:=`` with nothing after ``:=`` (the shell ate the quotes of
    ``-p NAME:=""``), showing spellings that survive the shell; None when there is none."""
    for i, arg in enumerate(argv[:-1]):
        if arg in ("-p", "--param"):
            item = argv[i + 1]
            if item.endswith(":=") and item.count(":=") == 1:
                name = item[:-2]
                return (
                    f"parameter {name!r} has no value: the shell removed the quotes of "
                    f'-p {name}:="". Write -p {name}:="\'\'" (or -p "{name}:=\'\'") '
                    f"for an empty string"
                )
    return None


def _stop_worker(name: str, node: WorkerNode) -> bool:
    """``node.shutdown()``; False when the worker is still running afterwards (its join timed
    out, or a second Ctrl-C cut the wait short)."""
    try:
        return node.shutdown()
    except KeyboardInterrupt:
        get_logger(f"{name}.exit").warning("interrupted again; not waiting for the worker")
        return False


def _exit_now(name: str, code: int) -> NoReturn:
    """Leave without interpreter finalization: the worker thread is still running.

    A daemon thread still inside torch or gRPC while the interpreter finalizes and the C++
    static destructors run (libtorch, gRPC core, Fast DDS) is a use-after-free waiting to
    happen (SIGSEGV/SIGABRT at exit). By the time this runs the node, the executor and the
    ROS context are shut down and the coordinator channel is closed; the worker's state is
    in memory only, so there is nothing left to flush but Python's streams.
    """
    get_logger(f"{name}.exit").error(
        "the worker thread did not stop; exiting without interpreter cleanup"
    )
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def run_node(name: str, make: Callable[[], WorkerNode], args: list[str] | None = None) -> int:
    """Init rclpy, build the node, start its worker, spin until Ctrl-C / shutdown, clean up.

    Exit status 0 after a clean shutdown, 1 when the node's parameters are unusable or the
    worker could not be stopped. Shutdown order: stop and join the worker (it closes its
    coordinator channel), shut the executor down, destroy the node, shut rclpy down; only
    then does the interpreter finalize, with no thread of ours left running.
    """
    if not faulthandler.is_enabled():
        # a native crash (SIGSEGV, SIGABRT, ...) prints every thread's Python stack to stderr
        faulthandler.enable()
    argv = sys.argv if args is None else args
    mangled = empty_parameter_message(list(argv))
    if mangled is not None:
        get_logger(name).error(mangled)
        return 1
    tuned = tune_allocator()
    use_large_data_profile()  # before the DDS participant exists
    watch_sigint()
    rclpy.init(args=argv)
    if not tuned:
        get_logger(name).debug("allocator tuning unavailable (not glibc)")
    node: WorkerNode | None = None
    executor = SingleThreadedExecutor()
    try:
        node = make()
        executor.add_node(node)
        node.start()
        executor.spin()
        return 0
    except NodeConfigError as exc:
        get_logger(name).error(str(exc))
        return 1
    except (KeyboardInterrupt, ExternalShutdownException):
        get_logger(f"{name}.exit").info("interrupted; shutting down")
        return 0
    except Exception:
        if not stopping():
            raise
        # a signal landed inside the executor: SIGTERM shut the context down while it built
        # its wait set, or Ctrl-C interrupted a message's conversion (see watch_sigint)
        get_logger(f"{name}.exit").info("interrupted; shutting down")
        return 0
    finally:
        stopped = _stop_worker(name, node) if node is not None else True
        executor.shutdown(timeout_sec=2.0)
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
        if not stopped:
            _exit_now(name, 1)
