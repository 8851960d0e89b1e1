"""Scene-drift detection for depth_node re-routing: a sliding descriptor window with hysteresis.

The depth node routes once from its first frames. With re-routing on, it keeps the GeM vectors
of the last ``window`` frames; every ``check_period`` frames :class:`DriftMonitor` compares the
window's Gaussian descriptor with the one that was routed (Jeffreys divergence, the measure the
coordinator clusters with, against the coordinator's tau). Divergence above ``enter * tau``
counts as drifting, below ``exit * tau`` resets the count (between the two the count is kept:
hysteresis); ``patience`` drifting checks in a row, outside the ``cooldown_s`` after the last
route, ask for a new route with the window's descriptor.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from fedepth.clustering import jeffreys_cross
from fedepth.descriptor import Descriptor, gem_descriptor


def divergence(a: Descriptor, b: Descriptor) -> float:
    """Jeffreys divergence between two descriptors."""
    return float(jeffreys_cross(a.mean[None], a.var[None], b.mean[None], b.var[None])[0, 0])


class DriftMonitor:
    """Decides when the scene has drifted far enough from the routed descriptor to re-route."""

    def __init__(
        self,
        reference: Descriptor,
        tau: float,
        *,
        window: int = 32,
        check_period: int = 8,
        enter: float = 1.0,
        exit: float = 0.7,
        patience: int = 3,
        cooldown_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not tau > 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        if not 0 <= exit <= enter:
            raise ValueError(f"need 0 <= exit <= enter, got exit {exit}, enter {enter}")
        if window < 2 or check_period < 1 or patience < 1 or cooldown_s < 0:
            raise ValueError("window >= 2, check_period >= 1, patience >= 1, cooldown_s >= 0")
        self.reference = reference
        self.tau = float(tau)
        self.enter = enter
        self.exit = exit
        self.patience = patience
        self.check_period = check_period
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.vectors: deque[np.ndarray] = deque(maxlen=window)
        self.streak = 0
        self.last_divergence: float | None = None
        self._since_check = 0
        self._routed_at = clock()

    def add(self, vector: np.ndarray) -> Descriptor | None:
        """Add one frame's GeM vector; returns the window's descriptor when a re-route is due."""
        self.vectors.append(np.asarray(vector, dtype=np.float64))
        self._since_check += 1
        if len(self.vectors) < (self.vectors.maxlen or 0) or self._since_check < self.check_period:
            return None
        self._since_check = 0
        current = gem_descriptor(np.stack(self.vectors))
        d = divergence(self.reference, current)
        self.last_divergence = d
        if d > self.enter * self.tau:
            self.streak += 1
        elif d < self.exit * self.tau:
            self.streak = 0
        cooled = self.clock() - self._routed_at >= self.cooldown_s
        return current if self.streak >= self.patience and cooled else None

    def rerouted(self, reference: Descriptor) -> None:
        """A new route was taken for ``reference``: start over from it."""
        self.reference = reference
        self.streak = 0
        self._routed_at = self.clock()
