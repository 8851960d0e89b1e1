"""PACFL (Vahidian et al., AAAI 2023) over descriptor features: the paper's PACFL-dagger.

Each client summarises its data by the top-p left singular vectors of its feature matrix; the
paper replaces PACFL's raw images with the descriptor extractor's per-frame GeM vectors (D x n),
so the basis is D x p (``ClientInfo.extra["pacfl_basis"]``, see
:func:`fedepth.clustering.subspace_basis`). The server's proximity is the smallest principal
angle between two clients' subspaces (degrees), clustered by average-linkage agglomeration cut
at ``threshold`` degrees. PACFL fixes the threshold per dataset; with ``threshold=None`` the cut
is placed in the largest gap of the dendrogram's merge heights, a data-driven stand-in that needs
no tuning on the test set. Unseen sequences send their own basis and go to the cluster with the
smallest mean angle.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedepth import clustering
from fedepth.descriptor import Descriptor
from fedepth.strategies.base import ClientInfo, ClusteredStrategy, RouteDecision

BASIS_KEY = "pacfl_basis"
#: Columns p of that basis unless configured otherwise (``SimConfig.pacfl_basis``; robots
#: always send this many).
BASIS_SIZE = 3


class PACFL(ClusteredStrategy):
    """One-shot hard clustering on principal angles between client feature subspaces."""

    name = "pacfl"
    client_summaries = (BASIS_KEY,)

    def __init__(self, *, threshold: float | None = None) -> None:
        super().__init__()
        self.threshold = threshold

    def _bases(self, infos: list[ClientInfo]) -> list[np.ndarray]:
        missing = [c.cid for c in infos if BASIS_KEY not in c.extra]
        if missing:
            raise ValueError(
                f"pacfl needs extra[{BASIS_KEY!r}] from every client; missing: {missing}"
            )
        return [np.asarray(c.extra[BASIS_KEY]) for c in infos]

    def form_clusters(self) -> np.ndarray:
        angles = clustering.principal_angle_matrix(self._bases(self.clients))
        if self.threshold is None:
            self.threshold = clustering.largest_gap_threshold(angles)
        return clustering.hard_clusters(angles, self.threshold)

    def _nearest(self, basis: np.ndarray) -> list[int]:
        bases = self._bases(self.clients)
        angles = clustering.principal_angle_matrix([basis, *bases])[0, 1:]
        return [int(np.argmin(clustering.cluster_scores(angles, self.M_star)))]

    def route(
        self,
        descriptor: Descriptor | None,
        *,
        labels: Mapping[str, str] | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> RouteDecision:
        if not extra or BASIS_KEY not in extra:
            raise ValueError(f"pacfl routes by feature subspace: pass extra[{BASIS_KEY!r}]")
        ks = self._nearest(np.asarray(extra[BASIS_KEY]))
        return RouteDecision(clusters=ks, weights=[1.0], state=self.average_of(ks))

    def add_client(self, info: ClientInfo) -> None:
        if BASIS_KEY not in info.extra:
            raise ValueError(f"client {info.cid!r} needs extra[{BASIS_KEY!r}] to join")
        self._append_client(info, memberships=self._nearest(np.asarray(info.extra[BASIS_KEY])))
