"""The fast clustering paths (issue 48, item 4) against today's code, kept here as reference.

``_RefPairMap``, ``_ref_calibrate``, ``_ref_grid_search`` and ``_ref_symmetrize_inplace`` are
copies of the implementations they replaced (commit 5113df6): the row-sorted soft maps, the
symmetric ``S S`` subset test, the memoized overlaps and the tiled symmetrization must give
the same tau and the same M*, bit for bit, for every merge rule and target overlap, on
clustered and unclustered fleets and on divergences with ties.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse

from fedepth import clustering as C
from fedepth import jeffreys as J
from fedepth.cluster_rules import MERGE_RULES, check_merge, maximal_rows
from fedepth.cluster_rules import canonical_rows as _canonical_rows

_REF_DENSE_LIMIT = 256
_REF_OVERLAP_TOLERANCE = 0.0025
_REF_GRID = 16


class _RefPairMap:
    """Today's ``fedepth.clustering._PairMap`` (5113df6), verbatim but for names."""

    def __init__(self, a: np.ndarray, t_max: float, merge: str = "subsets") -> None:
        self.rule = check_merge(merge)
        n = a.shape[0]
        rows, cols, vals = [], [], []
        for i0 in range(0, n, J.ROW_BLOCK):
            i1 = min(n, i0 + J.ROW_BLOCK)
            blk = a[i0:i1, i0:]
            r, c = np.nonzero(blk <= t_max)
            upper = c > r
            r, c = r[upper], c[upper]
            vals.append(blk[r, c])
            rows.append(r + i0)
            cols.append(c + i0)
        self.n = n
        self.t_max = t_max
        self.i = np.concatenate(rows)
        self.j = np.concatenate(cols)
        self.a = np.concatenate(vals).astype(np.float64)

    def merged(self, tau: float) -> sparse.csr_matrix:
        if self.rule != "subsets":
            rows = MERGE_RULES[self.rule](self._dense_map(tau))
            return sparse.csr_matrix(rows.astype(np.int32))
        sel = self.a <= tau
        i, j = self.i[sel], self.j[sel]
        linked = np.zeros(self.n, dtype=bool)
        linked[i] = linked[j] = True
        nodes = np.flatnonzero(linked)
        diag = np.arange(self.n)
        r = np.concatenate([diag, i, j])
        c = np.concatenate([diag, j, i])
        S = sparse.csr_matrix((np.ones(r.size, dtype=np.int32), (r, c)), shape=(self.n, self.n))
        if nodes.size == 0:
            return S
        keep = nodes[maximal_rows(S[nodes])]
        lonely = np.flatnonzero(~linked)
        return S[np.concatenate([keep, lonely])]

    def _dense_map(self, tau: float) -> np.ndarray:
        sel = self.a <= tau
        m = np.eye(self.n, dtype=bool)
        m[self.i[sel], self.j[sel]] = True
        m[self.j[sel], self.i[sel]] = True
        return m

    def overlap(self, tau: float) -> float:
        if self.rule == "subsets" and self.n <= _REF_DENSE_LIMIT:
            return self._overlap_dense(tau)
        counts = np.asarray(self.merged(tau).sum(axis=0)).ravel()
        return float((counts >= 2).mean())

    def _overlap_dense(self, tau: float) -> float:
        n = self.n
        sel = self.a <= tau
        m = np.eye(n, dtype=np.float32)
        m[self.i[sel], self.j[sel]] = 1.0
        m[self.j[sel], self.i[sel]] = 1.0
        inter = m @ m
        size = m.sum(axis=1)
        idx = np.arange(n)
        dominated = (inter == size[:, None]) & (
            (size[None, :] > size[:, None])
            | ((size[None, :] == size[:, None]) & (idx[None, :] < idx[:, None]))
        )
        keep = ~dominated.any(axis=1)
        return float((m[keep].sum(axis=0) >= 2).mean())

    def clustering(self, tau: float) -> C.Clustering:
        merged = self.merged(tau)
        merged = merged[_canonical_rows(merged)].tocoo()
        m_star = np.zeros(merged.shape, dtype=bool)
        m_star[merged.row, merged.col] = True
        overlap = float((np.bincount(merged.col, minlength=self.n) >= 2).mean())
        return C.Clustering(tau=float(tau), M_star=m_star, overlap=overlap)


