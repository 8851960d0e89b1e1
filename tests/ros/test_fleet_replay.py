"""``fedepth fleet replay``: the scheduler, the bag checks, and the loss-free replay of the smoke
scenario through real nodes compared with ``fedepth bench`` on the same scenario."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from fedepth.data.bag_writer import synthetic_frames, write_rgbd_bag
from fedepth_ros.replay import Scheduler, check_bag

ROOT = Path(__file__).resolve().parents[2]


def test_the_scheduler_keeps_at_most_n_robots_and_restarts_only_those_it_must() -> None:
    """A fleet of 7 through 3 slots: enrolment, then 4 rounds in which every robot reports."""
    fleet = [f"r{i}" for i in range(7)]
    sched = Scheduler(fleet, 3)
    running: list[str] = []
    starts = {r: 0 for r in fleet}

    def phase(work: set[str]) -> None:
        """Until no robot has work: each running robot with work does it in one step."""
        while work:
            start, stop = sched.decide(work, running, set())
            assert not set(stop) & work, "a robot with work was stopped"
            for r in stop:
                running.remove(r)
            for r in start:
                running.append(r)
                starts[r] += 1
            assert len(running) <= 3
            done = [r for r in running if r in work]
            assert done or start, "no progress"
            assert len(start) <= len(stop) + 3
            work -= set(done)

    phase(set(fleet))  # enrolment: every robot registers once
    assert sum(starts.values()) == 7
    for _ in range(4):
        phase(set(fleet))
    # the robots still running when a phase ends are the first of the next: 7 - 3 restarts
    # per round, never more
    assert sum(starts.values()) == 7 + 4 * (7 - 3)
    # with slots for everyone, nobody is ever stopped
    sched = Scheduler(fleet, 7)
    running = []
    for _ in range(3):
        start, stop = sched.decide(set(fleet), running, set())
        assert stop == []
        running += start
    assert sorted(running) == sorted(fleet)


def test_a_bag_without_depth_or_camera_info_is_named(tmp_path: Path) -> None:
    good = write_rgbd_bag(synthetic_frames(3), tmp_path / "good", progress=False).path
    assert check_bag(good) == (3, "")
    typestore = get_typestore(Stores.ROS2_KILTED)
    only_image = tmp_path / "only_image"
    with Writer(only_image, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        conn = writer.add_connection("/image", "sensor_msgs/msg/Image", typestore=typestore)
        image = typestore.types["sensor_msgs/msg/Image"]
        header = typestore.types["std_msgs/msg/Header"]
        stamp = typestore.types["builtin_interfaces/msg/Time"]
        msg = image(
            header=header(stamp=stamp(sec=1, nanosec=0), frame_id="camera"),
            height=2,
            width=2,
            encoding="rgb8",
            is_bigendian=0,
            step=6,
            data=np.zeros(12, dtype=np.uint8),
        )
        writer.write(conn, 1, typestore.serialize_cdr(msg, "sensor_msgs/msg/Image"))
    frames, problem = check_bag(only_image)
    assert frames == 1
    assert "has no /camera_info, /depth messages" in problem
    frames, problem = check_bag(tmp_path / "nothing")
    assert "no such file" in problem


@pytest.mark.slow
@pytest.mark.ros
@pytest.mark.timeout(2400)
def test_loss_free_replay_gives_the_benchmarks_cluster_map_and_abs_rel(
    smoke_hpe: Path, tmp_path: Path, ros_env: dict[str, str]
) -> None:
    """Smoke HPE, 4 robots (max 4 processes), 2 rounds of FeDepth: every frame reaches the
    robots' buffers, the robots' descriptors and the cluster map are the benchmark's, and the
    scored depth of the benchmark's evaluation frames is within 2 % of its Abs Rel."""
    from fedepth.bench import BenchSpec, run_benchmark, sim_config

    cache = tmp_path / "cache"
    t0 = time.monotonic()
    bench = run_benchmark(
        BenchSpec(
            scenario="hpe",
            profile="smoke",
            methods=("fedepth",),
            out=tmp_path / "bench",
            sim=sim_config("hpe", "smoke", rounds=2),
            data_dir=smoke_hpe,
            cache_dir=cache,
            progress=False,
        ),
        echo=lambda _line: None,
    )
    t_bench = time.monotonic() - t0
    out = tmp_path / "replay"
    cmd = [sys.executable, "-m", "fedepth_cli", "fleet", "replay", "--scenario-dir"]
    cmd += [str(smoke_hpe), "--methods", "fedepth", "--max-robots", "4", "--rounds", "2"]
    cmd += ["--out", str(out), "--cache", str(cache), "--quiet"]
    env = {**ros_env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env["OMP_WAIT_POLICY"] = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    t0 = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=2000)
    t_replay = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-4000:]
    log = done.stderr
    # progress: one line per round and per test sequence
    assert "fedepth: round 1/2 closed (all reported): 4/4 updates" in log, log
    assert "fedepth: round 2/2 closed (all reported): 4/4 updates" in log, log
    assert log.count("fedepth: test ") == 2, log

    results = json.loads((out / "results.json").read_text())
    assert results["transport"] == "ros-replay"
    for name in ("report.md", "curves.png", "clusters.png", "replay_frames.png"):
        assert (out / name).is_file(), name
    mine = results["methods"]["fedepth"]
    ref = bench["methods"]["fedepth"]
    replay = mine["seeds"]["0"]["replay"]
    # loss-free: every frame the players sent was buffered, every test frame answered
    assert replay["frames_buffered"] == replay["frames_sent"]
    tests = {k: v for k, v in replay["tests"].items() if k != "bench_frames"}
    assert len(tests) == 2
    for name, t in tests.items():
        assert t["frames_answered"] == t["frames_sent"], name
    # the robots computed the benchmark's descriptors from what they buffered
    from fedepth.bench import FleetSummary
    from fedepth_coordinator.state import open_store

    fleet = FleetSummary.load(tmp_path / "bench" / "state" / "seed0")
    assert fleet is not None
    store = open_store("sqlite", out / "state" / "fedepth" / "coordinator")
    try:
        robots = {r.robot_id: r for r in store.load().robots}
    finally:
        store.close()
    for i, client in enumerate(fleet.clients):
        d = robots[client["name"]].descriptor
        assert d is not None
        np.testing.assert_allclose(d.mean, fleet.means[i], rtol=1e-4, atol=1e-6)
    # the same cluster map, and Abs Rel within 2 % of the benchmark's (same round, frames, size)
    assert mine["clusters"] == ref["clusters"]
    bench_last = ref["curves"]["abs_rel"][-1]
    ours = replay["tests"]["bench_frames"]["all"]["abs_rel"]
    print(
        f"bench {t_bench:.0f} s (abs_rel last round {bench_last:.4f}), replay {t_replay:.0f} s "
        f"(abs_rel bench frames {ours:.4f}, every published frame {mine['abs_rel']:.4f})"
    )
    assert abs(ours - bench_last) <= 0.02 * bench_last, (ours, bench_last)

    # the same command again: everything is found finished and kept
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "fedepth: finished earlier" in again.stderr
