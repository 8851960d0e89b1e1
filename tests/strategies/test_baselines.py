"""Tests of the clustered baselines: hard, PACFL, FedClust, label groups and CL."""

from __future__ import annotations

import numpy as np
import pytest

from fedepth.descriptor import Descriptor
from fedepth.strategies import ClientInfo, ClientUpdate, create_strategy
from fedepth.strategies.cl import Centralized


def _desc(mu: float) -> Descriptor:
    return Descriptor(mean=np.array([mu]), var=np.array([1.0]), num_frames=4)


def _state(v: float, head: float = 0.0) -> dict[str, np.ndarray]:
    return {
        "enc.weight": np.array([v]),
        "bn.running_mean": np.array([0.0]),
        "head.weight": np.array([head, head]),
        "head.bias": np.array([head]),
    }


# J(i, j) = (mu_i - mu_j)^2: two tight pairs far apart.
MUS = [0.0, 0.5, 10.0, 10.5]


def test_hard_clustering_partitions_and_routes_to_nearest() -> None:
    s = create_strategy("hard", tau=1.0)
    s.initialize([ClientInfo(f"c{i}", 1, _desc(m)) for i, m in enumerate(MUS)], _state(0.0))
    np.testing.assert_array_equal(s.M_star, [[1, 1, 0, 0], [0, 0, 1, 1]])
    assert (s.M_star.sum(axis=0) == 1).all()
    s.aggregate_train(0, [ClientUpdate(f"c{i}", _state(v), 1) for i, v in enumerate([1, 3, 5, 7])])
    r = s.route(_desc(9.0))
    assert r.clusters == [1]
    np.testing.assert_allclose(r.state["enc.weight"], 6.0)


def _line(angle_deg: float) -> np.ndarray:
    a = np.radians(angle_deg)
    return np.array([[np.cos(a)], [np.sin(a)], [0.0]])


def test_pacfl_clusters_by_principal_angles() -> None:
    bases = [_line(0), _line(5), _line(85), _line(90)]
    infos = [ClientInfo(f"c{i}", 1, extra={"pacfl_basis": b}) for i, b in enumerate(bases)]
    s = create_strategy("pacfl")
    s.initialize(infos, _state(0.0))
    # angles: 5 within each pair, >= 80 across: the largest gap separates the pairs
    np.testing.assert_array_equal(s.M_star, [[1, 1, 0, 0], [0, 0, 1, 1]])
    assert s.route(None, extra={"pacfl_basis": _line(80)}).clusters == [1]
    with pytest.raises(ValueError, match="pacfl_basis"):
        s.route(_desc(0.0))
    fixed = create_strategy("pacfl", threshold=100.0)
    fixed.initialize(infos, _state(0.0))
    assert fixed.M_star.shape == (1, 4)


def test_group_by_labels_and_label_routing() -> None:
    plats = ["car", "spot", "car", "falcon"]
    infos = [
        ClientInfo(f"c{i}", 1, _desc(m), labels={"platform": p, "environment": "forest"})
        for i, (m, p) in enumerate(zip(MUS, plats, strict=True))
    ]
    s = create_strategy("group-platform")
    s.initialize(infos, _state(0.0))
    assert s.groups == ["car", "falcon", "spot"]
    np.testing.assert_array_equal(s.M_star, [[1, 0, 1, 0], [0, 0, 0, 1], [0, 1, 0, 0]])
    assert s.route(_desc(0.0), labels={"platform": "spot"}).clusters == [2]
    # unknown label: nearest by descriptor (mu = 10.4 is nearest to client 3, group falcon)
    assert s.route(_desc(10.4), labels={"platform": "boat"}).clusters == [1]
    env = create_strategy("group-environment")
    env.initialize(infos, _state(0.0))
    assert env.M_star.shape == (1, 4)
    with pytest.raises(ValueError, match="no 'platform' label"):
        create_strategy("group-platform").initialize([ClientInfo("x", 1)], _state(0.0))


def test_fedclust_warm_up_then_clusters_on_the_output_layer() -> None:
    infos = [ClientInfo(f"c{i}", 1, _desc(m)) for i, m in enumerate(MUS)]
    s = create_strategy("fedclust")
    s.initialize(infos, _state(0.0))
    assert s.M_star.shape == (1, 4) and not s.clustered
    # encoder weights do not matter; the head separates {c0, c2} from {c1, c3}
    heads = [0.0, 5.0, 0.1, 5.1]
    ups = [ClientUpdate(f"c{i}", _state(float(i), h), 1 + i) for i, h in enumerate(heads)]
    s.aggregate_train(0, ups[:3])  # c3 missing: not clustered yet, plain FedAvg
    assert not s.clustered
    np.testing.assert_allclose(s.model_for("c0")["enc.weight"], (0 * 1 + 1 * 2 + 2 * 3) / 6)
    s.aggregate_train(1, ups)
    assert s.clustered
    np.testing.assert_array_equal(s.M_star, [[1, 0, 1, 0], [0, 1, 0, 1]])
    np.testing.assert_allclose(s.model_for("c2")["enc.weight"], (0 * 1 + 2 * 3) / 4)
    np.testing.assert_allclose(s.model_for("c3")["enc.weight"], (1 * 2 + 3 * 4) / 6)
    np.testing.assert_allclose(s.partial_weights(_state(1.0, 2.0)), [2.0, 2.0, 2.0])
    k2 = create_strategy("fedclust", num_clusters=1)
    k2.initialize(infos, _state(0.0))
    k2.aggregate_train(0, ups)
    assert k2.M_star.shape == (1, 4)


def test_fedclust_state_round_trip() -> None:
    infos = [ClientInfo(f"c{i}", 1, _desc(m)) for i, m in enumerate(MUS)]
    s = create_strategy("fedclust")
    s.initialize(infos, _state(0.0))
    s.aggregate_train(0, [ClientUpdate("c0", _state(1.0, 3.0), 1)])
    meta, states = s.state_dict()
    fresh = create_strategy("fedclust")
    fresh.initialize(infos, _state(0.0))
    fresh.load_state_dict(meta, states)
    assert not fresh.clustered
    np.testing.assert_allclose(fresh._partial[0], s._partial[0])


def test_centralized_is_marked_pooled() -> None:
    s = create_strategy("cl")
    assert isinstance(s, Centralized) and s.pooled
