"""docs/ros.md, "A first fleet in ten minutes": every command of the section, as written.

The ``sh`` blocks of the section are run in order from a scratch directory holding a copy of
config/ (as from the repository root): blocks whose first line is ``# terminal N`` are started
and kept running, the others run to completion. Two things differ from a reader's run: port
50051 becomes a free port, and the processes get this test's own ROS domain (loopback only).
``text`` blocks (ros2 CLI, ros2 launch) need a ROS install and are not run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from sensor_msgs.msg import Image
from std_msgs.msg import String

from fedepth_coordinator.client import CoordinatorClient, open_channel
from fedepth_coordinator.domain import Phase

from .conftest import Listener

pytestmark = pytest.mark.ros

ROOT = Path(__file__).resolve().parents[2]
TITLE = "## A first fleet in ten minutes"
#: the whole section, from the first command to depth on the street sequence. Ten minutes on
#: an idle machine; the bound is for a shared 2-core CI machine, where every process that
#: imports torch takes a minute to start
BUDGET_S = 2400.0


def section_blocks() -> list[tuple[str, str]]:
    """(language, body) of every fenced block of the section."""
    text = (ROOT / "docs" / "ros.md").read_text()
    start = text.index(TITLE)
    end = text.find("\n## ", start + len(TITLE))
    body = text[start : end if end > 0 else None]
    return re.findall(r"```(\w+)\n(.*?)```", body, re.S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_section_starts_the_document_and_has_the_commands_it_promises() -> None:
    text = (ROOT / "docs" / "ros.md").read_text()
    assert text.splitlines()[2] == TITLE  # right under the title
    shell = "\n".join(b for lang, b in section_blocks() if lang == "sh")
    promised = (
        "--add-robot robot1",
        "fedepth-coordinator --config",
        "fedepth_ros.robot_node",
        "fedepth_ros.depth_node",
        "fedepth_ros.bag_player",
        "fedepth fleet status",
    )
    for what in promised:
        assert what in shell, what
    assert "ros2 launch fedepth_ros replay.launch.py" in "\n".join(
        b for lang, b in section_blocks() if lang == "text"
    )


def test_every_command_of_the_first_fleet_runs_as_written(
    tmp_path: Path, ros_env: dict[str, str]
) -> None:
    blocks = [b for lang, b in section_blocks() if lang == "sh"]
    port = free_port()
    blocks = [b.replace("50051", str(port)) for b in blocks]
    # every process that talks to the coordinator names its port: the coordinator's own too
    assert all(str(port) in b for b in blocks if b.startswith("# terminal")), blocks
    shutil.copytree(ROOT / "config", tmp_path / "config")
    env = {
        **ros_env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    terminals: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}
    domain = int(ros_env["ROS_DOMAIN_ID"])
    listener = Listener(
        domain,
        {"/street/depth_pred/image": Image, "/street/fedepth/route#latched": String},
        sensor_qos=frozenset({"/street/depth_pred/image"}),
    )

    def run(block: str) -> str:
        argv = ["bash", "-e", "-c", block]
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, (block, done.stdout[-2000:], done.stderr[-3000:])
        return done.stdout

    def all_logs() -> str:
        return "\n".join(f"--- {n}\n{p.read_text()[-3000:]}" for n, p in logs.items())

    started = time.monotonic()
    ops: CoordinatorClient | None = None
    try:
        after: list[str] = []
        for block in blocks:
            name = re.match(r"# (terminal \d+)", block)
            if name is None:
                if terminals:
                    after.append(block)  # run once the fleet has done its rounds
                else:
                    run(block)
                continue
            logs[name.group(1)] = tmp_path / f"{name.group(1).replace(' ', '_')}.log"
            with logs[name.group(1)].open("wb") as out:
                terminals[name.group(1)] = subprocess.Popen(
                    ["bash", "-e", "-c", block],
                    cwd=tmp_path,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its process group: the player it starts too
                )
            if len(terminals) == 1:  # as the section says: the others once it listens
                ready = "coordinator listening on"
                while ready not in logs[name.group(1)].read_text(errors="replace"):
                    proc = terminals[name.group(1)]
                    assert proc.poll() is None, f"the coordinator exited\n{all_logs()}"
                    assert time.monotonic() - started < BUDGET_S, f"not ready\n{all_logs()}"
                    time.sleep(1.0)
                print(f"first fleet: coordinator ready after {time.monotonic() - started:.0f} s")
        assert len(terminals) == 4 and after, "the section's blocks changed"
        for token in ("robot1", "robot2", "ops"):
            assert len((tmp_path / f"{token}.token").read_text().strip()) > 20
        ops_token = (tmp_path / "ops.token").read_text().strip()
        ops = CoordinatorClient(open_channel(f"127.0.0.1:{port}"), "ops", ops_token)

        def phase() -> Phase | None:
            for name, proc in terminals.items():
                assert proc.poll() is None, f"{name} exited\n{all_logs()}"
            try:
                assert ops is not None
                return ops.fleet_status().phase
            except Exception:
                return None  # the coordinator is still starting

        while phase() is not Phase.FINISHED:
            assert time.monotonic() - started < BUDGET_S, f"no finished run\n{all_logs()}"
            time.sleep(2.0)
        # the depth node follows the rounds: it publishes from the last round's models
        # (fedepth/route names the round) within a follow_period of the run's end
        assert ops is not None
        rounds = ops.fleet_status().num_rounds

        def routed_round() -> int:
            got = listener.received["/street/fedepth/route#latched"]
            return int(json.loads(got[-1][1].data).get("round", -1)) if got else -1

        while routed_round() < rounds:
            assert time.monotonic() - started < BUDGET_S, f"not followed\n{all_logs()}"
            time.sleep(1.0)
        # the blocks after the terminals, as written: the fleet table
        table = "\n".join(run(block) for block in after)
        assert "robot1" in table and "robot2" in table, table
        # the street depth against the bag's own, as the scorer block of the section wrote it
        scores = json.loads((tmp_path / "runs" / "street_depth.json").read_text())
        rows = [r["native"] for r in scores["rows"] if r.get("native")]
        assert len(rows) >= 40, scores["frames_answered"]
        street_abs_rel = float(np.mean([r["abs_rel"] for r in rows]))
        assert street_abs_rel <= 0.5, f"street Abs Rel {street_abs_rel:.3f}\n{all_logs()}"
        # the depth node on the unseen sequence: routed by the coordinator, depth published
        ok = listener.wait_for(
            {"/street/depth_pred/image": 5, "/street/fedepth/route#latched": 1},
            timeout=max(60.0, BUDGET_S - (time.monotonic() - started)),
        )
        assert ok, all_logs()
        route = listener.received["/street/fedepth/route#latched"][-1][1].data
        assert '"source": "coordinator"' in route, route
        assert '"model": "newcrfs-lite' in route, route  # built from the served card
    finally:
        if ops is not None:
            ops.close()
        listener.close()
        for proc in terminals.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        for proc in terminals.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = all_logs()
    assert "built the served model: newcrfs-lite" in text, text
    assert "Traceback" not in text, text
    print(f"first fleet: {time.monotonic() - started:.0f} s, street Abs Rel {street_abs_rel:.3f}")
