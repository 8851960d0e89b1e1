"""Radtan distortion, reprojection and z-buffering."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedepth.data.camera import (
    Camera,
    distort,
    invert_transform,
    reproject_depth,
    rigid,
    scale_intrinsics,
    undistort,
    zbuffer,
)

#: Wide-angle lenses with the barrel distortion typical of robot cameras.
EVENT_CAMERA = Camera(1280, 720, 1040.0, 1040.0, 640.0, 360.0, (-0.09, 0.12, 2e-4, -3e-4))
OVC_RGB = Camera(1280, 800, 880.0, 880.0, 640.0, 400.0, (-0.12, 0.09, -3e-4, 2e-4))


@settings(max_examples=30, deadline=None)
@given(st.floats(-0.5, 0.5), st.floats(-0.5, 0.5))
def test_undistort_inverts_distort(x: float, y: float) -> None:
    coeffs = OVC_RGB.dist
    xd, yd = distort(np.array([x]), np.array([y]), coeffs)
    xu, yu = undistort(xd, yd, coeffs)
    assert abs(xu[0] - x) < 1e-7 and abs(yu[0] - y) < 1e-7


def test_distort_hand_computed() -> None:
    # r2 = 0.25, radial = 1 + 0.1 * 0.25 = 1.025; no tangential terms.
    xd, yd = distort(np.array([0.3]), np.array([0.4]), (0.1, 0.0, 0.0, 0.0))
    assert np.allclose([xd[0], yd[0]], [0.3075, 0.41])


def test_project_back_projected_pixels_lands_on_pixel_centres() -> None:
    cam = EVENT_CAMERA.resized(64, 36)
    x, y = cam.pixel_rays()
    z = np.full(x.size, 3.0)
    pts = np.stack([x.ravel() * z, y.ravel() * z, z], 1)
    u, v, _ = cam.project(pts)
    vv, uu = np.mgrid[0:36, 0:64]
    assert np.abs(u - uu.ravel()).max() < 1e-6 and np.abs(v - vv.ravel()).max() < 1e-6


def test_scale_intrinsics_keeps_pixel_centres_aligned() -> None:
    K = scale_intrinsics(np.array([[10.0, 0, 4.5], [0, 10.0, 2.5], [0, 0, 1]]), 0.5, 0.5)
    # the centre of a 10 x 6 image (4.5, 2.5) maps to the centre of a 5 x 3 image (2, 1)
    assert np.allclose(K, [[5.0, 0, 2.0], [0, 5.0, 1.0], [0, 0, 1]])


def test_zbuffer_keeps_nearest_point() -> None:
    u = np.array([1.2, 0.8, 2.0, 5.0])
    v = np.array([0.9, 1.1, 0.0, 0.0])
    z = np.array([4.0, 2.0, 7.0, 1.0])
    out = zbuffer(u, v, z, 2, 3)
    assert out[1, 1] == 2.0 and out[0, 2] == 7.0
    assert (out > 0).sum() == 2  # u = 5 falls outside the 3-wide image


def test_reproject_identity_is_lossless() -> None:
    cam = OVC_RGB.resized(40, 25)
    depth = np.linspace(1, 9, cam.width * cam.height, dtype=np.float32).reshape(25, 40)
    depth[3, 5] = np.inf
    depth[4, 6] = 0.0
    out = reproject_depth(depth, cam, cam, np.eye(4))
    ok = np.isfinite(depth) & (depth > 0)
    assert np.allclose(out[ok], depth[ok], rtol=1e-6)
    assert out[3, 5] == 0 and out[4, 6] == 0


def test_reproject_translation_of_plane() -> None:
    """A fronto-parallel plane at z = 4 seen from a camera 0.5 m further back is at z = 4.5."""
    cam = Camera(30, 20, 20.0, 20.0, 14.5, 9.5)
    depth = np.full((20, 30), 4.0, np.float32)
    T = rigid(0, 0, 0, (0.0, 0.0, 0.5))  # source points -> target frame: z + 0.5
    out = reproject_depth(depth, cam, cam, T)
    assert np.allclose(out[out > 0], 4.5)
    assert (out > 0).mean() > 0.7  # the plane covers the middle of the farther camera


def test_invert_transform() -> None:
    T = rigid(3.0, -2.0, 10.0, (0.1, -0.2, 0.3))
    assert np.allclose(invert_transform(T) @ T, np.eye(4))
