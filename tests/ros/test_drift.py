"""DriftMonitor: window descriptor, divergence against tau, hysteresis, patience and cooldown."""

from __future__ import annotations

import numpy as np
import pytest

from fedepth.descriptor import Descriptor, gem_descriptor
from fedepth_ros.drift import DriftMonitor, divergence

DIM = 4


def reference() -> Descriptor:
    return Descriptor(mean=np.zeros(DIM), var=np.ones(DIM), num_frames=16)


def frames(shift: float, n: int, seed: int = 0) -> list[np.ndarray]:
    """n vectors ~ N(shift, 1) whose sample moments are exactly (shift, 1)."""
    x = np.random.default_rng(seed).standard_normal((n, DIM))
    x = (x - x.mean(0)) / x.std(0)
    return list(x + shift)


def test_window_descriptor_and_divergence() -> None:
    d = gem_descriptor(np.stack(frames(2.0, 8)))
    np.testing.assert_allclose(d.mean, 2.0)
    np.testing.assert_allclose(d.var, 1.0)
    # J = 0.5 * sum (m_a - m_b)^2 (1/s_a + 1/s_b) with unit variances: sum of squared shifts
    assert divergence(reference(), d) == pytest.approx(DIM * 4.0)
    assert divergence(reference(), reference()) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="expected"):
        gem_descriptor(np.zeros((0, DIM)))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def run(monitor: DriftMonitor, vectors: list[np.ndarray]) -> list[int]:
    """Indices of the vectors after which the monitor asked for a re-route."""
    return [i for i, v in enumerate(vectors) if monitor.add(v) is not None]


def test_sustained_drift_reroutes_after_patience_and_cooldown() -> None:
    clock = Clock()
    # tau = 4: shift 1 gives J = 4 (at enter * tau = 4, not above), shift 2 gives J = 16
    monitor = DriftMonitor(
        reference(), 4.0, window=4, check_period=2, patience=2, cooldown_s=5.0, clock=clock
    )
    assert run(monitor, frames(0.0, 8)) == [] and monitor.streak == 0
    clock.t = 1.0  # inside the cooldown: drift is counted but not acted on
    assert run(monitor, frames(2.0, 4, seed=1) + frames(2.0, 4, seed=3)) == []
    assert monitor.streak >= 2 and monitor.last_divergence == pytest.approx(16.0)
    clock.t = 6.0
    # due at the first check after the cooldown, and at every check until re-routed
    assert run(monitor, frames(2.0, 4, seed=2)) == [1, 3]
    window = gem_descriptor(np.stack(monitor.vectors))
    monitor.rerouted(window)
    assert monitor.streak == 0 and monitor.reference is window


def test_hysteresis_keeps_the_count_between_exit_and_enter() -> None:
    clock = Clock()
    clock.t = 100.0
    monitor = DriftMonitor(
        reference(), 4.0, window=4, check_period=4, enter=1.0, exit=0.5, patience=3, clock=clock
    )
    clock.t = 200.0
    run(monitor, frames(2.0, 4))  # J = 16 > 4: streak 1
    run(monitor, frames(0.9, 4))  # J = 3.24: between exit (2) and enter (4): kept
    assert monitor.streak == 1
    run(monitor, frames(2.0, 4))  # streak 2
    run(monitor, frames(0.3, 4))  # J = 0.36 < 2: reset
    assert monitor.streak == 0
    assert run(monitor, frames(2.0, 12)) == [11]  # three drifting checks in a row


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="tau must be > 0"):
        DriftMonitor(reference(), 0.0)
    with pytest.raises(ValueError, match="exit <= enter"):
        DriftMonitor(reference(), 1.0, enter=0.5, exit=0.7)
    with pytest.raises(ValueError, match="window >= 2"):
        DriftMonitor(reference(), 1.0, window=1)
