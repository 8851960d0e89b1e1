"""NYUv2 reader on hand-made files: MATLAB axis order, 1-based splits, corrupt input."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.io
from handmade_datasets import NYU_H, NYU_N, NYU_W, nyu_depth, nyu_image, write_nyu

from fedepth.data import DataError, NYUv2Labeled
from fedepth.data.nyu import NYU_K, nyu_intrinsics, read_splits


def test_axes_are_restored(tmp_path: Path) -> None:
    nyu = NYUv2Labeled(*write_nyu(tmp_path))
    assert (nyu.num_images, nyu.height, nyu.width) == (NYU_N, NYU_H, NYU_W)
    seq = nyu.sequence([3, 0], name="two")
    f = seq[0]
    assert f.rgb.shape == (NYU_H, NYU_W, 3)
    assert np.array_equal(f.rgb, nyu_image(3))  # rows, columns and channels all in place
    assert np.allclose(f.depth, nyu_depth(3))
    assert np.array_equal(seq.rgb(1), nyu_image(0))
    assert seq.meta.max_depth == 10.0 and seq.meta.platform == "handheld"


def test_official_splits_are_zero_based(tmp_path: Path) -> None:
    nyu = NYUv2Labeled(*write_nyu(tmp_path))
    assert nyu.split("train").tolist() == [0, 1, 3]
    assert nyu.split("test").tolist() == [2, 4]


def test_intrinsics_scale_with_image_size() -> None:
    assert np.allclose(nyu_intrinsics(480, 640), NYU_K)
    K = nyu_intrinsics(48, 64)
    assert np.isclose(K[0, 0], NYU_K[0, 0] / 10) and np.isclose(
        K[0, 2], (NYU_K[0, 2] + 0.5) / 10 - 0.5
    )


@pytest.mark.parametrize("key", ["images", "depths"])
def test_missing_key(tmp_path: Path, key: str) -> None:
    mat, _ = write_nyu(tmp_path, drop=key)
    with pytest.raises(DataError, match=rf"{mat.name}.*key '{key}': missing"):
        NYUv2Labeled(mat)


def test_depth_and_image_sizes_disagree(tmp_path: Path) -> None:
    mat, _ = write_nyu(tmp_path, depth_shape=(NYU_N, NYU_W, NYU_H + 1))
    with pytest.raises(DataError, match=r"key 'depths'.*do not match the images"):
        NYUv2Labeled(mat)


def test_truncated_mat(tmp_path: Path) -> None:
    mat, _ = write_nyu(tmp_path)
    mat.write_bytes(mat.read_bytes()[:600])
    with pytest.raises(DataError, match=r"nyu_depth_v2_labeled.mat: not a readable HDF5"):
        NYUv2Labeled(mat)


def test_splits_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.mat"
    scipy.io.savemat(bad, {"trainNdxs": np.array([[1.0]])})
    with pytest.raises(DataError, match=r"bad.mat: key 'testNdxs': missing"):
        read_splits(bad)
    scipy.io.savemat(bad, {"trainNdxs": np.array([[1.0]]), "testNdxs": np.array([[9.0]])})
    with pytest.raises(DataError, match=r"key 'testNdxs': index 9 exceeds the 5 images"):
        read_splits(bad, NYU_N)
    scipy.io.savemat(bad, {"trainNdxs": np.array([[0.0]]), "testNdxs": np.array([[2.0]])})
    with pytest.raises(DataError, match=r"key 'trainNdxs': indices are 1-based"):
        read_splits(bad)


def test_scene_names_are_read_from_matlab_cells(tmp_path: Path) -> None:
    mat, _ = write_nyu(tmp_path)
    with h5py.File(mat, "a") as f:
        refs = []
        for i in range(NYU_N):
            ds = f.create_dataset(
                f"#refs#/s{i}", data=np.array([[ord(c) for c in f"room_{i}"]], np.uint16).T
            )
            refs.append(ds.ref)
        cell = f.create_dataset("scenes", (1, NYU_N), dtype=h5py.ref_dtype)
        cell[0, :] = refs
    assert NYUv2Labeled(mat).scenes == [f"room_{i}" for i in range(NYU_N)]
