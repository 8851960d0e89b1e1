"""Pinhole cameras with radial-tangential (radtan / OpenCV plumb-bob k1 k2 p1 p2) distortion.

Conventions (OpenCV, Kalibr): camera frame x right, y down, z forward; pixel (u, v) = (column,
row) with integer coordinates at pixel centres; depth is the z coordinate (not the ray length).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def intrinsics_matrix(fx: float, fy: float, cx: float, cy: float) -> FloatArray:
    """The 3 x 3 matrix of Kalibr's ``intrinsics = [fx, fy, cx, cy]``."""
    return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=np.float64)


def scale_intrinsics(K: npt.ArrayLike, sx: float, sy: float) -> FloatArray:
    """Intrinsics after resizing the image by (sx, sy), pixel-centre aligned."""
    K2 = np.array(K, dtype=np.float64)
    K2[0, 0] *= sx
    K2[1, 1] *= sy
    K2[0, 2] = (K2[0, 2] + 0.5) * sx - 0.5
    K2[1, 2] = (K2[1, 2] + 0.5) * sy - 0.5
    return K2


def distort(x: FloatArray, y: FloatArray, coeffs: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Apply radtan distortion to normalized coordinates (x, y) = (X/Z, Y/Z)."""
    k1, k2, p1, p2 = (float(c) for c in np.asarray(coeffs, dtype=np.float64).ravel()[:4])
    r2 = x * x + y * y
    radial = 1.0 + k1 * r2 + k2 * r2 * r2
    xd = x * radial + 2.0 * p1 * x * y + p2 * (r2 + 2.0 * x * x)
    yd = y * radial + p1 * (r2 + 2.0 * y * y) + 2.0 * p2 * x * y
    return xd, yd


def undistort(
    xd: FloatArray, yd: FloatArray, coeffs: npt.ArrayLike, iterations: int = 20
) -> tuple[FloatArray, FloatArray]:
    """Invert :func:`distort` by fixed-point iteration (as OpenCV's ``undistortPoints``).

    Converges to float precision for the mild lens distortion of robot cameras (|k1| < 0.5 over
    the image); the residual is checked by the tests.
    """
    k1, k2, p1, p2 = (float(c) for c in np.asarray(coeffs, dtype=np.float64).ravel()[:4])
    x = xd.copy()
    y = yd.copy()
    for _ in range(iterations):
        r2 = x * x + y * y
        radial = 1.0 + k1 * r2 + k2 * r2 * r2
        dx = 2.0 * p1 * x * y + p2 * (r2 + 2.0 * x * x)
        dy = p1 * (r2 + 2.0 * y * y) + 2.0 * p2 * x * y
        x = (xd - dx) / radial
        y = (yd - dy) / radial
    return x, y


@dataclass(frozen=True)
class Camera:
    """A calibrated camera: image size, pinhole intrinsics and radtan distortion coefficients."""

    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float
    dist: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    @property
    def matrix(self) -> FloatArray:
        return intrinsics_matrix(self.fx, self.fy, self.cx, self.cy)

    @property
    def intrinsics(self) -> FloatArray:
        """Kalibr order ``[fx, fy, cx, cy]``."""
        return np.array([self.fx, self.fy, self.cx, self.cy], dtype=np.float64)

    @property
    def resolution(self) -> tuple[int, int]:
        """Kalibr order ``(width, height)``."""
        return (self.width, self.height)

    def resized(self, width: int, height: int) -> Camera:
        """The same lens on a sensor read out at another size (distortion is unit-free)."""
        K = scale_intrinsics(self.matrix, width / self.width, height / self.height)
        return Camera(width, height, K[0, 0], K[1, 1], K[0, 2], K[1, 2], self.dist)

    def pixel_rays(self) -> tuple[FloatArray, FloatArray]:
        """Undistorted normalized coordinates (x, y), each (H, W), of every pixel centre."""
        v, u = np.mgrid[0 : self.height, 0 : self.width].astype(np.float64)
        xd = (u - self.cx) / self.fx
        yd = (v - self.cy) / self.fy
        if any(self.dist):
            return undistort(xd, yd, self.dist)
        return xd, yd

    def project(self, points: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Pixel coordinates (u, v) and depth z of (N, 3) camera-frame points (z > 0 assumed)."""
        z = points[:, 2]
        x, y = distort(points[:, 0] / z, points[:, 1] / z, self.dist)
        return self.fx * x + self.cx, self.fy * y + self.cy, z


def zbuffer(
    u: FloatArray, v: FloatArray, z: FloatArray, height: int, width: int
) -> npt.NDArray[np.float32]:
    """Splat points to their nearest pixel, keeping the nearest point per pixel; 0 = empty."""
    ui = np.rint(u).astype(np.int64)
    vi = np.rint(v).astype(np.int64)
    ok = (ui >= 0) & (ui < width) & (vi >= 0) & (vi < height) & (z > 0) & np.isfinite(z)
    lin = vi[ok] * width + ui[ok]
    zz = z[ok]
    out = np.zeros(height * width, dtype=np.float32)
    if lin.size:
        order = np.lexsort((zz, lin))
        lin_s = lin[order]
        first = np.ones(lin_s.size, dtype=bool)
        first[1:] = lin_s[1:] != lin_s[:-1]
        out[lin_s[first]] = zz[order][first]
    return out.reshape(height, width)


def rigid(
    rx_deg: float, ry_deg: float, rz_deg: float, t: tuple[float, float, float]
) -> FloatArray:
    """4 x 4 transform from small rotations (deg, applied x then y then z) and a translation."""
    rx, ry, rz = np.deg2rad([rx_deg, ry_deg, rz_deg])
    Rx = np.array([[1, 0, 0], [0, np.cos(rx), -np.sin(rx)], [0, np.sin(rx), np.cos(rx)]])
    Ry = np.array([[np.cos(ry), 0, np.sin(ry)], [0, 1, 0], [-np.sin(ry), 0, np.cos(ry)]])
    Rz = np.array([[np.cos(rz), -np.sin(rz), 0], [np.sin(rz), np.cos(rz), 0], [0, 0, 1]])
    T = np.eye(4)
    T[:3, :3] = Rz @ Ry @ Rx
    T[:3, 3] = t
    return T


def invert_transform(T: npt.ArrayLike) -> FloatArray:
    """Inverse of a 4 x 4 rigid transform."""
    T = np.asarray(T, dtype=np.float64)
    R = T[:3, :3]
    out = np.eye(4)
    out[:3, :3] = R.T
    out[:3, 3] = -R.T @ T[:3, 3]
    return out


def reproject_depth(
    depth: npt.NDArray[np.floating],
    source: Camera,
    target: Camera,
    T_target_source: npt.ArrayLike,
    source_rays: tuple[FloatArray, FloatArray] | None = None,
) -> npt.NDArray[np.float32]:
    """Move a depth image from one camera into another.

    Back-projects every valid pixel (finite, > 0) with the source intrinsics and distortion,
    transforms the points with ``T_target_source`` (source-frame points -> target frame), projects
    them with the target intrinsics and distortion and keeps the nearest point per target pixel.
    Returns float32 (target.height, target.width), 0 where no point landed.
    """
    d = np.asarray(depth, dtype=np.float64)
    if d.shape != (source.height, source.width):
        raise ValueError(
            f"depth {d.shape} does not match the source camera ({source.height}, {source.width})"
        )
    x, y = source_rays if source_rays is not None else source.pixel_rays()
    ok = np.isfinite(d) & (d > 0)
    z = d[ok]
    pts = np.stack([x[ok] * z, y[ok] * z, z], axis=1)
    T = np.asarray(T_target_source, dtype=np.float64)
    pts = pts @ T[:3, :3].T + T[:3, 3]
    front = pts[:, 2] > 1e-6
    u, v, zt = target.project(pts[front])
    return zbuffer(u, v, zt, target.height, target.width)
