"""The ``depth_scorer`` node: scores the depth a ``depth_node`` publishes against a bag's depth.

Subscribes ``image`` (the frames a player sends, to time them) and ``depth_pred/image`` (what
the depth node publishes for them), both with the QoS ``input_qos`` names (``lossless`` in a
replay). Every published depth image is matched by stamp with the bag's ``/depth`` frame and
scored with :func:`fedepth.metrics.compute_errors` (valid = the bag's min/max depth metadata,
inside the source benchmark's evaluation crop): at the published size, as a navigation stack
receives it, and, with ``eval_height``/``eval_width``, at the model's size the way
``fedepth bench`` evaluates (ground truth resized by nearest neighbour, the prediction
bilinearly). Latency is the time from an image's arrival to its depth's, both seen here. It
exits once ``expect`` depth images arrived (0 = one per frame of the bag) or after
``timeout`` s, and writes ``out`` (JSON: per-frame rows, missing frames) and, next to it,
``<out>.npz`` (rgb, ground truth and prediction of the first frame, for the report's figure).

    depth_scorer --ros-args -p bag:=runs/test0 -p out:=scores.json -r __ns:=/test0
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
import torch
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.logging import get_logger
from rclpy.node import Node
from rclpy.parameter import Parameter
from rosbags.typesys import Stores, get_typestore
from sensor_msgs.msg import CameraInfo, Image

from fedepth.atomic import atomic_write_text
from fedepth.data import rosmsg
from fedepth.data.bags import (
    BagError,
    custom_data,
    iter_messages,
    open_bag,
    select_connections,
)
from fedepth.data.crops import evaluation_crop
from fedepth.depth_range import OUTDOOR, check_depth_range
from fedepth.metrics import compute_errors
from fedepth_ros.dds import use_large_data_profile
from fedepth_ros.interrupts import stopping, watch_sigint
from fedepth_ros.node_common import NodeConfigError, stream_qos
from fedepth_ros.params import DEPTH_SCORER, declare_parameters

NODE_NAME = "depth_scorer"


class GroundTruth:
    """A bag's depth frames by stamp, its sequence metadata and its first RGB frame."""

    def __init__(self, bag: Path, depth_topic: str = "/depth", image_topic: str = "/image"):
        typestore = get_typestore(Stores.ROS2_KILTED)
        self.depth: dict[int, np.ndarray] = {}
        self.image_stamps: list[int] = []
        self.first_rgb: dict[int, np.ndarray] = {}
        with open_bag(bag) as reader:
            custom = custom_data(reader)
            conns = select_connections(reader, bag, [depth_topic, image_topic])
            for conn, _, data in iter_messages(reader, bag, conns):
                msg: Any = typestore.deserialize_cdr(data, conn.msgtype)
                stamp = rosmsg.stamp_to_ns(msg.header.stamp)
                if conn.topic.lstrip("/") == depth_topic.lstrip("/"):
                    self.depth[stamp] = rosmsg.depth_to_meters(msg)
                else:
                    self.image_stamps.append(stamp)
                    if not self.first_rgb:
                        self.first_rgb[stamp] = rosmsg.image_to_rgb(msg)
        self.image_stamps.sort()
        self.name = str(custom.get("fedepth.sequence", bag.name))
        self.source = str(custom.get("fedepth.source", ""))
        self.min_depth = float(custom.get("fedepth.min_depth", OUTDOOR.min_depth))
        self.max_depth = float(custom.get("fedepth.max_depth", OUTDOOR.max_depth))
        try:
            check_depth_range(self.min_depth, self.max_depth, f"bag {bag}: fedepth.*_depth")
        except ValueError as exc:
            raise BagError(str(exc)) from None
        self.platform = str(custom.get("fedepth.platform", ""))
        self.environment = str(custom.get("fedepth.environment", ""))


def _scores(
    gt: np.ndarray, pred: np.ndarray, source: str, lo: float, hi: float
) -> dict[str, float] | None:
    crop = evaluation_crop(source, (gt.shape[0], gt.shape[1]))
    try:
        return compute_errors(gt, pred, lo, hi, mask=crop)
    except ValueError:  # no valid ground-truth pixel in this frame
        return None


def score_frame(
    truth: GroundTruth, stamp: int, pred: np.ndarray, eval_size: tuple[int, int] | None
) -> dict[str, Any]:
    """The scores of one published depth image against the bag's frame of the same stamp."""
    gt = truth.depth[stamp]
    row: dict[str, Any] = {"stamp_ns": stamp}
    if pred.shape != gt.shape:
        row["error"] = f"published depth is {pred.shape}, the bag's {gt.shape}"
        return row
    row["native"] = _scores(gt, pred, truth.source, truth.min_depth, truth.max_depth)
    if eval_size is not None:
        import torch.nn.functional as F

        gt_t = torch.from_numpy(np.ascontiguousarray(gt))[None, None]
        pred_t = torch.from_numpy(np.nan_to_num(pred, nan=truth.min_depth))[None, None]
        g = F.interpolate(gt_t, size=eval_size, mode="nearest")[0, 0].numpy()
        p = F.interpolate(pred_t, size=eval_size, mode="bilinear", align_corners=False)
        p_np = p[0, 0].numpy()
        row["model"] = _scores(g, p_np, truth.source, truth.min_depth, truth.max_depth)
    return row


