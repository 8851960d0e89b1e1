"""M3ED reader on hand-made h5 pairs: reprojection, pairing, colour order, and corrupt input."""

from __future__ import annotations

import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
from handmade_datasets import EVENT, RGB, rgb_pattern, write_m3ed_pair

from fedepth.data import DataError, M3EDSequence
from fedepth.data.camera import rigid
from fedepth.data.m3ed import pair_nearest, parse_m3ed_name


def test_frames_are_reprojected_paired_and_rgb(m3ed_pair: tuple[Path, Path]) -> None:
    seq = M3EDSequence(*m3ed_pair)
    assert len(seq) == 3
    assert seq.meta.platform == "spot" and seq.meta.environment == "forest"
    assert seq.meta.source == "m3ed" and seq.meta.max_depth == 80.0
    f = seq[1]
    assert f.rgb.shape == (RGB["h"], RGB["w"], 3) and f.rgb.dtype == np.uint8
    assert f.depth.shape == (RGB["h"], RGB["w"]) and f.depth.dtype == np.float32
    # depth 115 ms is nearest to RGB frame 3 (120 ms): its pattern encodes i = 3, in RGB order
    assert np.array_equal(f.rgb, rgb_pattern(3, RGB["h"], RGB["w"]))
    assert f.stamp_ns == 120_000 * 1000
    # the plane at 5 m stays at 5 m (identity extrinsics); +inf became invalid, not a value
    assert np.allclose(f.depth[f.depth > 0], 5.0)
    assert 0.3 < (f.depth > 0).mean() < 1.0
    assert np.array_equal(f.K, [[16.0, 0, 9.5], [0, 16.0, 7.0], [0, 0, 1]])
    assert seq.rgb(0).tolist() == rgb_pattern(0, RGB["h"], RGB["w"]).tolist()
    assert len(seq.rgb_frames()) == 3 and seq.rgb_frames()[-1].shape == (RGB["h"], RGB["w"], 3)


def test_event_to_rgb_extrinsics_are_applied(tmp_path: Path) -> None:
    # RGB camera 1 m behind the event camera: T_to_prophesee_left maps RGB points to the event
    # frame by z - 1, so the plane at 5 m from the event camera is 6 m from the RGB camera.
    data, depth = write_m3ed_pair(tmp_path, T_rgb=rigid(0, 0, 0, (0.0, 0.0, -1.0)))
    f = M3EDSequence(data, depth)[0]
    assert np.allclose(f.depth[f.depth > 0], 6.0)


def test_files_open_lazily_and_close(m3ed_pair: tuple[Path, Path]) -> None:
    with M3EDSequence(*m3ed_pair) as seq:
        assert seq._data is None and seq._depth is None
        seq[0]
        assert seq._data is not None
    assert seq._data is None and seq._depth is None
    clone = pickle.loads(pickle.dumps(seq))
    assert np.array_equal(clone[2].depth, seq[2].depth)


def test_sequence_without_depth_has_every_rgb_frame_and_no_valid_depth(
    m3ed_pair: tuple[Path, Path],
) -> None:
    seq = M3EDSequence(m3ed_pair[0], None, split="test")
    assert len(seq) == 6
    assert not seq[5].valid.any()


def test_pair_nearest_drops_samples_without_rgb_frame() -> None:
    rgb = np.array([0, 40, 80, 120], dtype=np.int64)
    keep, idx = pair_nearest(np.array([-100, 19, 21, 60, 125, 300]), rgb, 40)
    assert keep.tolist() == [1, 2, 3, 4] and idx.tolist() == [0, 1, 1, 3]


def test_parse_names() -> None:
    assert parse_m3ed_name("car_urban_night_penno_small_loop") == ("car", "urban_night")
    assert parse_m3ed_name("falcon_outdoor_day_fast_flight_1") == ("falcon", "urban_day")
    assert parse_m3ed_name("falcon_indoor_flight_2") == ("falcon", "indoor")


# --- corrupt and incomplete input: the error names the file and the key --------------------


def _error(data: Path, depth: Path | None) -> str:
    with pytest.raises(DataError) as info:
        M3EDSequence(data, depth)[0]
    return str(info.value)


