"""Clusters from ground-truth labels (paper Table 3c): one cluster per platform or environment.

``group-platform`` and ``group-environment`` group clients by ``ClientInfo.labels`` and train
one model per group with FedAvg inside it. An unseen sequence whose label is given goes to its
group; without a label (or with one no client had) it goes to the nearest group by descriptor.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedepth.descriptor import Descriptor
from fedepth.strategies.base import ClientInfo, ClusteredStrategy, RouteDecision


class GroupByLabel(ClusteredStrategy):
    """One cluster per distinct value of a client label."""

    name = "group"
    label: str = ""

    def __init__(self, *, label: str | None = None) -> None:
        super().__init__()
        self.label = label or self.label
        if not self.label:
            raise ValueError("group clustering needs the name of the label to group by")

    def _value(self, info: ClientInfo) -> str:
        if self.label not in info.labels:
            raise ValueError(f"client {info.cid!r} has no {self.label!r} label")
        return info.labels[self.label]

    def form_clusters(self) -> np.ndarray:
        values = [self._value(c) for c in self.clients]
        self.groups = sorted(set(values))
        return np.array([[v == g for v in values] for g in self.groups], dtype=bool)

    def _clusters_for(
        self, descriptor: Descriptor | None, labels: Mapping[str, str] | None
    ) -> list[int]:
        if labels and labels.get(self.label) in self.groups:
            return [self.groups.index(labels[self.label])]
        return self.nearest_by_descriptor(descriptor)

    def route(
        self,
        descriptor: Descriptor | None,
        *,
        labels: Mapping[str, str] | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> RouteDecision:
        ks = self._clusters_for(descriptor, labels)
        return RouteDecision(clusters=ks, weights=[1.0], state=self.average_of(ks))

    def add_client(self, info: ClientInfo) -> None:
        self._append_client(info, memberships=self._clusters_for(info.descriptor, info.labels))


class GroupByPlatform(GroupByLabel):
    name = "group-platform"
    label = "platform"


class GroupByEnvironment(GroupByLabel):
    name = "group-environment"
    label = "environment"
