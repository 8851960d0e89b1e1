"""The router alone, with fake descriptor checks: Route, the cluster map, the fleet status."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pytest

from fedepth.descriptor import Descriptor
from fedepth.strategies import RouteDecision
from fedepth_coordinator.checkpoints import Checkpoints
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.coordstate import CoordinatorState
from fedepth_coordinator.domain import Phase
from fedepth_coordinator.errors import FailedPreconditionError, InvalidArgumentError
from fedepth_coordinator.rounds import RoundController
from fedepth_coordinator.router import Router
from fedepth_coordinator.state import MemoryStore
from fedepth_coordinator.state.base import RoundRecord
from fedepth_coordinator.transfers import TransferSlots

Formed = Callable[..., tuple[CoordinatorState, Checkpoints, RoundController]]


class FakeChecks:
    def __init__(self) -> None:
        self.descriptors: list[str] = []
        self.summaries: list[Mapping[str, np.ndarray]] = []

    def check_descriptor(self, robot_id: str, d: Descriptor) -> None:
        self.descriptors.append(robot_id)

    def check_summary_values(self, summaries: Mapping[str, np.ndarray]) -> None:
        self.summaries.append(summaries)


class DescriptorOnly:
    """A strategy whose route takes no labels nor summaries."""

    name = "plain"

    def route(self, descriptor: Descriptor | None) -> RouteDecision:
        if descriptor is None:
            raise ValueError("needs a descriptor")
        return RouteDecision([1], [1.0], {"w": np.ones(3, dtype=np.float32)})


def router_for(state: CoordinatorState) -> tuple[Router, FakeChecks, TransferSlots]:
    checks, transfers = FakeChecks(), TransferSlots(state)
    return Router(state, checks, transfers), checks, transfers


def test_route_checks_the_request_and_streams_the_model_on_request(
    config_factory: Callable[..., CoordinatorConfig],
) -> None:
    state = CoordinatorState(config_factory(state={"backend": "memory"}), MemoryStore())
    router, checks, transfers = router_for(state)
    d = Descriptor(np.zeros(2), np.ones(2), 4)
    with pytest.raises(FailedPreconditionError, match="has not formed yet"):
        router.route("ops", d, include_model=False)
    state.strategy = DescriptorOnly()  # type: ignore[assignment]
    routed = router.route("ops", d, include_model=True)
    assert routed.header.clusters == (1,) and routed.header.weights == (1.0,)
    assert routed.header.layout is not None and transfers.streams == {"ops": 1}
    routed.payload.close()
    assert transfers.streams == {}
    bare = router.route("ops", d, include_model=False, summaries={})
    assert bare.header.layout is None and transfers.streams == {}
    assert checks.descriptors == ["", ""] and len(checks.summaries) == 3
    with pytest.raises(FailedPreconditionError, match="routes by descriptor only; drop labels"):
        router.route("ops", d, include_model=False, labels={"platform": "spot"})
    with pytest.raises(InvalidArgumentError, match="cannot route: needs a descriptor"):
        router.route("ops", None, include_model=False)


def test_views_of_a_clustered_fleet(formed_state: Formed) -> None:
    state, _, _ = formed_state(4, strategy="fedepth")
    router, _, _ = router_for(state)
    cmap = router.cluster_map()
    assert cmap.clustered and cmap.strategy == "fedepth" and cmap.tau is not None
    assert sorted({rid for c in cmap.clusters for rid in c}) == state.members
    finals = router.final_states()
    assert sorted(finals) == state.members
    state.touch(state.members[0])
    state.history.append(
        RoundRecord(0, tuple(state.members), 0.0, 1.0, 5.0, tuple(state.members[:1]))
    )
    status = router.fleet_status()
    assert status.phase is Phase.TRAINING and status.round == 0 and status.quorum == 2
    first, second = status.robots[:2]
    assert first.member and first.selected and first.updates_accepted == 1
    assert first.last_seen_s >= 0 and second.last_seen_s == -1.0
    assert first.clusters == state.clusters_of(first.robot_id)
    assert [h.duration_s for h in status.history] == [5.0]


def test_views_of_a_fleet_without_clusters(
    config_factory: Callable[..., CoordinatorConfig],
) -> None:
    state = CoordinatorState(config_factory(state={"backend": "memory"}), MemoryStore())
    router, _, _ = router_for(state)
    assert not router.cluster_map().clustered
    status = router.fleet_status()
    assert status.phase is Phase.WAITING_FOR_FLEET and status.robots == () and status.quorum == 0
    state.strategy = DescriptorOnly()  # type: ignore[assignment]
    cmap = router.cluster_map()
    assert not cmap.clustered and cmap.strategy == "fedepth"  # the configured name
