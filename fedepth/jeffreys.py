"""Jeffreys (symmetric KL) divergence between diagonal Gaussian descriptors N(mu, diag(var)).

Closed form, vectorized over all pairs: :func:`jeffreys_matrix` within one set (N x N, in row
blocks), :func:`jeffreys_cross` between two sets. :mod:`fedepth.clustering` clusters on it and
re-exports both.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fedepth.descriptor import check_descriptors

FloatArray = npt.NDArray[np.floating]

#: Row-block size for the Jeffreys matrix (and for scans of it in :mod:`fedepth.clustering`);
#: bounds the float64 scratch to block x N.
ROW_BLOCK = 1024
#: Tile size of the Jeffreys matrix's in-place symmetrization (two float64 tiles: 1 MB).
SYM_TILE = 256


def jeffreys_cross(
    m_a: npt.ArrayLike, v_a: npt.ArrayLike, m_b: npt.ArrayLike, v_b: npt.ArrayLike
) -> FloatArray:
    """Jeffreys divergence between every Gaussian of set a and every Gaussian of set b.

    ``J(a, b) = KL(a || b) + KL(b || a)
    = 0.5 * sum_d [ s_a/s_b + s_b/s_a - 2 + (m_a - m_b)^2 (1/s_a + 1/s_b) ]``
    (the log-determinant terms cancel). Returns float64 of shape (Na, Nb).

    Computed as two matrix products: with ``K[a, b] = sum_d (s_a + (m_a - m_b)^2) / s_b``,
    ``J = 0.5 * (K + K'^T) - D``, and
    ``K = [s_a + m_a^2, m_a] @ [1/s_b, -2 m_b/s_b]^T + sum m_b^2/s_b``.
    Means are centred on the pooled mean and every dimension is scaled by its pooled standard
    deviation first; J is invariant to both, and they keep the expansion well conditioned.
    """
    ma, va = check_descriptors(m_a, v_a, "set a")
    mb, vb = check_descriptors(m_b, v_b, "set b")
    if ma.shape[1] != mb.shape[1]:
        raise ValueError(f"descriptor dimensions differ: {ma.shape[1]} vs {mb.shape[1]}")
    centre, scale = _conditioning(np.concatenate([ma, mb]), np.concatenate([va, vb]))
    ma, va = (ma - centre) / scale, va / scale**2
    mb, vb = (mb - centre) / scale, vb / scale**2
    k_ab = _k_matrix(ma, va, mb, vb)
    k_ba = _k_matrix(mb, vb, ma, va)
    out = 0.5 * (k_ab + k_ba.T) - ma.shape[1]
    np.maximum(out, 0.0, out=out)
    return out


def jeffreys_matrix(
    means: npt.ArrayLike, variances: npt.ArrayLike, *, dtype: npt.DTypeLike = np.float64
) -> FloatArray:
    """Pairwise Jeffreys divergence A (N x N) of N diagonal Gaussians (rows of means, variances).

    Symmetric, exactly zero on the diagonal, non-negative. The products and the symmetrization
    run in ``dtype``, in row blocks of at most 1024 clients, so scratch memory is O(block x N)
    beside the output; pass ``dtype=np.float32`` to halve the output and the time (10,000
    clients: 400 MB instead of 800 MB).
    """
    m, v = check_descriptors(means, variances, "descriptors")
    n, d = m.shape
    centre, scale = _conditioning(m, v)
    m = (m - centre) / scale
    v = v / scale**2
    inv = 1.0 / v
    left = np.concatenate([v + m * m, m], axis=1).astype(dtype)  # (N, 2D)
    right = np.concatenate([inv, -2.0 * m * inv], axis=1).astype(dtype)  # (N, 2D)
    bias = np.einsum("nd,nd->n", m * m, inv).astype(dtype)  # sum_d m_b^2 / s_b
    out = np.empty((n, n), dtype=dtype)
    # K[i, j] = left_i . right_j + bias_j, filled block by block; then A = 0.5 (K + K^T) - D,
    # symmetrized in place block pair by block pair (each entry of K is computed once).
    for i0 in range(0, n, ROW_BLOCK):
        i1 = min(n, i0 + ROW_BLOCK)
        np.matmul(left[i0:i1], right.T, out=out[i0:i1])
        out[i0:i1] += bias[None, :]
    _symmetrize_inplace(out, shift=float(d))
    np.fill_diagonal(out, 0.0)
    return out


def _conditioning(m: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    centre = m.mean(axis=0)
    scale = np.sqrt(v.mean(axis=0) + m.var(axis=0))
    scale[scale == 0] = 1.0
    return centre, scale


def _k_matrix(ma: np.ndarray, va: np.ndarray, mb: np.ndarray, vb: np.ndarray) -> np.ndarray:
    inv_b = 1.0 / vb
    k = (
        np.concatenate([va + ma * ma, ma], axis=1)
        @ np.concatenate([inv_b, -2.0 * mb * inv_b], axis=1).T
    )
    k += np.einsum("nd,nd->n", mb * mb, inv_b)[None, :]
    return k


def _symmetrize_inplace(a: np.ndarray, shift: float = 0.0) -> None:
    """``a <- max(0.5 (a + a^T) - shift, 0)`` in place, one tile pair at a time.

    Tiles of ``SYM_TILE`` squared fit in the L2 cache with their transposes, and every step
    writes into one reused scratch tile: the same arithmetic, entry by entry, as on whole
    row blocks, in half the time at N = 10,000."""
    n = a.shape[0]
    tile = min(n, SYM_TILE)
    scratch = np.empty((tile, tile), dtype=a.dtype)
    for i0 in range(0, n, tile):
        i1 = min(n, i0 + tile)
        for j0 in range(i0, n, tile):
            j1 = min(n, j0 + tile)
            sym = scratch[: i1 - i0, : j1 - j0]
            np.add(a[i0:i1, j0:j1], a[j0:j1, i0:i1].T, out=sym)  # in the output dtype
            sym *= 0.5
            sym -= shift
            np.maximum(sym, 0.0, out=sym)
            a[i0:i1, j0:j1] = sym
            a[j0:j1, i0:i1] = sym.T
