"""The ``robot_node``: a robot's federated client (buffer RGB-D, descriptor, local rounds).

Subscribes ``image`` (rgb8/bgr8), ``depth`` (32FC1 m or 16UC1 mm) and ``camera_info`` with
sensor-data QoS; pairs image and depth by stamp (:class:`~fedepth_ros.sync.PairSync`) into a
bounded :class:`~fedepth_ros.sync.FrameBuffer`. A worker thread waits for
``descriptor_frames`` frames, sends the descriptor and then runs
:func:`fedepth_coordinator.robot.run_robot` with :class:`~fedepth_ros.learner.BufferLearner`
as its training function: every round trains with the recipe the coordinator sends in the task
(steps, batch, optimizer, learning rate and schedule, input size, flips, seed); the
``local_steps``, ``batch_size``, ``lr`` and ``train_height``/``train_width``
parameters are used only when it sends none (with one warning). State goes out on
``fedepth/status`` (std_msgs/String, JSON) and ``/diagnostics`` every ``status_period`` s.
Parameters: ``config/robot.yaml``, e.g.

    robot_node --ros-args --params-file config/robot.yaml -p robot_id:=robot-01 \\
        -p token_file:=robot-01.token -r __ns:=/robot1
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.parameter import Parameter
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import String

from fedepth.data import rosmsg
from fedepth.data.sequence import Frame
from fedepth.models import card_of
from fedepth.strategies import ClientUpdate, TrainTask
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient
from fedepth_coordinator.robot import RobotProfile, run_robot
from fedepth_ros.learner import (
    BufferLearner,
    LearnerConfig,
    check_served,
    initial_model,
    model_from_weights,
    set_threads,
)
from fedepth_ros.node_common import NodeConfigError, WorkerNode, connect, run_node, stream_qos
from fedepth_ros.params import ROBOT_NODE, declare_parameters
from fedepth_ros.routing import retry_until_stopped
from fedepth_ros.sync import FrameBuffer, Pair, PairSync

T = TypeVar("T")

NODE_NAME = "robot_node"
STATUS_TOPIC = "fedepth/status"
#: Seconds without messages before the diagnostics warn that a stream is silent.
QUIET_S = 3.0
#: Long-poll of the round plan; a shutdown cancels it at once (the channel is closed).
POLL_S = 5.0


class RobotNode(WorkerNode):
    """Thin adapter: messages -> frames -> buffer; worker: BufferLearner + run_robot."""

    def __init__(self, *, parameter_overrides: list[Parameter[Any]] | None = None) -> None:
        super().__init__(NODE_NAME, parameter_overrides=parameter_overrides)
        params = declare_parameters(self, ROBOT_NODE)
        self.params = params
        self.robot_id = str(params["robot_id"])
        for name in ("buffer_size", "frame_stride", "descriptor_frames", "local_steps"):
            if int(params[name]) < 1:
                raise NodeConfigError(f"{name} must be >= 1, got {params[name]}")
        if int(params["join_frames"]) < 0:
            raise NodeConfigError(f"join_frames must be >= 0, got {params['join_frames']}")
        input_qos = stream_qos(str(params["input_qos"]), "input_qos")
        if int(params["batch_size"]) < 1 or not float(params["status_period"]) > 0:
            raise NodeConfigError("batch_size must be >= 1 and status_period > 0")
        if ":" not in str(params["coordinator"]):
            raise NodeConfigError(f"coordinator must be host:port, got {params['coordinator']!r}")
        height, width = int(params["train_height"]), int(params["train_width"])
        if (height > 0) != (width > 0):
            raise NodeConfigError("set both train_height and train_width, or neither")
        size = (height, width) if height else None
        spill_dir = str(params["spill_dir"]) or None
        try:
            self.buffer = FrameBuffer(
                int(params["buffer_size"]),
                stride=int(params["frame_stride"]),
                spill_dir=spill_dir,
                spill_capacity=int(params["spill_size"]),
            )
            self.sync: PairSync[np.ndarray, np.ndarray] = PairSync(
                round(float(params["sync_slop"]) * 1e9), int(params["sync_queue_size"])
            )
            self.threads = set_threads(int(params["threads"]))
            # the model of the weights' card; without weights, built from the served card
            model = model_from_weights(str(params["weights"])) if params["weights"] else None
            self.learner = BufferLearner(
                self.robot_id,
                model,
                self.buffer,
                LearnerConfig(
                    local_steps=int(params["local_steps"]),
                    batch_size=int(params["batch_size"]),
                    lr=float(params["lr"]),
                    descriptor_frames=int(params["descriptor_frames"]),
                    image_size=size,
                    device=str(params["device"]),
                    seed=int(params["descriptor_seed"]),
                ),
                warn=self.get_logger().warning,
            )
        except (ValueError, OSError, KeyError) as exc:
            raise NodeConfigError(f"robot_node {self.robot_id}: {exc}") from None
        self._k: np.ndarray | None = None
        #: newest stamp per stream; any step back in one stream is a loop (bag replayed)
        self._newest: dict[str, int] = {"image": -1, "depth": -1}
        self._received = {"image": 0, "depth": 0}
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._no_camera_info = 0
        #: pairs that arrived before the first camera_info (another topic, another writer:
        #: no order across topics), kept until it comes, at most sync_queue_size of them
        self._before_info: list[Pair[np.ndarray, np.ndarray]] = []
        self._bad_messages = 0
        self.error: str | None = None
        self.finished = False
        self.stop = threading.Event()
        self._client: CoordinatorClient | None = None

        self.create_subscription(Image, "image", self._on_image, input_qos)
        self.create_subscription(Image, "depth", self._on_depth, input_qos)
        self.create_subscription(CameraInfo, "camera_info", self._on_camera_info, input_qos)
        self.status_pub = self.create_publisher(String, STATUS_TOPIC, 10)
        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_timer(float(params["status_period"]), self.publish_status)
        self.worker = threading.Thread(target=self._work, name="robot-worker", daemon=True)

    # -- spin thread: cheap conversions only ---------------------------------------------------
    def _warn_bad(self, what: str, exc: Exception) -> None:
        with self._lock:
            self._bad_messages += 1
        self.get_logger().warning(f"dropping {what}: {exc}", throttle_duration_sec=5.0)

    def _on_camera_info(self, msg: CameraInfo) -> None:
        try:
            self._k = rosmsg.k_from_camera_info(msg)
        except rosmsg.ConversionError as exc:
            self._warn_bad("camera_info", exc)
            return
        if self._before_info:
            waiting, self._before_info = self._before_info, []
            self._take(waiting)

    def _on_image(self, msg: Image) -> None:
        try:
            rgb = rosmsg.image_to_rgb(msg)
        except rosmsg.ConversionError as exc:
            self._warn_bad("image", exc)
            return
        stamp = rosmsg.stamp_to_ns(msg.header.stamp)
        self._check_time("image", stamp)
        self._take(self.sync.add_image(stamp, rgb))

    def _on_depth(self, msg: Image) -> None:
        try:
            depth = rosmsg.depth_to_meters(msg)
        except rosmsg.ConversionError as exc:
            self._warn_bad("depth", exc)
            return
        stamp = rosmsg.stamp_to_ns(msg.header.stamp)
        self._check_time("depth", stamp)
        self._take(self.sync.add_depth(stamp, depth))

    def _check_time(self, stream: str, stamp_ns: int) -> None:
        """A stamp behind the newest one of the same stream (each stream is in order): time
        jumped back (a looped bag, however short); start pairing afresh. The other stream
        then starts over too, so its own jump back does not reset the pairs again."""
        self._received[stream] += 1
        newest = self._newest[stream]
        if 0 <= stamp_ns < newest:
            self.get_logger().info(
                f"time jumped back {(newest - stamp_ns) / 1e9:.3f} s on {stream} (bag loop?); "
                "resetting the image/depth synchronizer",
                throttle_duration_sec=5.0,
            )
            self.sync.reset()
            self._newest = {k: -1 for k in self._newest}
        self._newest[stream] = max(self._newest[stream], stamp_ns)

    def _take(self, pairs: list[Pair[np.ndarray, np.ndarray]]) -> None:
        for pair in pairs:
            k = self._k
            if k is None:
                self._before_info.append(pair)
                if len(self._before_info) > self.sync.queue_size:
                    del self._before_info[0]
                    with self._lock:
                        self._no_camera_info += 1
                continue
            try:
                frame = Frame(pair.image, pair.depth, k, pair.image_stamp_ns)
            except ValueError as exc:
                self._warn_bad("image/depth pair", exc)
                continue
            self.buffer.push(frame)

    # -- worker thread -------------------------------------------------------------------------
    def start(self) -> None:
        self.worker.start()

    def _work(self) -> None:
        log = self.get_logger()
        need = int(self.params["join_frames"]) or self.learner.config.descriptor_frames
        try:
            while not self.buffer.wait_for(need, timeout=0.5):
                if self.stop.is_set():
                    return
            params = self.params
            client = connect(
                str(params["coordinator"]),
                self.robot_id,
                str(params["token_file"]),
                str(params["tls_ca_file"]),
            )
            with self._lock:
                if self.stop.is_set():
                    client.close()
                    return
                self._client = client
            num_samples = len(self.buffer)
            # only what the operator declared: the robot sends no label of its own making
            labels = {k: str(params[k]) for k in ("platform", "environment") if str(params[k])}
            card = self._join_model(client, num_samples, labels)
            if card is None:
                return  # stopped while waiting for the coordinator
            descriptor = self.learner.descriptor()
            log.info(f"descriptor of {descriptor.num_frames} frames (dim {descriptor.dim})")
            profile = RobotProfile(
                num_samples=num_samples,
                descriptor=descriptor,
                labels=labels,
                summaries=self.learner.summaries,
                model_card=card,
            )
            try:
                report = run_robot(client, profile, self._train, stop=self.stop, poll_s=POLL_S)
            finally:
                # the run is over: no channel (connection, keepalive, gRPC threads) stays open
                # for the rest of the node's life
                self._close_client()
            self.finished = report.finished
            self.learner.set_phase("finished" if report.finished else "stopped")
            log.info(f"run over: trained rounds {report.rounds}, finished: {report.finished}")
        except CoordinatorCallError as exc:
            if self.stop.is_set():
                return
            self.error = str(exc)
            self.learner.set_phase("error")
            log.error(f"coordinator: {exc}")
        except Exception as exc:  # the worker must report, not die silently
            self.error = f"{type(exc).__name__}: {exc}"
            self.learner.set_phase("error")
            log.error(f"worker failed: {self.error}")

    def _join_model(
        self, client: CoordinatorClient, num_samples: int, labels: dict[str, str]
    ) -> str | None:
        """Register (declaring the local weights' card, if any; the coordinator refuses a
        model that cannot take its weights) and, without weights, build the served model from
        the card in the reply with the run's initial weights: the frozen encoder the fleet's
        descriptors are computed with (a freshly initialized model would describe this
        robot's frames with an encoder of its own, and its divergences would be noise).
        Returns the card this robot declares from now on (None: stopped). Waits for a
        coordinator that is down, saying so."""
        log = self.get_logger()
        own = self.learner.model
        declared = None if own is None else card_of(own).to_json()
        reg = self._retried(
            lambda: client.register(num_samples, labels, model_card=declared), "register"
        )
        if reg is None:
            return None
        source = f"the coordinator {self.params['coordinator']}"
        if own is None:
            initial = self._retried(
                lambda: client.download_model(initial=True), "download the initial model"
            )
            if initial is None:
                return None
            model = initial_model(reg.model_card, initial.task.state, source)
            self.learner.set_model(model)
            log.info(f"built the served model: {card_of(model).describe()} (initial weights)")
            return card_of(model).to_json()
        check_served(own, reg.model_card, source)  # the coordinator checks too; older ones not
        assert declared is not None
        return declared

    def _retried(self, call: Callable[[], T], what: str) -> T | None:
        """``call()`` until it answers (:func:`fedepth_ros.routing.retry_until_stopped`): a
        retryable failure (coordinator down) is logged and retried, any other raised. None:
        stopped meanwhile."""

        def on_failure(exc: CoordinatorCallError, backoff: float) -> None:
            if not exc.retryable:
                raise exc
            self.learner.set_phase("waiting for the coordinator")
            self.get_logger().warning(
                f"coordinator {self.params['coordinator']}: {what}: {exc}; retrying",
                throttle_duration_sec=30.0,
            )
            self.stop.wait(backoff)

        return retry_until_stopped(call, self.stop, on_failure)

    def _train(self, rnd: int, task: TrainTask) -> ClientUpdate:
        self.get_logger().info(f"round {rnd}: training on {len(self.buffer)} frames")
        update = self.learner.train(rnd, task)
        self.get_logger().info(f"round {rnd}: loss {update.metrics['loss']:.4f}; uploading")
        return update

    def _close_client(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()  # cancels a call in progress (the worker sees CANCELLED)

    def shutdown(self) -> bool:
        self.stop.set()
        self._close_client()
        self.worker.join(timeout=30.0)
        self.buffer.close()
        return not self.worker.is_alive()

    # -- status --------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        st = self.learner.state
        buf = self.buffer.stats()
        sync = self.sync.stats()
        with self._lock:
            no_info, bad = self._no_camera_info, self._bad_messages
        return {
            "robot_id": self.robot_id,
            "phase": st.phase,
            "round": st.round,
            "rounds_done": st.rounds_done,
            "last_loss": st.last_loss,
            "last_train_s": st.last_train_s,
            "recipe": st.recipe,
            "buffer": {
                "size": buf.size,
                "capacity": buf.capacity,
                "fill": round(buf.fill, 4),
                "received": buf.received,
                "kept": buf.kept,
                "dropped": buf.dropped,
            },
            "pairs": sync.paired,
            "unpaired_dropped": sync.images_dropped + sync.depths_dropped,
            "pairs_without_camera_info": no_info,
            "bad_messages": bad,
            "error": self.error,
        }

    def diagnosis(self, status: dict[str, Any]) -> tuple[int, str]:
        """(level, message) naming why the robot makes no progress, if it makes none."""
        if status["error"]:
            return DiagnosticStatus.ERROR, str(status["error"])
        quiet = time.monotonic() - self._started > QUIET_S
        with self._lock:
            got = dict(self._received)
        if status["phase"] == "buffering" and quiet:
            for stream in ("image", "depth"):
                if not got[stream]:
                    return DiagnosticStatus.WARN, (
                        f"no {stream} messages on {self.resolve_topic_name(stream)}: "
                        "nothing to buffer"
                    )
            if self._k is None:
                return DiagnosticStatus.WARN, (
                    f"no camera_info on {self.resolve_topic_name('camera_info')}: "
                    f"{status['pairs_without_camera_info']} pairs dropped"
                )
            if status["pairs"] == 0:
                return DiagnosticStatus.WARN, (
                    "image and depth never pair: their stamps differ by more than sync_slop"
                )
        if status["phase"] == "waiting for the coordinator":
            return DiagnosticStatus.WARN, (
                f"waiting for the coordinator {self.params['coordinator']} (not reachable)"
            )
        if status["phase"] == "buffering":
            return DiagnosticStatus.OK, (
                f"buffering frames ({status['buffer']['size']}/"
                f"{self.learner.config.descriptor_frames} for the descriptor)"
            )
        return DiagnosticStatus.OK, f"{status['phase']} (round {status['round']})"

    def publish_status(self) -> None:
        status = self.status()
        self.status_pub.publish(String(data=json.dumps(status)))
        level, message = self.diagnosis(status)
        if level == DiagnosticStatus.WARN:
            self.get_logger().warning(message, throttle_duration_sec=10.0)
        values = [
            KeyValue(key=k, value=str(v)) for k, v in status.items() if not isinstance(v, dict)
        ]
        values += [KeyValue(key=f"buffer.{k}", value=str(v)) for k, v in status["buffer"].items()]
        diag = DiagnosticStatus(
            level=level,
            name=f"{self.get_fully_qualified_name()}: federated client",
            message=message,
            hardware_id=self.robot_id,
            values=values,
        )
        array = DiagnosticArray(status=[diag])
        array.header.stamp = self.get_clock().now().to_msg()
        self.diag_pub.publish(array)


def main(args: list[str] | None = None) -> int:
    """Entry point; ``args`` is a full argv (program name first), default ``sys.argv``."""
    return run_node(NODE_NAME, RobotNode, args)


if __name__ == "__main__":
    sys.exit(main())
