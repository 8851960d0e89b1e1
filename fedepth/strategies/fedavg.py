"""FedAvg (McMahan et al., 2017): one global model, the data-size weighted mean of the updates."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedepth.descriptor import Descriptor
from fedepth.strategies.base import ClientInfo, ClusteredStrategy, RouteDecision


class FedAvg(ClusteredStrategy):
    """A single cluster holding every client; unseen sequences get the global model."""

    name = "fedavg"

    def form_clusters(self) -> np.ndarray:
        return np.ones((1, len(self.clients)), dtype=bool)

    def route(
        self,
        descriptor: Descriptor | None,
        *,
        labels: Mapping[str, str] | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> RouteDecision:
        return RouteDecision(clusters=[0], weights=[1.0], state=self.cluster_states[0])

    def add_client(self, info: ClientInfo) -> None:
        self._append_client(info, memberships=[0])
