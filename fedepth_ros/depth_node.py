"""The ``depth_node``: live monocular depth from the cluster model routed for this sequence.

Subscribes ``image`` (rgb8/bgr8) and ``camera_info`` with sensor-data QoS. Images go through a
drop-oldest queue (``queue_size``) to a worker thread, which from the first
``descriptor_frames`` frames computes the descriptor, asks the coordinator to route it (the
``robot_id`` principal's credentials) and loads the averaged model of the chosen clusters; with
``coordinator: ""`` it uses the ``weights`` file alone. With ``follow_rounds`` (the default) it
then reloads the routed clusters' models each time a round of the fleet closes, so that a node
started with the fleet publishes the trained models, not the initial ones. Every frame, the
routing frames included, gives ``depth_pred/image`` (32FC1 metres, the input header, NaN =
invalid) and its sibling ``depth_pred/camera_info`` (the input camera_info unchanged,
distortion included, with the image's header; ``mask_border`` blanks a margin the model was
never trained on), and with ``publish_points`` ``depth_pred/points`` (PointCloud2, XYZ in the
camera frame); outputs use ``output_qos`` (sensor data by default) and inference runs only
while someone subscribes to one of them. With ``weights`` set, frames are answered with those
(card-checked) weights while the node waits for routing. The decision (clusters, weights, the
round whose models were loaded) is published on ``fedepth/route`` (latched: transient-local);
``/diagnostics`` says what the node is doing and why nothing is published. The routing calls
(retries, a route with its round, drift monitor, re-route) are :mod:`fedepth_ros.routing`, the
border's check and blanking :mod:`fedepth_ros.border`. Parameters:
``config/depth.yaml``, e.g.

    depth_node --ros-args --params-file config/depth.yaml -p coordinator:="''" \\
        -p weights:=model.safetensors -r image:=camera/image
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.logging import get_logger
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CameraInfo, Image, PointCloud2
from std_msgs.msg import String

from fedepth.data import rosmsg
from fedepth.descriptor import Descriptor
from fedepth.models import card_of
from fedepth.strategies import RouteDecision
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient
from fedepth_ros import messages
from fedepth_ros.border import border_fractions, mask_border
from fedepth_ros.drift import DriftMonitor
from fedepth_ros.learner import (
    DepthPredictor,
    check_served,
    initial_model,
    model_from_weights,
    resolve_device,
    set_threads,
)
from fedepth_ros.node_common import NodeConfigError, WorkerNode, connect, run_node, stream_qos
from fedepth_ros.params import DEPTH_NODE, declare_parameters
from fedepth_ros.routing import (
    ROUTE_RETRY,
    drift_monitor,
    reroute_on_drift,
    retry_until_stopped,
    route_with_round,
)
from fedepth_ros.sync import DropOldestQueue

NODE_NAME = "depth_node"
ROUTE_TOPIC = "fedepth/route"
#: Seconds without input before the diagnostics warn that nothing arrives.
QUIET_S = 3.0


class DepthNode(WorkerNode):
    """Thin adapter: image -> queue -> worker (route once, then infer and publish)."""

    def __init__(self, *, parameter_overrides: list[Parameter[Any]] | None = None) -> None:
        super().__init__(NODE_NAME, parameter_overrides=parameter_overrides)
        params = declare_parameters(self, DEPTH_NODE)
        self.params = params
        self.coordinator = str(params["coordinator"])
        self.weights = str(params["weights"])
        #: answer frames with the local weights while routing is pending (else they wait)
        self.answer_early = bool(self.weights) and bool(params["answer_before_routed"])
        self.descriptor_frames = int(params["descriptor_frames"])
        if self.descriptor_frames < 1 or int(params["queue_size"]) < 1:
            raise NodeConfigError("descriptor_frames and queue_size must be >= 1")
        if not self.coordinator and not self.weights:
            raise NodeConfigError("set coordinator (to route a model) or weights (a local model)")
        if self.coordinator and ":" not in self.coordinator:
            raise NodeConfigError(f"coordinator must be host:port, got {self.coordinator!r}")
        out_qos = stream_qos(str(params["output_qos"]), "output_qos")
        in_qos = stream_qos(str(params["input_qos"]), "input_qos")
        self.resize_input = bool(params["resize_input"])
        try:
            self.mask_border = border_fractions(params["mask_border"])
        except ValueError as exc:
            raise NodeConfigError(f"mask_border: {exc}") from None
        if not float(params["status_period"]) > 0:
            raise NodeConfigError("status_period must be > 0")
        try:
            self.threads = set_threads(int(params["threads"]))
            self.device = resolve_device(str(params["device"]))
            # the model of the weights' card; without weights, the served card's (see _route)
            self.predictor: DepthPredictor | None = (
                DepthPredictor(
                    model_from_weights(self.weights), self.device, resize=self.resize_input
                )
                if self.weights
                else None
            )
        except (ValueError, OSError, KeyError) as exc:
            raise NodeConfigError(f"depth_node: {exc}") from None
        self.reroute = bool(params["reroute"])
        if self.reroute and not self.coordinator:
            self.get_logger().warning("reroute needs a coordinator; keeping the local model")
            self.reroute = False
        self.monitor: DriftMonitor | None = None
        self.reroutes = 0
        self.follow_period = float(params["follow_period"])
        if not self.follow_period > 0:
            raise NodeConfigError("follow_period must be > 0")
        self.follow = bool(params["follow_rounds"]) and bool(self.coordinator)
        #: rounds of the fleet closed when the loaded model was routed (None: not known)
        self.routed_round: int | None = None
        #: what the follower fetched for the worker to load: (decision, rounds closed)
        self._refresh_ready: tuple[RouteDecision, int] | None = None
        self._route_summaries: Mapping[str, np.ndarray] | None = None
        self._follow_thread: threading.Thread | None = None
        self.queue: DropOldestQueue[Image] = DropOldestQueue(int(params["queue_size"]))
        self._pending_max = max(self.descriptor_frames, int(params["queue_size"]))
        self._k: np.ndarray | None = None
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._client: CoordinatorClient | None = None
        self.ready = False
        self.decision: RouteDecision | None = None
        self.routed_descriptor: Descriptor | None = None
        #: with re-routing: the descriptor's encoder (the initial or local weights), kept apart
        #: from the routed model that predicts, for the drift vectors
        self.describer: DepthPredictor | None = None
        self.processed = 0
        self.skipped_unsubscribed = 0
        self.infer_seconds: deque[float] = deque(maxlen=10_000)
        self._info: CameraInfo | None = None
        self.images_received = 0
        self._last_image = time.monotonic()
        self._started = time.monotonic()
        self.route_state = "local weights" if not self.coordinator else "collecting frames"
        self.route_error: str | None = None
        #: the served model is not the local weights' (routing off for good)
        self.card_error: str | None = None
        self._decision_ready: tuple[RouteDecision, Descriptor, DepthPredictor, int] | None = None
        self._route_thread: threading.Thread | None = None
        #: the served model, fetched at start (see _prepare); set once that is over
        self._served: DepthPredictor | None = None
        self._served_thread = threading.Thread(target=self._prepare, name="served", daemon=True)

        self.create_subscription(Image, "image", self._on_image, in_qos)
        self.create_subscription(CameraInfo, "camera_info", self._on_camera_info, in_qos)
        self.depth_pub = self.create_publisher(Image, "depth_pred/image", out_qos)
        self.info_pub = self.create_publisher(CameraInfo, "depth_pred/camera_info", out_qos)
        self.points_pub = (
            self.create_publisher(PointCloud2, "depth_pred/points", out_qos)
            if bool(params["publish_points"])
            else None
        )
        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_timer(float(params["status_period"]), self.publish_diagnostics)
        latched = QoSProfile(
            depth=1,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        )
        self.route_pub = self.create_publisher(String, ROUTE_TOPIC, latched)
        self.worker = threading.Thread(target=self._work, name="depth-worker", daemon=True)

    def _on_image(self, msg: Image) -> None:
        self.images_received += 1
        self._last_image = time.monotonic()
        self.queue.put(msg)  # converted on the worker: the spin thread only hands over

    def _on_camera_info(self, msg: CameraInfo) -> None:
        try:
            self._k = rosmsg.k_from_camera_info(msg)
            self._info = msg
        except rosmsg.ConversionError as exc:
            self.get_logger().warning(f"dropping camera_info: {exc}", throttle_duration_sec=5.0)

    def subscribed(self) -> bool:
        """Whether anyone listens to an output (inference runs only then)."""
        pubs = [self.depth_pub, self.info_pub, self.points_pub]
        return any(pub is not None and pub.get_subscription_count() > 0 for pub in pubs)

    # -- diagnostics (spin thread, cheap) ------------------------------------------------------
    def diagnosis(self) -> tuple[int, str]:
        """(level, message) of what the node does now, naming why nothing is published."""
        now = time.monotonic()
        image_topic = self.resolve_topic_name("image")
        if self.card_error is not None:
            return DiagnosticStatus.ERROR, self.card_error
        if self.route_error is not None and not self.ready and not self.weights:
            return DiagnosticStatus.ERROR, (
                f"publishing nothing: no weights until routed, and {self.route_error}"
            )
        if self.images_received == 0 and now - self._started > QUIET_S:
            return DiagnosticStatus.WARN, f"no images received on {image_topic}"
        if self.images_received and now - self._last_image > QUIET_S:
            return DiagnosticStatus.WARN, (
                f"no images on {image_topic} for {now - self._last_image:.0f} s"
            )
        if self.images_received and self._info is None:
            return DiagnosticStatus.WARN, (
                f"no camera_info on {self.resolve_topic_name('camera_info')}: depth is "
                "published without camera_info (and no points)"
            )
        if not self.ready:
            if self.weights:
                return DiagnosticStatus.WARN, (
                    f"{self.route_state}; predicting with the local weights meanwhile"
                )
            return DiagnosticStatus.WARN, (
                f"{self.route_state}; publishing nothing until routed (no local weights)"
            )
        if self.images_received and not self.subscribed():
            return DiagnosticStatus.OK, "no subscribers: inference paused"
        return DiagnosticStatus.OK, f"publishing depth ({self.route_state})"

    def publish_diagnostics(self) -> None:
        level, message = self.diagnosis()
        if level != DiagnosticStatus.OK:
            self.get_logger().warning(message, throttle_duration_sec=10.0)
        values = {
            "images_received": self.images_received,
            "processed": self.processed,
            "dropped": self.queue.dropped,
            "skipped_unsubscribed": self.skipped_unsubscribed,
            "route": self.route_state,
            "threads": self.threads,
        }
        diag = DiagnosticStatus(
            level=level,
            name=f"{self.get_fully_qualified_name()}: depth",
            message=message,
            hardware_id=str(self.params["robot_id"]),
            values=[KeyValue(key=k, value=str(v)) for k, v in values.items()],
        )
        array = DiagnosticArray(status=[diag])
        array.header.stamp = self.get_clock().now().to_msg()
        self.diag_pub.publish(array)

    # -- worker thread -------------------------------------------------------------------------
    def start(self) -> None:
        if self.coordinator:  # the served card (and model) while the first frames arrive
            self._served_thread.start()
        self.worker.start()

    def shutdown(self) -> bool:
        self.stop.set()
        self.queue.close()
        with self._lock:
            client = self._client
        if client is not None:
            client.close()
        self.worker.join(timeout=30.0)
        if self._route_thread is not None:
            self._route_thread.join(timeout=10.0)
        if self._follow_thread is not None:
            self._follow_thread.join(timeout=10.0)
        if self._served_thread.is_alive():
            self._served_thread.join(timeout=10.0)
        if self.processed:
            times = np.asarray(self.infer_seconds) * 1e3
            get_logger(f"{NODE_NAME}.exit").info(
                f"{self.processed} frames, inference median {np.median(times):.2f} ms, "
                f"mean {times.mean():.2f} ms, "
                f"{self.queue.dropped} dropped from the queue, {self.reroutes} re-routes"
            )
        return not self.worker.is_alive()

    def _work(self) -> None:
        log = self.get_logger()
        pending: list[tuple[Image, np.ndarray]] = []
        if not self.coordinator:
            self._publish_route("local", [], [])
            self.ready = True
        try:
            while not self.stop.is_set():
                try:
                    msg = self.queue.get(timeout=0.5)
                except queue.Empty:
                    # a decision that arrives after the last frame still answers the waiting ones
                    self._maybe_routed(pending)
                    self._maybe_refreshed()
                    continue
                try:
                    rgb = rosmsg.image_to_rgb(msg)
                except rosmsg.ConversionError as exc:
                    log.warning(f"dropping image: {exc}", throttle_duration_sec=5.0)
                    continue
                self._maybe_routed(pending)
                self._maybe_refreshed()
                if self.ready:
                    self._infer(msg, rgb)
                    if self.monitor is not None:
                        self._watch(self.monitor, rgb)
                    continue
                if self.answer_early:
                    self._infer(msg, rgb)  # the weights it has, while it waits for routing
                # kept until routing ends (bounded like the input queue): they get depth from
                # the routed model and feed its drift monitor
                pending.append((msg, rgb))
                del pending[: max(0, len(pending) - self._pending_max)]
                if self._route_thread is None:
                    self.route_state = (
                        f"collecting frames for routing ({len(pending)}/{self.descriptor_frames})"
                    )
                    if len(pending) >= self.descriptor_frames:
                        frames = [r for _, r in pending]
                        self._route_thread = threading.Thread(
                            target=self._route, args=(frames,), name="route", daemon=True
                        )
                        self._route_thread.start()
        except Exception as exc:  # the worker must report, not die silently
            log.error(f"worker failed: {type(exc).__name__}: {exc}")

    def _maybe_routed(self, pending: list[tuple[Image, np.ndarray]]) -> None:
        """Once routing has decided: load the routed model, then give the frames that waited
        their depth (without local weights) and feed them to the drift monitor."""
        routed = self._decision_ready
        if routed is None or self.ready:
            return
        self._apply(*routed)
        self.ready = True
        if self.reroute:
            self.monitor = self._make_monitor()
        if self.follow:
            self._follow_thread = threading.Thread(target=self._follow, name="follow", daemon=True)
            self._follow_thread.start()
        for m, r in pending:
            if not self.answer_early:  # the waiting frames get depth from the routed model
                self._infer(m, r)
            if self.monitor is not None:
                self._watch(self.monitor, r)
        pending.clear()

    def _client_once(self) -> CoordinatorClient:
        with self._lock:
            if self._client is None:
                params = self.params
                self._client = connect(
                    self.coordinator,
                    str(params["robot_id"]),
                    str(params["token_file"]),
                    str(params["tls_ca_file"]),
                )
            return self._client

    def _retry(self, what: str, exc: CoordinatorCallError, backoff: float) -> None:
        self.route_error = f"coordinator {self.coordinator}: {exc}"
        self.route_state = f"waiting for the coordinator {self.coordinator} to {what}"
        if exc.code not in ROUTE_RETRY:
            self.get_logger().error(f"{what}: {exc}", throttle_duration_sec=30.0)
        else:
            self.get_logger().warning(
                f"{what}: {exc}; retrying (every {backoff:g} s)", throttle_duration_sec=30.0
            )
        self.stop.wait(backoff)

    def _served_model(self, client: CoordinatorClient) -> DepthPredictor | None:
        """The served model's card (retried): the model to build without weights, or the one
        the local weights must be. None: stopped, or the card does not fit (route_error)."""
        status = retry_until_stopped(
            client.fleet_status,
            self.stop,
            lambda exc, backoff: self._retry("send its model card", exc, backoff),
        )
        if status is None:  # stopped (a served card may be None: no card, refused below)
            return None
        card_json = status.model_card
        source = f"the coordinator {self.coordinator}"
        try:
            if self.predictor is not None:
                check_served(self.predictor.model, card_json, source)
                return self.predictor
            initial = retry_until_stopped(
                lambda: client.download_model(initial=True),
                self.stop,
                lambda exc, backoff: self._retry("send the initial model", exc, backoff),
            )
            if initial is None:
                return None
            model = initial_model(card_json, initial.task.state, source)
            card = card_of(model)
        except ValueError as exc:
            keep = "; predicting with the local weights only" if self.predictor else ""
            self.card_error = self.route_error = f"cannot route: {exc}{keep}"
            self.route_state = "not routed (model card mismatch)"
            self.get_logger().error(self.card_error)
            return None
        log = self.get_logger()
        log.info(f"built the served model: {source} serves {card.describe()} (initial weights)")
        return DepthPredictor(model, self.device, resize=self.resize_input)

    def _prepare(self) -> None:
        """At start, on its own thread: the served card, the model built from it (or the
        local weights checked against it), so that routing can start with the first frames."""
        try:
            self._served = self._served_model(self._client_once())
        except Exception as exc:
            self.route_error = f"routing failed: {type(exc).__name__}: {exc}"
            self.get_logger().error(self.route_error)

    def _route(self, frames: list[np.ndarray]) -> None:
        """Served card -> descriptor -> Route (retried) on its own thread; the worker applies
        the decision."""
        log = self.get_logger()
        while self._served_thread.is_alive():  # the served card, asked for at start
            self._served_thread.join(timeout=0.5)
        predictor = self._served
        if predictor is None:
            return  # stopped, or the card does not fit (route_error says why)
        try:
            client = self._client_once()
            descriptor, summaries = predictor.features(frames, self.descriptor_frames, seed=0)
        except Exception as exc:
            self.route_error = f"routing failed: {type(exc).__name__}: {exc}"
            log.error(self.route_error)
            return
        self.route_state = f"routing {len(frames)} frames at the coordinator {self.coordinator}"
        self._route_summaries = summaries
        routed = retry_until_stopped(
            lambda: route_with_round(client, descriptor, summaries),
            self.stop,
            lambda exc, backoff: self._retry("route", exc, backoff),
        )
        if routed is None:
            return
        self.route_error = None
        if self.reroute:  # drift is measured with the encoder that made the descriptor
            self.describer = predictor.clone()
        decision, rounds = routed
        self._decision_ready = (decision, descriptor, predictor, rounds)

    def _follow(self) -> None:
        """On its own thread once routed: each time a round of the fleet has closed, route the
        routed descriptor again for the clusters' new models (the worker loads them). A failed
        check is logged and tried again a period later; the loaded model stays meanwhile."""
        log = self.get_logger()
        while not self.stop.wait(self.follow_period):
            descriptor, known = self.routed_descriptor, self.routed_round
            if descriptor is None or self._refresh_ready is not None:
                continue
            try:
                client = self._client_once()
                if known is not None and client.fleet_status().round <= known:
                    continue
                decision, rounds = route_with_round(client, descriptor, self._route_summaries)
            except CoordinatorCallError as exc:
                log.warning(
                    f"following the fleet's rounds: {exc}; keeping the loaded model "
                    f"(next check in {self.follow_period:g} s)",
                    throttle_duration_sec=60.0,
                )
                continue
            self._refresh_ready = (decision, rounds)

    def _maybe_refreshed(self) -> None:
        """Load what the follower fetched (on the worker, between two frames)."""
        refreshed = self._refresh_ready
        if refreshed is None or self.predictor is None or self.routed_descriptor is None:
            return
        self._refresh_ready = None
        decision, rounds = refreshed
        self._apply(decision, self.routed_descriptor, self.predictor, rounds)

    def _apply(
        self,
        decision: RouteDecision,
        descriptor: Descriptor,
        predictor: DepthPredictor,
        rounds: int | None,
    ) -> None:
        predictor.load_state(decision.state, source=f"route {decision.clusters}")
        self.predictor = predictor
        self.decision = decision
        self.routed_descriptor = descriptor
        self.routed_round = rounds
        self._publish_route("coordinator", decision.clusters, decision.weights)
        after = "" if rounds is None else f" after round {rounds}"
        self.route_state = f"routed to clusters {decision.clusters}{after}"
        self.get_logger().info(
            f"routed {descriptor.num_frames} frames to clusters {decision.clusters} "
            f"(weights {[round(w, 3) for w in decision.weights]}; their models{after or ' now'})"
        )

    # -- re-routing (off by default) -----------------------------------------------------------
    def _make_monitor(self) -> DriftMonitor | None:
        reference = self.routed_descriptor
        if reference is None:
            return None
        return drift_monitor(self._client_once, reference, self.params, self.get_logger())

    def _watch(self, monitor: DriftMonitor, rgb: np.ndarray) -> None:
        """Feed the drift monitor; on sustained drift, route the window (one attempt)."""
        assert self.predictor is not None and self.describer is not None
        log = self.get_logger()
        routed = reroute_on_drift(monitor, self.describer.gem(rgb), self._client_once, log)
        if routed is None:
            return
        decision, window, self._route_summaries = routed
        assert self.predictor is not None
        self._apply(decision, window, self.predictor, None)
        monitor.rerouted(window)
        self.reroutes += 1

    def _publish_route(self, source: str, clusters: list[int], weights: list[float]) -> None:
        payload = {
            "source": source,
            "clusters": [int(c) for c in clusters],
            "weights": [float(w) for w in weights],
            "model": "" if self.predictor is None else card_of(self.predictor.model).describe(),
            "weights_file": self.weights if source == "local" else "",
            "descriptor_frames": self.descriptor_frames if source != "local" else 0,
            # the fleet's rounds closed before the loaded models were fetched (-1: not known)
            "round": -1 if self.routed_round is None or source == "local" else self.routed_round,
        }
        self.route_pub.publish(String(data=json.dumps(payload)))

    def _infer(self, msg: Image, rgb: np.ndarray) -> None:
        if not self.subscribed():
            self.skipped_unsubscribed += 1
            return
        predictor = self.predictor
        if predictor is None:
            return
        start = time.perf_counter()
        try:
            depth = predictor.predict(rgb)
        except (RuntimeError, ValueError) as exc:  # e.g. an image too small for the encoder
            self.get_logger().warning(
                f"no depth for a {rgb.shape[1]}x{rgb.shape[0]} image: {exc}",
                throttle_duration_sec=5.0,
            )
            return
        if any(self.mask_border):
            depth = mask_border(depth, self.mask_border)
        self.infer_seconds.append(time.perf_counter() - start)
        self.processed += 1
        stamp_ns = rosmsg.stamp_to_ns(msg.header.stamp)
        out = messages.meters_to_depth_image(
            depth, "32FC1", stamp_ns=stamp_ns, frame_id=msg.header.frame_id
        )
        out.header = msg.header
        self.depth_pub.publish(out)
        info, k = self._info, self._k
        if info is not None and k is not None:
            # the input camera model unchanged, with the image's header
            self.info_pub.publish(messages.restamped_camera_info(info, msg.header))
            if self.points_pub is not None:
                points = rosmsg.depth_to_points(depth, k)
                self.points_pub.publish(messages.points_message(points, header=msg.header))


def main(args: list[str] | None = None) -> int:
    """Entry point; ``args`` is a full argv (program name first), default ``sys.argv``."""
    return run_node(NODE_NAME, DepthNode, args)


if __name__ == "__main__":
    sys.exit(main())
