"""fedepth.rounds: the one round driver (select, plan, collect, validate, close, aggregate), on
FedAvg over tiny arrays with hand-computed answers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pytest

from fedepth.recipe import TrainRecipe
from fedepth.rounds import (
    ALL_ANSWERED,
    ALL_REPORTED,
    QUORUM_AT_DEADLINE,
    RoundDriver,
    RoundRules,
)
from fedepth.strategies import ClientInfo, ClientUpdate, TrainTask, create_strategy
from fedepth.updates import UpdateBounds


def _driver(cids: list[str], rules: RoundRules | None = None, **kwargs: object) -> RoundDriver:
    strategy = create_strategy("fedavg")
    strategy.initialize(
        [ClientInfo(c, 1) for c in cids], {"w": np.zeros(2, np.float32), "n": np.array(0)}
    )
    return RoundDriver(strategy, rules or RoundRules(3), **kwargs)  # type: ignore[arg-type]


class _Shift:
    """Participants that train by adding their shift to the task's model (answering in
    ``order``, default the tasks'), with ``samples`` each."""

    def __init__(
        self,
        shifts: Mapping[str, float],
        samples: Mapping[str, int] | None = None,
        order: list[str] | None = None,
    ) -> None:
        self.shifts, self.samples, self.order = shifts, samples or {}, order
        self.asked: list[dict[str, TrainTask]] = []

    def collect(self, rnd: int, tasks: Mapping[str, TrainTask]) -> Iterable[ClientUpdate]:
        self.asked.append(dict(tasks))
        for cid in self.order or list(tasks):
            w = tasks[cid].state["w"] + np.float32(self.shifts[cid])
            state = {"w": w, "n": tasks[cid].state["n"]}
            yield ClientUpdate(cid, state, self.samples.get(cid, 1), metrics={"loss": 1.0})


def test_a_round_plans_collects_and_aggregates_in_the_selections_order() -> None:
    recipe = TrainRecipe(local_steps=3)
    driver = _driver(["b", "a", "c"], recipe=lambda rnd: recipe)
    clients = _Shift(
        {"a": 1.0, "b": 2.0, "c": 6.0}, {"a": 1, "b": 1, "c": 2}, order=["c", "a", "b"]
    )
    out = driver.run_round(0, ["b", "a", "c"], clients)
    assert out.selected == ("b", "a", "c")  # the fleet's order (the simulation's)
    assert [u.cid for u in out.accepted] == ["b", "a", "c"]  # not the answers' order
    assert out.closed_by == ALL_REPORTED and out.rejected == {}
    assert all(t.recipe is recipe for t in clients.asked[0].values())
    # weighted by samples: (2 * 1 + 1 * 1 + 6 * 2) / 4
    np.testing.assert_array_equal(driver.strategy.model_for("a")["w"], [3.75, 3.75])


def test_selection_is_a_seeded_fraction_in_the_fleets_or_the_ids_order() -> None:
    members = [f"r{i}" for i in (5, 3, 1, 4, 0, 2)]
    in_order = _driver(members, RoundRules(4, fraction=0.5, seed=3))
    by_id = _driver(members, RoundRules(4, fraction=0.5, seed=3, sorted_ids=True))
    for rnd in range(4):
        a, b = in_order.select(rnd, members), by_id.select(rnd, members)
        assert len(a) == 3 and set(a) == set(b)  # the same draw ...
        assert list(b) == sorted(b)  # ... sorted by id, or in the members' order
        assert [members.index(m) for m in a] == sorted(members.index(m) for m in a)
        assert a == in_order.select(rnd, members)  # seeded by (seed, round)
    assert len({in_order.select(r, members) for r in range(4)}) > 1
    assert by_id.select(0, members[:1]) == ("r5",)  # at least one
    assert by_id.select(0, members) != tuple(members)
    assert _driver(members).select(0, members) == tuple(members)  # all: fraction 1


def test_a_round_closes_when_all_reported_or_on_a_quorum_at_the_deadline() -> None:
    driver = _driver(["a"], RoundRules(1, quorum=0.5))
    assert driver.quorum(5) == 3 and driver.quorum(1) == 1
    assert driver.close_reason(5, 5, now=0.0, deadline=10.0) == ALL_REPORTED
    assert driver.close_reason(3, 5, now=9.9, deadline=10.0) is None  # quorum, before deadline
    assert driver.close_reason(3, 5, now=10.0, deadline=10.0) == QUORUM_AT_DEADLINE
    assert driver.close_reason(2, 5, now=99.0, deadline=10.0) is None  # no quorum: stays open
    with pytest.raises(ValueError, match="quorum must lie in"):
        RoundRules(1, quorum=0.0)


def test_an_in_process_round_stops_collecting_once_it_closes() -> None:
    """Past its deadline with a quorum, a round takes no more updates (the late ones are not
    aggregated), as a coordinator that closed the round refuses them."""
    times = iter([0.0, 5.0, 20.0, 30.0])
    clock: Callable[[], float] = lambda: next(times)  # noqa: E731
    driver = _driver(["a", "b", "c"], RoundRules(1, quorum=0.5, deadline_s=10.0), clock=clock)
    out = driver.run_round(0, ["a", "b", "c"], _Shift({"a": 1.0, "b": 3.0, "c": 100.0}))
    assert out.closed_by == QUORUM_AT_DEADLINE and [u.cid for u in out.accepted] == ["a", "b"]
    np.testing.assert_array_equal(driver.strategy.model_for("c")["w"], [2.0, 2.0])


def test_a_rejected_update_is_left_out_and_said_why() -> None:
    """The coordinator's rules, in-process: NaN, and the norm bounds (off by default)."""
    members = ["a", "b", "c"]
    clients = _Shift({"a": 1.0, "b": 9.0, "c": float("nan")})
    unbounded = _driver(members)
    out = unbounded.run_round(0, members, clients)
    assert out.closed_by == ALL_ANSWERED and [u.cid for u in out.accepted] == ["a", "b"]
    assert "state/w has a NaN or Inf value (element 0)" in out.rejected["c"]
    np.testing.assert_array_equal(unbounded.strategy.model_for("a")["w"], [5.0, 5.0])
    # b moved sqrt(2) * 9 from its task's model, a sqrt(2)
    bounded = _driver(members, bounds=UpdateBounds(2.0))
    out = bounded.run_round(0, members, clients)
    assert [u.cid for u in out.accepted] == ["a"] and set(out.rejected) == {"b", "c"}
    assert out.rejected["b"].startswith("update norm 12.73 exceeds the bound 2 (")
    np.testing.assert_array_equal(bounded.strategy.model_for("b")["w"], [1.0, 1.0])


def test_an_update_nobody_asked_for_or_a_second_one_is_refused() -> None:
    driver = _driver(["a", "b"])
    with pytest.raises(ValueError, match="an update from 'a', which was not asked for one or"):
        driver.run_round(0, ["a", "b"], _Shift({"a": 1.0, "b": 1.0}, order=["a", "a"]))