def _ref_grid_search(
    pairs: _RefPairMap, cand: np.ndarray, target: float, tolerance: float
) -> tuple[float, float]:
    lo, hi = 0, cand.size - 1
    best_i, best_e = lo, np.inf
    while True:
        idx = np.unique(np.linspace(lo, hi, _REF_GRID).round().astype(int))
        errors = np.array([abs(pairs.overlap(float(cand[i])) - target) for i in idx])
        j = int(np.argmin(errors))
        if errors[j] < best_e or (errors[j] == best_e and idx[j] < best_i):
            best_i, best_e = int(idx[j]), float(errors[j])
        if best_e <= tolerance or hi - lo + 1 <= _REF_GRID:
            break
        lo = int(idx[max(0, j - 1)])
        hi = int(idx[min(idx.size - 1, j + 1)])
    return float(cand[best_i]), best_e


def _ref_calibrate(
    a: np.ndarray, overlap: float, *, exhaustive_limit: int = 1024, merge: str = "subsets"
) -> C.Clustering:
    """Today's ``calibrate`` (5113df6) on the reference pair map."""
    n = a.shape[0]
    if n == 1:
        return _RefPairMap(a, 0.0, merge).clustering(0.0)
    upper = a[np.triu_indices(n, 1)] if n <= 2048 else None
    if upper is not None:
        cand = np.unique(upper[np.isfinite(upper)])
        if cand.size == 0:
            return _RefPairMap(a, 0.0, merge).clustering(0.0)
        if cand.size <= exhaustive_limit:
            pairs = _RefPairMap(a, float(cand[-1]), merge)
            errors = np.array([abs(pairs.overlap(t) - overlap) for t in cand])
            return pairs.clustering(float(cand[int(np.argmin(errors))]))
    tolerance = max(0.5 / n, _REF_OVERLAP_TOLERANCE)
    best_tau, best_err, best_pairs = np.inf, np.inf, None
    fraction = min(0.01, 16.0 / n)
    while True:
        pairs = _RefPairMap(a, C._pair_quantile(a, fraction), merge)
        cand = np.unique(pairs.a)
        if cand.size:
            tau, err = _ref_grid_search(pairs, cand, overlap, tolerance)
            if err < best_err or (err == best_err and tau < best_tau):
                best_tau, best_err, best_pairs = tau, err, pairs
        if fraction >= 1.0 or best_err <= tolerance:
            if best_pairs is None:
                return _RefPairMap(a, 0.0, merge).clustering(0.0)
            return best_pairs.clustering(float(best_tau))
        fraction = min(1.0, fraction * 4)


def _ref_symmetrize_inplace(a: np.ndarray, shift: float = 0.0) -> None:
    """Today's ``fedepth.jeffreys._symmetrize_inplace`` (5113df6): whole row blocks."""
    n = a.shape[0]
    for i0 in range(0, n, J.ROW_BLOCK):
        i1 = min(n, i0 + J.ROW_BLOCK)
        for j0 in range(i0, n, J.ROW_BLOCK):
            j1 = min(n, j0 + J.ROW_BLOCK)
            sym = a[i0:i1, j0:j1] + a[j0:j1, i0:i1].T
            sym *= 0.5
            sym -= shift
            np.maximum(sym, 0.0, out=sym)
            a[i0:i1, j0:j1] = sym
            a[j0:j1, i0:i1] = sym.T


