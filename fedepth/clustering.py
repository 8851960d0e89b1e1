"""Soft clustering of clients from Gaussian descriptors (FeDepth, Sec. 3.3) and hard baselines.

Everything here is a pure function on numpy arrays:

- :func:`jeffreys_matrix` / :func:`jeffreys_cross`: symmetric KL (Jeffreys) divergence between
  diagonal Gaussians N(mu, diag(var)), in closed form and vectorized over all pairs (computed
  in :mod:`fedepth.jeffreys`, re-exported here).
- :func:`soft_cluster_map`: ``M[i, j] = A[i, j] <= tau``; row i is the cluster seeded by client i.
- :func:`merge_subsets`: drop duplicate rows and rows that are proper subsets of another row
  (the paper's merge rule; it and the other rules live in :mod:`fedepth.cluster_rules`).
- :func:`overlap_ratio`, :func:`calibrate_tau`: the overlap-driven choice of tau (paper: 20 %
  on HPE); :func:`match_partition`: the tau whose clusters best reproduce a hard partition
  (paper, BMR: "closely approximate those of the hard clustering method"). Each takes the
  merge rule (``merge=``, default the paper's ``subsets``): the overlap is that of the map the
  rule merges.
- :func:`route`: the paper's sequence-level routing of an unseen descriptor (re-exported from
  :mod:`fedepth.cluster_rules` with the other routing rules).
- :func:`hard_clusters`: agglomerative clustering (average linkage) cut at tau, used by the
  ``hard`` and PACFL baselines; :func:`principal_angle_matrix` is PACFL's proximity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import sparse
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from fedepth.cluster_rules import MERGE_RULES, BoolArray, check_merge
from fedepth.cluster_rules import canonical_rows as _canonical_rows
from fedepth.cluster_rules import cluster_scores as cluster_scores
from fedepth.cluster_rules import merge_subsets as merge_subsets
from fedepth.cluster_rules import route as route
from fedepth.jeffreys import ROW_BLOCK, FloatArray
from fedepth.jeffreys import jeffreys_cross as jeffreys_cross
from fedepth.jeffreys import jeffreys_matrix as jeffreys_matrix


def _check_square(A: npt.ArrayLike) -> np.ndarray:
    a = np.asarray(A)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"the divergence matrix must be square (N x N), got shape {a.shape}")
    if a.shape[0] == 0:
        raise ValueError("the divergence matrix is empty: no clients")
    if np.isnan(a).any():
        raise ValueError("the divergence matrix contains NaN")
    return a


def soft_cluster_map(A: npt.ArrayLike, tau: float) -> BoolArray:
    """Initial soft map ``M[i, j] = A[i, j] <= tau`` (N x N); row i is the cluster seeded by i."""
    a = _check_square(A)
    if not np.isfinite(tau) and tau != np.inf:
        raise ValueError(f"tau must be a number, got {tau}")
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    return a <= tau


def overlap_ratio(M_star: npt.ArrayLike) -> float:
    """Fraction of clients that belong to two or more clusters of the (merged) map."""
    m = np.asarray(M_star, dtype=bool)
    if m.ndim != 2 or m.shape[1] == 0:
        raise ValueError(f"the cluster map must be K x N with N > 0, got shape {m.shape}")
    return float((m.sum(axis=0) >= 2).mean())


@dataclass(frozen=True)
class Clustering:
    """A merged soft clustering: threshold, map (K x N) and its overlap ratio."""

    tau: float
    M_star: BoolArray
    overlap: float

    @property
    def num_clusters(self) -> int:
        return int(self.M_star.shape[0])

    def clusters(self) -> list[list[int]]:
        """Client indices of each cluster."""
        return [np.flatnonzero(row).tolist() for row in self.M_star]

    def memberships(self) -> list[list[int]]:
        """Cluster indices of each client."""
        return [np.flatnonzero(col).tolist() for col in self.M_star.T]


def soft_clustering(A: npt.ArrayLike, tau: float, *, merge: str = "subsets") -> Clustering:
    """Threshold, merge and measure: the FeDepth clustering at a given tau.

    Equal to ``cluster_rules.merge(soft_cluster_map(A, tau), merge)`` (the paper's rule:
    ``merge_subsets(soft_cluster_map(A, tau))``) for a symmetric A, computed on the pairs within
    tau (the paper's rule sparsely: cheaper when clusters are small compared with the fleet).
    """
    a = _check_square(A)
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    return _PairMap(a, tau, merge).clustering(tau)


#: Up to this many distinct candidate thresholds calibrate_tau evaluates every one.
EXHAUSTIVE_LIMIT = 1024
_GRID = 16
#: Fleets up to this size evaluate overlaps with dense matrices (see _PairMap._overlap_dense).
DENSE_LIMIT = 256
#: The searched calibration (more candidates than EXHAUSTIVE_LIMIT) stops once the overlap is
#: this close to the target (or within half a client, whichever is larger).
OVERLAP_TOLERANCE = 0.0025


#: A random look-up in the matrix costs about this many sparse-product steps (_maximal_rows).
_LOOKUP_COST = 4


def _maximal_rows(S: sparse.csr_matrix, a: np.ndarray, tau: float) -> np.ndarray:
    """:func:`~fedepth.cluster_rules.maximal_rows` of the soft map ``S`` of ``a`` at ``tau``
    (N x N CSR, symmetric, diagonal set), ascending.

    Row i can only lie inside row j if j is i's neighbour with ``|j| >= |i|``, and only if
    i's 64-bit signature (bit ``c % 64`` set for every member c) lies inside j's: necessary
    conditions read off the stored entries. Each neighbour pair (i, j) that passes them is
    tested exactly, member by member: every k of row i has ``a[min(j, k), max(j, k)] <= tau``
    (the upper triangle, as the pairs are read) or is j; where those look-ups would cost more
    than the suspect rows' intersection counts ``S[rows] S`` (dense neighbourhoods), the counts
    decide. Either way no intersection counts of the whole map (``S S^T``) are formed.
    """
    n = S.shape[0]
    size = np.diff(S.indptr)
    owner = np.repeat(np.arange(n), size)
    member = S.indices
    bits = np.left_shift(np.uint64(1), (member % 64).astype(np.uint64))
    signature = np.bitwise_or.reduceat(bits, S.indptr[:-1])  # no empty rows: diagonal set
    maybe = (
        (member != owner)
        & (size[member] >= size[owner])
        & ((signature[owner] & ~signature[member]) == 0)
    )
    ei, ej = owner[maybe], member[maybe]  # suspects: row ei inside row ej?
    drop = np.zeros(n, dtype=bool)
    if ei.size == 0:
        return np.arange(n)
    lens = size[ei]
    suspects = np.unique(ei)
    product_cost = np.add.reduceat(size[member], S.indptr[:-1])[suspects].sum()
    if _LOOKUP_COST * int(lens.sum()) <= int(product_cost):  # few, small rows: look them up
        offsets = np.cumsum(lens) - lens
        pos = np.repeat(S.indptr[ei] - offsets, lens) + np.arange(int(lens.sum()))
        k, jj = member[pos], np.repeat(ej, lens)
        lo, hi = np.minimum(jj, k), np.maximum(jj, k)
        value = a[lo, hi].astype(np.float64)  # compared in float64, as the pairs are
        outside = (lo != hi) & ~(value <= tau)  # k is not in row j
        inside = np.add.reduceat(outside.astype(np.int64), offsets) == 0
        i, j = ei[inside], ej[inside]
    else:  # dense neighbourhoods: the suspects' intersection counts, S[suspects] S
        C = S[suspects] @ S  # S is symmetric: no transpose
        rows = suspects[np.repeat(np.arange(suspects.size), np.diff(C.indptr))]
        counted = C.data == size[rows]  # row i is contained in row j (i == j included)
        i, j = rows[counted], C.indices[counted]
    dominated = (size[j] > size[i]) | ((size[j] == size[i]) & (j < i))
    drop[i[dominated]] = True
    return np.flatnonzero(~drop)


class _PairMap:
    """The soft maps of one matrix for every tau up to ``t_max``, from its sparse pairs, merged
    by the rule named ``merge`` (:data:`~fedepth.cluster_rules.MERGE_RULES`). The paper's
    ``subsets`` is computed sparsely; the other rules on the dense N x N map, meant for fleets
    of up to a few thousand clients."""

    def __init__(self, a: np.ndarray, t_max: float, merge: str = "subsets") -> None:
        self.rule = check_merge(merge)
        n = a.shape[0]
        rows, cols, vals = [], [], []
        for i0 in range(0, n, ROW_BLOCK):  # strict upper triangle, a block of rows at a time
            i1 = min(n, i0 + ROW_BLOCK)
            blk = a[i0:i1, i0:]  # columns left of the block lie below the diagonal
            r, c = np.nonzero(blk <= t_max)
            upper = c > r  # c counts from column i0
            r, c = r[upper], c[upper]
            vals.append(blk[r, c])
            rows.append(r + i0)
            cols.append(c + i0)
        self.n = n
        self.t_max = t_max
        self.i = np.concatenate(rows)
        self.j = np.concatenate(cols)
        self.a = np.concatenate(vals).astype(np.float64)
        self._matrix = a  # the exact subset test looks pairs up in it
        self._sorted: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._overlaps: dict[float, float] = {}

    def merged(self, tau: float) -> sparse.csr_matrix:
        """The merged map M* at ``tau`` (<= t_max) as a sparse K x N matrix (rows unordered).

        Row i of the soft map is i's closed neighbourhood N[i] in the graph of pairs within tau.
        The paper's rule keeps the rows no other row dominates (:func:`_maximal_rows`).
        """
        if self.rule != "subsets":
            rows = MERGE_RULES[self.rule](self._dense_map(tau))
            return sparse.csr_matrix(rows.astype(np.int32))
        S = self._soft_map(tau)
        return S[_maximal_rows(S, self._matrix, tau)]

    def _soft_map(self, tau: float) -> sparse.csr_matrix:
        """The soft map at ``tau`` (N x N, symmetric, diagonal set) in CSR form, read off the
        neighbourhoods sorted once by divergence: each row's members within tau are a prefix
        of its row (column indices unsorted within a row)."""
        if self._sorted is None:
            n = self.n
            diag = np.arange(n)
            r = np.concatenate([diag, self.i, self.j])
            c = np.concatenate([diag, self.j, self.i])
            v = np.concatenate([np.full(n, -np.inf), self.a, self.a])  # the diagonal first
            order = np.lexsort((v, r))  # by row, then by divergence
            self._sorted = (r[order], c[order], v[order])
        rows, cols, vals = self._sorted
        sel = vals <= tau
        indptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows[sel], minlength=self.n), out=indptr[1:])
        indices = cols[sel]
        data = np.ones(indices.size, dtype=np.int32)
        return sparse.csr_matrix((data, indices, indptr), shape=(self.n, self.n))

    def _dense_map(self, tau: float) -> BoolArray:
        """The symmetric soft map at ``tau`` (N x N, diagonal set), from the pairs."""
        sel = self.a <= tau
        m = np.eye(self.n, dtype=bool)
        m[self.i[sel], self.j[sel]] = True
        m[self.j[sel], self.i[sel]] = True
        return m

    def overlap(self, tau: float) -> float:
        """The overlap ratio of the merged map at ``tau``; each tau is evaluated once (the
        grid search's levels share their end points)."""
        known = self._overlaps.get(tau)
        if known is not None:
            return known
        if self.rule == "subsets" and self.n <= DENSE_LIMIT:
            value = self._overlap_dense(tau)
        else:
            merged = self.merged(tau)
            counts = np.bincount(merged.indices, minlength=self.n)
            value = float((counts >= 2).mean())
        self._overlaps[tau] = value
        return value

    def _overlap_dense(self, tau: float) -> float:
        """:meth:`overlap` with dense matrices: faster for small fleets, where the calibration
        evaluates up to ``EXHAUSTIVE_LIMIT`` thresholds."""
        n = self.n
        sel = self.a <= tau
        m = np.eye(n, dtype=np.float32)
        m[self.i[sel], self.j[sel]] = 1.0
        m[self.j[sel], self.i[sel]] = 1.0
        inter = m @ m  # symmetric map: |N[i] & N[j]|, exact in float32 below 2^24 members
        size = m.sum(axis=1)
        idx = np.arange(n)
        dominated = (inter == size[:, None]) & (
            (size[None, :] > size[:, None])
            | ((size[None, :] == size[:, None]) & (idx[None, :] < idx[:, None]))
        )
        keep = ~dominated.any(axis=1)
        return float((m[keep].sum(axis=0) >= 2).mean())

    def clustering(self, tau: float) -> Clustering:
        merged = self.merged(tau)
        merged = merged[_canonical_rows(merged)].tocoo()
        m_star = np.zeros(merged.shape, dtype=bool)  # straight to bool: no int32 K x N detour
        m_star[merged.row, merged.col] = True
        overlap = float((np.bincount(merged.col, minlength=self.n) >= 2).mean())
        return Clustering(tau=float(tau), M_star=m_star, overlap=overlap)


def calibrate_tau(
    A: npt.ArrayLike,
    overlap: float,
    *,
    exhaustive_limit: int = EXHAUSTIVE_LIMIT,
    merge: str = "subsets",
) -> float:
    """The tau whose merged soft map has the overlap ratio closest to ``overlap`` (in [0, 1];
    the strategies and the command line take [0, 1), see :class:`~fedepth.strategies.fedepth.
    TauRule`).

    The map is merged by the rule named ``merge`` (default the paper's ``subsets``), the rule
    the clusters will be formed by.

    The map only changes at the distinct off-diagonal values of A, so those values are the
    candidate thresholds (tau = a value includes that pair). With at most ``exhaustive_limit``
    candidates every one is evaluated. Beyond that, the search looks at the smallest values
    first (a growing fraction of the pairs: min(1 %, 16 / N), then 4x more each time, up to
    all): a grid over the sorted candidates, narrowed to the neighbours of the best grid point
    until the last grid holds every candidate left (a local search: it can miss a better
    isolated value). It stops as soon as the
    overlap is within ``max(0.5 / N, OVERLAP_TOLERANCE)`` of the target, and widens the range
    while it is not, keeping the best over all ranges. Small ranges keep every evaluation sparse
    for the overlaps used in practice.

    Tie rule: among thresholds with equally close overlap, the smallest tau wins: it gives the
    most specific clusters that meet the target. A single cluster holding everyone has overlap 0
    (no client is in two clusters), as do all-singletons; the target 0 therefore returns the
    smallest candidate threshold.
    """
    return calibrate(A, overlap, exhaustive_limit=exhaustive_limit, merge=merge).tau


def calibrate(
    A: npt.ArrayLike,
    overlap: float,
    *,
    exhaustive_limit: int = EXHAUSTIVE_LIMIT,
    merge: str = "subsets",
) -> Clustering:
    """The clustering at :func:`calibrate_tau`'s threshold, built from the pairs the search has
    already gathered (one scan of A fewer than ``soft_clustering(A, calibrate_tau(A, r))``,
    which it equals, for the same ``merge`` rule)."""
    a = _check_square(A)
    check_merge(merge)
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"the target overlap ratio must lie in [0, 1], got {overlap}")
    n = a.shape[0]
    if n == 1:
        return _PairMap(a, 0.0, merge).clustering(0.0)
    upper = a[np.triu_indices(n, 1)] if n <= 2048 else None
    if upper is not None:
        cand = np.unique(upper[np.isfinite(upper)])
        if cand.size == 0:
            return _PairMap(a, 0.0, merge).clustering(0.0)
        if cand.size <= exhaustive_limit:
            pairs = _PairMap(a, float(cand[-1]), merge)
            errors = np.array([abs(pairs.overlap(t) - overlap) for t in cand])
            # argmin: the smallest tau of the ties
            return pairs.clustering(float(cand[int(np.argmin(errors))]))
    # Close enough: within half a client, or a quarter of a percentage point for large fleets.
    tolerance = max(0.5 / n, OVERLAP_TOLERANCE)
    best_tau, best_err, best_pairs = np.inf, np.inf, None
    fraction = min(0.01, 16.0 / n)  # start near a handful of neighbours per client
    while True:
        pairs = _PairMap(a, _pair_quantile(a, fraction), merge)
        cand = np.unique(pairs.a)
        if cand.size:
            tau, err = _grid_search(pairs, cand, overlap, tolerance)
            if err < best_err or (err == best_err and tau < best_tau):
                best_tau, best_err, best_pairs = tau, err, pairs
        if fraction >= 1.0 or best_err <= tolerance:
            if best_pairs is None:
                return _PairMap(a, 0.0, merge).clustering(0.0)
            return best_pairs.clustering(float(best_tau))
        fraction = min(1.0, fraction * 4)


def co_membership(M: npt.ArrayLike) -> BoolArray:
    """N x N: whether clients i and j share at least one cluster of the K x N map ``M``."""
    m = np.asarray(M, dtype=bool)
    if m.ndim != 2 or m.shape[1] == 0:
        raise ValueError(f"the cluster map must be K x N with N > 0, got shape {m.shape}")
    f = m.astype(np.float32)
    return np.asarray((f.T @ f) > 0, dtype=bool)


def rand_index(M1: npt.ArrayLike, M2: npt.ArrayLike) -> float:
    """Agreement of two cluster maps of the same N clients (soft or hard, any K): the fraction
    of client pairs that both put together (sharing a cluster) or both keep apart. 1 for the
    same grouping; for hard maps this is the Rand index. 1 for a single client."""
    p1, p2 = _pairs_together(M1), _pairs_together(M2)
    if p1.size != p2.size:
        raise ValueError(f"the maps cluster {_clients(M1)} and {_clients(M2)} clients")
    return float(np.mean(p1 == p2)) if p1.size else 1.0


def _clients(M: npt.ArrayLike) -> int:
    return int(np.asarray(M).shape[-1])


def _pairs_together(M: npt.ArrayLike) -> BoolArray:
    """:func:`co_membership` over the pairs i < j, flattened (row by row)."""
    c = co_membership(M)
    return np.asarray(c[np.triu_indices(c.shape[0], 1)], dtype=bool)


def match_partition(
    A: npt.ArrayLike,
    reference: npt.ArrayLike,
    *,
    exhaustive_limit: int = EXHAUSTIVE_LIMIT,
    merge: str = "subsets",
) -> Clustering:
    """The soft clustering of A whose grouping best reproduces ``reference`` (a K x N map),
    its clusters merged by the rule named ``merge`` (default the paper's ``subsets``).

    The paper's BMR protocol: "we set tau such that the resulting cluster assignments closely
    approximate those of the hard clustering method". Candidates are the distinct off-diagonal
    values of A (every one up to ``exhaustive_limit`` of them, else that many evenly spaced
    quantiles); the score is :func:`rand_index` against ``reference``; ties go to the smallest
    tau (the most specific clusters), as in :func:`calibrate`. The reference is met exactly
    only where A's within-group divergences all lie below its between-group ones; otherwise
    this is the closest grouping a threshold can give, which :func:`rand_index` measures.
    Each candidate costs an N x N co-membership product: meant for fleets of up to a few
    hundred clients (32 clients: 0.5 s, 200 clients: 12 s on a busy 2-core CPU), not for
    :func:`calibrate`'s tens of thousands.
    """
    a = _check_square(A)
    check_merge(merge)
    ref = np.asarray(reference, dtype=bool)
    n = a.shape[0]
    if ref.ndim != 2 or ref.shape[1] != n:
        raise ValueError(f"the reference map must be K x {n}, got shape {ref.shape}")
    if n == 1:
        return _PairMap(a, 0.0, merge).clustering(0.0)
    upper = a[np.triu_indices(n, 1)]
    cand = np.unique(upper[np.isfinite(upper)])
    if cand.size == 0:
        return _PairMap(a, 0.0, merge).clustering(0.0)
    if cand.size > exhaustive_limit:
        cand = np.unique(np.quantile(cand, np.linspace(0.0, 1.0, exhaustive_limit)))
    pairs = _PairMap(a, float(cand[-1]), merge)
    target = _pairs_together(ref)  # once, not per candidate
    best_tau, best_score = float(cand[0]), -1.0
    for t in cand:
        score = float(np.mean(_pairs_together(pairs.clustering(float(t)).M_star) == target))
        if score > best_score:  # strictly better: the smallest tau of the ties stays
            best_tau, best_score = float(t), score
    return pairs.clustering(best_tau)


def _pair_quantile(a: np.ndarray, fraction: float) -> float:
    """The value below which ``fraction`` of the off-diagonal entries lie (estimated from a
    sample of one million entries when there are more), ``inf`` for fraction 1."""
    if fraction >= 1.0:
        return float(np.inf)
    n = a.shape[0]
    rng = np.random.default_rng(0)
    k = min(1_000_000, n * (n - 1))
    r = rng.integers(0, n, size=k)
    c = (r + rng.integers(1, n, size=k)) % n  # never the diagonal
    return float(np.quantile(a[r, c], fraction))


def _grid_search(
    pairs: _PairMap, cand: np.ndarray, target: float, tolerance: float
) -> tuple[float, float]:
    """Best (tau, |overlap - target|) over the sorted ``cand`` by a narrowing grid."""
    lo, hi = 0, cand.size - 1
    best_i, best_e = lo, np.inf
    while True:  # each level narrows [lo, hi] to two grid steps around the best point
        idx = np.unique(np.linspace(lo, hi, _GRID).round().astype(int))
        errors = np.array([abs(pairs.overlap(float(cand[i])) - target) for i in idx])
        j = int(np.argmin(errors))
        if errors[j] < best_e or (errors[j] == best_e and idx[j] < best_i):
            best_i, best_e = int(idx[j]), float(errors[j])
        if best_e <= tolerance or hi - lo + 1 <= _GRID:  # close enough, or last level exhaustive
            break
        lo = int(idx[max(0, j - 1)])
        hi = int(idx[min(idx.size - 1, j + 1)])
    return float(cand[best_i]), best_e


def labels_to_map(labels: Sequence[int] | npt.ArrayLike) -> BoolArray:
    """One-hot cluster map (K x N) of a hard assignment, clusters ordered by first member."""
    lab = np.asarray(labels).reshape(-1)
    _, first_idx, inverse = np.unique(lab, return_index=True, return_inverse=True)
    order = np.argsort(first_idx)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    m = np.zeros((order.size, lab.size), dtype=bool)
    m[rank[inverse], np.arange(lab.size)] = True
    return m


def _average_linkage(A: npt.ArrayLike) -> np.ndarray | None:
    """Average-linkage dendrogram of a (symmetrized) distance matrix; None for one client."""
    a = _check_square(A).astype(np.float64)
    if a.shape[0] == 1:
        return None
    sym = 0.5 * (a + a.T)
    np.fill_diagonal(sym, 0.0)
    return np.asarray(linkage(squareform(sym, checks=False), method="average"))


def hard_clusters(A: npt.ArrayLike, tau: float) -> BoolArray:
    """Agglomerative (average-linkage) clustering of a distance matrix cut at ``tau``.

    Two groups are joined while their mean pairwise distance is <= tau; the result is a
    one-hot K x N map (every client in exactly one cluster). Used by the ``hard`` baseline
    (Table 3a) on the Jeffreys matrix and by PACFL on principal angles.
    """
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    z = _average_linkage(A)
    if z is None:
        return np.ones((1, 1), dtype=bool)
    return labels_to_map(fcluster(z, t=tau, criterion="distance"))


def hard_clusters_k(A: npt.ArrayLike, k: int) -> BoolArray:
    """Agglomerative (average-linkage) clustering of a distance matrix into at most k clusters."""
    if k < 1:
        raise ValueError(f"the number of clusters must be >= 1, got {k}")
    z = _average_linkage(A)
    if z is None:
        return np.ones((1, 1), dtype=bool)
    return labels_to_map(fcluster(z, t=k, criterion="maxclust"))


def largest_gap_threshold(A: npt.ArrayLike) -> float:
    """A cut height for :func:`hard_clusters`: the middle of the largest gap between consecutive
    merge heights of the average-linkage dendrogram of A (a standard way to pick the number of
    clusters without a fixed threshold). One cluster when there are fewer than three clients.
    """
    z = _average_linkage(A)
    if z is None or z.shape[0] < 2:
        return float(np.asarray(A).max())
    heights = np.sort(z[:, 2])
    k = int(np.argmax(np.diff(heights)))
    return float(0.5 * (heights[k] + heights[k + 1]))


def subspace_basis(features: npt.ArrayLike, p: int) -> FloatArray:
    """PACFL: the top-p left singular vectors (D x p) of a client's feature matrix (D x n).

    ``features`` holds one column per sample (here: per-frame GeM descriptors). Fewer samples
    than p give fewer basis vectors; PACFL's proximity uses the columns available.
    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"features must be D x n, got shape {x.shape}")
    if p < 1:
        raise ValueError(f"p must be >= 1, got {p}")
    u, _, _ = np.linalg.svd(x, full_matrices=False)
    return u[:, : min(p, u.shape[1])]


def principal_angle_matrix(bases: Sequence[npt.ArrayLike]) -> FloatArray:
    """PACFL proximity: smallest principal angle (degrees) between every pair of subspaces.

    ``bases[i]`` is a D x p_i orthonormal basis. The smallest principal angle between spans
    U_i and U_j is ``arccos(sigma_max(U_i^T U_j))``.
    """
    us = [np.asarray(u, dtype=np.float64) for u in bases]
    n = len(us)
    if n == 0:
        raise ValueError("no subspaces given")
    out = np.zeros((n, n), dtype=np.float64)
    for i in range(n):
        for j in range(i + 1, n):
            s = np.linalg.svd(us[i].T @ us[j], compute_uv=False)
            ang = np.degrees(np.arccos(np.clip(s.max() if s.size else 0.0, -1.0, 1.0)))
            out[i, j] = out[j, i] = ang
    return out
