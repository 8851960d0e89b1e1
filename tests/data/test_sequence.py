"""The Sequence contract: indexing, views, frame validation."""

from __future__ import annotations

import numpy as np
import pytest

from fedepth.data import Frame, Sequence, SequenceMeta, SubSequence


class Counting(Sequence):
    """Frame i has depth i + 1 everywhere and counts how often it was read."""

    def __init__(self, n: int) -> None:
        super().__init__("count", SequenceMeta("spot", "forest", "test", "train"))
        self.n = n
        self.reads = 0

    def __len__(self) -> int:
        return self.n

    def _frame(self, i: int) -> Frame:
        self.reads += 1
        return Frame(
            np.full((2, 3, 3), i, np.uint8), np.full((2, 3), i + 1.0, np.float32), np.eye(3), i
        )


def test_indexing_and_iteration() -> None:
    seq = Counting(4)
    assert seq[-1].stamp_ns == 3 and [f.stamp_ns for f in seq] == [0, 1, 2, 3]
    with pytest.raises(IndexError, match="frame 4 out of range for 4 frames"):
        seq[4]
    assert seq[0].size == (2, 3) and seq[0].valid.all()


def test_rgb_view_is_lazy_and_sliceable() -> None:
    seq = Counting(5)
    view = seq.rgb_frames()
    assert seq.reads == 0 and len(view) == 5
    assert [int(x[0, 0, 0]) for x in view[1:5:2]] == [1, 3]
    assert seq.reads == 2


def test_sub_sequence() -> None:
    base = Counting(5)
    sub = SubSequence(base, [4, 0], name="pick")
    assert len(sub) == 2 and sub.meta == base.meta and sub[0].stamp_ns == 4
    assert int(sub.rgb(1)[0, 0, 0]) == 0
    with pytest.raises(IndexError):
        SubSequence(base, [5], name="bad")


def test_frame_and_meta_validation() -> None:
    with pytest.raises(ValueError, match="rgb must be"):
        Frame(np.zeros((2, 3), np.uint8), np.zeros((2, 3), np.float32), np.eye(3), 0)
    with pytest.raises(ValueError, match="depth must be float32"):
        Frame(np.zeros((2, 3, 3), np.uint8), np.zeros((3, 2), np.float32), np.eye(3), 0)
    with pytest.raises(ValueError, match="K must be 3 x 3"):
        Frame(np.zeros((2, 3, 3), np.uint8), np.zeros((2, 3), np.float32), np.eye(4), 0)
    with pytest.raises(ValueError, match="min_depth < max_depth"):
        SequenceMeta("car", "urban_day", "kitti", "train", 10.0, 5.0)
