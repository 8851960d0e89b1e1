"""KITTI reader on a hand-made tree: uint16 / 256 scaling, split lines, corrupt input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from handmade_datasets import write_kitti
from PIL import Image

from fedepth.data import DataError, KittiSequence


def test_depth_scaling_and_none_lines(tmp_path: Path) -> None:
    seq = KittiSequence(*write_kitti(tmp_path))
    assert len(seq) == 2  # the line with None ground truth is skipped
    f = seq[0]
    assert f.depth.dtype == np.float32 and f.rgb.shape == (5, 12, 3)
    assert f.depth[1, 2] == 10.5 and f.depth[3, 4] == 65535 / 256
    assert (f.depth > 0).sum() == 2
    assert seq.meta.max_depth == 80.0 and seq.meta.source == "kitti"
    # focal from the split line, principal point from P_rect_02 of the date's calibration
    assert np.allclose(f.K, [[7.0, 0, 5.25], [0, 7.0, 2.1], [0, 0, 1]])


def test_keep_lines_without_ground_truth(tmp_path: Path) -> None:
    seq = KittiSequence(*write_kitti(tmp_path), skip_missing_gt=False)
    assert len(seq) == 3 and not seq[2].valid.any()


def test_principal_point_falls_back_to_the_centre(tmp_path: Path) -> None:
    seq = KittiSequence(*write_kitti(tmp_path, calib=False))
    assert np.allclose(seq[0].K[:2, 2], [5.5, 2.0])


def test_select_lines(tmp_path: Path) -> None:
    seq = KittiSequence(*write_kitti(tmp_path), lines=[2])
    assert len(seq) == 1 and seq[0].rgb[0, 0, 0] == 40


def test_split_line_naming_a_missing_file(tmp_path: Path) -> None:
    split, data, gt = write_kitti(tmp_path)
    lines = split.read_text().splitlines()
    lines[1] = lines[1].replace("0000000001.png", "0000000099.png", 1)
    split.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as info:
        KittiSequence(split, data, gt)
    msg = str(info.value)
    assert f"{split}:2:" in msg and "0000000099.png does not exist" in msg


def test_malformed_line(tmp_path: Path) -> None:
    split, data, gt = write_kitti(tmp_path, lines=["a.png b.png 7.0", "a.png b.png"])
    with pytest.raises(DataError, match=r"eigen_train_files_with_gt.txt:2: expected"):
        KittiSequence(split, data, gt)
    split.write_text("a.png b.png seven\n")
    with pytest.raises(DataError, match=r":1: focal length 'seven' is not a number"):
        KittiSequence(split, data, gt)


def test_depth_and_image_sizes_disagree(tmp_path: Path) -> None:
    seq = KittiSequence(*write_kitti(tmp_path, depth_size=(6, 12)))
    with pytest.raises(DataError, match=r"0000000000.png: depth is 12x6 but image .* line 1"):
        seq[0]


def test_corrupt_png(tmp_path: Path) -> None:
    split, data, gt = write_kitti(tmp_path)
    bad = next(gt.rglob("0000000000.png"))
    bad.write_bytes(b"\x89PNG broken")
    with pytest.raises(DataError, match=r"0000000000.png: not a readable PNG"):
        KittiSequence(split, data, gt)[0]


def test_rgb_png_is_not_a_depth_map(tmp_path: Path) -> None:
    split, data, gt = write_kitti(tmp_path)
    bad = next(gt.rglob("0000000000.png"))
    Image.fromarray(np.zeros((5, 12, 3), np.uint8)).save(bad)
    with pytest.raises(DataError, match=r"expected a single-channel 16-bit PNG"):
        KittiSequence(split, data, gt)[0]
