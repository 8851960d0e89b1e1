"""Tests of fedepth.cluster_rules: the merge and routing rules on hand-made matrices."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedepth import cluster_rules as R
from fedepth import clustering as C
from fedepth.descriptor import Descriptor
from fedepth.sim import strategy_outputs
from fedepth.strategies import ClientInfo, create_strategy
from fedepth_cli.main import main

# "The star absorbs the triangle": client 0 (the hub) is within tau = 1 of everyone, clients
# 1, 2, 3 (the triangle) are within 0.5 of each other, the leaves 4 and 5 are near the hub
# alone. Neighbourhoods at tau = 1:
#   row 0 = {0, 1, 2, 3, 4, 5}; rows 1, 2, 3 = {0, 1, 2, 3}; row 4 = {0, 4}; row 5 = {0, 5}.
STAR = np.full((6, 6), 5.0)
STAR[0, :] = STAR[:, 0] = 1.0
for _i in (1, 2, 3):
    for _j in (1, 2, 3):
        STAR[_i, _j] = 0.5
np.fill_diagonal(STAR, 0.0)
TAU = 1.0


def _sets(m: np.ndarray) -> list[list[int]]:
    return [np.flatnonzero(r).tolist() for r in m]


def test_star_subsets_keeps_only_the_hubs_wide_cluster() -> None:
    M = C.soft_cluster_map(STAR, TAU)
    assert _sets(R.merge(M, "subsets")) == [[0, 1, 2, 3, 4, 5]]
    np.testing.assert_array_equal(R.merge(M, "subsets"), C.merge_subsets(M))


def test_star_duplicates_keeps_the_triangles_row() -> None:
    M = C.soft_cluster_map(STAR, TAU)
    # the three identical triangle rows once; {0, 5} before {0, 4} by the membership bytes
    assert _sets(R.merge(M, "duplicates")) == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3], [0, 5], [0, 4]]


def test_star_cliques_split_the_star_into_its_tight_parts() -> None:
    M = C.soft_cluster_map(STAR, TAU)
    # seeds by neighbourhood size: leaf 4 -> {4, 0}, leaf 5 -> {5, 0}, client 1 -> {1, 0, 2, 3};
    # the hub, within tau of all, is the overlap: in every cluster, and no wide cluster
    got = _sets(R.merge(M, "cliques"))
    assert got == [[0, 1, 2, 3], [0, 5], [0, 4]]
    assert C.overlap_ratio(R.merge(M, "cliques")) == pytest.approx(1 / 6)


def test_cliques_on_a_bowtie_and_on_the_four_client_case() -> None:
    # two triangles {0, 1, 2} and {2, 3, 4} sharing client 2: seeded by 0 and by 3, 2 in both
    bowtie = np.zeros((5, 5), dtype=bool)
    for tri in ([0, 1, 2], [2, 3, 4]):
        bowtie[np.ix_(tri, tri)] = True
    assert _sets(R.merge_cliques(bowtie)) == [[0, 1, 2], [2, 3, 4]]
    assert _sets(R.merge_subsets(bowtie)) == [[0, 1, 2, 3, 4]]  # row 2 holds everyone
    # A4 of test_clustering at tau 4 (the path 0 - 1 - 2 - 3): {0, 1, 2} is no clique
    # (A[0, 2] = 5); the cover is seeded by 0 ({0, 1}) and 3 ({3, 2}), which cover 1 and 2
    A4 = np.array([[0, 1, 5, 9], [1, 0, 3, 9], [5, 3, 0, 2], [9, 9, 2, 0]], dtype=float)
    assert _sets(R.merge_cliques(C.soft_cluster_map(A4, 4.0))) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="square"):
        R.merge_cliques(np.ones((2, 3), dtype=bool))


maps = st.integers(1, 9).flatmap(lambda n: hnp.arrays(np.bool_, (n, n)))


@settings(max_examples=100, deadline=None)
@given(maps)
def test_every_rule_covers_every_client_in_canonical_order(M: np.ndarray) -> None:
    M = M | M.T | np.eye(M.shape[0], dtype=bool)  # a symmetric soft map with its diagonal
    for name in R.MERGE_RULES:
        M_star = R.merge(M, name)
        np.testing.assert_array_equal(R.merge(M, name), M_star)  # deterministic
        assert M_star.any(axis=0).all()  # every client in a cluster
        rows = [frozenset(np.flatnonzero(r)) for r in M_star]
        assert len(set(rows)) == len(rows)  # distinct
        key = [(int(r.argmax()), -int(r.sum()), np.packbits(r).tobytes()) for r in M_star]
        assert key == sorted(key)  # canonical order
    # the paper's rule against its definition, set by set: the maximal rows
    sets = {frozenset(np.flatnonzero(r)) for r in M}
    assert {frozenset(np.flatnonzero(r)) for r in R.merge(M, "subsets")} == {
        s for s in sets if not any(s < t for t in sets)
    }
    assert {frozenset(np.flatnonzero(r)) for r in R.merge(M, "duplicates")} == sets
    # cliques: every cluster a clique, maximal, none inside another
    for r in R.merge(M, "cliques"):
        idx = np.flatnonzero(r)
        assert M[np.ix_(idx, idx)].all()
        assert not (M[idx].all(axis=0) & ~r).any()


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 7).flatmap(
        lambda n: hnp.arrays(np.float64, (n, n), elements=st.sampled_from([0.5, 1.0, 2.0, 4.0]))
    ),
    st.sampled_from([0.5, 1.0, 2.0, 4.0]),
)
def test_soft_clustering_and_calibration_follow_the_rule(A: np.ndarray, tau: float) -> None:
    A = np.triu(A, 1) + np.triu(A, 1).T  # symmetric, zero diagonal
    cand = np.unique(A[np.triu_indices(A.shape[0], 1)])
    for name in R.MERGE_RULES:
        got = C.soft_clustering(A, tau, merge=name)
        np.testing.assert_array_equal(got.M_star, R.merge(C.soft_cluster_map(A, tau), name))
        assert got.overlap == C.overlap_ratio(got.M_star)
        # the calibration measures the overlap on the map this rule merges (ties: least tau)
        errors = [abs(C.soft_clustering(A, t, merge=name).overlap - 0.3) for t in cand]
        best = C.calibrate(A, 0.3, merge=name)
        assert best.tau == cand[int(np.argmin(errors))]
        np.testing.assert_array_equal(
            best.M_star, C.soft_clustering(A, best.tau, merge=name).M_star
        )


def test_calibration_and_matching_use_the_merge_rule() -> None:
    # Candidates 0.5, 1, 5. Overlap at tau 1: subsets 0 (one wide cluster), cliques 1/6 (the
    # hub), duplicates 1 (everyone in two rows); 0 at tau 0.5 and 5 for every rule.
    assert C.calibrate_tau(STAR, 1 / 6) == 0.5  # subsets: never 1/6, the tie goes to 0.5
    assert C.calibrate_tau(STAR, 1 / 6, merge="cliques") == 1.0
    assert C.calibrate(STAR, 0.9, merge="duplicates").tau == 1.0
    # The partition {hub, triangle}, {4}, {5} by cliques: at tau 0.5 {1,2,3},{0},{4},{5}
    # (3 of 15 pairs differ), at 1 {0,1,2,3},{0,4},{0,5} (2 differ: 0-4, 0-5), at 5 everyone
    # (9 differ). By subsets, tau 0.5 gives the same 12/15 and tau 1 one wide cluster (9).
    reference = [[1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 1]]
    got = C.match_partition(STAR, reference, merge="cliques")
    assert got.tau == 1.0 and C.rand_index(got.M_star, reference) == pytest.approx(13 / 15)
    assert C.match_partition(STAR, reference).tau == 0.5
    with pytest.raises(ValueError, match="unknown merge rule 'biggest'; known: subsets"):
        C.calibrate(STAR, 0.2, merge="biggest")


def test_routing_rules_by_hand() -> None:
    M_star = np.array([[1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 0, 1]], dtype=bool)
    d = np.array([1.0, 1.0, 2.0, 2.0])  # S = [1, 2, 1.5]
    np.testing.assert_allclose(R.cluster_scores(d, M_star), [1.0, 2.0, 1.5])
    # within tau 2.5: all three averaged; nearest: cluster 0 alone; S_min + tau = 3.5: all
    assert R.route(d, M_star, 2.5) == [0, 1, 2]
    assert R.route(d, M_star, 2.5, "within-tau") == C.route(d, M_star, 2.5)
    assert R.route(d, M_star, 2.5, "nearest") == [0]
    assert R.route(d, M_star, 2.5, "near-nearest") == [0, 1, 2]
    # tau 1.2: within tau only cluster 0; near-nearest S <= 2.2: every cluster
    assert R.route(d, M_star, 1.2) == [0]
    assert R.route(d, M_star, 1.2, "near-nearest") == [0, 1, 2]
    # tau 0.5: nothing within tau -> the nearest; near-nearest S <= 1.5: clusters 0 and 2
    far = d + 3.0  # S = [4, 5, 4.5]
    assert R.route(far, M_star, 0.5) == [0]
    assert R.route(far, M_star, 0.5, "near-nearest") == [0, 2]
    assert R.route(far, M_star, 0.0, "near-nearest") == [0]
    with pytest.raises(ValueError, match="unknown routing rule 'all'; known: within-tau"):
        R.route(d, M_star, 1.0, "all")


def test_presets_and_names() -> None:
    assert R.RULES["paper"] == ("subsets", "within-tau")
    assert R.resolve_rules() == ("subsets", "within-tau")
    assert R.resolve_rules("paper", merge="cliques") == ("cliques", "within-tau")
    assert R.resolve_rules(routing="nearest") == ("subsets", "nearest")
    with pytest.raises(ValueError, match="unknown rules preset 'mine'; known: paper"):
        R.resolve_rules("mine")
    with pytest.raises(ValueError, match="known: subsets, duplicates, cliques"):
        R.resolve_rules(merge="nope")
    with pytest.raises(ValueError, match="known: within-tau, nearest, near-nearest"):
        R.check_routing("nope")


# The star again as a fleet: with unit variances J(i, j) = |mu_i - mu_j|^2. Hub (0, 0); the
# triangle (1, 0), (1.1, 0.1), (1.1, -0.1) (within 0.04 of each other, 1 - 1.22 of the hub);
# leaves (-1, 0) and (0, 1) (1 from the hub, 2 from each other, >= 2 from the triangle).
STAR_MUS = [(0.0, 0.0), (1.0, 0.0), (1.1, 0.1), (1.1, -0.1), (-1.0, 0.0), (0.0, 1.0)]


def _desc(mu: tuple[float, float]) -> Descriptor:
    return Descriptor(mean=np.array(mu), var=np.ones(2), num_frames=10)


def _fleet() -> list[ClientInfo]:
    return [ClientInfo(f"c{i}", 10, _desc(mu)) for i, mu in enumerate(STAR_MUS)]


def _state() -> dict[str, np.ndarray]:
    return {"w": np.zeros(1)}


def test_fedepth_takes_the_rules_and_its_state_keeps_them() -> None:
    paper = create_strategy("fedepth", tau=1.25)
    paper.initialize(_fleet(), _state())
    assert _sets(paper.M_star) == [[0, 1, 2, 3, 4, 5]]
    s = create_strategy("fedepth", tau=1.25, merge="cliques", routing="nearest")
    s.initialize(_fleet(), _state())
    assert _sets(s.M_star) == [[0, 1, 2, 3], [0, 5], [0, 4]]
    # a sequence at (0.6, 0): S = [0.26, 0.86, 1.46] over the three cliques
    seq = _desc((0.6, 0.0))
    np.testing.assert_allclose(s.cluster_scores(seq), [0.26, 0.86, 1.46])
    assert s.route(seq).clusters == [0]
    by = {
        r: create_strategy("fedepth", tau=1.25, merge="cliques", routing=r)
        for r in R.ROUTING_RULES
    }
    for strategy in by.values():
        strategy.initialize(_fleet(), _state())
    assert by["within-tau"].route(seq).clusters == [0, 1]
    assert by["near-nearest"].route(seq).clusters == [0, 1, 2]  # S <= 0.26 + 1.25
    # the rules travel with the state: a coordinator resumed with the defaults keeps them
    meta, states = s.state_dict()
    assert (meta["merge"], meta["routing"]) == ("cliques", "nearest")
    fresh = create_strategy("fedepth", tau=1.25)
    fresh.initialize(_fleet(), _state())
    fresh.load_state_dict(meta, states)
    assert fresh.rules_meta() == {"merge": "cliques", "routing": "nearest"}
    assert fresh.route(seq).clusters == [0]
    # a state saved before the rules existed was made by the paper's
    old = {k: v for k, v in meta.items() if k not in ("merge", "routing")}
    fresh.load_state_dict(old, states)
    assert fresh.rules_meta() == {"merge": "subsets", "routing": "within-tau"}
    # the records name them next to the threshold rule
    _, params = strategy_outputs(s, {"merge": "cliques", "routing": "nearest"})
    assert params["merge"] == "cliques" and params["routing"] == "nearest"
    assert strategy_outputs(paper, {"tau": 1.25})[1]["merge"] == "subsets"


def test_hard_clustering_calibrates_on_its_merge_rule() -> None:
    A = C.jeffreys_matrix(np.array(STAR_MUS), np.ones((6, 2)))
    hard = create_strategy("hard", overlap=0.2, merge="cliques")
    hard.initialize(_fleet(), _state())
    assert hard.tau == C.calibrate_tau(A, 0.2, merge="cliques")
    assert hard.tau != C.calibrate_tau(A, 0.2)  # the paper's rule never leaves the hub in two
    assert create_strategy("hard").rules_meta() == {"merge": "subsets", "routing": "nearest"}
    # average linkage at tau 1.4: the hub joins leaf 4 (1) before the triangle (mean 1.15):
    # {0, 4}, {1, 2, 3}, {5}; the sequence at (0.6, 0) has S = [1.46, 0.227, 1.36]: within
    # tau clusters 1 and 2, the nearest 1 alone
    within = create_strategy("hard", tau=1.4, routing="within-tau")
    within.initialize(_fleet(), _state())
    assert _sets(within.M_star) == [[0, 4], [1, 2, 3], [5]]
    assert within.route(_desc((0.6, 0.0))).clusters == [1, 2]
    assert within.state_dict()[0]["routing"] == "within-tau"
    nearest = create_strategy("hard", tau=1.4)
    nearest.initialize(_fleet(), _state())
    assert nearest.route(_desc((0.6, 0.0))).clusters == [1]


def test_strategies_refuse_unknown_rules_and_an_overlap_of_one() -> None:
    with pytest.raises(ValueError, match="unknown merge rule 'wide'; known: subsets"):
        create_strategy("fedepth", merge="wide")
    with pytest.raises(ValueError, match="unknown routing rule 'all'"):
        create_strategy("hard", routing="all")
    with pytest.raises(ValueError, match="unknown rules preset"):
        create_strategy("fedepth", rules="ours")
    for overlap in (1.0, -0.1):
        with pytest.raises(ValueError, match=r"overlap must lie in \[0, 1\)"):
            create_strategy("fedepth", overlap=overlap)
    assert create_strategy("fedepth", tau=float("inf")).tau == float("inf")  # the 100 % point


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("fedepth.merge=biggest", "unknown merge rule 'biggest'; known: subsets, duplicates"),
        ("fedepth.routing=all", "unknown routing rule 'all'; known: within-tau, nearest"),
        ("fedepth.overlap=1.0", "overlap must lie in [0, 1), got 1.0"),
        ("fedepth.overlap=-0.1", "overlap must lie in [0, 1), got -0.1"),
        ("hard.merge=biggest", "unknown merge rule 'biggest'"),
    ],
)
def test_bench_cli_refuses_bad_rules_and_overlaps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], param: str, message: str
) -> None:
    argv = ["bench", "--scenario", "hpe", "--profile", "smoke", "--out", str(tmp_path)]
    assert main([*argv, "--methods", "fedepth,hard", "--method-param", param]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not (tmp_path / "results.json").exists()


def test_cluster_cli_takes_the_merge_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "star.npz"
    np.savez(f, means=np.array(STAR_MUS), variances=np.ones((6, 2)))
    assert main(["cluster", "--descriptors", str(f), "--tau", "1.25", "--merge", "cliques"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["clusters"] == [[0, 1, 2, 3], [0, 5], [0, 4]] and out["merge"] == "cliques"
    for args, message in (
        (["--overlap", "1.0"], "--overlap must lie in [0, 1], 1 excluded"),
        (["--overlap", "-0.1"], "--overlap must lie in [0, 1]"),
        (["--tau", "1", "--merge", "wide"], "unknown merge rule 'wide'; known: subsets"),
    ):
        assert main(["cluster", "--descriptors", str(f), *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err
