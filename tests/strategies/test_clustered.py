"""Tests of the clustered strategies (FedAvg, FeDepth) on tiny states, answers by hand."""

from __future__ import annotations

import numpy as np
import pytest

from fedepth.descriptor import Descriptor
from fedepth.strategies import ClientInfo, ClientUpdate, create_strategy, list_strategies


def _desc(mu: float) -> Descriptor:
    return Descriptor(mean=np.array([mu]), var=np.array([1.0]), num_frames=10)


def _clients(mus: list[float], sizes: list[int]) -> list[ClientInfo]:
    return [
        ClientInfo(f"c{i}", n, _desc(m)) for i, (m, n) in enumerate(zip(mus, sizes, strict=True))
    ]


def _state(v: float) -> dict[str, np.ndarray]:
    return {"w": np.array([v], dtype=np.float64)}


def _updates(values: list[float], sizes: list[int]) -> list[ClientUpdate]:
    return [
        ClientUpdate(f"c{i}", _state(v), n)
        for i, (v, n) in enumerate(zip(values, sizes, strict=True))
    ]


# With one-dimensional descriptors of variance 1, J(i, j) = (mu_i - mu_j)^2.
# Means 0, 1, 2, 3 at tau = 1: rows {0,1}, {0,1,2}, {1,2,3}, {2,3} -> M* = {0,1,2}, {1,2,3}.
MUS = [0.0, 1.0, 2.0, 3.0]
SIZES = [10, 30, 20, 40]
VALUES = [1.0, 2.0, 4.0, 8.0]


def test_fedepth_two_overlapping_clusters_by_hand() -> None:
    s = create_strategy("fedepth", tau=1.0)
    s.initialize(_clients(MUS, SIZES), _state(0.0))
    np.testing.assert_array_equal(s.M_star, [[1, 1, 1, 0], [0, 1, 1, 1]])
    s.aggregate_train(0, _updates(VALUES, SIZES))
    k0 = (10 * 1 + 30 * 2 + 20 * 4) / 60  # 2.5
    k1 = (30 * 2 + 20 * 4 + 40 * 8) / 90  # 5.111...
    np.testing.assert_allclose(s.cluster_states[0]["w"], k0)
    np.testing.assert_allclose(s.cluster_states[1]["w"], k1)
    np.testing.assert_allclose(s.model_for("c0")["w"], k0)
    np.testing.assert_allclose(s.model_for("c1")["w"], (k0 + k1) / 2)
    np.testing.assert_allclose(s.model_for("c2")["w"], (k0 + k1) / 2)
    np.testing.assert_allclose(s.model_for("c3")["w"], k1)
    tasks = s.configure_train(1, ["c1", "c3"])
    np.testing.assert_allclose(tasks["c1"].state["w"], (k0 + k1) / 2)
    assert tasks["c3"].hook is None


def test_fedepth_routing_by_hand() -> None:
    s = create_strategy("fedepth", tau=1.0)
    s.initialize(_clients(MUS, SIZES), _state(0.0))
    s.aggregate_train(0, _updates(VALUES, SIZES))
    # a sequence at mu = 1.5: J to clients = 2.25, 0.25, 0.25, 2.25
    # S_0 = 2.75/3 = 0.917 <= 1, S_1 = 2.75/3 <= 1: both clusters, averaged
    r = s.route(_desc(1.5))
    assert r.clusters == [0, 1]
    np.testing.assert_allclose(r.state["w"], (2.5 + 460 / 90) / 2)
    # mu = -3: J = 9, 16, 25, 36; S_0 = 50/3, S_1 = 77/3: none within tau, the nearest
    assert s.route(_desc(-3.0)).clusters == [0]


def test_fedepth_with_one_cluster_equals_fedavg() -> None:
    soft = create_strategy("fedepth", tau=1e9)
    avg = create_strategy("fedavg")
    for s in (soft, avg):
        s.initialize(_clients(MUS, SIZES), _state(0.0))
        s.aggregate_train(0, _updates(VALUES, SIZES))
    assert soft.M_star.shape == (1, 4)
    for c in ("c0", "c1", "c2", "c3"):
        np.testing.assert_allclose(soft.model_for(c)["w"], avg.model_for(c)["w"])
    np.testing.assert_allclose(avg.model_for("c0")["w"], (10 + 60 + 80 + 320) / 100)


def test_fedepth_with_disjoint_clusters_equals_per_cluster_fedavg() -> None:
    mus = [0.0, 0.5, 10.0, 10.5]  # two far-apart pairs
    soft = create_strategy("fedepth", tau=1.0)
    soft.initialize(_clients(mus, SIZES), _state(0.0))
    soft.aggregate_train(0, _updates(VALUES, SIZES))
    np.testing.assert_array_equal(soft.M_star, [[1, 1, 0, 0], [0, 0, 1, 1]])
    for members in ([0, 1], [2, 3]):
        avg = create_strategy("fedavg")
        avg.initialize(
            _clients([mus[i] for i in members], [SIZES[i] for i in members]), _state(0.0)
        )
        avg.aggregate_train(0, _updates([VALUES[i] for i in members], [SIZES[i] for i in members]))
        for local, c in enumerate(members):
            np.testing.assert_allclose(
                soft.model_for(f"c{c}")["w"], avg.model_for(f"c{local}")["w"]
            )