class DepthScorer(Node):
    """Thin adapter: depth_pred/image -> score against the bag (cheap: tiny frames)."""

    def __init__(self, *, parameter_overrides: list[Parameter[Any]] | None = None) -> None:
        super().__init__(NODE_NAME, parameter_overrides=parameter_overrides)
        params = declare_parameters(self, DEPTH_SCORER)
        self.params = params
        if not str(params["bag"]) or not str(params["out"]):
            raise NodeConfigError("set bag (the sequence's bag) and out (the JSON to write)")
        qos = stream_qos(str(params["input_qos"]), "input_qos")
        try:
            self.truth = GroundTruth(Path(str(params["bag"])))
        except BagError as exc:
            raise NodeConfigError(str(exc)) from None
        if not self.truth.depth:
            raise NodeConfigError(f"bag {params['bag']}: no /depth frames to score against")
        h, w = int(params["eval_height"]), int(params["eval_width"])
        self.eval_size = (h, w) if h > 0 and w > 0 else None
        self.expect = int(params["expect"]) or len(self.truth.image_stamps)
        self.lock = threading.Lock()
        self.sent_at: dict[int, float] = {}
        self.rows: dict[int, dict[str, Any]] = {}
        self.sample: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.done = threading.Event()
        self.create_subscription(Image, "image", self._on_image, qos)
        self.create_subscription(Image, "depth_pred/image", self._on_depth, qos)
        # so that a player waiting for two subscribers per topic (this node and the depth
        # node) starts once both are there; the messages themselves are not needed
        self.create_subscription(CameraInfo, "camera_info", lambda _msg: None, qos)

    def _on_image(self, msg: Image) -> None:
        with self.lock:
            self.sent_at.setdefault(rosmsg.stamp_to_ns(msg.header.stamp), time.monotonic())

    def _on_depth(self, msg: Image) -> None:
        now = time.monotonic()
        stamp = rosmsg.stamp_to_ns(msg.header.stamp)
        if stamp not in self.truth.depth:
            self.get_logger().warning(f"depth for stamp {stamp}, which the bag has not")
            return
        pred = rosmsg.depth_to_meters(msg, invalid=float("nan"))
        row = score_frame(self.truth, stamp, pred, self.eval_size)
        with self.lock:
            sent = self.sent_at.get(stamp)
            row["latency_s"] = None if sent is None else now - sent
            self.rows[stamp] = row
            if self.sample is None and stamp in self.truth.first_rgb:
                self.sample = (self.truth.first_rgb[stamp], self.truth.depth[stamp], pred)
            if len(self.rows) >= self.expect:
                self.done.set()

    def result(self, waited_s: float, timed_out: bool) -> dict[str, Any]:
        t = self.truth
        with self.lock:
            rows = [self.rows[s] for s in sorted(self.rows)]
            sent = len(self.sent_at)
        index = {s: i for i, s in enumerate(t.image_stamps)}
        for row in rows:
            row["index"] = index.get(row["stamp_ns"])
        return {
            "sequence": t.name,
            "platform": t.platform,
            "environment": t.environment,
            "source": t.source,
            "min_depth": t.min_depth,
            "max_depth": t.max_depth,
            "frames_in_bag": len(t.image_stamps),
            "frames_seen": sent,
            "frames_answered": len(rows),
            "missing_stamps": [s for s in t.image_stamps if s not in self.rows],
            "eval_size": None if self.eval_size is None else list(self.eval_size),
            "rows": rows,
            "seconds": waited_s,
            "timed_out": timed_out,
        }


def main(args: list[str] | None = None) -> int:
    """Entry point; ``args`` is a full argv (program name first), default ``sys.argv``."""
    argv = list(sys.argv if args is None else args)
    use_large_data_profile()
    watch_sigint()
    rclpy.init(args=argv)
    logger = get_logger(NODE_NAME)
    executor = SingleThreadedExecutor()
    node: DepthScorer | None = None
    try:
        torch.set_num_threads(1)
        node = DepthScorer()
        logger = node.get_logger()
        executor.add_node(node)
        timeout = float(node.params["timeout"])
        t0 = time.monotonic()
        logger.info(f"scoring {node.truth.name}: waiting for {node.expect} depth images")
        while not node.done.is_set() and time.monotonic() - t0 < timeout and rclpy.ok():
            executor.spin_once(timeout_sec=0.1)
        timed_out = not node.done.is_set()
        result = node.result(time.monotonic() - t0, timed_out)
        out = Path(str(node.params["out"]))
        out.parent.mkdir(parents=True, exist_ok=True)
        if node.sample is not None:
            rgb, gt, pred = node.sample
            np.savez(out.with_suffix(".npz"), rgb=rgb, gt=gt, pred=pred)
        atomic_write_text(out, json.dumps(result))
        scored = [r["native"] for r in result["rows"] if r.get("native")]
        summary = (
            f"; mean Abs Rel {np.mean([s['abs_rel'] for s in scored]):.3f}, "
            f"delta<1.25 {np.mean([s['d1'] for s in scored]):.3f} over {len(scored)} frames"
            if scored
            else ""
        )
        logger.info(
            f"{result['frames_answered']}/{result['frames_in_bag']} frames answered"
            + (" (timed out)" if timed_out else "")
            + summary
            + f"; wrote {out}"
        )
        return 0 if not timed_out else 3
    except NodeConfigError as exc:
        logger.error(str(exc))
        return 1
    except (KeyboardInterrupt, ExternalShutdownException):
        get_logger(f"{NODE_NAME}.exit").info("interrupted")
        return 130
    except Exception:
        if not stopping():
            raise
        get_logger(f"{NODE_NAME}.exit").info("interrupted")  # inside rclpy: see watch_sigint
        return 130
    finally:
        executor.shutdown(timeout_sec=2.0)
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
