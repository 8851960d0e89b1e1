"""load_scenario on hand-written manifests: sequences over real-format files, and bad manifests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from handmade_datasets import write_kitti, write_m3ed_pair, write_nyu

from fedepth.data import DataError, load_scenario


def _manifest(root: Path, sequences: list[dict[str, Any]], **extra: Any) -> None:
    doc = {"format": "fedepth-scenario", "version": 1, "scenario": "hand", "sequences": sequences}
    doc.update(extra)
    (root / "manifest.json").write_text(json.dumps(doc))


def _entries(root: Path) -> list[dict[str, Any]]:
    (root / "m").mkdir()
    write_m3ed_pair(root / "m")
    (root / "n").mkdir()
    write_nyu(root / "n")
    (root / "k").mkdir()
    write_kitti(root / "k")
    common = {"min_depth": 1e-3}
    return [
        {
            **common,
            "name": "robot",
            "split": "train",
            "client": "robot",
            "platform": "spot",
            "environment": "forest",
            "source": "m3ed",
            "max_depth": 80.0,
            "num_samples": 3,
            "files": {
                "data": "m/spot_forest_easy_1_data.h5",
                "depth": "m/spot_forest_easy_1_depth_gt.h5",
            },
        },
        {
            **common,
            "name": "home",
            "split": "train",
            "client": "home",
            "platform": "handheld",
            "environment": "indoor",
            "source": "nyu",
            "max_depth": 10.0,
            "num_samples": 2,
            "files": {"mat": "n/nyu_depth_v2_labeled.mat", "splits": "n/splits.mat"},
            "indices": [0, 1],
        },
        {
            **common,
            "name": "drive",
            "split": "test",
            "client": None,
            "platform": "car",
            "environment": "urban_day",
            "source": "kitti",
            "max_depth": 80.0,
            "num_samples": 2,
            "files": {
                "split_file": "k/eigen_train_files_with_gt.txt",
                "data_path": "k/raw",
                "gt_path": "k/gt",
            },
        },
    ]


def test_load_mixed_sources(tmp_path: Path) -> None:
    _manifest(tmp_path, _entries(tmp_path))
    sc = load_scenario(tmp_path)
    assert [c.name for c in sc.clients] == ["robot", "home"] and [s.name for s in sc.test] == [
        "drive"
    ]
    assert sc.clients[0].num_samples == 3 and sc.clients[1].num_samples == 2
    assert sc.client("home").sequences[0].meta.max_depth == 10.0
    assert sc.test[0][0].depth.dtype == np.float32
    assert len(sc.sequences()) == 3
    sc.close()
    with pytest.raises(KeyError):
        sc.client("nobody")


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"manifest.json: no such file"):
        load_scenario(tmp_path)


def test_bad_json_names_the_line(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('{\n "version": 1,\n oops\n}')
    with pytest.raises(DataError, match=r"manifest.json:3: not valid JSON"):
        load_scenario(tmp_path)


def test_unsupported_version(tmp_path: Path) -> None:
    _manifest(tmp_path, [{}], version=7)
    with pytest.raises(DataError, match=r"key 'version': unsupported manifest version 7"):
        load_scenario(tmp_path)


def test_entry_missing_key(tmp_path: Path) -> None:
    entries = _entries(tmp_path)
    del entries[1]["indices"]
    _manifest(tmp_path, entries)
    with pytest.raises(DataError, match=r"key 'indices': sequence 'home' has no 'indices'"):
        load_scenario(tmp_path)


def test_entry_pointing_at_a_missing_file(tmp_path: Path) -> None:
    entries = _entries(tmp_path)
    entries[0]["files"]["depth"] = "m/gone_depth_gt.h5"
    _manifest(tmp_path, entries)
    with pytest.raises(DataError, match=r"gone_depth_gt.h5: no such file"):
        load_scenario(tmp_path)


def test_unknown_source(tmp_path: Path) -> None:
    entries = _entries(tmp_path)
    entries[2]["source"] = "tum"
    _manifest(tmp_path, entries)
    with pytest.raises(DataError, match=r"unknown source 'tum'"):
        load_scenario(tmp_path)


def test_rgb_frames_feed_the_descriptor_extractor(tmp_path: Path) -> None:
    from fedepth.descriptor import DescriptorExtractor

    _manifest(tmp_path, _entries(tmp_path))
    sc = load_scenario(tmp_path)
    extractor = DescriptorExtractor(lambda x: x, num_frames=2, batch_size=2)
    desc = extractor.extract(sc.client("robot").sequences[0].rgb_frames())
    assert desc.dim == 3 and desc.num_frames == 2
    # channel order: red (200) > blue (30), so an RGB/BGR swap would show here
    assert desc.mean[0] > desc.mean[2]
