"""KITTI reader: Eigen-split files over the raw tree and the annotated depth (uint16 PNG / 256).

Layout (as BTS, AdaBins and NeWCRFs use it)::

    <data_path>/<date>/calib_cam_to_cam.txt
    <data_path>/<date>/<drive>_sync/image_02/data/<frame>.png
    <gt_path>/<drive>_sync/proj_depth/groundtruth/image_02/<frame>.png

and a split file whose lines are ``<rgb path> <gt path | None> <focal>`` relative to those roots.
Depth PNGs are uint16, metres = value / 256, 0 = no LiDAR point. The principal point comes from
``P_rect_02`` of the date's ``calib_cam_to_cam.txt`` when present, else the image centre.
Lines with ``None`` ground truth are skipped by default, as the standard evaluation does. Frame
stamps are frame number x 100 ms (the raw data's 10 Hz; timestamps.txt is not read).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from PIL import Image

from fedepth.data.camera import intrinsics_matrix
from fedepth.data.errors import DataError
from fedepth.data.sequence import Frame, Sequence, SequenceMeta
from fedepth.depth_range import OUTDOOR

log = logging.getLogger(__name__)

DEPTH_SCALE = 256.0
#: KITTI raw is recorded at 10 Hz; a frame's stamp is its frame number times 100 ms.
RAW_PERIOD_NS = 100_000_000


@dataclass(frozen=True)
class SplitEntry:
    """One split line: image path, depth path (None if the line says None), focal, line no."""

    rgb: str
    depth: str | None
    focal: float
    line: int

    @property
    def drive(self) -> str:
        """The drive folder, e.g. ``2011_09_26_drive_0001_sync``."""
        parts = Path(self.rgb).parts
        return parts[1] if len(parts) > 1 else parts[0]

    @property
    def date(self) -> str:
        return Path(self.rgb).parts[0]


def read_split(path: str | Path) -> list[SplitEntry]:
    """Parse a split file; a malformed line raises DataError naming the file and line."""
    p = Path(path)
    if not p.is_file():
        raise DataError(p, "no such file")
    entries = []
    for no, raw in enumerate(p.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 3:
            raise DataError(
                p,
                f"expected '<rgb> <gt|None> <focal>', found {len(fields)} field(s): {line!r}",
                line=no,
            )
        try:
            focal = float(fields[2])
        except ValueError:
            raise DataError(p, f"focal length {fields[2]!r} is not a number", line=no) from None
        if not np.isfinite(focal) or focal <= 0:
            raise DataError(p, f"focal length must be > 0, got {focal}", line=no)
        depth = None if fields[1] == "None" else fields[1]
        entries.append(SplitEntry(fields[0], depth, focal, no))
    if not entries:
        raise DataError(p, "split file has no entries")
    return entries


def read_principal_point(calib: Path) -> tuple[float, float] | None:
    """(cx, cy) of camera 2 from ``P_rect_02`` in ``calib_cam_to_cam.txt``; None if no file."""
    if not calib.is_file():
        return None
    for no, raw in enumerate(calib.read_text().splitlines(), start=1):
        if raw.startswith("P_rect_02:"):
            try:
                P = np.array([float(x) for x in raw.split(":", 1)[1].split()]).reshape(3, 4)
            except ValueError:
                raise DataError(calib, "P_rect_02 is not 12 numbers", line=no) from None
            return float(P[0, 2]), float(P[1, 2])
    raise DataError(calib, "missing", key="P_rect_02")


def read_depth_png(path: Path) -> npt.NDArray[np.float32]:
    """A KITTI depth PNG as float32 metres (value / 256, 0 = invalid)."""
    try:
        with Image.open(path) as im:
            raw = np.asarray(im)
    except (OSError, ValueError) as exc:
        raise DataError(path, f"not a readable PNG ({exc})") from exc
    if raw.ndim != 2 or raw.dtype not in (np.uint16, np.int32):
        raise DataError(
            path, f"expected a single-channel 16-bit PNG, found {raw.shape} {raw.dtype}"
        )
    return (raw.astype(np.float32) / DEPTH_SCALE).astype(np.float32)


def read_rgb_png(path: Path) -> npt.NDArray[np.uint8]:
    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()
    except (OSError, ValueError) as exc:
        raise DataError(path, f"not a readable image ({exc})") from exc


class KittiSequence(Sequence):
    """Frames listed by (a selection of) the lines of a KITTI split file.

    Every listed file is checked to exist when the sequence is built, so a split line naming a
    missing file fails at once with the split file and line number.
    """

    def __init__(
        self,
        split_file: str | Path,
        data_path: str | Path,
        gt_path: str | Path,
        *,
        lines: list[int] | None = None,
        name: str | None = None,
        meta: SequenceMeta | None = None,
        split: str = "train",
        skip_missing_gt: bool = True,
    ) -> None:
        self.split_file = Path(split_file)
        self.data_path = Path(data_path)
        self.gt_path = Path(gt_path)
        entries = read_split(self.split_file)
        if lines is not None:
            by_line = {e.line: e for e in entries}
            missing = [n for n in lines if n not in by_line]
            if missing:
                raise DataError(
                    self.split_file, f"no entry on line(s) {missing[:5]}", line=missing[0]
                )
            entries = [by_line[n] for n in lines]
        if skip_missing_gt:
            n0 = len(entries)
            entries = [e for e in entries if e.depth is not None]
            if n0 != len(entries):
                log.info(
                    "%s: skipped %d line(s) without ground truth",
                    self.split_file,
                    n0 - len(entries),
                )
        if not entries:
            raise DataError(self.split_file, "no entries with ground truth selected")
        for e in entries:
            if not (self.data_path / e.rgb).is_file():
                raise DataError(
                    self.split_file, f"image {self.data_path / e.rgb} does not exist", line=e.line
                )
            if e.depth is not None and not (self.gt_path / e.depth).is_file():
                raise DataError(
                    self.split_file, f"depth {self.gt_path / e.depth} does not exist", line=e.line
                )
        self.entries = entries
        self._pp: dict[str, tuple[float, float] | None] = {}
        super().__init__(
            name or self.split_file.stem,
            meta
            or SequenceMeta(
                "car", "urban_day", "kitti", split, OUTDOOR.min_depth, OUTDOOR.max_depth
            ),
        )

    def __len__(self) -> int:
        return len(self.entries)

    def _intrinsics(self, e: SplitEntry, h: int, w: int) -> npt.NDArray[np.float64]:
        if e.date not in self._pp:
            self._pp[e.date] = read_principal_point(
                self.data_path / e.date / "calib_cam_to_cam.txt"
            )
        pp = self._pp[e.date]
        cx, cy = pp if pp is not None else ((w - 1) / 2.0, (h - 1) / 2.0)
        return intrinsics_matrix(e.focal, e.focal, cx, cy)

    def _rgb(self, i: int) -> npt.NDArray[np.uint8]:
        return read_rgb_png(self.data_path / self.entries[i].rgb)

    def _frame(self, i: int) -> Frame:
        e = self.entries[i]
        rgb = self._rgb(i)
        h, w = rgb.shape[:2]
        if e.depth is None:
            depth = np.zeros((h, w), dtype=np.float32)
        else:
            depth = read_depth_png(self.gt_path / e.depth)
            if depth.shape != (h, w):
                raise DataError(
                    self.gt_path / e.depth,
                    f"depth is {depth.shape[1]}x{depth.shape[0]} but image "
                    f"{self.data_path / e.rgb} is {w}x{h} (split {self.split_file.name} line "
                    f"{e.line})",
                )
        stamp = int(Path(e.rgb).stem) * RAW_PERIOD_NS if Path(e.rgb).stem.isdigit() else 0
        return Frame(rgb, depth, self._intrinsics(e, h, w), stamp)
