"""Server halves of FedProx, SCAFFOLD and FedDyn against hand-computed updates."""

from __future__ import annotations

import numpy as np
import pytest

from fedepth.strategies import (
    ClientInfo,
    ClientUpdate,
    FedDynHook,
    FedProxHook,
    ScaffoldHook,
    TrainTask,
    create_strategy,
    make_client_hook,
)
from fedepth.strategies.feddyn import GRAD_STATE
from fedepth.strategies.scaffold import CLIENT_CONTROL, CONTROL_DELTA, SERVER_CONTROL


def _clients(n: int) -> list[ClientInfo]:
    return [ClientInfo(f"c{i}", 1 + i) for i in range(n)]


def _state(w: float, stat: float = 0.0) -> dict[str, np.ndarray]:
    return {"w": np.array([w], dtype=np.float32), "bn.running_mean": np.array([stat])}


def test_fedprox_aggregates_like_fedavg_and_sends_mu() -> None:
    s = create_strategy("fedprox", mu=0.1)
    s.initialize(_clients(2), _state(0.0))
    task = s.configure_train(0, ["c0"])["c0"]
    assert task.hook == "fedprox" and task.hook_params == {"mu": 0.1}
    hook = make_client_hook(task, {})
    assert isinstance(hook, FedProxHook) and hook.mu == 0.1
    s.aggregate_train(0, [ClientUpdate("c0", _state(1.0), 1), ClientUpdate("c1", _state(4.0), 2)])
    np.testing.assert_allclose(s.model_for("c0")["w"], (1 + 8) / 3)


def test_scaffold_server_rule_by_hand() -> None:
    s = create_strategy("scaffold", eta_g=0.5)
    s.initialize(_clients(4), _state(0.0))
    first = s.configure_train(0, ["c0"])["c0"]
    assert first.hook == "scaffold" and first.hook_state == {}  # c starts at zero
    ups = [
        ClientUpdate("c0", _state(2.0, 1.0), 1, extra={CONTROL_DELTA: {"w": np.array([1.0])}}),
        ClientUpdate("c1", _state(4.0, 3.0), 3, extra={CONTROL_DELTA: {"w": np.array([3.0])}}),
    ]
    s.aggregate_train(0, ups)
    # x = 0 + 0.5 * mean(2 - 0, 4 - 0) = 1.5 (unweighted mean, as in SCAFFOLD)
    np.testing.assert_allclose(s.model_for("c2")["w"], 1.5)
    np.testing.assert_allclose(s.model_for("c2")["bn.running_mean"], 1.0)  # 0 + 0.5 * 2
    # c = 0 + |S|/N * mean(delta c) = 2/4 * 2 = 1
    task = s.configure_train(1, ["c0"])["c0"]
    np.testing.assert_allclose(task.hook_state[SERVER_CONTROL]["w"], 1.0)
    memory = {CLIENT_CONTROL: {"w": np.array([0.25])}}
    hook = make_client_hook(task, memory)
    assert isinstance(hook, ScaffoldHook)
    meta, states = s.state_dict()
    fresh = create_strategy("scaffold", eta_g=0.5)
    fresh.initialize(_clients(4), _state(0.0))
    fresh.load_state_dict(meta, states)
    np.testing.assert_allclose(fresh.control["w"], 1.0)


def test_feddyn_server_rule_by_hand() -> None:
    alpha = 0.5
    s = create_strategy("feddyn", alpha=alpha)
    s.initialize(_clients(2), _state(0.0))
    assert s.configure_train(0, ["c0"])["c0"].hook_params == {"alpha": alpha}
    s.aggregate_train(
        0, [ClientUpdate("c0", _state(2.0, 1.0), 1), ClientUpdate("c1", _state(4.0, 3.0), 1)]
    )
    # h = 0 - alpha / m * ((2 - 0) + (4 - 0)) = -1.5; theta = mean 3 - h / alpha = 6
    np.testing.assert_allclose(s.h["w"], -1.5)
    np.testing.assert_allclose(s.model_for("c0")["w"], 6.0)
    np.testing.assert_allclose(s.model_for("c0")["bn.running_mean"], 2.0)  # plain mean
    assert "bn.running_mean" not in s.h
    # round 2, only c0 reports 6 (no drift from theta = 6): h unchanged, theta = 6 + 3
    s.aggregate_train(1, [ClientUpdate("c0", _state(6.0, 2.0), 1)])
    np.testing.assert_allclose(s.model_for("c1")["w"], 9.0)
    hook = make_client_hook(s.configure_train(2, ["c0"])["c0"], {GRAD_STATE: {"w": np.zeros(1)}})
    assert isinstance(hook, FedDynHook) and hook.alpha == alpha


def test_make_client_hook_none_and_unknown() -> None:
    assert make_client_hook(TrainTask(state={}), {}) is None
    with pytest.raises(ValueError, match="unknown client hook 'x'"):
        make_client_hook(TrainTask(state={}, hook="x"), {})
    with pytest.raises(ValueError, match="alpha must be > 0"):
        create_strategy("feddyn", alpha=0.0)


def test_server_momentum_by_hand_and_through_a_checkpoint() -> None:
    s = create_strategy("fedavg", server_lr=2.0, server_momentum=0.5)
    s.initialize(_clients(2), _state(0.0))
    # round 0: aggregate (1 * 1 + 2 * 4) / 3 = 3, d = 3 - 0; v = 3; w = 0 + 2 * 3 = 6
    s.aggregate_train(
        0, [ClientUpdate("c0", _state(1.0, 1.0), 1), ClientUpdate("c1", _state(4.0, 4.0), 2)]
    )
    np.testing.assert_allclose(s.model_for("c0")["w"], 6.0)
    # BatchNorm statistics take the aggregate, never an extrapolation
    np.testing.assert_allclose(s.model_for("c0")["bn.running_mean"], 3.0)
    meta, states = s.state_dict()
    resumed = create_strategy("fedavg", server_lr=2.0, server_momentum=0.5)
    resumed.initialize(_clients(2), _state(0.0))
    resumed.load_state_dict(meta, states)
    # round 1: aggregate 7, d = 7 - 6 = 1; v = 0.5 * 3 + 1 = 2.5; w = 6 + 2 * 2.5 = 11
    for strategy in (s, resumed):
        strategy.aggregate_train(1, [ClientUpdate("c0", _state(7.0), 1)])
        np.testing.assert_allclose(strategy.model_for("c1")["w"], 11.0)


def test_server_optimizer_defaults_are_the_aggregate_and_bad_values_are_refused() -> None:
    plain = create_strategy("fedavg")
    plain.initialize(_clients(2), _state(0.0))
    plain.aggregate_train(0, [ClientUpdate("c0", _state(1.0), 1)])
    assert not plain.server_optimizer and plain.state_dict()[1].keys() == {"cluster/0"}
    np.testing.assert_allclose(plain.model_for("c0")["w"], 1.0)
    with pytest.raises(ValueError, match="momentum must lie in"):
        create_strategy("fedepth", server_momentum=1.0)
    with pytest.raises(ValueError, match="lr must be a number > 0"):
        create_strategy("fedavg", server_lr=0)
    with pytest.raises(ValueError, match="its own rule"):
        create_strategy("scaffold", server_momentum=0.9)
