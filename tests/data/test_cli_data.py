"""`fedepth data synth | info | preview`: outputs, and one-line errors with exit status 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fedepth_cli.main import main


@pytest.fixture(scope="module")
def hpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "hpe"
    rc = main(
        [
            "data",
            "synth",
            "--scenario",
            "hpe",
            "--profile",
            "smoke",
            "--seed",
            "3",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 0
    return out


def test_synth_writes_manifest(hpe: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (hpe / "manifest.json").is_file()
    assert len(list((hpe / "train").glob("*_data.h5"))) == 4


def test_info_table(hpe: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "info", str(hpe), "--frames", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("scenario hpe  profile smoke  seed 3  4 clients, 2 test")
    assert out[1].split()[:5] == ["split", "client", "sequence", "platform", "environment"]
    rows = [r.split() for r in out[2:]]
    assert len(rows) == 7 and {r[0] for r in rows} == {"train", "test", "pretrain"}
    indoor = next(r for r in rows if r[4] == "indoor")
    assert float(indoor[-1]) < 10.0  # max depth indoors


def test_preview_sheet(hpe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sheet = tmp_path / "sheet.png"
    assert main(["data", "preview", str(hpe), "--out", str(sheet), "--split", "train"]) == 0
    assert sheet.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    return err


def test_errors_are_one_line(
    hpe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _error(["data", "info", str(tmp_path)], capsys)
    assert err.startswith("fedepth data: error:") and "manifest.json: no such file" in err
    err = _error(["data", "synth", "--scenario", "bmr", "--out", str(hpe)], capsys)
    assert "is not empty; pass --force" in err
    err = _error(["data", "info", str(hpe), "--frames", "0"], capsys)
    assert "--frames must be > 0" in err
    broken = tmp_path / "broken"
    shutil.copytree(hpe, broken)
    (broken / "train" / "spot_forest_easy_1_depth_gt.h5").write_bytes(b"not hdf5")
    err = _error(["data", "info", str(broken)], capsys)
    assert "spot_forest_easy_1_depth_gt.h5: not a readable HDF5 file" in err