def _fleet(n: int, clustered: bool, seed: int, dim: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if clustered:  # domains, a third of the clients between two of them
        centres = rng.normal(0.0, 1.0, size=(6, dim))
        dom, other = rng.integers(0, 6, size=n), rng.integers(0, 6, size=n)
        mix = np.where(rng.random(n) < 1 / 3, rng.uniform(0.2, 0.8, n), 0.0)[:, None]
        means = (1 - mix) * centres[dom] + mix * centres[other] + rng.normal(0, 0.15, (n, dim))
    else:
        means = rng.normal(0.0, 1.0, size=(n, dim))
    variances = 0.05 * np.exp(rng.normal(0.0, 0.3, size=(n, dim)))
    return means, variances


def _matrix(n: int, kind: str, seed: int) -> np.ndarray:
    a = C.jeffreys_matrix(*_fleet(n, kind != "unclustered", seed))
    if kind == "ties":  # a few distinct values: many pairs at each candidate tau
        a = np.round(a / np.quantile(a, 0.5) * 40.0)
    return a


_CASES = [
    (60, "clustered", 0),
    (70, "ties", 7),
    (150, "unclustered", 1),
    (300, "clustered", 2),
    (260, "ties", 3),
    (400, "unclustered", 4),
]


# every candidate (1024), or the searched calibration (48); not every one of the many
# candidates of the large tied matrix, whose dense neighbourhoods are slow in both versions
_CALIBRATIONS = [(*case, limit) for case in _CASES for limit in (1024, 48)]
_CALIBRATIONS.remove((260, "ties", 3, 1024))


@pytest.mark.parametrize(("n", "kind", "seed", "limit"), _CALIBRATIONS)
def test_calibrate_matches_the_reference(n: int, kind: str, seed: int, limit: int) -> None:
    a = _matrix(n, kind, seed)
    rules = list(MERGE_RULES) if n <= 100 else ["subsets"]  # the dense rules: small fleets
    for merge in rules:
        for target in (0.0, 0.2, 0.5):
            new = C.calibrate(a, target, exhaustive_limit=limit, merge=merge)
            ref = _ref_calibrate(a, target, exhaustive_limit=limit, merge=merge)
            assert new.tau == ref.tau, (merge, target)
            assert new.overlap == ref.overlap
            assert new.M_star.shape == ref.M_star.shape
            assert np.array_equal(new.M_star, ref.M_star)


@pytest.mark.parametrize(("n", "kind", "seed"), _CASES)
def test_pair_map_overlaps_and_maps_match_the_reference(n: int, kind: str, seed: int) -> None:
    a = _matrix(n, kind, seed)
    cand = np.unique(a[np.triu_indices(n, 1)])
    taus = [0.0, *cand[np.linspace(0, cand.size - 1, 8).round().astype(int)].tolist()]
    for merge in MERGE_RULES if n <= 100 else ["subsets"]:
        new, ref = C._PairMap(a, float(cand[-1]), merge), _RefPairMap(a, float(cand[-1]), merge)
        for tau in taus:
            assert new.overlap(tau) == ref.overlap(tau), (merge, tau)
            got, want = new.clustering(tau), ref.clustering(tau)
            assert np.array_equal(got.M_star, want.M_star) and got.overlap == want.overlap
    # the sparse subset test, also where the dense one would serve (n <= DENSE_LIMIT)
    sparse_new = C._PairMap(a, float(cand[-1]))
    for tau in taus:
        counts = np.bincount(sparse_new.merged(tau).indices, minlength=n)
        assert float((counts >= 2).mean()) == ref_overlap_sparse(a, float(cand[-1]), tau)


def ref_overlap_sparse(a: np.ndarray, t_max: float, tau: float) -> float:
    counts = np.asarray(_RefPairMap(a, t_max).merged(tau).sum(axis=0)).ravel()
    return float((counts >= 2).mean())


@pytest.mark.parametrize("n", [1, 7, 256, 300, 700])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tiled_symmetrization_is_bit_for_bit(n: int, dtype: type) -> None:
    rng = np.random.default_rng(n)
    k = (rng.normal(0.0, 50.0, size=(n, n)) + 512.0).astype(dtype)
    want, got = k.copy(), k.copy()
    _ref_symmetrize_inplace(want, shift=512.0)
    J._symmetrize_inplace(got, shift=512.0)
    assert np.array_equal(got, want)


def test_soft_clustering_matches_the_reference_at_every_rule() -> None:
    a = _matrix(120, "ties", 6)
    for merge in MERGE_RULES:
        for tau in (0.0, 3.0, 8.0, 20.0, np.inf):
            got = C.soft_clustering(a, tau, merge=merge)
            want = _RefPairMap(a, tau, merge).clustering(tau)
            assert np.array_equal(got.M_star, want.M_star) and got.overlap == want.overlap


def test_float32_matrix_and_taus_between_its_values() -> None:
    a = _matrix(300, "clustered", 8).astype(np.float32)
    cand = np.unique(a[np.triu_indices(300, 1)]).astype(np.float64)
    for q in (0.002, 0.01, 0.05):
        lo = cand[int(q * cand.size)]
        for tau in (lo, np.nextafter(lo, np.inf), lo * (1 + 1e-8), lo * (1 - 1e-8)):
            got = C.soft_clustering(a, float(tau))
            want = _RefPairMap(a, float(tau)).clustering(float(tau))
            assert np.array_equal(got.M_star, want.M_star) and got.overlap == want.overlap
    new, ref = (
        C.calibrate(a, 0.2, exhaustive_limit=48),
        _ref_calibrate(a, 0.2, exhaustive_limit=48),
    )
    assert new.tau == ref.tau and np.array_equal(new.M_star, ref.M_star)
