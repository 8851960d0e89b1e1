"""The RGB-D sequence abstraction every reader implements: lazy frames, intrinsics and metadata."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from collections.abc import Sequence as AbcSequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from fedepth.depth_range import OUTDOOR, check_depth_range

#: Platforms and environments used across the project (M3ED's robots plus NYUv2's handheld rig).
PLATFORMS = ("car", "spot", "falcon", "handheld")
ENVIRONMENTS = ("forest", "urban_day", "urban_night", "indoor")
SPLITS = ("train", "test", "pretrain")


@dataclass(frozen=True)
class SequenceMeta:
    """What a sequence is: robot platform, environment, source dataset, split, evaluation caps.

    ``min_depth`` / ``max_depth`` are the evaluation caps of the source benchmark
    (:mod:`fedepth.depth_range`: NYUv2 indoors, KITTI outdoors, the default); metrics count a
    pixel only where ``min_depth < gt < max_depth``.
    """

    platform: str
    environment: str
    source: str
    split: str
    min_depth: float = OUTDOOR.min_depth
    max_depth: float = OUTDOOR.max_depth

    def __post_init__(self) -> None:
        check_depth_range(self.min_depth, self.max_depth, "depth caps")


@dataclass(frozen=True, eq=False)
class Frame:
    """One RGB-D sample.

    ``rgb``: (H, W, 3) uint8 in RGB order. ``depth``: (H, W) float32 metres, 0 = invalid.
    ``K``: (3, 3) float64 pinhole intrinsics for this (H, W). ``stamp_ns``: image time in ns.
    """

    rgb: npt.NDArray[np.uint8]
    depth: npt.NDArray[np.float32]
    K: npt.NDArray[np.float64]
    stamp_ns: int

    def __post_init__(self) -> None:
        if self.rgb.ndim != 3 or self.rgb.shape[2] != 3 or self.rgb.dtype != np.uint8:
            raise ValueError(f"rgb must be (H, W, 3) uint8, got {self.rgb.shape} {self.rgb.dtype}")
        if self.depth.shape != self.rgb.shape[:2] or self.depth.dtype != np.float32:
            raise ValueError(
                f"depth must be float32 of the image size {self.rgb.shape[:2]}, got "
                f"{self.depth.shape} {self.depth.dtype}"
            )
        if self.K.shape != (3, 3):
            raise ValueError(f"K must be 3 x 3, got {self.K.shape}")

    @property
    def size(self) -> tuple[int, int]:
        """(H, W)."""
        return (int(self.rgb.shape[0]), int(self.rgb.shape[1]))

    @property
    def valid(self) -> npt.NDArray[np.bool_]:
        """Pixels with a depth value."""
        return np.asarray(self.depth > 0)


class Sequence(abc.ABC):
    """An ordered, lazily read RGB-D sequence.

    Subclasses implement :meth:`_frame` (and usually a cheaper :meth:`_rgb`) and :meth:`__len__`;
    nothing is read before a frame is asked for, and files are opened on first use and closed by
    :meth:`close` (or the context manager). Sequences pickle without their open handles, so they
    can go to DataLoader worker processes.
    """

    def __init__(self, name: str, meta: SequenceMeta) -> None:
        self.name = name
        self.meta = meta

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def _frame(self, i: int) -> Frame: ...

    def _rgb(self, i: int) -> npt.NDArray[np.uint8]:
        return self._frame(i).rgb

    def _index(self, i: int) -> int:
        n = len(self)
        j = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"{self.name}: frame {i} out of range for {n} frames")
        return j

    def __getitem__(self, i: int) -> Frame:
        return self._frame(self._index(i))

    def __iter__(self) -> Iterator[Frame]:
        for i in range(len(self)):
            yield self._frame(i)

    def rgb(self, i: int) -> npt.NDArray[np.uint8]:
        """The RGB image of frame ``i`` alone (no depth read, no reprojection)."""
        return self._rgb(self._index(i))

    def rgb_frames(self) -> RGBFrames:
        """A lazy indexable of the RGB images (for ``DescriptorExtractor.extract``)."""
        return RGBFrames(self)

    def close(self) -> None:  # noqa: B027 (a default: most readers have files to release)
        """Release open files; the sequence reopens them if used again."""

    def __enter__(self) -> Sequence:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        m = self.meta
        return (
            f"{type(self).__name__}({self.name!r}, {len(self)} frames, {m.platform}/"
            f"{m.environment}, {m.source}:{m.split})"
        )


class RGBFrames(AbcSequence[npt.NDArray[np.uint8]]):
    """The RGB images of a sequence as a read-on-demand sequence of (H, W, 3) uint8 arrays."""

    def __init__(self, sequence: Sequence) -> None:
        self.sequence = sequence

    def __len__(self) -> int:
        return len(self.sequence)

    @overload
    def __getitem__(self, i: int) -> npt.NDArray[np.uint8]: ...

    @overload
    def __getitem__(self, i: slice) -> list[npt.NDArray[np.uint8]]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self.sequence.rgb(j) for j in range(*i.indices(len(self)))]
        return self.sequence.rgb(i)


class SubSequence(Sequence):
    """A view of selected frames of another sequence, under its own name and metadata."""

    def __init__(
        self,
        base: Sequence,
        indices: npt.ArrayLike,
        *,
        name: str,
        meta: SequenceMeta | None = None,
    ) -> None:
        super().__init__(name, meta or base.meta)
        idx = np.asarray(indices, dtype=np.int64).ravel()
        if idx.size and (idx.min() < 0 or idx.max() >= len(base)):
            raise IndexError(f"{name}: indices outside 0..{len(base) - 1} of {base.name}")
        self.base = base
        self.indices = idx

    def __len__(self) -> int:
        return int(self.indices.size)

    def _frame(self, i: int) -> Frame:
        return self.base[int(self.indices[i])]

    def _rgb(self, i: int) -> npt.NDArray[np.uint8]:
        return self.base.rgb(int(self.indices[i]))

    def close(self) -> None:
        self.base.close()
