"""FrameDataset: fixed-size tensors, nearest-neighbour depth, seeded flips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from handmade_datasets import write_m3ed_pair

from fedepth.data import Frame, M3EDSequence, Sequence, SequenceMeta
from fedepth.data.torchdata import FrameDataset, resize_frame


class Ramp(Sequence):
    """Frames whose depth increases left to right (so a flip is visible)."""

    def __init__(self, n: int, h: int = 12, w: int = 16) -> None:
        super().__init__("ramp", SequenceMeta("car", "urban_day", "test", "train"))
        self.n, self.h, self.w = n, h, w

    def __len__(self) -> int:
        return self.n

    def _frame(self, i: int) -> Frame:
        x = np.tile(np.arange(self.w, dtype=np.float32), (self.h, 1))
        depth = 1.0 + x + 100 * i
        depth[0, 0] = 0.0
        rgb = np.zeros((self.h, self.w, 3), np.uint8)
        rgb[..., 0] = (x * 10).astype(np.uint8)
        return Frame(rgb, depth.astype(np.float32), np.eye(3), i)


def test_shapes_ranges_and_nearest_depth() -> None:
    ds = FrameDataset([Ramp(2), Ramp(3)], size=(6, 10))
    assert len(ds) == 5
    rgb, depth = ds[4]
    assert rgb.shape == (3, 6, 10) and rgb.dtype == torch.float32
    assert depth.shape == (1, 6, 10) and depth.dtype == torch.float32
    assert float(rgb.min()) >= 0.0 and float(rgb.max()) <= 1.0
    source = set(np.unique(Ramp(3)[2].depth).tolist())
    assert set(np.unique(depth.numpy()).tolist()) <= source  # no interpolated depth values
    assert ds.locate(4) == (ds.sequences[1], 2)
    with pytest.raises(IndexError):
        ds[5]


def test_flips_are_seeded_per_epoch_and_index() -> None:
    def flips(seed: int, epoch: int) -> list[bool]:
        ds = FrameDataset(Ramp(16), size=(12, 16), flip=True, seed=seed)
        ds.set_epoch(epoch)
        out = []
        for i in range(len(ds)):
            rgb, depth = ds[i]
            flipped = bool(depth[0, 5, 0] > depth[0, 5, -1])
            assert flipped == bool(rgb[0, 5, 0] > rgb[0, 5, -1])  # image and depth together
            out.append(flipped)
        return out

    a = flips(0, 0)
    assert a == flips(0, 0)
    assert 0 < sum(a) < 16
    assert a != flips(0, 1) and a != flips(1, 0)
    assert not any(FrameDataset(Ramp(4), (12, 16))[i][1][0, 5, 0] > 1 + 100 * i for i in range(4))


def test_resize_frame_upscales_m3ed_frames(tmp_path: Path) -> None:
    seq = M3EDSequence(*write_m3ed_pair(tmp_path))
    rgb, depth = resize_frame(seq[0], (30, 40))
    assert rgb.shape == (3, 30, 40) and depth.shape == (1, 30, 40)
    assert np.allclose(np.unique(depth.numpy()), [0.0, 5.0])
    # channel 0 is red (200) after the BGR -> RGB conversion
    assert abs(float(rgb[0].mean()) - 200 / 255) < 1e-3


def test_works_with_a_dataloader(tmp_path: Path) -> None:
    seq = M3EDSequence(*write_m3ed_pair(tmp_path))
    loader = torch.utils.data.DataLoader(FrameDataset(seq, (8, 8)), batch_size=2, num_workers=0)
    rgb, depth = next(iter(loader))
    assert rgb.shape == (2, 3, 8, 8) and depth.shape == (2, 1, 8, 8)
