"""The ``fedepth bag`` command group: test-scene writer and info, without importing rclpy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedepth.cli import main


def test_test_scene_then_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "scene"
    argv = ["bag", "test-scene", "--out", str(out), "--frames", "6", "--size", "32x24"]
    assert main([*argv, "--rate", "5", "--storage", "sqlite3", "--no-progress"]) == 0
    assert f"wrote 6 frames (1.000 s) to {out} (sqlite3)" in capsys.readouterr().out
    assert main(["bag", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["storage"], info["message_count"], info["duration_s"]) == ("sqlite3", 18, 1.0)
    assert {t["name"]: t["count"] for t in info["topics"]} == {
        "/image": 6,
        "/depth": 6,
        "/camera_info": 6,
    }
    assert main(["bag", "info", str(out)]) == 0
    text = capsys.readouterr().out
    assert (
        "storage:   sqlite3" in text
        and "/camera_info         6  sensor_msgs/msg/CameraInfo" in text
    )


def test_bag_errors_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bag", "info", str(tmp_path / "missing")]) == 2
    assert "fedepth bag: error: bag" in capsys.readouterr().err
    argv = ["bag", "test-scene", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 2
    assert "exists already" in capsys.readouterr().err
    argv = ["bag", "test-scene", "--out", str(tmp_path / "x"), "--size", "big", "--no-progress"]
    assert main(argv) == 2
    assert "--size WxH" in capsys.readouterr().err


def test_bag_commands_do_not_import_rclpy(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from fedepth.cli import main\n"
        f"assert main(['bag', 'test-scene', '--out', {str(tmp_path / 'b')!r}, '--frames', '2',"
        " '--no-progress']) == 0\n"
        f"assert main(['bag', 'info', {str(tmp_path / 'b')!r}]) == 0\n"
        "assert 'rclpy' not in sys.modules, 'fedepth bag imported rclpy'\n"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)
