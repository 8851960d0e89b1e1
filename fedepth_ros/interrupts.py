"""Ctrl-C that lands inside rclpy's bindings: tell it from a real error."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import rclpy

_SIGINT_SEEN = threading.Event()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _SIGINT_SEEN.set()
    signal.default_int_handler(signum, frame)


def watch_sigint() -> None:
    """Note each Ctrl-C before Python raises KeyboardInterrupt for it (call before
    ``rclpy.init``, whose signal handler calls the one it finds installed).

    The KeyboardInterrupt is raised at the next bytecode wherever the main thread is. Inside
    the executor's ``take_message`` that is the message's Python constructor, and rclpy's
    bindings turn the failed conversion into ``RuntimeError: Unable to convert call argument
    '0' to Python object``, the interrupt lost; rclpy's own shutdown of the context runs on
    another thread and may not have landed yet. :func:`stopping` tells that error from a real
    one. A handler someone else installed is left alone."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def stopping() -> bool:
    """Whether a signal asked this process to stop: a Ctrl-C was noted (:func:`watch_sigint`)
    or the ROS context was shut down (SIGTERM, or rclpy's SIGINT handling)."""
    return _SIGINT_SEEN.is_set() or not rclpy.ok()
