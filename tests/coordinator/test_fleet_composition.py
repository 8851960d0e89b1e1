"""The coordinator's fleet status gives each cluster's composition from the labels robots
declared at Register, over the wire and in `fedepth fleet status`'s table.

The hand-made map and labels are those of tests/test_composition.py: five robots labelled
spot/forest, spot/forest, spot/urban, car/forest, car/urban; clusters {0, 1, 3}, {1, 2}, {4};
co-member shares: same platform 13/24, same environment 2/3, both 5/24, one robot alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from fedepth_coordinator.checkpoints import Checkpoints
from fedepth_coordinator.coordstate import CoordinatorState
from fedepth_coordinator.domain import CoMemberShares
from fedepth_coordinator.report import format_fleet
from fedepth_coordinator.rounds import RoundController
from fedepth_coordinator.router import Router
from fedepth_coordinator.serde import fleet_from_pb, fleet_to_pb
from fedepth_coordinator.state.base import RobotRecord
from fedepth_coordinator.transfers import TransferSlots

LABELS = [
    {"platform": "spot", "environment": "forest"},
    {"platform": "spot", "environment": "forest"},
    {"platform": "spot", "environment": "urban"},
    {"platform": "car", "environment": "forest"},
    {"platform": "car", "environment": "urban"},
]
CLUSTERS = [[0, 1, 3], [1, 2], [4]]
M = np.array([[c in row for c in range(5)] for row in CLUSTERS])
SHARES = {"platform": 13 / 24, "environment": 2 / 3, "both": 5 / 24}

Formed = Callable[..., tuple[CoordinatorState, Checkpoints, RoundController]]


def test_the_fleet_status_gives_the_composition_from_the_declared_labels(
    formed_state: Formed,
) -> None:
    state, _, _ = formed_state(5, strategy="fedepth")
    strategy: Any = state.strategy
    ids = [c.cid for c in strategy.clients]
    for rid, lab in zip(ids, LABELS, strict=True):  # the labels as robots declared them
        rec = state.robots[rid]
        state.robots[rid] = RobotRecord(rid, rec.num_samples, lab, rec.descriptor)
    strategy.M_star = M.copy()  # a hand-made map over the same members
    router = Router(state, _NoChecks(), TransferSlots(state))
    status = router.fleet_status()
    assert [c.members for c in status.clusters] == [
        (ids[0], ids[1], ids[3]),
        (ids[1], ids[2]),
        (ids[4],),
    ]
    assert [c.label for c in status.clusters] == [
        "spot/forest x2, car/forest x1",
        "spot/forest x1, spot/urban x1",
        "car/urban x1",
    ]
    assert dict(status.clusters[0].counts) == {"spot/forest": 2, "car/forest": 1}
    assert status.co_members is not None
    assert (status.co_members.platform, status.co_members.environment) == pytest.approx(
        (SHARES["platform"], SHARES["environment"])
    )
    assert status.co_members.both == pytest.approx(SHARES["both"])
    assert status.co_members.alone == 1
    # the wire keeps it
    assert fleet_from_pb(fleet_to_pb(status)) == status
    # and the CLI's table prints it beside the cluster map
    text = format_fleet(status, router.cluster_map())
    assert f"  cluster 0: spot/forest x2, car/forest x1: {ids[0]}, {ids[1]}, {ids[3]}" in text
    assert f"  cluster 2: car/urban x1: {ids[4]}" in text
    assert (
        "co-members with the robot's label (mean over robots): platform 0.54, environment 0.67, "
        "both 0.21; 1 robot alone"
    ) in text


def test_a_fleet_status_without_composition_prints_as_before(formed_state: Formed) -> None:
    state, _, _ = formed_state(4, strategy="fedepth")
    router = Router(state, _NoChecks(), TransferSlots(state))
    status = router.fleet_status()
    msg = fleet_to_pb(status)
    msg.ClearField("clusters")
    msg.ClearField("co_members")
    old = fleet_from_pb(msg)  # as an older coordinator answers
    assert old.clusters == () and old.co_members is None
    text = format_fleet(old, router.cluster_map())
    members = router.cluster_map().clusters[0]
    assert f"  cluster 0: {', '.join(members)}" in text and "co-members" not in text
    unknown = replace(status, co_members=CoMemberShares(alone=4))
    assert "platform -, environment -, both -; 4 robots alone" in format_fleet(
        unknown, router.cluster_map()
    )


class _NoChecks:
    def check_descriptor(self, robot_id: str, d: Any) -> None:
        pass

    def check_summary_values(self, summaries: Any) -> None:
        pass
