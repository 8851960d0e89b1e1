"""Checked access to HDF5 files: every failure becomes a DataError naming the file and the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt

from fedepth.data.errors import DataError


def open_h5(path: str | Path) -> h5py.File:
    """Open an HDF5 file read-only; a missing, truncated or non-HDF5 file raises DataError."""
    p = Path(path)
    if not p.is_file():
        raise DataError(p, "no such file")
    try:
        return h5py.File(p, "r")
    except OSError as exc:
        raise DataError(p, f"not a readable HDF5 file (truncated or corrupt?): {exc}") from exc


def dataset(f: h5py.File, key: str) -> h5py.Dataset:
    """The dataset at ``key``; DataError if it is missing or a group."""
    try:
        obj = f[key]
    except KeyError:
        raise DataError(f.filename, "missing", key=key) from None
    except Exception as exc:  # h5py raises RuntimeError/OSError for damaged object headers
        raise DataError(f.filename, f"unreadable ({exc})", key=key) from exc
    if not isinstance(obj, h5py.Dataset):
        raise DataError(f.filename, f"expected a dataset, found a {type(obj).__name__}", key=key)
    return obj


def read(f: h5py.File, key: str, index: Any = ()) -> npt.NDArray[Any]:
    """Read ``f[key][index]``; a damaged chunk (truncated file) raises DataError."""
    ds = dataset(f, key)
    try:
        return np.asarray(ds[index])
    except (OSError, RuntimeError, ValueError) as exc:
        raise DataError(f.filename, f"cannot read {index!r} ({exc})", key=key) from exc


def read_array(
    f: h5py.File, key: str, shape: tuple[int, ...] | None = None, *, numeric: bool = True
) -> npt.NDArray[Any]:
    """Read a whole small dataset and check its shape (``-1`` matches any length)."""
    arr = read(f, key)
    if shape is not None and (
        arr.ndim != len(shape)
        or any(s not in (-1, a) for s, a in zip(shape, arr.shape, strict=True))
    ):
        want = "x".join("N" if s == -1 else str(s) for s in shape)
        raise DataError(f.filename, f"expected shape ({want}), found {arr.shape}", key=key)
    if numeric and not np.issubdtype(arr.dtype, np.number):
        raise DataError(f.filename, f"expected numbers, found dtype {arr.dtype}", key=key)
    return arr


def read_string(f: h5py.File, key: str) -> str:
    """A scalar string dataset (Kalibr's ``camera_model`` / ``distortion_model``)."""
    arr = read(f, key)
    value = arr.item() if arr.shape == () else arr.ravel()[0]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
