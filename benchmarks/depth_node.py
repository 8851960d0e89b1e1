"""Benchmark of depth_node: image-to-depth latency and throughput against the bare model forward.

Starts the depth_node executable (local weights, no coordinator) and, in this process, an rclpy
publisher of rgb8 images and a subscriber of ``depth_pred``. Measures, in the same run:

- forward: the bare ``model(x)`` time of the same model and weights on the same input size,
  device and thread count;
- latency: publish an image, wait for its depth (closed loop, one frame in flight), the time
  from ``publish()`` to the depth message's arrival; forward and latency samples alternate, so
  both see the same machine load (medians of ``--frames`` each);
- throughput: images published at ``--flood-hz`` for ``--flood-s`` seconds; depth frames
  received per second (the node drops the oldest queued images, so this is its capacity);
- replay: a node with its default parameters (only ``weights`` set; no coordinator runs, so it
  predicts with them) fed a ``--replay-frames`` bag at its recorded rate (``--replay-hz``,
  M3ED's 10 Hz RGB-D pairs) by bag_player; the share of frames answered with a depth image, on
  a sensor-data subscription as a navigation stack has. Target: at least 99 %.

Node overhead = median latency - median forward (conversion, queue hand-off, DDS both ways,
clipping, message building). Target: under 10 % of the forward time. The node's own median
predict time (logged when it exits; the latency run has a node of its own) splits that gap
into transport + plumbing (latency - in-node predict) and the node's forward running slower
than this process's (in-node predict - forward: CPU contention, another process's caches).

    python benchmarks/depth_node.py [--size 640x480] [--frames 40] [--device cpu] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
import torch
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import Image

from fedepth.data.bag_writer import synthetic_frames, write_rgbd_bag
from fedepth.data.rosmsg import stamp_to_ns
from fedepth.descriptor import image_to_tensor
from fedepth.models import create_model, save_weights
from fedepth_ros.dds import use_large_data_profile
from fedepth_ros.learner import resolve_device
from fedepth_ros.messages import numpy_to_image
from fedepth_ros.node_common import tune_allocator

ROOT = Path(__file__).resolve().parents[1]
MIN_DEPTH, MAX_DEPTH = 0.1, 10.0


class Forward:
    """The bare model forward on one fixed input (same model, weights, device, threads)."""

    def __init__(self, model: torch.nn.Module, rgb: np.ndarray, device: torch.device) -> None:
        self.model = model.to(device).eval()
        self.x = image_to_tensor(rgb)[None].to(device)
        self.device = device

    def __call__(self) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            self.model(self.x)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start


class Client:
    """Publisher of images and subscriber of depth_pred, spinning in a thread."""

    def __init__(self, domain: int) -> None:
        self.context = Context()
        rclpy.init(
            args=[],
            context=self.context,
            domain_id=domain,
            signal_handler_options=SignalHandlerOptions.NO,
        )
        self.node = rclpy.create_node("bench_depth_client", context=self.context)
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self.pub = self.node.create_publisher(Image, "/bench/image", qos)
        self.cond = threading.Condition()
        self.received: dict[int, float] = {}
        # what a navigation stack subscribes with: the node's default output QoS (sensor data)
        self.sub = self.node.create_subscription(
            Image, "/bench/depth_pred/image", self._on_depth, qos_profile_sensor_data
        )
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _on_depth(self, msg: Image) -> None:
        now = time.perf_counter()
        with self.cond:
            self.received[stamp_to_ns(msg.header.stamp)] = now
            self.cond.notify_all()

    def wait_matched(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.pub.get_subscription_count() and self.sub.get_publisher_count():
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)


def round_trip(client: Client, rgb: np.ndarray, i: int, timeout: float) -> float | None:
    """Publish image ``i`` and wait for its depth; seconds from publish() to arrival, or None
    when it never came (the node's image subscription is best effort: large frames can be
    lost on a busy machine)."""
    msg = numpy_to_image(rgb, "rgb8", stamp_ns=i, frame_id="camera")
    start = time.perf_counter()
    client.pub.publish(msg)
    with client.cond:
        if not client.cond.wait_for(lambda: i in client.received, timeout):
            return None
        return client.received[i] - start


def measure(
    client: Client, forward: Forward, rgb: np.ndarray, n: int, warmup: int = 3
) -> tuple[list[float], list[float], int]:
    """Interleaved: one bare forward, one node round trip (both see the same machine load).

    Returns forward times, latencies and the number of images that got no depth."""
    fwd: list[float] = []
    lat: list[float] = []
    lost = 0
    i = 0
    while len(lat) < n:
        i += 1
        f = forward()
        timeout = max(2.0, 20 * f)
        r = round_trip(client, rgb, i, timeout)
        if r is None:
            lost += 1
            if lost > n:
                raise RuntimeError(f"{lost} images got no depth; is depth_node running?")
            continue
        if i > warmup:
            fwd.append(f)
            lat.append(r)
    return fwd, lat, lost


def measure_throughput(client: Client, rgb: np.ndarray, hz: float, seconds: float) -> float:
    base = 1_000_000
    period = 1.0 / hz
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < seconds:
        i += 1
        client.pub.publish(numpy_to_image(rgb, "rgb8", stamp_ns=base + i, frame_id="camera"))
        time.sleep(max(0.0, start + i * period - time.perf_counter()))
    time.sleep(1.0)  # let the frame in flight finish
    with client.cond:
        arrivals = sorted(t for s, t in client.received.items() if s > base)
    if len(arrivals) < 2:
        return 0.0
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


def measure_replay(
    client: Client, bag: Path, stamps: list[int], env: dict[str, str], timeout_s: float
) -> int:
    """Play ``bag`` at its recorded rate with bag_player (image and camera_info) into the
    running node; the number of its frames answered with a depth image."""
    end = time.monotonic() + 60.0
    while not client.sub.get_publisher_count() and time.monotonic() < end:
        time.sleep(0.05)
    player = [sys.executable, "-m", "fedepth_ros.bag_player", str(bag), "--topics"]
    player += ["/image,/camera_info", "--wait-for-subscribers", "1", "--wait-timeout", "60"]
    done = subprocess.run(
        [*player, "--ros-args", "-r", "__ns:=/bench"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bag_player failed:\n{done.stdout}{done.stderr}")
    time.sleep(2.0)  # the last frames' depth
    wanted = set(stamps)
    with client.cond:
        return len(wanted & set(client.received))


@contextmanager
def running_node(argv: list[str], env: dict[str, str], client: Client) -> Iterator[list[str]]:
    """depth_node as a child while the block runs; yields a list that receives its output."""
    log: list[str] = []
    node = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        if not client.wait_matched(120.0):
            raise RuntimeError("depth_node did not come up within 120 s")
        yield log
    finally:
        node.send_signal(signal.SIGINT)
        try:
            log.append(node.communicate(timeout=30)[0])
        except subprocess.TimeoutExpired:
            node.kill()
            node.communicate()
        deadline = time.monotonic() + 10.0
        while client.pub.get_subscription_count() and time.monotonic() < deadline:
            time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="320x240", metavar="WxH")
    parser.add_argument("--frames", type=int, default=40, help="latency / forward samples")
    parser.add_argument("--model", default="regression-lite")
    parser.add_argument("--device", default="cpu", help="auto | cpu | cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, both sides")
    parser.add_argument("--flood-hz", type=float, default=100.0)
    parser.add_argument("--flood-s", type=float, default=5.0)
    parser.add_argument(
        "--replay-frames",
        type=int,
        default=300,
        help="frames of the default-parameters replay (0: skip it)",
    )
    parser.add_argument(
        "--replay-hz",
        type=float,
        default=10.0,
        help="the replayed bag's recorded rate (M3ED's RGB-D pairs: 10 Hz)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))
    torch.set_num_threads(args.threads)
    tune_allocator()  # the node does this at start: the bare forward runs under the same malloc
    device = resolve_device(args.device)
    rgb = synthetic_frames(1, width=width, height=height)[0].rgb
    domain = 1 + os.getpid() % 100

    with tempfile.TemporaryDirectory() as tmp:
        model = create_model(args.model, min_depth=MIN_DEPTH, max_depth=MAX_DEPTH)
        weights = Path(tmp) / "model.safetensors"
        save_weights(model, weights)
        env = {
            **os.environ,
            "ROS_DOMAIN_ID": str(domain),
            "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
            "OMP_NUM_THREADS": str(args.threads),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
            ),
        }
        node = [sys.executable, "-m", "fedepth_ros.depth_node", "--ros-args", "-r", "__ns:=/bench"]
        argv = list(node)
        for k, v in {
            "coordinator": '""',
            "weights": weights,  # its card: the model and depth range the node builds
            "device": args.device,
            "threads": args.threads,
            "queue_size": 1,
        }.items():
            argv += ["-p", f"{k}:={v}"]
        os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
        use_large_data_profile()  # this process publishes the images: as bag_player does
        client = Client(domain)
        try:
            # one node for the latency run, a fresh one for the flood: the node's own figures
            # (logged at exit) then belong to one run each
            with running_node(argv, env, client) as node_log:
                forward, latency, lost = measure(
                    client, Forward(model, rgb, device), rgb, args.frames
                )
            with running_node(argv, env, client):
                throughput = measure_throughput(client, rgb, args.flood_hz, args.flood_s)
            answered = None
            if args.replay_frames:
                # the node with its defaults but for the weights (no coordinator runs: it
                # predicts with them while it waits), fed a bag by bag_player
                frames = synthetic_frames(
                    args.replay_frames, width=width, height=height, rate_hz=args.replay_hz
                )
                bag = write_rgbd_bag(frames, Path(tmp) / "replay", progress=False).path
                defaults = [*node, "-p", f"weights:={weights}"]
                with running_node(defaults, env, client):
                    answered = measure_replay(
                        client,
                        bag,
                        [f.stamp_ns for f in frames],
                        env,
                        timeout_s=60.0 + 2 * args.replay_frames / args.replay_hz,
                    )
        finally:
            client.close()
    found = re.search(r"inference median ([0-9.]+) ms", "".join(node_log))
    in_node_ms = float(found.group(1)) if found else None

    fwd = float(np.median(forward))
    lat = float(np.median(latency))
    result: dict[str, Any] = {
        "model": args.model,
        "size": [width, height],
        "device": str(device),
        "threads": args.threads,
        "forward_ms": {"median": fwd * 1e3, "p95": float(np.percentile(forward, 95)) * 1e3},
        "latency_ms": {
            "median": lat * 1e3,
            "p95": float(np.percentile(latency, 95)) * 1e3,
            "max": float(np.max(latency)) * 1e3,
        },
        "overhead_ms": (lat - fwd) * 1e3,
        "overhead_pct": 100.0 * (lat - fwd) / fwd,
        "in_node_predict_ms": in_node_ms,
        "transport_ms": None if in_node_ms is None else lat * 1e3 - in_node_ms,
        "throughput_hz": throughput,
        "lost_in_latency_run": lost,
        "forward_bound_hz": 1.0 / fwd,
        "target_overhead_pct": 10.0,
        "replay": None
        if answered is None
        else {
            "frames": args.replay_frames,
            "rate_hz": args.replay_hz,
            "answered": answered,
            "answered_pct": 100.0 * answered / args.replay_frames,
            "target_pct": 99.0,
        },
    }
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        sys.stdout.write(
            f"depth_node {args.model} {width}x{height} on {device} ({args.threads} thread(s))\n"
            f"  bare forward      median {result['forward_ms']['median']:8.2f} ms\n"
            f"  publish->depth    median {lat * 1e3:8.2f} ms  p95 "
            f"{result['latency_ms']['p95']:.2f} ms ({lost} image(s) lost, re-sent)\n"
            f"  in-node predict   median {in_node_ms or float('nan'):8.2f} ms "
            "(image conversion + forward + clip, in the node, same run)\n"
            f"  transport+plumbing{(result['transport_ms'] or float('nan')):8.2f} ms "
            "(publish->depth - in-node predict)\n"
            f"  node overhead     {result['overhead_ms']:8.2f} ms = "
            f"{result['overhead_pct']:.1f} % of forward (target < 10 %)\n"
            f"  throughput        {throughput:8.2f} Hz (forward bound {1 / fwd:.2f} Hz)\n"
        )
        if answered is not None:
            sys.stdout.write(
                f"  replay, defaults  {answered}/{args.replay_frames} frames answered "
                f"({100.0 * answered / args.replay_frames:.1f} %) at {args.replay_hz:g} Hz "
                "(target >= 99 %)\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
