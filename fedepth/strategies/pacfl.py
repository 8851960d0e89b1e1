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


def pacfl_partition(
    bases: list[np.ndarray], threshold: float | None = None
) -> tuple[np.ndarray, float]:
    """PACFL's hard clusters (K x N) of clients with these subspace bases, and the cut in
    degrees: ``threshold``, or the largest gap of the dendrogram's merge heights when None."""
    angles = clustering.principal_angle_matrix(bases)
    if threshold is None:
        threshold = clustering.largest_gap_threshold(angles)
    return clustering.hard_clusters(angles, threshold), threshold


def client_bases(infos: list[ClientInfo]) -> list[np.ndarray]:
    """Every client's PACFL subspace basis (``extra[BASIS_KEY]``); names the clients without."""
    missing = [c.cid for c in infos if BASIS_KEY not in c.extra]
    if missing:
        raise ValueError(f"pacfl needs extra[{BASIS_KEY!r}] from every client; missing: {missing}")
    return [np.asarray(c.extra[BASIS_KEY]) for c in infos]


class PACFL(ClusteredStrategy):
    """One-shot hard clustering on principal angles between client feature subspaces."""

    name = "pacfl"
    client_summaries = (BASIS_KEY,)

    def __init__(self, *, threshold: float | None = None) -> None:
        super().__init__()
        self.threshold = threshold
        self.threshold_rule = (
            "given" if threshold is not None else "PACFL's largest dendrogram gap"
        )

    def form_clusters(self) -> np.ndarray:
        M, self.threshold = pacfl_partition(client_bases(self.clients), self.threshold)
        return M

    def _nearest(self, basis: np.ndarray) -> list[int]:
        bases = client_bases(self.clients)
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
