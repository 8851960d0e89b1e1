"""Trajectories that keep their platform's standoff: no recorded robot drives, walks or flies
its camera into a wall, so neither do the synthetic ones (see :func:`clear_trajectory`)."""

from __future__ import annotations

import logging

import numpy as np
import numpy.typing as npt

from fedepth.data.camera import Camera
from fedepth.data.synth.platforms import Platform
from fedepth.data.synth.render import Renderer
from fedepth.data.synth.trajectory import Trajectory
from fedepth.data.synth.world import World

log = logging.getLogger(__name__)
F64 = npt.NDArray[np.float64]

#: Ouster OS1-64 (M3ED) and Velodyne HDL-64E (KITTI) ranges are of the order of 120 m.
LIDAR_RANGE = 120.0
#: Trajectories drawn for a sequence before settling for the clearest one (see
#: :func:`clear_trajectory`), and the coarse view (width, height) clearance is probed with.
TRAJECTORY_ATTEMPTS = 16
PROBE_SIZE = (16, 12)


def view_depth(renderer: Renderer, probe: Camera, T_world_cam: F64) -> float:
    """Median z-depth (m) of what ``probe`` sees at a pose; inf when it sees only sky."""
    _, depth = renderer.render(probe, T_world_cam, max_range=LIDAR_RANGE)
    hit = depth[depth > 0]
    return float(np.median(hit)) if hit.size else float("inf")


def clear_trajectory(
    world: World,
    platform: Platform,
    environment: str,
    rng: np.random.Generator,
    duration: float,
    cam: Camera,
    times: npt.ArrayLike,
    name: str,
) -> Trajectory:
    """A trajectory along which ``cam``'s view keeps the platform's standoff at every time in
    ``times`` (seconds): no robot of a real recording drives, walks or flies its camera into a
    wall. Trajectories are drawn from ``rng`` until one keeps it (deterministic for a seed);
    after :data:`TRAJECTORY_ATTEMPTS` the clearest one is kept, with a warning.

    Without this, a loop around a small room could face a wall at 0.2 m for a third of a test
    sequence while no training sequence came closer than 1.7 m (HPE small, seed 0).
    """
    renderer = Renderer(world)
    probe = cam.resized(*PROBE_SIZE)
    best: tuple[float, Trajectory] | None = None
    for _ in range(TRAJECTORY_ATTEMPTS):
        traj = Trajectory(world, platform, environment, rng, duration)
        clearance = min(
            view_depth(renderer, probe, traj.pose(float(t))) for t in np.asarray(times).ravel()
        )
        if clearance >= platform.standoff:
            return traj
        if best is None or clearance > best[0]:
            best = (clearance, traj)
    assert best is not None
    log.warning(
        "%s: no trajectory of %d keeps the %s's %.1f m standoff; the clearest comes to %.2f m",
        name,
        TRAJECTORY_ATTEMPTS,
        platform.name,
        platform.standoff,
        best[0],
    )
    return best[1]
