"""Federated learning strategies: one file per algorithm; shared arithmetic in ``aggregate``.

``create_strategy(name, **cfg)`` builds one by its method name (see ``list_strategies()``).
"""

from __future__ import annotations

from typing import Any

from fedepth.strategies.base import (
    ClientInfo,
    ClientUpdate,
    ClusteredStrategy,
    RouteDecision,
    State,
    StateView,
    Strategy,
    TrainTask,
)
from fedepth.strategies.fedavg import FedAvg
from fedepth.strategies.fedepth import FeDepth

_REGISTRY: dict[str, type[Strategy]] = {cls.name: cls for cls in (FedAvg, FeDepth)}


def list_strategies() -> list[str]:
    """Names of the registered strategies."""
    return sorted(_REGISTRY)


def create_strategy(name: str, **cfg: Any) -> Strategy:
    """A new strategy by method name, configured by keyword arguments."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown method {name!r}; known: {', '.join(list_strategies())}"
        ) from None
    return cls(**cfg)


__all__ = [
    "ClientInfo",
    "ClientUpdate",
    "ClusteredStrategy",
    "FeDepth",
    "FedAvg",
    "RouteDecision",
    "State",
    "StateView",
    "Strategy",
    "TrainTask",
    "create_strategy",
    "list_strategies",
]
