"""The ``bag_player`` node: publishes a rosbag2 (mcap or sqlite3) at its recorded rate.

Messages go out exactly as stored (serialized CDR, no decode / re-encode) on publishers of the
bag's message types. Settings are ROS parameters (defaults in ``config/bag_player.yaml``); the
command line options below are a shorthand that overrides them, e.g.

    bag_player runs/seq0 --rate 2 --loop --ros-args -r __ns:=/robot1
    bag_player --ros-args --params-file config/bag_player.yaml -p bag:=runs/seq0

Topics are published relative to the node namespace by default (``/image`` in the bag ->
``image`` -> ``/robot1/image``), so namespaces and ``-r image:=camera/image`` remaps apply.
Exit status: 0 after playing (or on Ctrl-C), 1 if the bag or a parameter is unusable, 3
(:data:`EXIT_NOT_ACKNOWLEDGED`) if ``lossless`` is set and a subscriber did not acknowledge
every message within ``ack_timeout``: the loss-free delivery it promised did not happen.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rclpy
from rclpy.duration import Duration
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.logging import get_logger
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.publisher import Publisher
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.utilities import remove_ros_args
from rosbags.interfaces import Connection
from rosbags.rosbag2 import Reader

from fedepth.data.bags import BagError, detect_storage, iter_messages, open_bag, select_connections
from fedepth_ros.dds import use_large_data_profile
from fedepth_ros.interrupts import stopping, watch_sigint
from fedepth_ros.params import BAG_PLAYER, NodeConfigError, declare_parameters

#: Exit status of a lossless playback that a subscriber did not fully acknowledge.
EXIT_NOT_ACKNOWLEDGED = 3

NODE_NAME = "bag_player"

PARAMETERS = BAG_PLAYER  # defaults as in config/bag_player.yaml


@dataclass
class PlayStats:
    """Result of a playback: messages per topic, loops completed, wall and bag time spans."""

    published: Counter[str] = field(default_factory=Counter)
    loops: int = 0
    first_wall_ns: int = 0
    last_wall_ns: int = 0
    first_bag_ns: int = 0
    last_bag_ns: int = 0
    #: bag time played, summed over loops (stamps start over each loop)
    bag_played_ns: int = 0
    interrupted: bool = False

    @property
    def total(self) -> int:
        return sum(self.published.values())


def message_class(msgtype: str) -> type:
    """``pkg/msg/Name`` -> the installed rclpy message class."""
    parts = msgtype.split("/")
    if len(parts) != 3:
        raise ImportError(f"malformed message type {msgtype!r}")
    pkg, kind, name = parts
    module = importlib.import_module(f"{pkg}.{kind}")
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ImportError(f"{pkg}.{kind} has no message {name}")
    return cls


def output_topic(bag_topic: str, *, prefix: str = "", absolute: bool = False) -> str:
    """Name a bag topic is published on: relative unless ``absolute``, under ``prefix``."""
    name = bag_topic if absolute else bag_topic.lstrip("/")
    if not prefix:
        return name
    return prefix.rstrip("/") + "/" + name.lstrip("/")


class BagPlayer(Node):
    """Opens the bag named by the parameters and owns one publisher per played topic."""

    def __init__(self, *, parameter_overrides: list[Parameter[Any]] | None = None) -> None:
        super().__init__(NODE_NAME, parameter_overrides=parameter_overrides)
        self.parameter_values = declare_parameters(self, PARAMETERS)
        self._bag_cm: AbstractContextManager[Reader] | None = None
        self.publishers_by_topic: dict[str, Publisher[Any]] = {}

    def open(self) -> None:
        """Check the parameters, open the bag and create the publishers; raises BagError."""
        params = self.parameter_values
        if not str(params["bag"]):
            raise BagError("no bag given: pass BAG or set the parameter 'bag'")
        self.bag = Path(str(params["bag"]))
        self.rate = float(params["rate"])
        self.loop = bool(params["loop"])
        self.start_offset_ns = round(float(params["start_offset"]) * 1e9)
        self.wait_for_subscribers = int(params["wait_for_subscribers"])
        self.wait_timeout = float(params["wait_timeout"])
        self.start_delay = float(params["start_delay"])
        self.ack_timeout = float(params["ack_timeout"])
        if not self.rate > 0:
            raise BagError(f"bag {self.bag}: rate must be > 0, got {self.rate}")
        if self.start_offset_ns < 0:
            raise BagError(
                f"bag {self.bag}: start_offset must be >= 0, got {params['start_offset']}"
            )
        for name in ("wait_timeout", "start_delay", "ack_timeout"):
            if float(params[name]) < 0:
                raise BagError(f"bag {self.bag}: {name} must be >= 0, got {params[name]}")
        if int(params["qos_depth"]) < 1:
            raise BagError(f"bag {self.bag}: qos_depth must be >= 1, got {params['qos_depth']}")
        requested = [t.strip() for t in str(params["topics"]).split(",") if t.strip()]

        self.storage = detect_storage(self.bag)
        self._bag_cm = open_bag(self.bag)
        self.reader: Reader = self._bag_cm.__enter__()
        self.connections: list[Connection] = select_connections(self.reader, self.bag, requested)
        self.bag_start_ns = self.reader.start_time
        self.bag_end_ns = self.reader.end_time - 1
        if self.bag_start_ns + self.start_offset_ns > self.bag_end_ns:
            raise BagError(
                f"bag {self.bag}: start_offset {self.start_offset_ns / 1e9:g} s is past its "
                f"end (duration {(self.bag_end_ns - self.bag_start_ns) / 1e9:g} s)"
            )
        self.lossless = bool(params["lossless"])
        qos = QoSProfile(
            # lossless: every message stays until each subscriber acknowledged it; publishing
            # blocks (flow control) rather than overwrite one not yet delivered
            history=HistoryPolicy.KEEP_ALL if self.lossless else HistoryPolicy.KEEP_LAST,
            depth=int(params["qos_depth"]),
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.VOLATILE,
        )
        self.publishers_by_topic = self._make_publishers(
            requested, qos, str(params["topic_prefix"]), bool(params["absolute_topics"])
        )
        self.connections = [c for c in self.connections if c.topic in self.publishers_by_topic]

    def _make_publishers(
        self, requested: Sequence[str], qos: QoSProfile, prefix: str, absolute: bool
    ) -> dict[str, Publisher[Any]]:
        types: dict[str, set[str]] = {}
        for conn in self.connections:
            types.setdefault(conn.topic, set()).add(conn.msgtype)
        publishers: dict[str, Publisher[Any]] = {}
        for topic, msgtypes in sorted(types.items()):
            if len(msgtypes) > 1:
                raise BagError(f"bag {self.bag}: topic {topic} mixes types {sorted(msgtypes)}")
            msgtype = msgtypes.pop()
            try:
                cls = message_class(msgtype)
            except (ImportError, AttributeError) as exc:
                problem = f"bag {self.bag}: topic {topic}: type {msgtype} not installed ({exc})"
                if requested:
                    raise BagError(problem) from None
                self.get_logger().warning(problem + "; skipping the topic")
                continue
            name = output_topic(topic, prefix=prefix, absolute=absolute)
            publishers[topic] = self.create_publisher(cls, name, qos)
        if not publishers:
            raise BagError(f"bag {self.bag}: none of its message types is installed here")
        return publishers

    def close_bag(self) -> None:
        if self._bag_cm is not None:
            cm, self._bag_cm = self._bag_cm, None
            cm.__exit__(None, None, None)

    def wait_for_matches(self, stop: threading.Event) -> bool:
        """Wait until each publisher has ``wait_for_subscribers`` subscribers; False on timeout."""
        if self.wait_for_subscribers <= 0:
            return True
        deadline = time.monotonic() + self.wait_timeout
        while not stop.is_set():
            if all(
                pub.get_subscription_count() >= self.wait_for_subscribers
                for pub in self.publishers_by_topic.values()
            ):
                return True
            if time.monotonic() >= deadline:
                return False
            # 10 Hz: a faster poll costs a waiting player ~10 % of a core (measured), which
            # the processes it waits for (starting up) need
            stop.wait(0.1)
        return False

    def wait_for_acks(self) -> bool:
        """Wait up to ``ack_timeout`` until subscribers acknowledged every message sent."""
        deadline = time.monotonic() + self.ack_timeout
        acked = True
        for pub in self.publishers_by_topic.values():
            left = max(0.0, deadline - time.monotonic())
            acked = pub.wait_for_all_acked(Duration(nanoseconds=round(left * 1e9))) and acked
        return acked

    def play(self, stop: threading.Event) -> PlayStats:
        """Publish the bag (again and again when looping) until done or ``stop`` is set."""
        stats = PlayStats()
        start = self.bag_start_ns + self.start_offset_ns
        while not stop.is_set() and self.context.ok():
            t0 = time.monotonic_ns()
            prev = start if stats.total else None  # a loop's first message follows the last
            for conn, stamp, data in iter_messages(self.reader, self.bag, self.connections, start):
                delay_ns = t0 + (stamp - start) / self.rate - time.monotonic_ns()
                if delay_ns > 0 and stop.wait(delay_ns / 1e9):
                    break
                if stop.is_set() or not self.context.ok():
                    break
                try:
                    self.publishers_by_topic[conn.topic].publish(data)
                except Exception:
                    if stop.is_set() or not self.context.ok():  # shut down by a signal
                        break
                    raise
                now = time.monotonic_ns()
                if not stats.total:
                    stats.first_wall_ns, stats.first_bag_ns = now, stamp
                stats.last_wall_ns, stats.last_bag_ns = now, stamp
                if prev is not None:
                    stats.bag_played_ns += max(0, stamp - prev)
                prev = stamp
                stats.published[conn.topic] += 1
            else:
                stats.loops += 1
                if self.loop:
                    continue
                return stats
        stats.interrupted = True
        return stats

    def describe(self) -> str:
        span = (self.bag_end_ns - self.bag_start_ns) / 1e9
        count = sum(c.msgcount for c in self.connections)
        topics = ", ".join(
            f"{t} -> {pub.topic_name}" for t, pub in sorted(self.publishers_by_topic.items())
        )
        return (
            f"playing {self.bag} ({self.storage}, {count} messages, {span:.3f} s) at rate "
            f"{self.rate:g}{', looping' if self.loop else ''}"
            f"{', lossless' if self.lossless else ''}: {topics}"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bag_player",
        description="Publish a rosbag2 (mcap or sqlite3) on its recorded topics at the "
        "recorded rate. Options override the ROS parameters of the same meaning "
        "(defaults: config/bag_player.yaml); ROS arguments go after --ros-args.",
        epilog="Parameters: " + "; ".join(f"{k} ({d!r}): {h}" for k, (d, h) in PARAMETERS.items()),
    )
    parser.add_argument("bag", nargs="?", help="rosbag2 directory or .mcap / .db3 file")
    parser.add_argument("--rate", type=float, help="playback rate factor")
    parser.add_argument("--loop", action="store_true", default=None, help="loop forever")
    parser.add_argument("--start-offset", type=float, metavar="S", help="start S s into the bag")
    parser.add_argument("--topics", metavar="T1,T2", help="bag topics to play (default: all)")
    parser.add_argument("--prefix", metavar="NS", help="namespace for the published topics")
    parser.add_argument(
        "--absolute-topics", action="store_true", default=None, help="keep recorded names"
    )
    parser.add_argument("--qos-depth", type=int, metavar="N", help="publisher history depth")
    parser.add_argument(
        "--wait-for-subscribers", type=int, metavar="N", help="wait for N subscribers per topic"
    )
    parser.add_argument("--wait-timeout", type=float, metavar="S", help="max wait in seconds")
    parser.add_argument("--start-delay", type=float, metavar="S", help="delay before playing")
    parser.add_argument(
        "--ack-timeout", type=float, metavar="S", help="max wait for acknowledgments at the end"
    )
    parser.add_argument(
        "--lossless",
        action="store_true",
        default=None,
        help="keep every message until acknowledged (KEEP_ALL; no loss to lossless subscribers)",
    )
    return parser


def cli_overrides(ns: argparse.Namespace) -> list[Parameter[Any]]:
    """Parameters set on the command line (options left out keep the parameter values)."""
    mapping = {
        "bag": ns.bag,
        "rate": ns.rate,
        "loop": ns.loop,
        "start_offset": ns.start_offset,
        "topics": ns.topics,
        "topic_prefix": ns.prefix,
        "absolute_topics": ns.absolute_topics,
        "qos_depth": ns.qos_depth,
        "wait_for_subscribers": ns.wait_for_subscribers,
        "wait_timeout": ns.wait_timeout,
        "start_delay": ns.start_delay,
        "ack_timeout": ns.ack_timeout,
        "lossless": ns.lossless,
    }
    return [Parameter(k, value=v) for k, v in mapping.items() if v is not None]


def _spin(executor: SingleThreadedExecutor, stop: threading.Event) -> None:
    """Serve the node (parameter services); a signal ends the spin and stops playback.

    A signal shuts the context down from another thread: the executor then raises either
    ExternalShutdownException or, when the shutdown lands while it builds its wait set, an
    RCLError ("the given context is not valid"). Both mean "stop"; an error while the context
    is still valid is a real one and propagates."""
    try:
        executor.spin()
    except ExternalShutdownException:
        pass
    except Exception:
        if executor.context.ok():
            raise
    finally:
        stop.set()


def main(args: list[str] | None = None) -> int:
    """Entry point; ``args`` is a full argv (program name first), default ``sys.argv``."""
    argv = list(sys.argv if args is None else args)
    options = build_parser().parse_args(remove_ros_args(argv)[1:])
    use_large_data_profile()  # before the DDS participant exists: images are large samples
    watch_sigint()
    rclpy.init(args=argv)
    logger = get_logger(NODE_NAME)
    stop = threading.Event()
    rclpy.get_default_context().on_shutdown(stop.set)
    node: BagPlayer | None = None
    executor = SingleThreadedExecutor()
    spinner = threading.Thread(target=_spin, args=(executor, stop), name="spin", daemon=True)
    try:
        node = BagPlayer(parameter_overrides=cli_overrides(options))
        logger = node.get_logger()
        node.open()
        executor.add_node(node)
        spinner.start()
        logger.info(node.describe())
        if not node.wait_for_matches(stop):
            logger.warning(
                f"not every topic has {node.wait_for_subscribers} subscriber(s) after "
                f"{node.wait_timeout:g} s; playing anyway"
            )
        if node.start_delay > 0:
            stop.wait(node.start_delay)
        stats = node.play(stop)
        delivered = stats.interrupted or node.wait_for_acks()
        if not delivered:
            say = logger.error if node.lossless else logger.warning
            say(f"not every message was acknowledged within {node.ack_timeout:g} s")
        if not node.context.ok():  # shut down by a signal: rosout is gone, log to the console
            logger = get_logger(f"{NODE_NAME}.exit")
        wall = (stats.last_wall_ns - stats.first_wall_ns) / 1e9
        bag = stats.bag_played_ns / 1e9
        logger.info(
            f"published {stats.total} messages ({dict(sorted(stats.published.items()))}) "
            f"in {wall:.3f} s for {bag:.3f} s of bag"
            + (f", effective rate {bag / wall:.3f}" if wall > 0 else "")
            + (" (interrupted)" if stats.interrupted else "")
        )
        return EXIT_NOT_ACKNOWLEDGED if node.lossless and not delivered else 0
    except (BagError, NodeConfigError) as exc:
        logger.error(str(exc))
        return 1
    except (KeyboardInterrupt, ExternalShutdownException):
        get_logger(f"{NODE_NAME}.exit").info("interrupted")
        return 0
    except Exception:
        if not stopping():
            raise
        get_logger(f"{NODE_NAME}.exit").info("interrupted")  # inside rclpy: see watch_sigint
        return 0
    finally:
        stop.set()
        executor.shutdown(timeout_sec=2.0)
        if spinner.is_alive():
            spinner.join(timeout=2.0)
        if node is not None:
            node.close_bag()
            node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
