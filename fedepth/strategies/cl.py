"""Centralized learning (CL), the upper bound: one model trained on the pooled data of all clients.

Not a federated algorithm: the simulation sees ``pooled = True`` and trains a single model on
the union of the clients' data, taking per round as many steps as all clients together (the
same compute and samples as the federation), then serves that model everywhere. As a
strategy it is FedAvg over that one pooled participant.
"""

from __future__ import annotations

from typing import ClassVar

from fedepth.strategies.fedavg import FedAvg


class Centralized(FedAvg):
    """Training on pooled data; the simulation drives it as a single participant."""

    name = "cl"
    pooled: ClassVar[bool] = True
