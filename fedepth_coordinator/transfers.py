"""Weight streams in flight: ``server.max_transfers`` at once, and a limit per principal."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

import numpy as np

from fedepth_coordinator.coordstate import CoordinatorState
from fedepth_coordinator.domain import Payload
from fedepth_coordinator.errors import ResourceExhaustedError


class TransferSlots:
    """The coordinator's transfer slots (downloads, uploads, routed models all take one while
    their chunks flow) and the streams each principal has open (counted under the state's
    lock)."""

    def __init__(self, state: CoordinatorState) -> None:
        self._state = state
        #: weight streams (downloads, uploads, routed models) allowed in flight at once
        self.slots = threading.BoundedSemaphore(state.config.server.max_transfers)
        #: weight streams each principal has open (server.max_transfers_per_robot)
        self.streams: Counter[str] = Counter()

    def payload(self, groups: list[Mapping[str, np.ndarray]], principal: str) -> Payload:
        """A stream of ``groups`` for ``principal``, counted against its own transfer limit
        (call it without the state's lock)."""
        chunk_bytes = self._state.chunk_bytes
        if not groups:
            return Payload(groups, chunk_bytes, self.slots)
        limit = self._state.config.server.max_transfers_per_robot
        cond = self._state.cond
        with cond:
            if self.streams[principal] >= limit:
                raise ResourceExhaustedError(
                    f"{principal!r} already has {limit} weight streams in flight "
                    "(server.max_transfers_per_robot): finish or cancel one first"
                )
            self.streams[principal] += 1

        def release() -> None:
            with cond:
                self.streams[principal] -= 1
                if self.streams[principal] <= 0:
                    del self.streams[principal]

        return Payload(groups, chunk_bytes, self.slots, on_close=release)