def test_truncated_file(tmp_path: Path) -> None:
    data, depth = write_m3ed_pair(tmp_path)
    raw = data.read_bytes()
    data.write_bytes(raw[: len(raw) // 3])
    msg = _error(data, depth)
    assert str(data) in msg and "truncated or corrupt" in msg


def test_missing_key(tmp_path: Path) -> None:
    data, depth = write_m3ed_pair(tmp_path, mutate=lambda f, g: f.__delitem__("/ovc/ts"))
    msg = _error(data, depth)
    assert str(data) in msg and "'/ovc/ts'" in msg and "missing" in msg


def test_missing_depth_key(tmp_path: Path) -> None:
    data, depth = write_m3ed_pair(
        tmp_path, mutate=lambda f, g: g.__delitem__("/depth/prophesee/left")
    )
    msg = _error(data, depth)
    assert str(depth) in msg and "'/depth/prophesee/left'" in msg


def test_wrong_calibration_shape(tmp_path: Path) -> None:
    def bad(f: h5py.File, g: h5py.File) -> None:
        del f["/ovc/rgb/calib/T_to_prophesee_left"]
        f["/ovc/rgb/calib/T_to_prophesee_left"] = np.eye(3)

    data, depth = write_m3ed_pair(tmp_path, mutate=bad)
    msg = _error(data, depth)
    assert "'/ovc/rgb/calib/T_to_prophesee_left'" in msg and "(4x4)" in msg and "(3, 3)" in msg


def test_intrinsics_of_wrong_length(tmp_path: Path) -> None:
    def bad(f: h5py.File, g: h5py.File) -> None:
        del f["/prophesee/left/calib/intrinsics"]
        f["/prophesee/left/calib/intrinsics"] = np.ones(3)

    msg = _error(*write_m3ed_pair(tmp_path, mutate=bad))
    assert "'/prophesee/left/calib/intrinsics'" in msg


def test_unsupported_distortion_model(tmp_path: Path) -> None:
    def bad(f: h5py.File, g: h5py.File) -> None:
        del f["/ovc/rgb/calib/distortion_model"]
        f["/ovc/rgb/calib/distortion_model"] = "equidistant"

    msg = _error(*write_m3ed_pair(tmp_path, mutate=bad))
    assert "equidistant" in msg and "distortion_model" in msg


def test_image_size_disagrees_with_calibration(tmp_path: Path) -> None:
    def bad(f: h5py.File, g: h5py.File) -> None:
        f["/ovc/rgb/calib/resolution"][...] = [RGB["w"] + 1, RGB["h"]]

    msg = _error(*write_m3ed_pair(tmp_path, mutate=bad))
    assert "'/ovc/rgb/data'" in msg and "resolution" in msg


def test_depth_size_disagrees_with_event_camera(tmp_path: Path) -> None:
    def bad(f: h5py.File, g: h5py.File) -> None:
        del g["/depth/prophesee/left"]
        g["/depth/prophesee/left"] = np.ones((3, EVENT["h"], EVENT["w"] - 2), np.float32)

    data, depth = write_m3ed_pair(tmp_path, mutate=bad)
    msg = _error(data, depth)
    assert str(depth) in msg and "do not match the event camera" in msg


def test_timestamp_count_disagrees(tmp_path: Path) -> None:
    def bad(f: h5py.File, g: h5py.File) -> None:
        del g["/ts"]
        g["/ts"] = np.arange(2, dtype=np.int64)

    msg = _error(*write_m3ed_pair(tmp_path, mutate=bad))
    assert "'/ts'" in msg and "2 timestamps for 3 frames" in msg


def test_no_depth_sample_near_any_image(tmp_path: Path) -> None:
    msg = _error(*write_m3ed_pair(tmp_path, depth_ts=(10_000_000,)))
    assert "none of 1 depth samples" in msg


def test_missing_file(tmp_path: Path) -> None:
    msg = _error(tmp_path / "nope_data.h5", None)
    assert "nope_data.h5" in msg and "no such file" in msg
