"""PyTorch adapter: frames of sequences (or a robot's frame buffer) as fixed-size tensor pairs."""

from __future__ import annotations

from collections.abc import Sequence as AbcSequence
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from fedepth.data.sequence import Frame, Sequence


def resize_frame(frame: Frame, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(rgb (3, H, W) float32 in [0, 1], depth (1, H, W) float32 metres, 0 = invalid).

    RGB is resized bilinearly (with anti-aliasing when shrinking); depth by nearest neighbour,
    so no depth value is invented between a surface and the background or an invalid pixel.
    """
    h, w = size
    rgb = resize_rgb(frame.rgb, size)
    depth = torch.from_numpy(np.ascontiguousarray(frame.depth))[None]
    if tuple(depth.shape[1:]) != (h, w):
        depth = F.interpolate(depth[None], size=(h, w), mode="nearest")[0]
    return rgb, depth.contiguous()


def resize_rgb(image: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    """(H, W, 3) uint8 RGB -> (3, h, w) float32 in [0, 1] at ``size`` = (h, w): bilinear, with
    anti-aliasing when shrinking (the RGB half of :func:`resize_frame`)."""
    h, w = size
    rgb = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float().div_(255.0)
    if tuple(rgb.shape[1:]) != (h, w):
        shrink = h < rgb.shape[1] or w < rgb.shape[2]
        rgb = F.interpolate(
            rgb[None], size=(h, w), mode="bilinear", align_corners=False, antialias=shrink
        )[0].clamp_(0.0, 1.0)
    return rgb.contiguous()


def descriptor_rgb(image: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    """(H, W, 3) uint8 RGB -> (3, h, w) float32 at ``size``, as descriptors are computed:
    bilinear with anti-aliasing whatever the direction, not clamped (what
    :func:`fedepth.sim.prepare_fleet` feeds the frozen encoder; a robot and depth_node
    describe their frames with this too, so that the same frames give the same descriptor)."""
    rgb = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float().div_(255.0)
    return F.interpolate(
        rgb[None], size=size, mode="bilinear", align_corners=False, antialias=True
    )[0]


class Frames(Protocol):
    """Indexable frames: a :class:`~fedepth.data.sequence.Sequence`, or a list of Frames."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int, /) -> Frame: ...


#: What a :class:`FrameDataset` is built from: one sequence, several, or loose frames (a robot's
#: buffer), which form one part.
FrameSource = Sequence | AbcSequence[Sequence] | AbcSequence[Frame]


def frame_parts(source: FrameSource) -> list[Frames]:
    """The parts of a :data:`FrameSource`, in order: its sequences, or its frames as one part."""
    if isinstance(source, Sequence):
        return [source]
    items = list(source)
    if items and all(isinstance(x, Frame) for x in items):
        return [items]  # type: ignore[list-item]
    if not all(isinstance(x, Sequence) for x in items):
        kinds = sorted({type(x).__name__ for x in items})
        raise TypeError(
            f"FrameDataset takes sequences or Frames (not a mix), got {', '.join(kinds)}"
        )
    return list(items)  # type: ignore[arg-type]


class FrameDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """All frames of ``sequences``, resized to ``size`` = (H, W).

    ``sequences`` is a :data:`FrameSource`: a sequence, a list of them (the simulation's
    clients), or a list of :class:`~fedepth.data.sequence.Frame` (a robot's buffer); the same
    frames give the same items either way.

    Items are ``(rgb (3, H, W) float32 in [0, 1], depth (1, H, W) float32 metres, 0 invalid)``.
    With ``flip=True`` each item is mirrored left-right with probability 1/2, decided by
    ``(seed, epoch, index)`` only, so results do not depend on worker count or order; call
    :meth:`set_epoch` to draw new flips each epoch.
    """

    def __init__(
        self,
        sequences: FrameSource,
        size: tuple[int, int],
        *,
        flip: bool = False,
        seed: int = 0,
    ) -> None:
        seqs = frame_parts(sequences)
        if not seqs:
            raise ValueError("FrameDataset has no frames: give it a sequence or frames")
        if len(size) != 2 or min(size) <= 0:
            raise ValueError(f"size must be (H, W) with positive entries, got {size}")
        self.sequences = seqs
        self.size = (int(size[0]), int(size[1]))
        self.flip = flip
        self.seed = seed
        self.epoch = 0
        self._offsets = np.cumsum([0] + [len(s) for s in seqs])

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def locate(self, index: int) -> tuple[Frames, int]:
        """The sequence (or list of frames) and frame index of dataset item ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} frames")
        k = int(np.searchsorted(self._offsets, index, side="right") - 1)
        return self.sequences[k], int(index - self._offsets[k])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq, i = self.locate(int(index))
        rgb, depth = resize_frame(seq[i], self.size)
        if self.flip:
            draw = np.random.default_rng([self.seed, self.epoch, int(index)]).random()
            if draw < 0.5:
                rgb = rgb.flip(-1)
                depth = depth.flip(-1)
        return rgb, depth
