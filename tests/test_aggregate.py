"""Tests of fedepth.strategies.aggregate on tiny states with hand-computed answers."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from fedepth.strategies.aggregate import (
    client_models,
    cluster_models,
    coordinate_median,
    robust_mean,
    trimmed_mean,
    weighted_mean,
)


def _s(v: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2,), v, dtype=np.float32), "n": np.array(int(v), dtype=np.int64)}


def test_weighted_mean_by_hand() -> None:
    out = weighted_mean([_s(1.0), _s(2.0)], [1, 2])
    np.testing.assert_allclose(out["w"], (1 * 1 + 2 * 2) / 3)
    assert out["w"].dtype == np.float32
    assert out["n"].dtype == np.int64 and int(out["n"]) == 2  # 5/3 rounds to 2


def test_weighted_mean_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        weighted_mean([], [])
    with pytest.raises(ValueError, match="non-negative"):
        weighted_mean([_s(1.0)], [-1])
    with pytest.raises(ValueError, match="2 weights"):
        weighted_mean([_s(1.0)], [1, 1])
    with pytest.raises(ValueError, match="different tensor names"):
        weighted_mean([_s(1.0), {"w": np.zeros(2)}], [1, 1])
    with pytest.raises(ValueError, match="shape"):
        weighted_mean([{"w": np.zeros(2)}, {"w": np.zeros(3)}], [1, 1])


def test_two_clusters_with_an_overlapping_client() -> None:
    # clients 0, 1, 2 with values 1, 2, 4 and sizes 10, 30, 60;
    # cluster 0 = {0, 1}, cluster 1 = {1, 2}: client 1 is in both.
    states = [_s(1.0), _s(2.0), _s(4.0)]
    M = np.array([[1, 1, 0], [0, 1, 1]], dtype=bool)
    ks = cluster_models(states, [10, 30, 60], M)
    np.testing.assert_allclose(ks[0]["w"], (10 * 1 + 30 * 2) / 40)  # 1.75
    np.testing.assert_allclose(ks[1]["w"], (30 * 2 + 60 * 4) / 90)  # 3.333...
    cs = client_models(ks, M)
    np.testing.assert_allclose(cs[0]["w"], 1.75)
    np.testing.assert_allclose(cs[1]["w"], (1.75 + 300 / 90) / 2)
    np.testing.assert_allclose(cs[2]["w"], 300 / 90, rtol=1e-6)


def test_single_cluster_is_fedavg() -> None:
    states = [_s(1.0), _s(2.0), _s(4.0)]
    ks = cluster_models(states, [1, 1, 2], np.ones((1, 3), dtype=bool))
    assert len(ks) == 1
    np.testing.assert_allclose(ks[0]["w"], (1 + 2 + 8) / 4)
    for c in client_models(ks, np.ones((1, 3), dtype=bool)):
        np.testing.assert_allclose(c["w"], 11 / 4)


def test_map_shape_errors() -> None:
    with pytest.raises(ValueError, match="N clients"):
        cluster_models([_s(1.0)], [1, 2], np.ones((1, 2), dtype=bool))
    with pytest.raises(ValueError, match="no members"):
        cluster_models([_s(1.0)], [1], np.zeros((1, 1), dtype=bool))
    with pytest.raises(ValueError, match="belongs to no cluster"):
        client_models([_s(1.0)], np.array([[1, 0]], dtype=bool))


# -- robust per-cluster rules (issue 14): hand-computed cases ------------------------------------
def _states(*rows: list[float]) -> list[dict[str, np.ndarray]]:
    return [{"w": np.array(r, dtype=np.float32), "n": np.array(int(r[0]))} for r in rows]


def test_coordinate_median_hand_computed() -> None:
    states = _states([1.0, 10.0], [2.0, -4.0], [100.0, 0.0])
    out = coordinate_median(states)
    np.testing.assert_array_equal(out["w"], [2.0, 0.0])  # medians of (1, 2, 100), (10, -4, 0)
    assert out["w"].dtype == np.float32 and out["n"] == 2
    even = coordinate_median(_states([1.0], [3.0], [4.0], [1e30]))
    np.testing.assert_allclose(even["w"], [3.5])  # (3 + 4) / 2


def test_trimmed_mean_hand_computed() -> None:
    states = _states([1.0, 5.0], [2.0, 5.0], [3.0, 5.0], [4.0, 5.0], [1e6, -1e6])
    out = trimmed_mean(states, 0.2)  # n = 5: drop 1 lowest and 1 highest per coordinate
    np.testing.assert_allclose(out["w"], [(2 + 3 + 4) / 3, 5.0])
    plain = [(1 + 2 + 3 + 4 + 1e6) / 5, (4 * 5 - 1e6) / 5]
    np.testing.assert_allclose(trimmed_mean(states, 0.0)["w"], plain, rtol=1e-6)
    out = trimmed_mean(states, 0.1)  # floor(0.5) = 0: nothing trimmed
    np.testing.assert_allclose(out["w"][0], (1 + 2 + 3 + 4 + 1e6) / 5)
    with pytest.raises(ValueError, match="trim"):
        trimmed_mean(states, 0.5)


def test_robust_mean_dispatches_and_ignores_weights_for_robust_rules() -> None:
    states = _states([0.0], [3.0], [30.0])
    np.testing.assert_allclose(robust_mean(states, [1, 1, 1])["w"], [11.0])
    np.testing.assert_allclose(robust_mean(states, [1, 0, 0])["w"], [0.0])  # weighted
    np.testing.assert_allclose(robust_mean(states, [1, 0, 0], method="median")["w"], [3.0])
    np.testing.assert_allclose(
        robust_mean(states, [1, 0, 0], method="trimmed_mean", trim=0.34)["w"], [3.0]
    )
    with pytest.raises(ValueError, match="unknown aggregation"):
        robust_mean(states, [1, 1, 1], method="krum")


def test_clustered_strategy_uses_its_cluster_rule() -> None:
    from fedepth.strategies import ClientInfo, ClientUpdate, create_strategy

    s = create_strategy("fedavg")
    s.initialize([ClientInfo(f"c{i}", 10) for i in range(3)], {"w": np.zeros(1, np.float32)})
    s.cluster_rule = functools.partial(robust_mean, method="median")
    values = [1.0, 2.0, 1e9]
    ups = [
        ClientUpdate(f"c{i}", {"w": np.array([v], np.float32)}, 10) for i, v in enumerate(values)
    ]
    s.aggregate_train(0, ups)
    np.testing.assert_allclose(s.model_for("c0")["w"], [2.0])


def test_cluster_without_members_keeps_its_previous_model() -> None:
    previous = [_s(7.0), _s(9.0)]
    M = np.array([[1, 1], [0, 0]], dtype=bool)
    ks = cluster_models([_s(1.0), _s(3.0)], [1, 3], M, previous=previous)
    np.testing.assert_allclose(ks[0]["w"], (1 * 1 + 3 * 3) / 4)
    assert ks[1] is previous[1]
    with pytest.raises(ValueError, match="1 previous states given for 2 clusters"):
        cluster_models([_s(1.0), _s(3.0)], [1, 3], M, previous=previous[:1])


def test_cluster_rule_replaces_the_weighted_mean() -> None:
    median = functools.partial(robust_mean, method="median")
    ks = cluster_models(
        [_s(1.0), _s(2.0), _s(9.0)], [1, 1, 100], np.ones((1, 3), bool), rule=median
    )
    np.testing.assert_allclose(ks[0]["w"], 2.0)  # the sizes do not weigh the median


def test_server_step_by_hand() -> None:
    from fedepth.strategies.aggregate import server_step

    prev = {"w": np.array([1.0], dtype=np.float32), "n": np.array(3), "bn.running_var": np.ones(1)}
    agg = {
        "w": np.array([2.0], dtype=np.float32),
        "n": np.array(4),
        "bn.running_var": np.full(1, 0.2),
    }
    new, v = server_step(prev, agg, {"w": np.array([1.0])}, lr=3.0, momentum=0.5)
    # d = 2 - 1 = 1, v = 0.5 * 1 + 1 = 1.5, w = 1 + 3 * 1.5 = 5.5
    np.testing.assert_allclose(v["w"], 1.5)
    np.testing.assert_allclose(new["w"], 5.5)
    assert new["w"].dtype == np.float32
    assert int(new["n"]) == 4 and new["bn.running_var"][0] == 0.2  # the aggregate's
    assert set(v) == {"w"}
    same, _ = server_step(prev, agg, None, lr=1.0, momentum=0.0)
    np.testing.assert_array_equal(same["w"], agg["w"])
