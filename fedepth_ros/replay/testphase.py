"""The test phase: each test sequence's bag played into a routed ``depth_node`` whose depth a
``depth_scorer`` scores, in waves of the robot slots (the first wave's nodes start during the
last round)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedepth.runstate import write_json_atomic
from fedepth_coordinator.simulate import CoordinatorProcess
from fedepth_ros.replay.bags import BagEntry
from fedepth_ros.replay.coordinator import ReplayCoordinator
from fedepth_ros.replay.processes import Child, node_cmd, ros_params, stop_all

_ROUTE = re.compile(r"routed \d+ frames to clusters \[([0-9, ]*)\]")


class ReplayTestPhase(ReplayCoordinator):
    """The test sequences' depth nodes, scorers and players."""

    def _start_test(self, i: int, e: BagEntry, sdir: Path, target: str) -> tuple[Child, Child]:
        """A test sequence's scorer and routed depth_node (its player comes later)."""
        s, c = self.spec, self.config
        qos = "lossless" if s.lossless else "sensor_data"
        ns = ["--ros-args", "-r", f"__ns:=/test{i:03d}"]
        logs, tdir = sdir / "logs", sdir / "test"
        tdir.mkdir(exist_ok=True)
        principal = f"test-{i:03d}"
        scorer_params = {
            "bag": str(e.bag),
            "out": str(tdir / f"{e.name}.json"),
            "timeout": s.start_timeout_s,
            "eval_height": int(c.image_size[0]),
            "eval_width": int(c.image_size[1]),
            "input_qos": qos,
        }
        node_params = {
            "robot_id": principal,
            "coordinator": target,
            "token_file": str(sdir / "tokens" / f"{principal}.token"),
            "descriptor_frames": max(1, min(e.frames, c.descriptor_frames)),
            "threads": 1,
            "output_qos": qos,
            "input_qos": qos,
            "resize_input": True,
            "queue_size": e.frames + 1,
            # no weights: the node downloads the run's initial model, whose encoder makes the
            # routing descriptor (as the benchmark describes its test sequences), and every
            # frame waits for the routed model
        }
        scorer = Child(
            e.name,
            node_cmd("depth_scorer") + ns + ros_params(scorer_params),
            logs / f"test{i:03d}.scorer.log",
            self.env,
            self.forks,
        )
        node = Child(
            e.name,
            node_cmd("depth_node") + ns + ros_params(node_params),
            logs / f"test{i:03d}.depth.log",
            self.env,
            self.forks,
        )
        self.children += [scorer, node]
        return scorer, node

    def _start_test_player(self, i: int, e: BagEntry, sdir: Path) -> Child:
        s = self.spec
        params = {
            "bag": str(e.bag),
            "topics": "/image,/camera_info",
            "rate": s.rate,
            "lossless": s.lossless,
            "qos_depth": max(10, e.frames),
            "wait_for_subscribers": 2,  # the depth node and the scorer
            "wait_timeout": s.start_timeout_s,
            "ack_timeout": 60.0,
        }
        player = Child(
            e.name,
            [
                *node_cmd("bag_player"),
                "--ros-args",
                "-r",
                f"__ns:=/test{i:03d}",
                *ros_params(params),
            ],
            sdir / "logs" / f"test{i:03d}.player.log",
            self.env,
            self.forks,
        )
        self.children.append(player)
        return player

    def _prestart_tests(self, sdir: Path, target: str) -> None:
        """During the last round, with fresh interpreters (``--fresh-processes``): the first
        wave's scorers and depth nodes start (imports, the served model), so the test phase
        does not wait for them; their players start only once the run finished, so they
        route with the final models. Forked nodes start in seconds: they are not
        prestarted."""
        tdir = sdir / "test"
        todo = [
            (i, e) for i, e in enumerate(self.tests) if not (tdir / f"{e.name}.json").is_file()
        ]
        for i, e in todo[: max(1, self.spec.max_robots)]:
            if i not in self._prestarted:
                self._prestarted[i] = self._start_test(i, e, sdir, target)

    def _test_sequences(
        self,
        method: str,
        sdir: Path,
        target: str,
        coordinator: CoordinatorProcess,
        principals: Sequence[str],
    ) -> dict[str, dict[str, Any]]:
        """Each test sequence's bag into a routed depth_node, scored (in waves of the
        robot slots); sequences scored before are kept."""
        s = self.spec
        tdir = sdir / "test"
        tdir.mkdir(exist_ok=True)
        todo = [
            (i, e) for i, e in enumerate(self.tests) if not (tdir / f"{e.name}.json").is_file()
        ]
        wave_size = max(1, s.max_robots)
        for k in range(0, len(todo), wave_size):
            wave = todo[k : k + wave_size]
            procs = [
                self._prestarted.pop(i)
                if i in self._prestarted
                else self._start_test(i, e, sdir, target)
                for i, e in wave
            ]
            players = [self._start_test_player(i, e, sdir) for i, e in wave]
            for scorer, node in procs:
                try:
                    scorer.proc.wait(s.start_timeout_s + 60)
                except subprocess.TimeoutExpired:
                    scorer.stop()
                node.sample_memory()
            stop_all([c for pair in procs for c in pair] + players)
            for child in [c for pair in procs for c in pair] + players:
                if child in self.children:
                    self.children.remove(child)
            for (_, e), (scorer, node) in zip(wave, procs, strict=True):
                path = tdir / f"{e.name}.json"
                if not path.is_file():
                    self.echo(
                        f"{method}: test {e.name}: the scorer wrote nothing (status "
                        f"{scorer.proc.returncode}; {scorer.log}); left out"
                    )
                    continue
                res = json.loads(path.read_text(encoding="utf-8"))
                res["route"] = _route_of(node.log)
                res["npz"] = str(path.with_suffix(".npz"))
                res["depth_node_peak_rss_bytes"] = node.peak_rss
                write_json_atomic(path, res)
                lat = [r["latency_s"] for r in res["rows"] if r.get("latency_s") is not None]
                rows = [r["native"] for r in res["rows"] if r.get("native")]
                abs_rel = float(np.mean([r["abs_rel"] for r in rows])) if rows else float("nan")
                self.echo(
                    f"{method}: test {e.name}: {res['frames_answered']}/{res['frames_in_bag']} "
                    f"frames answered, abs_rel {abs_rel:.3f}, latency median "
                    f"{(np.median(lat) * 1e3 if lat else float('nan')):.0f} ms, routed to "
                    f"{res['route']}"
                )
        out = {}
        for e in self.tests:
            path = tdir / f"{e.name}.json"
            if path.is_file():
                out[e.name] = json.loads(path.read_text(encoding="utf-8"))
        return out


def _route_of(log: Path) -> list[int] | None:
    try:
        found = _ROUTE.findall(log.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    if not found:
        return None
    return [int(x) for x in found[-1].split(",") if x.strip()]
