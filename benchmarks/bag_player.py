"""Benchmark of bag_player: publish-rate accuracy and throughput of RGB-D replay over loopback.

Writes a synthetic RGB-D bag (default 90 frames of 640x480 at 30 Hz: rgb8 image, 32FC1 depth,
camera_info), replays it with the bag_player executable at several rate factors, and receives
it in this process with a reliable rclpy subscriber. Reports, per rate: messages received, the
image arrival span against the recorded span / rate (rate error; "pub" is the player's own
figure from its log), the lateness of each image against its ideal time (median, p95, max) and
the payload throughput. Target: rate error under 2 % and p95 lateness under one frame period
(33 ms) at rate 1. Subscriber-side figures include this process's own scheduling delays.

    python benchmarks/bag_player.py [--rates 1 2 4] [--frames 90] [--size 640x480] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import CameraInfo, Image

from fedepth.data.bag_writer import synthetic_frames, write_rgbd_bag
from fedepth.data.rosmsg import stamp_to_ns

ROOT = Path(__file__).resolve().parents[1]


def replay(bag: Path, rate: float, frames: int, domain: int) -> dict[str, Any]:
    context = Context()
    rclpy.init(
        args=[], context=context, domain_id=domain, signal_handler_options=SignalHandlerOptions.NO
    )
    node = rclpy.create_node("bench_listener", context=context)
    arrivals: dict[str, list[tuple[float, int, int]]] = {"image": [], "depth": [], "info": []}
    cond = threading.Condition()
    qos = QoSProfile(depth=200, reliability=ReliabilityPolicy.RELIABLE)

    def record(key: str) -> Any:
        def cb(msg: Any) -> None:
            size = len(msg.data) if hasattr(msg, "data") else 0
            with cond:
                arrivals[key].append((time.monotonic(), stamp_to_ns(msg.header.stamp), size))
                cond.notify_all()

        return cb

    node.create_subscription(Image, "/bench/image", record("image"), qos)
    node.create_subscription(Image, "/bench/depth", record("depth"), qos)
    node.create_subscription(CameraInfo, "/bench/camera_info", record("info"), qos)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "fedepth_ros.bag_player", str(bag), "--rate", str(rate)]
    cmd += ["--wait-for-subscribers", "1", "--ros-args", "-r", "__ns:=/bench"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    timeout = 30 + 3 * frames / 30.0 / rate
    with cond:
        cond.wait_for(lambda: all(len(a) >= frames for a in arrivals.values()), timeout)
    _, err = proc.communicate(timeout=30)
    published = re.search(r"effective rate ([0-9.]+)", err.decode(errors="replace"))
    executor.shutdown(timeout_sec=2.0)
    node.destroy_node()
    rclpy.shutdown(context=context)
    spinner.join(timeout=5)

    images = arrivals["image"]
    t = np.array([a[0] for a in images])
    s = np.array([a[1] for a in images], dtype=np.float64) / 1e9
    ideal = (s - s[0]) / rate
    lateness = (t - t[0]) - ideal
    lateness -= min(0.0, float(lateness.min()))
    span = float(t[-1] - t[0])
    want = float(ideal[-1])
    payload = sum(a[2] for k in ("image", "depth") for a in arrivals[k])
    return {
        "rate": rate,
        "received": {k: len(v) for k, v in arrivals.items()},
        "span_s": span,
        "expected_span_s": want,
        "rate_error": span / want - 1.0 if want else 0.0,
        "publisher_rate_error": float(published.group(1)) / rate - 1.0 if published else None,
        "lateness_median_ms": float(np.median(lateness) * 1e3),
        "lateness_p95_ms": float(np.percentile(lateness, 95) * 1e3),
        "lateness_max_ms": float(lateness.max() * 1e3),
        "throughput_mb_s": payload / 1e6 / span if span > 0 else 0.0,
        "exit_code": proc.returncode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--frames", type=int, default=90)
    parser.add_argument("--size", default="640x480", metavar="WxH")
    parser.add_argument("--storage", choices=["mcap", "sqlite3"], default="mcap")
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    args = parser.parse_args()
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"  # loopback only, here and below
    width, height = (int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        bag = Path(tmp) / "bench"
        frames = synthetic_frames(args.frames, width=width, height=height, rate_hz=30.0)
        write_rgbd_bag(frames, bag, storage=args.storage, progress=False)
        del frames
        if not args.json:
            print(f"{args.frames} frames {args.size} at 30 Hz, {args.storage}")
            print(
                f"{'rate':>5} {'received':>12} {'span':>8} {'want':>8} {'error':>7} {'pub':>7} "
                f"{'late p50':>9} {'p95':>8} {'max':>8} {'MB/s':>7}"
            )
        for i, rate in enumerate(args.rates):
            r = replay(bag, rate, args.frames, domain=1 + (os.getpid() + i) % 100)
            if args.json:
                print(json.dumps(r))
                continue
            got = "/".join(str(n) for n in r["received"].values())
            print(
                f"{rate:>5g} {got:>12} {r['span_s']:>7.3f}s {r['expected_span_s']:>7.3f}s "
                f"{r['rate_error']:>+7.2%} {r['publisher_rate_error'] or 0.0:>+7.2%} "
                f"{r['lateness_median_ms']:>7.1f}ms "
                f"{r['lateness_p95_ms']:>6.1f}ms {r['lateness_max_ms']:>6.1f}ms "
                f"{r['throughput_mb_s']:>7.1f}"
            )


if __name__ == "__main__":
    main()
