"""Check a written M3ED-format sequence: reprojected depth vs. depth rendered in the RGB camera."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedepth.data.m3ed import M3EDSequence
from fedepth.data.synth.generate import LIDAR_RANGE, M3EDRecord
from fedepth.data.synth.render import Renderer
from fedepth.data.synth.world import World


@dataclass(frozen=True)
class Agreement:
    """How the reader's reprojected depth matches a direct render of the RGB camera.

    ``median_abs_rel`` / ``p90_abs_rel``: |reprojected - direct| / direct over pixels where
    both have depth. ``coverage_in_view``: share of RGB pixels with direct depth whose surface
    the event camera sees that received a reprojected value. ``coverage``: share of all RGB
    pixels with direct depth that did (lower: the RGB lens is wider than the event camera's).
    """

    frames: int
    median_abs_rel: float
    p90_abs_rel: float
    coverage_in_view: float
    coverage: float


def reprojection_agreement(record: M3EDRecord, world: World) -> Agreement:
    """Read ``record``'s files back and compare every frame with the RGB camera's own depth,
    rendered at the depth sample's time (so pairing to the nearest RGB frame plays no part)."""
    seq = M3EDSequence(record.data_path, record.depth_path)
    rig = record.rig
    renderer = Renderer(world)
    T = rig.T_event_rgb  # RGB-frame points -> event frame (the RGB camera's T_to_prophesee_left)
    x, y = rig.rgb.pixel_rays()
    rel, in_view, total = [], [], []
    with seq:
        for i in range(len(seq)):
            frame = seq[i]
            T_ev = record.trajectory.pose(record.depth_ts[seq.depth_index[i]] / 1e6)
            _, direct = renderer.render(rig.rgb, T_ev @ rig.T_event_rgb, max_range=LIDAR_RANGE)
            pts = np.stack([x * direct, y * direct, direct], -1).reshape(-1, 3)
            pts = pts @ T[:3, :3].T + T[:3, 3]
            u, v, _ = rig.event.project(np.where(pts[:, 2:] > 1e-6, pts, 1.0))
            ev = rig.event
            seen = (
                (direct.ravel() > 0)
                & (pts[:, 2] > 1e-6)
                & (u > 0)
                & (v > 0)
                & (u < ev.width - 1)
                & (v < ev.height - 1)
            ).reshape(direct.shape)
            got = frame.depth > 0
            both = got & (direct > 0)
            rel.append(np.abs(frame.depth[both] - direct[both]) / direct[both])
            in_view.append((got & seen).sum() / max(int(seen.sum()), 1))
            total.append(both.sum() / max(int((direct > 0).sum()), 1))
    r = np.concatenate(rel) if rel else np.zeros(1)
    return Agreement(
        len(in_view),
        float(np.median(r)),
        float(np.percentile(r, 90)),
        float(np.mean(in_view)),
        float(np.mean(total)),
    )
