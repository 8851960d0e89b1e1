"""Tests of fedepth.clustering: hand-computed cases, properties, a torch.distributions check."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedepth import clustering as C


def _direct_jeffreys(m: np.ndarray, v: np.ndarray) -> np.ndarray:
    s1, s2 = v[:, None, :], v[None, :, :]
    d = m[:, None, :] - m[None, :, :]
    return 0.5 * (s1 / s2 + s2 / s1 - 2 + d**2 * (1 / s1 + 1 / s2)).sum(-1)


def test_jeffreys_two_clients_by_hand() -> None:
    # D = 2: client 0 ~ N([0, 1], diag[1, 2]), client 1 ~ N([2, 1], diag[4, 2]).
    # dim 0: 1/4 + 4/1 - 2 + (0-2)^2 (1 + 1/4) = 2.25 + 5 = 7.25; dim 1: 1 + 1 - 2 + 0 = 0.
    A = C.jeffreys_matrix([[0.0, 1.0], [2.0, 1.0]], [[1.0, 2.0], [4.0, 2.0]])
    assert A[0, 1] == pytest.approx(0.5 * 7.25)
    assert A[1, 0] == A[0, 1]
    assert A[0, 0] == 0.0 and A[1, 1] == 0.0


def test_jeffreys_equals_sum_of_torch_kls() -> None:
    rng = np.random.default_rng(3)
    m = rng.normal(size=(5, 7)) * 2
    v = np.exp(rng.normal(size=(5, 7)))
    A = C.jeffreys_matrix(m, v)
    for i in range(5):
        for j in range(5):
            p = torch.distributions.Normal(torch.tensor(m[i]), torch.tensor(v[i]).sqrt())
            q = torch.distributions.Normal(torch.tensor(m[j]), torch.tensor(v[j]).sqrt())
            kl = (
                torch.distributions.kl_divergence(p, q).sum()
                + torch.distributions.kl_divergence(q, p).sum()
            )
            assert A[i, j] == pytest.approx(float(kl), rel=1e-9, abs=1e-9)


def test_jeffreys_matches_direct_formula_on_badly_conditioned_data() -> None:
    rng = np.random.default_rng(0)
    m = rng.normal(size=(40, 64)) * 5 + 100.0  # large offsets, small variances
    v = np.exp(rng.normal(size=(40, 64))) * 1e-2
    m[1] = m[0] + 1e-3  # a near-duplicate pair
    v[1] = v[0] * 1.001
    np.testing.assert_allclose(
        C.jeffreys_matrix(m, v), _direct_jeffreys(m, v), rtol=1e-7, atol=1e-6
    )


def test_jeffreys_float32_output_is_close() -> None:
    rng = np.random.default_rng(1)
    m, v = rng.normal(size=(30, 16)), np.exp(rng.normal(size=(30, 16)))
    exact = _direct_jeffreys(m, v)
    approx = C.jeffreys_matrix(m, v, dtype=np.float32)
    assert approx.dtype == np.float32
    np.testing.assert_allclose(approx, exact, rtol=1e-3, atol=1e-2 * exact.mean())


def test_jeffreys_cross_agrees_with_matrix() -> None:
    rng = np.random.default_rng(2)
    m, v = rng.normal(size=(9, 5)), np.exp(rng.normal(size=(9, 5)))
    A = C.jeffreys_matrix(m, v)
    X = C.jeffreys_cross(m[:4], v[:4], m[4:], v[4:])
    np.testing.assert_allclose(X, A[:4, 4:], rtol=1e-9, atol=1e-9)


def test_jeffreys_rejects_bad_descriptors() -> None:
    with pytest.raises(ValueError, match="> 0"):
        C.jeffreys_matrix([[0.0, 1.0]], [[1.0, 0.0]])
    with pytest.raises(ValueError, match="NaN"):
        C.jeffreys_matrix([[np.nan, 1.0]], [[1.0, 1.0]])
    with pytest.raises(ValueError, match="differ in shape"):
        C.jeffreys_matrix([[0.0, 1.0]], [[1.0, 1.0, 1.0]])
    with pytest.raises(ValueError, match="dimensions differ"):
        C.jeffreys_cross([[0.0]], [[1.0]], [[0.0, 1.0]], [[1.0, 1.0]])


descriptor_sets = st.integers(2, 8).flatmap(
    lambda n: st.tuples(
        hnp.arrays(np.float64, (n, 4), elements=st.floats(-50, 50)),
        hnp.arrays(np.float64, (n, 4), elements=st.floats(1e-3, 1e3)),
    )
)


@settings(max_examples=60, deadline=None)
@given(descriptor_sets)
def test_jeffreys_properties(data: tuple[np.ndarray, np.ndarray]) -> None:
    m, v = data
    A = C.jeffreys_matrix(m, v)
    assert (A == A.T).all()
    assert (A >= 0).all()
    assert (np.diag(A) == 0).all()
    exact = _direct_jeffreys(m, v)
    np.testing.assert_allclose(A, exact, rtol=1e-6, atol=1e-6 * max(1.0, exact.max()))


# A hand-made 4-client case.
#   A = [[0, 1, 5, 9],      tau = 4:  M = [[1, 1, 0, 0],   row 0 = {0, 1}
#        [1, 0, 3, 9],                     [1, 1, 1, 0],   row 1 = {0, 1, 2}
#        [5, 3, 0, 2],                     [0, 1, 1, 1],   row 2 = {1, 2, 3}
#        [9, 9, 2, 0]]                     [0, 0, 1, 1]]   row 3 = {2, 3}
# Row 0 is a proper subset of row 1, row 3 of row 2: M* = [{0, 1, 2}, {1, 2, 3}], K = 2,
# clients 1 and 2 are in both clusters: overlap ratio 2/4 = 0.5.
A4 = np.array([[0, 1, 5, 9], [1, 0, 3, 9], [5, 3, 0, 2], [9, 9, 2, 0]], dtype=float)


def test_four_client_map_and_merge_by_hand() -> None:
    M = C.soft_cluster_map(A4, 4.0)
    expected_M = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(M, expected_M)
    M_star = C.merge_subsets(M)
    np.testing.assert_array_equal(M_star, np.array([[1, 1, 1, 0], [0, 1, 1, 1]], dtype=bool))
    assert C.overlap_ratio(M_star) == 0.5
    result = C.soft_clustering(A4, 4.0)
    assert result.clusters() == [[0, 1, 2], [1, 2, 3]]
    assert result.memberships() == [[0], [0, 1], [0, 1], [1]]
    assert result.num_clusters == 2


def test_threshold_is_inclusive_and_extremes() -> None:
    assert C.soft_cluster_map(A4, 3.0)[1, 2]  # A = 3 <= tau = 3
    assert C.merge_subsets(C.soft_cluster_map(A4, 0.0)).shape == (4, 4)  # all singletons
    everyone = C.merge_subsets(C.soft_cluster_map(A4, 100.0))
    np.testing.assert_array_equal(everyone, np.ones((1, 4), dtype=bool))
    assert C.overlap_ratio(everyone) == 0.0
    with pytest.raises(ValueError, match="tau must be >= 0"):
        C.soft_cluster_map(A4, -1.0)


def test_merge_drops_duplicates_and_empty_rows() -> None:
    M = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 0], [0, 0, 1]], dtype=bool)
    np.testing.assert_array_equal(C.merge_subsets(M), [[1, 1, 0], [0, 0, 1]])


maps = st.integers(1, 9).flatmap(lambda n: hnp.arrays(np.bool_, (n, n)))


@settings(max_examples=150, deadline=None)
@given(maps)
def test_merge_properties(M: np.ndarray) -> None:
    M = M | np.eye(M.shape[0], dtype=bool)  # every soft map has its seed on the diagonal
    M_star = C.merge_subsets(M)
    rows = [frozenset(np.flatnonzero(r)) for r in M_star]
    # every client stays in at least one cluster
    assert M_star.any(axis=0).all()
    # no duplicates and no row inside another
    assert len(set(rows)) == len(rows)
    assert not any(a < b for a in rows for b in rows)
    # every original row is contained in a surviving row
    for r in M:
        assert any(frozenset(np.flatnonzero(r)) <= s for s in rows)
    # idempotent
    np.testing.assert_array_equal(C.merge_subsets(M_star), M_star)
    # canonical order: (first member, larger first, membership bytes)
    key = [(int(r.argmax()), -int(r.sum()), np.packbits(r).tobytes()) for r in M_star]
    assert key == sorted(key)


@settings(max_examples=100, deadline=None)
@given(descriptor_sets, st.floats(0, 200), st.randoms(use_true_random=False))
def test_clustering_is_independent_of_client_order(
    data: tuple[np.ndarray, np.ndarray], tau: float, rnd: object
) -> None:
    m, v = data
    n = m.shape[0]
    perm = np.arange(n)
    rnd.shuffle(perm)  # type: ignore[attr-defined]
    A = C.jeffreys_matrix(m, v)
    # The divergences are permutation-equivariant (up to rounding in the last bits) ...
    A_p = C.jeffreys_matrix(m[perm], v[perm])
    np.testing.assert_allclose(A_p, A[np.ix_(perm, perm)], rtol=1e-9, atol=1e-9 * (1 + A.max()))
    # ... and the map and its merge are exactly equivariant for a given matrix.
    got = {
        frozenset(int(perm[j]) for j in np.flatnonzero(r))
        for r in C.merge_subsets(C.soft_cluster_map(A[np.ix_(perm, perm)], tau))
    }
    ref = {
        frozenset(np.flatnonzero(r).tolist()) for r in C.merge_subsets(C.soft_cluster_map(A, tau))
    }
    assert got == ref


def test_overlap_ratio() -> None:
    M = np.array([[1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 0, 1, 1]], dtype=bool)
    assert C.overlap_ratio(M) == pytest.approx(1 / 5)


def test_calibrate_tau_by_hand() -> None:
    # Candidate thresholds are the off-diagonal values {1, 2, 3, 5, 9}:
    #   tau = 1: rows {0,1},{0,1},{2},{3}       -> M* {0,1},{2},{3}        overlap 0
    #   tau = 2: {0,1},{0,1},{2,3},{2,3}        -> {0,1},{2,3}             overlap 0
    #   tau = 3: {0,1},{0,1,2},{1,2,3},{2,3}    -> {0,1,2},{1,2,3}         overlap 0.5
    #   tau = 5: {0,1,2},{0,1,2},{0,1,2,3},...  -> {0,1,2,3}               overlap 0
    assert C.calibrate_tau(A4, 0.5) == 3.0
    assert C.calibrate_tau(A4, 0.4) == 3.0
    # overlap 0 is reached at tau = 1, 2, 5, 9: the smallest tau wins the tie
    assert C.calibrate_tau(A4, 0.0) == 1.0
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        C.calibrate_tau(A4, 1.5)


def test_calibrate_tau_grid_search_on_a_large_fleet() -> None:
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(6, 8)) * 3
    m = np.concatenate([c + rng.normal(size=(8, 8)) for c in centres])
    v = np.exp(rng.normal(size=m.shape) * 0.2)
    A = C.jeffreys_matrix(m, v)
    exact = C.calibrate_tau(A, 0.2, exhaustive_limit=10**9)
    grid = C.calibrate_tau(A, 0.2, exhaustive_limit=50)
    err_exact = abs(C.soft_clustering(A, exact).overlap - 0.2)
    err_grid = abs(C.soft_clustering(A, grid).overlap - 0.2)
    assert err_grid <= err_exact + 0.02
    # calibrate() builds the map from the pairs its search gathered: same result as a fresh scan
    for limit in (10**9, 50):
        got = C.calibrate(A, 0.2, exhaustive_limit=limit)
        ref = C.soft_clustering(A, C.calibrate_tau(A, 0.2, exhaustive_limit=limit))
        assert got.tau == ref.tau and got.overlap == ref.overlap
        np.testing.assert_array_equal(got.M_star, ref.M_star)
    assert C.calibrate(A4, 0.5).clusters() == [[0, 1, 2], [1, 2, 3]]
    assert C.calibrate(np.zeros((1, 1)), 0.2).clusters() == [[0]]


def test_route() -> None:
    M_star = np.array([[1, 1, 1, 0], [0, 1, 1, 1]], dtype=bool)
    # S_0 = (1 + 2 + 3) / 3 = 2, S_1 = (2 + 3 + 10) / 3 = 5
    d = np.array([1.0, 2.0, 3.0, 10.0])
    assert C.route(d, M_star, tau=2.0) == [0]
    assert C.route(d, M_star, tau=5.0) == [0, 1]
    assert C.route(d, M_star, tau=1.0) == [0]  # nothing within tau: the nearest cluster
    assert C.route(np.array([9.0, 3.0, 3.0, 0.0]), M_star, tau=0.5) == [1]
    np.testing.assert_allclose(C.cluster_scores(d, M_star), [2.0, 5.0])
    with pytest.raises(ValueError, match="3 divergences"):
        C.route(d[:3], M_star, tau=1.0)


def test_hard_clusters_cut_at_tau() -> None:
    A = np.array([[0, 1, 9, 9], [1, 0, 9, 9], [9, 9, 0, 2], [9, 9, 2, 0]], dtype=float)
    np.testing.assert_array_equal(C.hard_clusters(A, 2.0), [[1, 1, 0, 0], [0, 0, 1, 1]])
    np.testing.assert_array_equal(
        C.hard_clusters(A, 1.5), [[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    )
    assert C.hard_clusters(A, 100.0).shape == (1, 4)
    # average linkage: joining {0,1} with {2,3} costs mean(9, 9, 9, 9) = 9
    assert C.hard_clusters(A, 9.0).shape == (1, 4)
    assert C.hard_clusters(A, 8.9).shape == (2, 4)


def test_hard_clusters_on_four_client_case() -> None:
    # average linkage: (0,1) at 1, then (2,3) at 2, then {0,1}-{2,3} at mean(5,9,3,9) = 6.5
    assert C.hard_clusters(A4, 4.0).sum(axis=0).tolist() == [1, 1, 1, 1]
    assert C.hard_clusters(A4, 4.0).shape[0] == 2
    assert C.hard_clusters(A4, 6.5).shape[0] == 1


def test_labels_to_map() -> None:
    np.testing.assert_array_equal(
        C.labels_to_map([7, 3, 7, 5]), [[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1]]
    )


def test_principal_angles() -> None:
    e = np.eye(3)
    u0 = e[:, :1]  # x axis
    u1 = (e[:, :1] + e[:, 1:2]) / np.sqrt(2)  # 45 degrees from x in the xy plane
    u2 = e[:, 2:]  # z axis
    u3 = e[:, :2]  # xy plane: contains x
    P = C.principal_angle_matrix([u0, u1, u2, u3])
    assert P[0, 1] == pytest.approx(45.0)
    assert P[0, 2] == pytest.approx(90.0)
    assert P[0, 3] == pytest.approx(0.0, abs=1e-6)
    assert P[2, 3] == pytest.approx(90.0)
    assert (P == P.T).all() and (np.diag(P) == 0).all()


def test_subspace_basis_spans_the_features() -> None:
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.normal(size=(10, 2)))[0]
    feats = basis @ rng.normal(size=(2, 30))  # rank-2 data
    U = C.subspace_basis(feats, p=2)
    assert U.shape == (10, 2)
    assert C.principal_angle_matrix([U, basis])[0, 1] == pytest.approx(0.0, abs=1e-5)


@settings(max_examples=60, deadline=None)
@given(descriptor_sets, st.floats(0, 200))
def test_soft_clustering_equals_map_then_merge(
    data: tuple[np.ndarray, np.ndarray], tau: float
) -> None:
    A = C.jeffreys_matrix(*data)
    result = C.soft_clustering(A, tau)
    np.testing.assert_array_equal(result.M_star, C.merge_subsets(C.soft_cluster_map(A, tau)))
    assert result.overlap == C.overlap_ratio(result.M_star)


def test_largest_gap_threshold_and_k_clusters() -> None:
    A = np.array([[0, 1, 9, 9], [1, 0, 9, 9], [9, 9, 0, 2], [9, 9, 2, 0]], dtype=float)
    # merge heights 1, 2, 9: the largest gap is 2 -> 9, cut at 5.5
    assert C.largest_gap_threshold(A) == 5.5
    np.testing.assert_array_equal(C.hard_clusters_k(A, 2), [[1, 1, 0, 0], [0, 0, 1, 1]])
    assert C.hard_clusters_k(A, 1).shape == (1, 4)
    assert C.hard_clusters_k(A, 4).shape == (4, 4)


@settings(max_examples=60, deadline=None)
@given(descriptor_sets, st.floats(0, 200))
def test_dense_and_sparse_overlap_agree(data: tuple[np.ndarray, np.ndarray], tau: float) -> None:
    m, v = data
    A = C.jeffreys_matrix(m, v)
    pairs = C._PairMap(A, np.inf)
    expected = C.overlap_ratio(C.merge_subsets(C.soft_cluster_map(A, tau)))
    assert pairs._overlap_dense(tau) == expected
    assert float((np.asarray(pairs.merged(tau).sum(axis=0)).ravel() >= 2).mean()) == expected


def test_rand_index_by_hand() -> None:
    two = [[1, 1, 0], [0, 0, 1]]
    # pairs (0,1) together in both; (0,2) and (1,2) apart in `two`, together in one cluster
    assert C.rand_index(two, [[1, 1, 1]]) == pytest.approx(1 / 3)
    assert C.rand_index(two, [[0, 0, 1], [1, 1, 0]]) == 1.0  # cluster order does not matter
    # soft: client 1 in both clusters shares a cluster with 0 and with 2, 0 and 2 stay apart
    assert C.co_membership([[1, 1, 0], [0, 1, 1]]).tolist() == [
        [True, True, False],
        [True, True, True],
        [False, True, True],
    ]
    assert C.rand_index([[1]], [[1]]) == 1.0
    with pytest.raises(ValueError, match="clients"):
        C.rand_index(two, [[1, 1]])


def test_match_partition_finds_the_smallest_tau_that_reproduces_it() -> None:
    # J = (mu_i - mu_j)^2 for unit variances. Groups {0, 1, 2} and {10, 11, 13}: within them
    # 1, 4, 1 and 1, 9, 4; between them >= 64. At tau = 4 the second group's rows are
    # {10, 11}, {10, 11, 13}, {11, 13}, merged into one: the partition, and no smaller tau
    # gives it (at tau = 1.5, 13 is alone: 2 of the 15 pairs disagree).
    mus = np.array([[0.0], [1.0], [2.0], [10.0], [11.0], [13.0]])
    A = C.jeffreys_matrix(mus, np.ones_like(mus))
    reference = [[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]]
    got = C.match_partition(A, reference)
    assert got.tau == pytest.approx(4.0)
    np.testing.assert_array_equal(got.M_star, reference)
    assert C.rand_index(C.soft_clustering(A, 1.5).M_star, reference) == pytest.approx(13 / 15)
    # a reference no threshold reaches (0 with 13, 1 with 10): the closest grouping is returned
    odd = [[1, 0, 0, 0, 0, 1], [0, 1, 0, 1, 0, 0], [0, 0, 1, 0, 1, 0]]
    best = C.match_partition(A, odd)
    score = C.rand_index(best.M_star, odd)
    assert score < 1.0
    upper = A[np.triu_indices(6, 1)]
    assert all(C.rand_index(C.soft_clustering(A, t).M_star, odd) <= score for t in upper)
    with pytest.raises(ValueError, match="K x 6"):
        C.match_partition(A, [[1, 1, 1]])
