"""The strategy and its durable copy: building it, checkpoints, restoring a run at start-up.

A checkpoint is the strategy's ``state_dict`` (its arrays in one blob, ``ckpt-r<rounds done>-
<random>``) with the members in join order and the rounds done; the starting model stays in the
blob ``initial``. Restoring replays formation (``initialize`` with the first ``num_initial``
members, ``add_client`` for the others) and then loads the checkpoint into it.
"""

from __future__ import annotations

import functools
import uuid

from fedepth.strategies import Strategy, aggregates_clusterwise, create_strategy
from fedepth.strategies.aggregate import robust_mean
from fedepth_coordinator.blobs import BlobReader, write_blob
from fedepth_coordinator.coordstate import (
    INITIAL_BLOB,
    CoordinatorState,
    OpenRound,
    client_info,
    log,
    some,
)
from fedepth_coordinator.state.base import Checkpoint, Snapshot, StateError
from fedepth_coordinator.tensors import STATE


class Checkpoints:
    """Builds the run's strategy, writes and loads its checkpoints, restores a stored run."""

    def __init__(self, state: CoordinatorState) -> None:
        self._state = state

    def new_strategy(self) -> Strategy:
        """A fresh strategy of the config (with the configured robust rule)."""
        s = self._state
        if s.strategy_factory is not None:
            strategy = s.strategy_factory()
        else:
            cfg = s.config.strategy
            strategy = create_strategy(cfg.name, **dict(cfg.params))
        if getattr(strategy, "pooled", False):
            raise ValueError(
                f"strategy {strategy.name!r} trains one model on the pooled data of every robot "
                "(the benchmark's upper bound); a coordinator never sees the robots' data: "
                "use fedavg for one fleet-wide model"
            )
        v = s.config.validation
        if v.robust_aggregation != "mean":
            if not aggregates_clusterwise(strategy):
                raise ValueError(
                    f"validation.robust_aggregation {v.robust_aggregation!r}: strategy "
                    f"{strategy.name} aggregates by its own rule; use 'mean' with it"
                )
            strategy.cluster_rule = functools.partial(
                robust_mean, method=v.robust_aggregation, trim=v.trim_fraction
            )
        return strategy

    def write(self) -> Checkpoint:
        """Write the strategy's state to a new blob (lock held); the caller records it."""
        s = self._state
        strategy = s.require_strategy()
        meta, states = strategy.state_dict()
        key = f"ckpt-r{s.rounds_done:06d}-{uuid.uuid4().hex[:8]}"
        write_blob(s.store, key, states, chunk_bytes=s.chunk_bytes)
        return Checkpoint(
            rounds_done=s.rounds_done,
            members=tuple(s.members),
            num_initial=s.num_initial,
            meta=meta,
            blob=key,
        )

    def load(self, ck: Checkpoint) -> None:
        """Rebuild the strategy as of ``ck`` and make it the run's (lock held)."""
        s = self._state
        strategy = self.new_strategy()
        infos = [client_info(s.robots[m]) for m in ck.members]
        initial = BlobReader(s.store, INITIAL_BLOB).read_all()[STATE]
        strategy.initialize(infos[: ck.num_initial], initial)
        for info in infos[ck.num_initial :]:
            strategy.add_client(info)
        strategy.load_state_dict(ck.meta, BlobReader(s.store, ck.blob).read_all())
        s.strategy = strategy
        s.members = list(ck.members)
        s.member_set = set(ck.members)
        s.num_initial = ck.num_initial
        s.rounds_done = ck.rounds_done
        s.checkpoint = ck

    # -- start-up ----------------------------------------------------------------------------
    def restore(self) -> bool:
        """Load the store: robots, history and the recorded run (blobs verified); unreferenced
        blobs are deleted or quarantined. True when the store records a run (False: the caller
        forms the fleet, enough robots may have been ready before a restart)."""
        s = self._state
        snap = s.store.load()
        s.robots = {r.robot_id: r for r in snap.robots}
        s.history = list(snap.history)
        keep: set[str] = set()
        if snap.run is not None:
            keep = self._resume(snap)
        unreferenced = [k for k in s.store.blob_keys() if k not in keep]
        # a blob whose checksum the database recorded is one this state wrote (an interrupted
        # write, or an initial model written just before a crash): garbage. One it has no
        # record of belongs to a run the database does not know (state.db lost, replaced or
        # restored from an older backup): it may be the only copy of a run's models.
        unknown = [k for k in unreferenced if s.store.blob_checksum(k) is None]
        dropped = [k for k in unreferenced if k not in unknown]
        if unknown and (snap.run is None and s.config.state.unaccounted_blobs == "refuse"):
            raise StateError(
                f"the state in {s.config.state.dir} records no run, but its blobs/ holds "
                f"{len(unknown)} blobs it has no record of ({some(unknown)}): state.db was "
                "lost, replaced or corrupted. Recover: restore state.db (with its -wal file) "
                "from a backup; or, to start a fresh run and keep those blobs aside, set "
                "state.unaccounted_blobs=quarantine (moves them to <state dir>/quarantine); "
                "or use another --state-dir. Nothing was deleted"
            )
        if unknown:
            moved = [s.store.quarantine_blob(k) for k in unknown]
            log.warning(
                "the state has no record of %d blobs (%s); they were moved aside, not deleted, "
                "to %s. If state.db was lost or restored from an older backup, stop, restore "
                "the matching state.db and move them back; otherwise delete them",
                len(unknown),
                some(unknown),
                sorted({str(m).rsplit("/", 1)[0] for m in moved if m}) or "(kept in place)",
            )
        for k in dropped:
            s.store.delete_blob(k)
        if dropped:
            log.info("removed %d unreferenced blobs left by an interrupted write", len(dropped))
        return snap.run is not None

    def _resume(self, snap: Snapshot) -> set[str]:
        """Restore the recorded run (blobs verified); the blobs it references."""
        s = self._state
        run = snap.run
        assert run is not None
        keep: set[str] = {run.initial_blob, run.checkpoint.blob}
        try:
            s.initial = None
            s.model_order = BlobReader(s.store, run.initial_blob).layout.group(STATE).names()
            self.load(run.checkpoint)
        except Exception as exc:  # any fault of the stored run: one line, not a traceback
            log.debug("restoring the run failed", exc_info=True)
            raise StateError(
                f"the run recorded in {s.config.state.dir} cannot be restored "
                f"({type(exc).__name__}: {str(exc)[:300]}). Recover: restore the state "
                "directory from a backup, or start a fresh run with another --state-dir; "
                "nothing was deleted"
            ) from None
        s.finished = run.finished
        if run.open_round is not None:
            rnd = run.open_round
            reported = {u.robot_id: u for u in snap.updates if u.round == rnd.round}
            s.open_round = OpenRound(rnd, reported)
            keep |= {u.blob for u in reported.values()}
        log.info(
            "resumed run: %d rounds done, %d members, round %s open with %d accepted updates",
            s.rounds_done,
            len(s.members),
            "-" if s.open_round is None else s.open_round.record.round,
            0 if s.open_round is None else len(s.open_round.reported),
        )
        return keep
