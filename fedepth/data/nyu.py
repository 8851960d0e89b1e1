"""NYUv2 reader: the labeled ``nyu_depth_v2_labeled.mat`` (MATLAB v7.3 = HDF5) and ``splits.mat``.

MATLAB stores arrays column-major, so through h5py every axis order is reversed: ``images`` is
(N, 3, W, H) uint8 and ``depths`` (N, W, H) float metres (in-painted, dense). Frame i is
``images[i].transpose(2, 1, 0)`` and ``depths[i].T``. ``splits.mat`` is a MATLAB v5 file (read
with scipy) holding 1-based ``trainNdxs`` (795) and ``testNdxs`` (654). The labeled set ships no
intrinsics; the NYU toolbox's Kinect RGB intrinsics (camera_params.m) are used, scaled to the
image size when it differs from 480 x 640.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt
import scipy.io

from fedepth.data import h5util
from fedepth.data.camera import intrinsics_matrix, scale_intrinsics
from fedepth.data.errors import DataError
from fedepth.data.sequence import Frame, Sequence, SequenceMeta
from fedepth.depth_range import INDOOR

#: Kinect RGB intrinsics of the NYU Depth v2 toolbox (camera_params.m) at 480 x 640.
NYU_K = intrinsics_matrix(
    5.1885790117450188e02, 5.1946961112127485e02, 3.2558244941119034e02, 2.5373616633400465e02
)
NYU_SIZE = (480, 640)


def nyu_intrinsics(height: int, width: int) -> npt.NDArray[np.float64]:
    """The toolbox intrinsics for an image of (height, width)."""
    return scale_intrinsics(NYU_K, width / NYU_SIZE[1], height / NYU_SIZE[0])


def read_splits(
    path: str | Path, num_images: int | None = None
) -> dict[str, npt.NDArray[np.int64]]:
    """``{"train": ..., "test": ...}`` 0-based indices from ``splits.mat``."""
    p = Path(path)
    if not p.is_file():
        raise DataError(p, "no such file")
    try:
        mat = scipy.io.loadmat(p)
    except Exception as exc:  # scipy raises ValueError/TypeError/MatReadError for damaged files
        raise DataError(p, f"not a readable MATLAB v5 file ({exc})") from exc
    out: dict[str, npt.NDArray[np.int64]] = {}
    for split, key in (("train", "trainNdxs"), ("test", "testNdxs")):
        if key not in mat:
            raise DataError(p, "missing", key=key)
        raw = np.asarray(mat[key])
        if not np.issubdtype(raw.dtype, np.number) or raw.size == 0:
            raise DataError(p, f"expected a non-empty numeric vector, found {raw.dtype}", key=key)
        idx = raw.ravel().astype(np.int64)
        if not np.array_equal(idx, raw.ravel()):
            raise DataError(p, "indices are not integers", key=key)
        if idx.min() < 1:
            raise DataError(p, f"indices are 1-based, found {idx.min()}", key=key)
        if num_images is not None and idx.max() > num_images:
            raise DataError(p, f"index {idx.max()} exceeds the {num_images} images", key=key)
        out[split] = idx - 1
    if np.intersect1d(out["train"], out["test"]).size:
        raise DataError(p, "trainNdxs and testNdxs overlap", key="testNdxs")
    return out


class NYUv2Labeled:
    """The labeled NYUv2 file: image count, size, scene names, and sequences over index sets."""

    def __init__(self, mat_path: str | Path, splits_path: str | Path | None = None) -> None:
        self.path = Path(mat_path)
        with h5util.open_h5(self.path) as f:
            images = h5util.dataset(f, "images")
            depths = h5util.dataset(f, "depths")
            if images.ndim != 4 or images.shape[1] != 3 or images.dtype != np.uint8:
                raise DataError(
                    self.path,
                    f"expected (N, 3, W, H) uint8, found {images.shape} {images.dtype}",
                    key="images",
                )
            if depths.ndim != 3:
                raise DataError(
                    self.path, f"expected (N, W, H), found {depths.shape}", key="depths"
                )
            if depths.shape != (images.shape[0], images.shape[2], images.shape[3]):
                raise DataError(
                    self.path,
                    f"depth maps {depths.shape} do not match the images {images.shape}",
                    key="depths",
                )
            self.num_images = int(images.shape[0])
            self.height, self.width = int(images.shape[3]), int(images.shape[2])
            self.scenes = _read_cellstr(f, "scenes", self.num_images)
        self.splits = (
            read_splits(splits_path, self.num_images) if splits_path is not None else None
        )

    @property
    def intrinsics(self) -> npt.NDArray[np.float64]:
        return nyu_intrinsics(self.height, self.width)

    def split(self, name: str) -> npt.NDArray[np.int64]:
        """0-based indices of the official ``train`` or ``test`` split."""
        if self.splits is None:
            raise ValueError(f"{self.path}: no splits.mat given")
        return self.splits[name]

    def sequence(
        self,
        indices: npt.ArrayLike | None = None,
        *,
        name: str = "nyu",
        split: str = "train",
        meta: SequenceMeta | None = None,
    ) -> NYUSequence:
        """A sequence over the given 0-based image indices (all images if None)."""
        idx = np.arange(self.num_images) if indices is None else np.asarray(indices)
        meta = meta or SequenceMeta(
            "handheld", "indoor", "nyu", split, INDOOR.min_depth, INDOOR.max_depth
        )
        return NYUSequence(self, idx, name=name, meta=meta)


def _read_cellstr(f: h5py.File, key: str, n: int) -> list[str] | None:
    """A MATLAB cell array of strings (v7.3: references to uint16 char arrays), or None."""
    if key not in f:
        return None
    refs = h5util.read(f, key).ravel()
    if refs.size != n:
        raise DataError(f.filename, f"{refs.size} entries for {n} images", key=key)
    out = []
    for i, ref in enumerate(refs):
        try:
            chars = np.asarray(f[ref]).ravel()
        except Exception as exc:  # a dangling or non-reference entry
            raise DataError(
                f.filename, f"entry {i} is not a valid reference ({exc})", key=key
            ) from exc
        out.append("".join(chr(int(c)) for c in chars))
    return out


class NYUSequence(Sequence):
    """Images of the labeled NYUv2 file at given indices, read one at a time.

    The labeled set has no timestamps: a frame's ``stamp_ns`` is its image index.
    """

    def __init__(
        self, source: NYUv2Labeled, indices: npt.ArrayLike, *, name: str, meta: SequenceMeta
    ) -> None:
        super().__init__(name, meta)
        idx = np.asarray(indices, dtype=np.int64).ravel()
        if idx.size == 0:
            raise DataError(source.path, f"sequence {name!r} selects no images")
        if idx.min() < 0 or idx.max() >= source.num_images:
            raise DataError(
                source.path, f"sequence {name!r}: indices outside 0..{source.num_images - 1}"
            )
        self.source = source
        self.indices = idx
        self._f: h5py.File | None = None

    def __len__(self) -> int:
        return int(self.indices.size)

    def _file(self) -> h5py.File:
        if self._f is None:
            self._f = h5util.open_h5(self.source.path)
        return self._f

    def _rgb(self, i: int) -> npt.NDArray[np.uint8]:
        img = h5util.read(self._file(), "images", int(self.indices[i]))
        return np.ascontiguousarray(img.transpose(2, 1, 0))

    def _frame(self, i: int) -> Frame:
        depth = h5util.read(self._file(), "depths", int(self.indices[i])).T
        depth = np.where(np.isfinite(depth) & (depth > 0), depth, 0).astype(np.float32)
        return Frame(
            self._rgb(i), np.ascontiguousarray(depth), self.source.intrinsics, int(self.indices[i])
        )

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_f"] = None
        return state