def test_calibrated_tau_and_partial_participation() -> None:
    s = create_strategy("fedepth", overlap=0.5)
    s.initialize(_clients(MUS, SIZES), _state(0.0))
    assert s.tau == 1.0  # the smallest tau giving 2 of 4 clients in two clusters
    # only c0 reports: cluster 0 = its update, cluster 1 keeps the initial model
    s.aggregate_train(0, [ClientUpdate("c0", _state(6.0), 10)])
    np.testing.assert_allclose(s.cluster_states[0]["w"], 6.0)
    np.testing.assert_allclose(s.cluster_states[1]["w"], 0.0)
    np.testing.assert_allclose(s.model_for("c1")["w"], 3.0)


def test_late_client_joins_by_routing_and_state_round_trips() -> None:
    s = create_strategy("fedepth", tau=1.0)
    s.initialize(_clients(MUS, SIZES), _state(0.0))
    s.aggregate_train(0, _updates(VALUES, SIZES))
    s.add_client(ClientInfo("late", 5, _desc(3.2)))  # J = 10.24, 4.84, 1.44, 0.04: S_1 < S_0
    assert s.M_star[:, -1].tolist() == [False, True]
    np.testing.assert_allclose(s.model_for("late")["w"], 460 / 90)
    meta, states = s.state_dict()
    fresh = create_strategy("fedepth", tau=1.0)
    fresh.initialize(s.clients, _state(0.0))
    fresh.load_state_dict(meta, states)
    np.testing.assert_allclose(fresh.model_for("late")["w"], 460 / 90)
    np.testing.assert_allclose(fresh.model_for("c1")["w"], s.model_for("c1")["w"])


def test_errors() -> None:
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        create_strategy("nope")
    assert {"fedavg", "fedepth"} <= set(list_strategies())
    s = create_strategy("fedepth", tau=1.0)
    with pytest.raises(ValueError, match="descriptor"):
        s.initialize([ClientInfo("a", 1)], _state(0.0))
    with pytest.raises(ValueError, match="unique"):
        create_strategy("fedavg").initialize(_clients([0, 0], [1, 1])[:1] * 2, _state(0.0))
    avg = create_strategy("fedavg")
    avg.initialize(_clients([0.0], [1]), _state(0.0))
    with pytest.raises(KeyError, match="unknown client 'x'"):
        avg.model_for("x")


def _basis(deg: float, axis: int) -> np.ndarray:
    """A one-column PACFL basis in R^3: unit vector ``deg`` degrees away from axis ``axis``
    (0: e1, rotating toward e2; 2: e3, rotating toward e2)."""
    c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
    v = np.array([c, s, 0.0]) if axis == 0 else np.array([0.0, s, c])
    return v[:, None]


def test_fedepth_and_hard_match_pacfl_partition() -> None:
    """BMR's rule: tau chosen so the soft clusters reproduce PACFL's partition, and hard
    clustering at that tau. The bases split {c0, c1, c2} from {c3, c4, c5} (angles <= 10
    degrees within, >= 80 between); the descriptors (means 0, 1, 2 and 10, 11, 13) reach that
    grouping from tau = 4 on."""
    mus = [0.0, 1.0, 2.0, 10.0, 11.0, 13.0]
    bases = [_basis(0, 0), _basis(5, 0), _basis(10, 0), _basis(0, 2), _basis(5, 2), _basis(10, 2)]
    clients = [
        ClientInfo(f"c{i}", 10, _desc(m), extra={"pacfl_basis": b})
        for i, (m, b) in enumerate(zip(mus, bases, strict=True))
    ]
    partition = [[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]]
    pacfl = create_strategy("pacfl")
    pacfl.initialize(clients, _state(0.0))
    np.testing.assert_array_equal(pacfl.M_star, partition)
    soft = create_strategy("fedepth", match="pacfl")
    hard = create_strategy("hard", match="pacfl")
    assert soft.client_summaries == hard.client_summaries == ("pacfl_basis",)
    assert create_strategy("fedepth").client_summaries == ()
    for s in (soft, hard):
        s.initialize(clients, _state(0.0))
        assert s.tau == pytest.approx(4.0)  # hard clustering at FeDepth's tau
    np.testing.assert_array_equal(soft.M_star, partition)
    # average linkage at tau 4: {10, 11} (1) and 13 stay apart, their mean distance is 6.5
    np.testing.assert_array_equal(
        hard.M_star, [[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 1]]
    )
    # the 20 % overlap rule on the same fleet bridges the two groups: 2 of 6 clients (c2, c3)
    # in both clusters is the overlap closest to 20 %, reached at tau = (10 - 2)^2 = 64
    calibrated = create_strategy("fedepth")
    calibrated.initialize(clients, _state(0.0))
    assert calibrated.M_star.shape[0] != 2 or calibrated.tau != pytest.approx(4.0)
    assert calibrated.tau == pytest.approx(64.0)
    np.testing.assert_array_equal(calibrated.M_star, [[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]])
    # how each threshold was set, as the report states it
    assert soft.threshold_rule == "chosen so the clusters best reproduce PACFL's partition"
    assert calibrated.threshold_rule == "calibrated for 20% overlap"
    assert create_strategy("hard", tau=2.0).threshold_rule == "given"
    assert pacfl.threshold_rule == "PACFL's largest dendrogram gap"
    with pytest.raises(ValueError, match="pacfl_basis"):
        create_strategy("fedepth", match="pacfl").initialize(_clients(MUS, SIZES), _state(0.0))


def test_tau_rule_errors() -> None:
    with pytest.raises(ValueError, match="unknown match 'kmeans'; known: pacfl"):
        create_strategy("fedepth", match="kmeans")
    with pytest.raises(ValueError, match="tau or match"):
        create_strategy("hard", tau=1.0, match="pacfl")
    with pytest.raises(ValueError, match="overlap"):
        create_strategy("hard", overlap=1.5)
