"""Tests of `fedepth cluster`: JSON output and one-line errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedepth_cli.main import main


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 6)) * 4
    means = np.concatenate([c + rng.normal(size=(4, 6)) * 0.3 for c in centres])
    variances = np.exp(rng.normal(size=means.shape) * 0.1)
    names = np.array([f"robot{i}" for i in range(12)])
    return _npz(tmp_path / "d.npz", means=means, variances=variances, names=names)


def test_cluster_with_tau(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "--descriptors", str(fleet), "--tau", "10"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tau"] == 10.0
    assert out["K"] == len(out["clusters"])
    assert set(out["memberships"]) == {f"robot{i}" for i in range(12)}
    members = {name for cluster in out["clusters"] for name in cluster}
    assert members == set(out["memberships"])
    # the three well separated groups of four are found
    expected = [{f"robot{i}" for i in range(g * 4, g * 4 + 4)} for g in range(3)]
    assert sorted(map(set, out["clusters"]), key=min) == sorted(expected, key=min)
    assert out["overlap_ratio"] == 0.0


def test_cluster_with_overlap_and_no_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(1)
    f = _npz(
        tmp_path / "d.npz",
        means=rng.normal(size=(10, 4)),
        variances=np.exp(rng.normal(size=(10, 4))),
    )
    assert main(["cluster", "--descriptors", str(f), "--overlap", "0.3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["target_overlap"] == 0.3
    assert all(isinstance(i, int) for c in out["clusters"] for i in c)
    assert 0.0 <= out["overlap_ratio"] <= 1.0


@pytest.mark.parametrize(
    ("arrays", "args", "message"),
    [
        ({"means": np.zeros((3, 2))}, ["--tau", "1"], "missing array(s) variances"),
        (
            {"means": np.zeros((3, 2)), "variances": np.ones((3, 4))},
            ["--tau", "1"],
            "must both be N x D",
        ),
        (
            {"means": np.full((3, 2), np.nan), "variances": np.ones((3, 2))},
            ["--tau", "1"],
            "means contain NaN",
        ),
        (
            {"means": np.zeros((3, 2)), "variances": -np.ones((3, 2))},
            ["--tau", "1"],
            "zero or negative",
        ),
        (
            {"means": np.zeros((3, 2)), "variances": np.zeros((3, 2))},
            ["--tau", "1"],
            "zero or negative",
        ),
        (
            {"means": np.zeros((3, 2)), "variances": np.ones((3, 2))},
            ["--tau", "-1"],
            "--tau must be a finite number >= 0",
        ),
        (
            {"means": np.zeros((3, 2)), "variances": np.ones((3, 2))},
            ["--overlap", "1.5"],
            "--overlap must lie in [0, 1]",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arrays: dict, args: list[str], message: str
) -> None:
    f = _npz(tmp_path / "bad.npz", **arrays)
    assert main(["cluster", "--descriptors", str(f), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert message in err


def test_missing_and_corrupt_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "--descriptors", str(tmp_path / "none.npz"), "--tau", "1"]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "corrupt.npz"
    bad.write_bytes(b"not a zip")
    assert main(["cluster", "--descriptors", str(bad), "--tau", "1"]) == 2
    assert "not a readable .npz" in capsys.readouterr().err


def test_console_script_entry_point(fleet: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedepth_cli",
            "cluster",
            "--descriptors",
            str(fleet),
            "--overlap",
            "0.2",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["K"] >= 1
