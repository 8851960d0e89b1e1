"""The coordinator's logic, free of gRPC: fleet, rounds, uploads, routing, persistence.

:class:`Coordinator` runs one fedepth :class:`~fedepth.strategies.Strategy` unchanged:

- robots register and send descriptors; once ``rounds.min_robots`` are ready the strategy is
  initialized with them (sorted by id) and round 0 opens. A robot that becomes ready later is
  placed by ``strategy.add_client`` (FeDepth routes its descriptor).
- a round selects members (seeded fraction), serves each one ``configure_train``'s task with
  the run's training recipe (config section ``training``), and closes when every selected
  robot reported, or when a quorum has and the deadline passed.
- an upload is checked against the robot's task (names, shapes, dtypes, finite values, optional
  norm bound) while it streams into a blob; only then is it recorded. Aggregation reads the
  spilled blobs tensor by tensor, so memory does not grow with the number of updates.
- after every aggregation the strategy state and round bookkeeping are stored in one
  transaction; accepted uploads of the open round are stored as they arrive. A coordinator
  restarted on the same store resumes the open round with the uploads it had accepted.

Every public method takes the authenticated caller and raises
:class:`~fedepth_coordinator.errors.CoordinatorError` subclasses with actionable messages.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fedepth.clustering import jeffreys_cross
from fedepth.descriptor import Descriptor
from fedepth.strategies import (
    ClientInfo,
    ClientUpdate,
    ClusteredStrategy,
    RouteDecision,
    Strategy,
    TrainTask,
    create_strategy,
)
from fedepth.strategies.aggregate import robust_mean
from fedepth.strategies.pacfl import BASIS_KEY as PACFL_BASIS
from fedepth_coordinator.blobs import BlobReader, start_blob, write_blob
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.domain import (
    ClusterMap,
    DescriptorAck,
    FleetStatus,
    ModelHeader,
    ModelStream,
    Payload,
    Phase,
    PlanAction,
    Registration,
    RobotStatus,
    RoundPlan,
    RoundSummary,
    RouteHeader,
    RouteStream,
    UpdateHeader,
    UploadReceipt,
)
from fedepth_coordinator.errors import (
    AbortedError,
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    shown,
)
from fedepth_coordinator.pipeline import consume_in_worker
from fedepth_coordinator.state.base import (
    ID_PATTERN,
    Checkpoint,
    CorruptBlobError,
    RobotRecord,
    RoundRecord,
    RunRecord,
    Snapshot,
    StateError,
    Store,
    UpdateRecord,
    valid_id,
)
from fedepth_coordinator.tensors import (
    STATE,
    Layout,
    State,
    StreamChecker,
    check_matches,
)

log = logging.getLogger(__name__)

INITIAL_BLOB = "initial"
MAX_LABELS = 16
MAX_LABEL_CHARS = 128
MAX_METRICS = 64
#: Chunks of an upload received but not yet checked and written, at most (per transfer).
SPILL_QUEUE_CHUNKS = 2


@dataclass
class _OpenRound:
    record: RoundRecord
    reported: dict[str, UpdateRecord] = field(default_factory=dict)
    uploading: set[str] = field(default_factory=set)


def _check_labels(labels: Mapping[str, str], what: str) -> None:
    if len(labels) > MAX_LABELS:
        raise InvalidArgumentError(f"{what}: at most {MAX_LABELS} labels, got {len(labels)}")
    for k, v in labels.items():
        if not k or len(k) > MAX_LABEL_CHARS or len(v) > MAX_LABEL_CHARS:
            raise InvalidArgumentError(
                f"{what}: label {k[:20]!r} must be non-empty and keys and values at most "
                f"{MAX_LABEL_CHARS} characters"
            )


def _some(keys: list[str]) -> str:
    return ", ".join(keys[:5]) + (", ..." if len(keys) > 5 else "")


def _same_descriptor(a: Descriptor | None, b: Descriptor | None) -> bool:
    if a is None or b is None:
        return a is b
    return (
        a.num_frames == b.num_frames
        and np.array_equal(a.mean, b.mean)
        and np.array_equal(a.var, b.var)
    )


def _same_summaries(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


class Coordinator:
    """Fleet and round state of one federated run (thread-safe; one lock, one condition)."""

    def __init__(
        self,
        config: CoordinatorConfig,
        store: Store,
        initial_model: Mapping[str, np.ndarray],
        *,
        clock: Callable[[], float] = time.time,
        strategy_factory: Callable[[], Strategy] | None = None,
        model_card: str | None = None,
    ) -> None:
        self.config = config
        self.store = store
        #: the served model's card (JSON), sent in every model header; None: no card
        self.model_card = model_card
        self.clock = clock
        #: builds the strategy (default: ``create_strategy`` with the config's name and params)
        self.strategy_factory = strategy_factory
        #: the starting model until the run starts (then only in its blob), and its tensor order
        self._initial: dict[str, np.ndarray] | None = dict(initial_model)
        self._model_order = list(initial_model)
        self._cond = threading.Condition()
        self._robots: dict[str, RobotRecord] = {}
        self._last_seen: dict[str, float] = {}
        self._strategy: Strategy | None = None
        self._members: list[str] = []
        self._member_set: set[str] = set()
        self._num_initial = 0
        self._rounds_done = 0
        self._checkpoint: Checkpoint | None = None
        self._round: _OpenRound | None = None
        self._finished = False
        #: the robots a fleet is being formed with (None: no formation in progress)
        self._forming: set[str] | None = None
        self._history: list[RoundRecord] = []
        #: weight streams (downloads, uploads, routed models) allowed in flight at once
        self._transfers = threading.BoundedSemaphore(config.server.max_transfers)
        #: weight streams each principal has open (server.max_transfers_per_robot)
        self._streams: Counter[str] = Counter()
        #: robots told once that their claimed sample count was clipped to the registered one
        self._overclaimed: set[str] = set()
        # built once now: a strategy that cannot take the configured rule refuses to start,
        # and robots learn at Register which data summaries it needs (and send no others)
        probe = self._new_strategy()
        self.summaries_wanted = probe.client_summaries
        self._strategy_name = probe.name
        self._restore()

    # -- start-up ----------------------------------------------------------------------------
    def _restore(self) -> None:
        snap = self.store.load()
        self._robots = {r.robot_id: r for r in snap.robots}
        self._history = list(snap.history)
        keep: set[str] = set()
        if snap.run is not None:
            keep = self._resume(snap)
        unreferenced = [k for k in self.store.blob_keys() if k not in keep]
        # a blob whose checksum the database recorded is one this state wrote (an interrupted
        # write, or an initial model written just before a crash): garbage. One it has no
        # record of belongs to a run the database does not know (state.db lost, replaced or
        # restored from an older backup): it may be the only copy of a run's models.
        unknown = [k for k in unreferenced if self.store.blob_checksum(k) is None]
        dropped = [k for k in unreferenced if k not in unknown]
        if unknown and (snap.run is None and self.config.state.unaccounted_blobs == "refuse"):
            raise StateError(
                f"the state in {self.config.state.dir} records no run, but its blobs/ holds "
                f"{len(unknown)} blobs it has no record of ({_some(unknown)}): state.db was "
                "lost, replaced or corrupted. Recover: restore state.db (with its -wal file) "
                "from a backup; or, to start a fresh run and keep those blobs aside, set "
                "state.unaccounted_blobs=quarantine (moves them to <state dir>/quarantine); "
                "or use another --state-dir. Nothing was deleted"
            )
        if unknown:
            moved = [self.store.quarantine_blob(k) for k in unknown]
            log.warning(
                "the state has no record of %d blobs (%s); they were moved aside, not deleted, "
                "to %s. If state.db was lost or restored from an older backup, stop, restore "
                "the matching state.db and move them back; otherwise delete them",
                len(unknown),
                _some(unknown),
                sorted({str(m).rsplit("/", 1)[0] for m in moved if m}) or "(kept in place)",
            )
        for k in dropped:
            self.store.delete_blob(k)
        if dropped:
            log.info("removed %d unreferenced blobs left by an interrupted write", len(dropped))
        if snap.run is None:
            try:
                self._form_fleet()  # enough robots may have been ready before a restart
            except FailedPreconditionError as exc:
                log.warning("%s", exc)

    def _resume(self, snap: Snapshot) -> set[str]:
        """Restore the recorded run (blobs verified); the blobs it references."""
        run = snap.run
        assert run is not None
        keep: set[str] = {run.initial_blob, run.checkpoint.blob}
        try:
            self._initial = None
            self._model_order = (
                BlobReader(self.store, run.initial_blob).layout.group(STATE).names()
            )
            self._load_checkpoint(run.checkpoint)
        except Exception as exc:  # any fault of the stored run: one line, not a traceback
            log.debug("restoring the run failed", exc_info=True)
            raise StateError(
                f"the run recorded in {self.config.state.dir} cannot be restored "
                f"({type(exc).__name__}: {str(exc)[:300]}). Recover: restore the state "
                "directory from a backup, or start a fresh run with another --state-dir; "
                "nothing was deleted"
            ) from None
        self._finished = run.finished
        if run.open_round is not None:
            rnd = run.open_round
            reported = {u.robot_id: u for u in snap.updates if u.round == rnd.round}
            self._round = _OpenRound(rnd, reported)
            keep |= {u.blob for u in reported.values()}
        log.info(
            "resumed run: %d rounds done, %d members, round %s open with %d accepted updates",
            self._rounds_done,
            len(self._members),
            "-" if self._round is None else self._round.record.round,
            0 if self._round is None else len(self._round.reported),
        )
        return keep

    def _new_strategy(self) -> Strategy:
        if self.strategy_factory is not None:
            strategy = self.strategy_factory()
        else:
            cfg = self.config.strategy
            strategy = create_strategy(cfg.name, **dict(cfg.params))
        v = self.config.validation
        if v.robust_aggregation != "mean":
            own = type(strategy).aggregate_train is not ClusteredStrategy.aggregate_train
            if not isinstance(strategy, ClusteredStrategy) or own:
                raise ValueError(
                    f"validation.robust_aggregation {v.robust_aggregation!r}: strategy "
                    f"{strategy.name} aggregates by its own rule; use 'mean' with it"
                )
            strategy.cluster_rule = functools.partial(
                robust_mean, method=v.robust_aggregation, trim=v.trim_fraction
            )
        return strategy

    def _load_checkpoint(self, ck: Checkpoint) -> None:
        strategy = self._new_strategy()
        infos = [self._client_info(self._robots[m]) for m in ck.members]
        initial = BlobReader(self.store, INITIAL_BLOB).read_all()[STATE]
        strategy.initialize(infos[: ck.num_initial], initial)
        for info in infos[ck.num_initial :]:
            strategy.add_client(info)
        strategy.load_state_dict(ck.meta, BlobReader(self.store, ck.blob).read_all())
        self._strategy = strategy
        self._members = list(ck.members)
        self._member_set = set(ck.members)
        self._num_initial = ck.num_initial
        self._rounds_done = ck.rounds_done
        self._checkpoint = ck

    @staticmethod
    def _client_info(r: RobotRecord) -> ClientInfo:
        return ClientInfo(
            cid=r.robot_id,
            num_samples=r.num_samples,
            descriptor=r.descriptor,
            labels=dict(r.labels),
            extra=dict(r.summaries),
        )

    # -- helpers -----------------------------------------------------------------------------
    @property
    def phase(self) -> Phase:
        if self._strategy is None:
            return Phase.WAITING_FOR_FLEET
        return Phase.FINISHED if self._finished else Phase.TRAINING

    @staticmethod
    def _check_caller(caller: str, robot_id: str) -> None:
        if caller != robot_id:
            raise PermissionDeniedError(
                f"principal {caller!r} may not act as robot {shown(robot_id)}: a robot can only "
                "send requests in its own name"
            )

    def _robot(self, robot_id: str) -> RobotRecord:
        try:
            return self._robots[robot_id]
        except KeyError:
            raise NotFoundError(
                f"robot {shown(robot_id)} is not registered; call Register first"
            ) from None

    def _touch(self, robot_id: str) -> None:
        self._last_seen[robot_id] = time.monotonic()

    def _ready(self) -> list[str]:
        """Robots with a descriptor of the fleet's dimension, sorted by id."""
        dim = self._expected_dim()
        if dim is None:  # not fixed yet: the dimension most robots sent (one robot cannot
            # impose its own on the fleet by sending first)
            dims = Counter(r.descriptor.dim for r in self._robots.values() if r.descriptor)
            dim = min(dims, key=lambda d: (-dims[d], d)) if dims else None
        return sorted(
            rid
            for rid, r in self._robots.items()
            if r.descriptor is not None and r.descriptor.dim == dim
        )

    def _quorum(self, selected: int) -> int:
        return max(1, math.ceil(self.config.rounds.quorum * selected - 1e-9))

    def _expected_dim(self) -> int | None:
        """The descriptor dimension every robot must send: configured, else the members' once
        the fleet formed (None before: any dimension is stored, the majority's forms it)."""
        if self.config.validation.descriptor_dim is not None:
            return self.config.validation.descriptor_dim
        if self._members:
            d = self._robots[self._members[0]].descriptor
            return None if d is None else d.dim
        return None

    def _check_descriptor(self, robot_id: str, d: Descriptor) -> None:
        v = self.config.validation
        if d.dim == 0 or d.dim > v.max_descriptor_dim:
            raise InvalidArgumentError(
                f"descriptor has {d.dim} dimensions; it needs 1 to {v.max_descriptor_dim}"
            )
        if d.num_frames <= 0:
            raise InvalidArgumentError(f"descriptor num_frames must be > 0, got {d.num_frames}")
        dim = self._expected_dim()
        if dim is not None and d.dim != dim:
            raise InvalidArgumentError(
                f"descriptor has {d.dim} dimensions but the fleet's have {dim}: compute it "
                "with the same encoder as the other robots"
            )
        bound = v.descriptor_bound
        if not (
            np.abs(d.mean).max() <= bound and 1 / bound <= d.var.min() <= d.var.max() <= bound
        ):
            raise InvalidArgumentError(
                f"descriptor out of range: means must lie in [-{bound:g}, {bound:g}] and "
                f"variances in [{1 / bound:g}, {bound:g}] (validation.descriptor_bound)"
            )
        others = [
            r.descriptor
            for rid, r in self._robots.items()
            if rid != robot_id and r.descriptor is not None and r.descriptor.dim == d.dim
        ]
        if others:
            with np.errstate(all="ignore"):
                div = jeffreys_cross(
                    d.mean[None],
                    d.var[None],
                    np.stack([o.mean for o in others]),
                    np.stack([o.var for o in others]),
                )
            if not np.isfinite(div).all():
                raise InvalidArgumentError(
                    "descriptor's divergence to the fleet's is not finite: it cannot be clustered"
                )

    def _check_summary_values(self, summaries: Mapping[str, np.ndarray]) -> None:
        """Inline summaries (descriptor uploads and Route alike): bounded size, finite."""
        size = sum(np.asarray(a).nbytes for a in summaries.values())
        if size > self.config.validation.max_summary_bytes:
            raise ResourceExhaustedError(
                f"summaries take {size} bytes; at most {self.config.validation.max_summary_bytes}"
                " are accepted (validation.max_summary_bytes)"
            )
        for name, arr in summaries.items():
            if np.asarray(arr).dtype.kind == "f" and not np.isfinite(arr).all():
                raise InvalidArgumentError(f"summary {shown(name)} contains NaN or Inf")

    def _check_summaries(self, d: Descriptor, summaries: Mapping[str, np.ndarray]) -> None:
        basis = summaries.get(PACFL_BASIS)
        if basis is None:
            return
        b = np.asarray(basis)
        if b.ndim != 2 or b.shape[0] != d.dim or not 1 <= b.shape[1] <= d.dim:
            raise InvalidArgumentError(
                f"summary {PACFL_BASIS!r} must be a D x p basis with D = {d.dim} (the "
                f"descriptor's dimension) and 1 <= p <= D, got shape {list(b.shape)}"
            )
        most = self.config.validation.max_basis_columns
        if b.shape[1] > most:
            # formation costs N^2 SVDs of p x p products (D p^2 each): p is what bounds it
            raise InvalidArgumentError(
                f"summary {PACFL_BASIS!r} has {b.shape[1]} columns; at most {most} are "
                "accepted (validation.max_basis_columns)"
            )
        if b.dtype.kind != "f":
            raise InvalidArgumentError(f"summary {PACFL_BASIS!r} must be floating point")
        b = b.astype(np.float64)
        gram = np.einsum("ij,ik->jk", b, b)
        if not np.allclose(gram, np.eye(b.shape[1]), atol=1e-3):
            raise InvalidArgumentError(
                f"summary {PACFL_BASIS!r} must have orthonormal columns "
                "(fedepth.clustering.subspace_basis)"
            )

    def _require_strategy(self) -> Strategy:
        if self._strategy is None:
            ready, need = len(self._ready()), self.config.rounds.min_robots
            raise FailedPreconditionError(
                f"the fleet has not formed yet ({ready}/{need} robots registered with a "
                "descriptor): try again once training has started"
            )
        return self._strategy

    # -- fleet -------------------------------------------------------------------------------
    def register(
        self,
        caller: str,
        robot_id: str,
        num_samples: int,
        labels: Mapping[str, str],
        *,
        model_card: str | None = None,
    ) -> Registration:
        self._check_caller(caller, robot_id)
        if not valid_id(robot_id):
            raise InvalidArgumentError(
                f"robot id {shown(robot_id)} must match {ID_PATTERN.pattern}"
            )
        if num_samples <= 0:
            raise InvalidArgumentError(f"num_samples must be > 0, got {num_samples}")
        _check_labels(labels, f"robot {robot_id!r}")
        if model_card is not None:
            self._check_model_card(robot_id, model_card)
        with self._cond:
            self._touch(robot_id)
            old = self._robots.get(robot_id)
            if old is not None and robot_id in self._member_set:
                if old.num_samples != num_samples or dict(old.labels) != dict(labels):
                    raise FailedPreconditionError(
                        f"robot {robot_id!r} joined the run with num_samples={old.num_samples} "
                        f"and labels {dict(old.labels)}; registration data cannot change "
                        "during a run (re-register with the same values)"
                    )
            elif old is None or old.num_samples != num_samples or dict(old.labels) != dict(labels):
                self._check_not_forming(robot_id)
                new = RobotRecord(
                    robot_id,
                    num_samples,
                    dict(labels),
                    descriptor=None if old is None else old.descriptor,
                    summaries={} if old is None else old.summaries,
                )
                self.store.put_robot(new)
                self._robots[robot_id] = new
                log.info("robot %s registered (%d samples, %s)", robot_id, num_samples, labels)
                self._after_fleet_change(robot_id)
        self._form_fleet()  # outside the lock: formation work may be long
        with self._cond:
            return Registration(
                self.phase, robot_id in self._member_set, self.model_card, self.summaries_wanted
            )

    def _check_model_card(self, robot_id: str, declared_json: str) -> None:
        """Refuse a robot whose declared model cannot take the served weights."""
        from fedepth.models.card import ModelCard

        try:
            declared = ModelCard.from_json(declared_json, f"robot {robot_id!r}'s model card")
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        if self.model_card is None:
            raise FailedPreconditionError(
                f"robot {robot_id!r} declares {declared.describe()}, but this coordinator "
                "serves a model without a card (the synthetic test model): no robot model "
                "can take it"
            )
        served = ModelCard.from_json(self.model_card, "served model")
        diff = served.differences(declared)
        if diff:
            raise FailedPreconditionError(
                f"robot {robot_id!r} declares {declared.describe()}, but this coordinator "
                f"serves {served.describe()} (differs in {', '.join(diff)}): start the robot "
                "without weights (it builds the served model) or with weights of that model"
            )

    def upload_descriptor(
        self,
        caller: str,
        robot_id: str,
        descriptor: Descriptor,
        summaries: Mapping[str, np.ndarray],
    ) -> DescriptorAck:
        self._check_caller(caller, robot_id)
        self._check_summary_values(summaries)
        missing = [k for k in self.summaries_wanted if k not in summaries]
        if missing:
            raise InvalidArgumentError(
                f"strategy {self._strategy_name} needs the summaries {missing} with the "
                "descriptor (RegisterReply.summaries names them): send them in this "
                "UploadDescriptor; fedepth_coordinator.robot.run_robot does"
            )
        # what the strategy did not ask for is not kept: the coordinator stores no more of a
        # robot's data than its algorithm uses
        summaries = {k: v for k, v in summaries.items() if k in self.summaries_wanted}
        with self._cond:
            old = self._robot(robot_id)
            self._touch(robot_id)
            self._check_descriptor(robot_id, descriptor)
            self._check_summaries(descriptor, summaries)
            if robot_id in self._member_set:
                if not (
                    _same_descriptor(old.descriptor, descriptor)
                    and _same_summaries(old.summaries, summaries)
                ):
                    raise FailedPreconditionError(
                        f"robot {robot_id!r} is already clustered by its descriptor; it cannot "
                        "change during a run"
                    )
            else:
                self._check_not_forming(robot_id)
                new = replace(old, descriptor=descriptor, summaries=dict(summaries))
                self.store.put_robot(new)
                self._robots[robot_id] = new
                self._after_fleet_change(robot_id)
        self._form_fleet()  # outside the lock: formation work (PACFL's SVDs) may be long
        with self._cond:
            return DescriptorAck(
                self.phase, robot_id in self._member_set, self._clusters_of(robot_id)
            )

    def _check_not_forming(self, robot_id: str) -> None:
        if self._forming is not None and robot_id in self._forming:
            raise AbortedError(
                f"the fleet is being formed with robot {robot_id!r}'s current registration and "
                "descriptor, which cannot change meanwhile: retry shortly"
            )

    def _after_fleet_change(self, robot_id: str) -> None:
        """A robot's record changed (lock held); one that is ready joins a running fleet (the
        caller then calls :meth:`_form_fleet`, outside the lock, for a fleet not formed yet)."""
        if self._strategy is None or self._forming is not None:
            return
        if robot_id not in self._member_set and self._robots[robot_id].descriptor is not None:
            self._join(robot_id)

    def _form_fleet(self) -> None:
        """Form the fleet once enough robots are ready. The strategy's formation work
        (``initialize``: divergences, PACFL's principal angles) runs without the lock, so the
        coordinator answers other calls meanwhile; the robots it is formed with cannot change
        their records until it is done (ABORTED)."""
        with self._cond:
            if self._strategy is not None or self._forming is not None:
                return
            ready = self._ready()
            if len(ready) < self.config.rounds.min_robots:
                return
            assert self._initial is not None
            infos = [self._client_info(self._robots[r]) for r in ready]
            initial = self._initial
            self._forming = set(ready)
        try:
            strategy = self._new_strategy()
            try:
                strategy.initialize(infos, initial)
            except ValueError as exc:
                raise FailedPreconditionError(
                    f"the fleet of {len(ready)} robots could not be formed: {exc}"
                ) from exc
            with self._cond:
                self._start_run(strategy, ready)
        finally:
            with self._cond:
                self._forming = None
        with self._cond:  # robots that became ready while it was formed join now
            for rid in self._ready():
                if rid not in self._member_set:
                    try:
                        self._join(rid)
                    except (FailedPreconditionError, InvalidArgumentError) as exc:
                        log.warning("robot %s did not join the formed fleet: %s", rid, exc)

    def _start_run(self, strategy: Strategy, ready: list[str]) -> None:
        """Record the run of a formed strategy and open round 0 (lock held)."""
        assert self._initial is not None
        self._strategy = strategy
        self._members, self._member_set, self._num_initial = list(ready), set(ready), len(ready)
        self._rounds_done = 0
        try:
            write_blob(
                self.store, INITIAL_BLOB, {STATE: self._initial}, chunk_bytes=self._chunk_bytes
            )
            checkpoint = self._write_checkpoint()
            first = self._new_round(0)
            self.store.start_run(RunRecord(INITIAL_BLOB, checkpoint, first))
        except BaseException:
            self._strategy = None
            self._members, self._member_set, self._num_initial = [], set(), 0
            raise
        self._checkpoint = checkpoint
        self._round = _OpenRound(first)
        self._initial = None  # the strategy holds the model now; the blob keeps the original
        log.info(
            "fleet formed with %d robots (strategy %s, %s); round 0 opened for %d robots",
            len(ready),
            strategy.name,
            self._describe_clusters(),
            len(first.selected),
        )
        self._cond.notify_all()

    def _join(self, robot_id: str) -> None:
        strategy = self._require_strategy()
        try:
            strategy.add_client(self._client_info(self._robots[robot_id]))
        except NotImplementedError as exc:
            raise FailedPreconditionError(
                f"strategy {strategy.name} does not accept robots after the fleet formed: {exc}"
            ) from exc
        except ValueError as exc:
            raise InvalidArgumentError(f"robot {robot_id!r} cannot join: {exc}") from exc
        self._members.append(robot_id)
        self._member_set.add(robot_id)
        old = self._checkpoint
        checkpoint = self._write_checkpoint()
        self.store.save_checkpoint(checkpoint)
        self._checkpoint = checkpoint
        if old is not None:
            self.store.delete_blob(old.blob)
        log.info(
            "robot %s joined the running fleet in clusters %s",
            robot_id,
            list(self._clusters_of(robot_id)),
        )

    def _write_checkpoint(self) -> Checkpoint:
        strategy = self._require_strategy()
        meta, states = strategy.state_dict()
        key = f"ckpt-r{self._rounds_done:06d}-{uuid.uuid4().hex[:8]}"
        write_blob(self.store, key, states, chunk_bytes=self._chunk_bytes)
        return Checkpoint(
            rounds_done=self._rounds_done,
            members=tuple(self._members),
            num_initial=self._num_initial,
            meta=meta,
            blob=key,
        )

    def _clusters_of(self, robot_id: str) -> tuple[int, ...]:
        s = self._strategy
        if not isinstance(s, ClusteredStrategy) or robot_id not in self._member_set:
            return ()
        return tuple(int(k) for k in np.flatnonzero(s.M_star[:, s.index(robot_id)]))

    def _describe_clusters(self) -> str:
        s = self._strategy
        if not isinstance(s, ClusteredStrategy):
            return "no clusters"
        overlap = float((s.M_star.sum(axis=0) > 1).mean())
        return f"{s.M_star.shape[0]} clusters, overlap {overlap:.0%}"

    @property
    def _chunk_bytes(self) -> int:
        return self.config.server.chunk_bytes

    def _payload(self, groups: list[Mapping[str, np.ndarray]], principal: str) -> Payload:
        """A stream of ``groups`` for ``principal``, counted against its own transfer limit."""
        if not groups:
            return Payload(groups, self._chunk_bytes, self._transfers)
        limit = self.config.server.max_transfers_per_robot
        with self._cond:
            if self._streams[principal] >= limit:
                raise ResourceExhaustedError(
                    f"{principal!r} already has {limit} weight streams in flight "
                    "(server.max_transfers_per_robot): finish or cancel one first"
                )
            self._streams[principal] += 1

        def release() -> None:
            with self._cond:
                self._streams[principal] -= 1
                if self._streams[principal] <= 0:
                    del self._streams[principal]

        return Payload(groups, self._chunk_bytes, self._transfers, on_close=release)

    # -- rounds ------------------------------------------------------------------------------
    def _new_round(self, number: int) -> RoundRecord:
        members = self._members
        k = max(1, math.ceil(self.config.rounds.fraction * len(members) - 1e-9))
        if k < len(members):
            rng = np.random.default_rng([self.config.rounds.seed, number])
            chosen = rng.choice(len(members), size=k, replace=False)
            selected = tuple(sorted(members[int(i)] for i in chosen))
        else:
            selected = tuple(sorted(members))
        now = self.clock()
        return RoundRecord(number, selected, now, now + self.config.rounds.deadline_s)

    def _task(self, rnd: int, robot_id: str) -> TrainTask:
        """The strategy's task for the robot, with the run's training recipe."""
        task = self._require_strategy().configure_train(rnd, [robot_id])[robot_id]
        recipe = self.config.training.recipe(rnd, self.config.rounds.num_rounds)
        return replace(task, recipe=recipe)

    @staticmethod
    def _task_groups(task: TrainTask) -> dict[str, Mapping[str, np.ndarray]]:
        if STATE in task.hook_state:
            raise RuntimeError(f"hook state may not use the reserved name {STATE!r}")
        return {STATE: task.state, **task.hook_state}

    def _plan(self, robot_id: str, after_round: int) -> RoundPlan:
        num_rounds = self.config.rounds.num_rounds

        def wait(reason: str, rnd: int = self._rounds_done) -> RoundPlan:
            return RoundPlan(PlanAction.WAIT, self.phase, rnd, num_rounds, reason=reason)

        if self._strategy is None:
            ready = len(self._ready())
            return wait(
                f"waiting for the fleet: {ready}/{self.config.rounds.min_robots} robots "
                "registered with a descriptor"
            )
        if self._finished or self._round is None:
            return RoundPlan(PlanAction.FINISHED, self.phase, self._rounds_done, num_rounds)
        r = self._round.record
        if robot_id not in self._member_set:
            return wait(f"robot {robot_id} is not a member yet: upload its descriptor", r.round)
        if robot_id not in r.selected:
            return wait(f"not selected for round {r.round}", r.round)
        if robot_id in self._round.reported:
            return wait(f"round {r.round} already reported", r.round)
        if r.round <= after_round:
            return wait(f"round {r.round} is not after round {after_round}", r.round)
        layout = Layout.of(self._task_groups(self._task(r.round, robot_id)))
        return RoundPlan(
            PlanAction.TRAIN,
            self.phase,
            r.round,
            num_rounds,
            deadline_unix=r.deadline,
            model_bytes=layout.total_bytes,
        )

    def round_plan(self, caller: str, robot_id: str, after_round: int, wait_s: float) -> RoundPlan:
        """The robot's plan; waits up to ``wait_s`` (capped) for one that is not WAIT."""
        self._check_caller(caller, robot_id)
        if not math.isfinite(wait_s) or wait_s < 0:
            raise InvalidArgumentError(
                f"wait_s must be a finite number of seconds >= 0, got {wait_s!r}"
            )
        end = time.monotonic() + min(wait_s, self.config.server.max_wait_s)
        with self._cond:
            self._robot(robot_id)
            while True:
                self._touch(robot_id)
                plan = self._plan(robot_id, after_round)
                remaining = end - time.monotonic()
                if plan.action is not PlanAction.WAIT or remaining <= 0:
                    return plan
                self._cond.wait(remaining)

    def download(self, caller: str, robot_id: str, rnd: int, latest: bool) -> ModelStream:
        """The robot's task for round ``rnd`` (or, with ``latest``, its current model)."""
        self._check_caller(caller, robot_id)
        with self._cond:
            self._robot(robot_id)
            self._touch(robot_id)
            self._require_strategy()
            if robot_id not in self._member_set:
                raise FailedPreconditionError(
                    f"robot {robot_id!r} is not a member of the run yet: upload its descriptor"
                )
            if latest:
                assert self._strategy is not None
                task = TrainTask(state=self._strategy.model_for(robot_id))
                rnd = self._rounds_done
            else:
                r = self._open_round_for(robot_id, rnd)
                task = self._task(r.round, robot_id)
        groups = self._task_groups(task)
        header = ModelHeader(
            rnd,
            Layout.of(groups),
            task.hook,
            dict(task.hook_params),
            recipe=task.recipe,
            card=self.model_card,
        )
        return ModelStream(header, self._payload(list(groups.values()), caller))

    def _open_round_for(self, robot_id: str, rnd: int) -> RoundRecord:
        if self._round is None:
            raise FailedPreconditionError(
                f"round {rnd} is not open: the run finished after {self._rounds_done} rounds"
            )
        r = self._round.record
        if rnd != r.round:
            state = "closed" if rnd < r.round else "not open yet"
            raise FailedPreconditionError(
                f"round {rnd} is {state}; the open round is {r.round}: ask for the round plan"
            )
        if robot_id not in r.selected:
            raise FailedPreconditionError(
                f"robot {robot_id!r} is not selected for round {r.round}"
            )
        return r

    # -- uploads -----------------------------------------------------------------------------
    def upload(
        self, caller: str, header: UpdateHeader, chunks: Iterable[bytes | memoryview]
    ) -> UploadReceipt:
        """Check, spill and record one update; closes the round when it completes it."""
        robot_id, rnd = header.robot_id, header.round
        self._check_caller(caller, robot_id)
        if header.num_samples <= 0:
            raise InvalidArgumentError(f"num_samples must be > 0, got {header.num_samples}")
        if header.num_steps < 0:
            raise InvalidArgumentError(f"num_steps must be >= 0, got {header.num_steps}")
        if len(header.metrics) > MAX_METRICS:
            raise InvalidArgumentError(f"at most {MAX_METRICS} metrics, got {len(header.metrics)}")
        with self._cond:
            weight = self._sample_weight(self._robot(robot_id), header.num_samples)
            self._touch(robot_id)
            self._require_strategy()
            self._open_round_for(robot_id, rnd)
            self._check_not_duplicate(robot_id, rnd)
            reference = self._task(rnd, robot_id).state
            check_matches(
                header.layout,
                Layout.of({STATE: reference}).groups[0],
                max_extra_groups=self.config.validation.max_extra_groups,
            )
            assert self._round is not None
            self._round.uploading.add(robot_id)
        key = f"upd-r{rnd:06d}-{robot_id}"
        try:
            checker = StreamChecker(
                header.layout,
                reference=reference,
                max_norm=self.config.validation.max_update_norm,
                group_norms=self.config.validation.max_group_norms,
            )
            with self._transfers, start_blob(self.store, key, header.layout) as writer:

                def spill(chunk: bytes | memoryview) -> None:
                    checker.feed(chunk)
                    writer.write(chunk)

                # check and write in a worker while this thread receives the next chunks
                consume_in_worker(chunks, spill, depth=SPILL_QUEUE_CHUNKS, name=f"spill-{key}")
                checker.finish()
                writer.commit()
        finally:
            with self._cond:
                if self._round is not None:
                    self._round.uploading.discard(robot_id)
        with self._cond:
            if self._round is None or self._round.record.round != rnd:
                self.store.delete_blob(key)
                raise FailedPreconditionError(
                    f"round {rnd} closed while the upload was streaming (late); the update "
                    "was discarded: ask for the round plan"
                )
            record = UpdateRecord(
                rnd, robot_id, weight, header.num_steps, dict(header.metrics), key
            )
            self.store.add_update(record)
            self._round.reported[robot_id] = record
            selected = len(self._round.record.selected)
            accepted = len(self._round.reported)
            self._maybe_close()
            self._cond.notify_all()
            return UploadReceipt(rnd, accepted, selected)

    def _sample_weight(self, robot: RobotRecord, claimed: int) -> int:
        """The aggregation weight of an update claiming ``claimed`` samples (never more than the
        robot registered; see validation.sample_weights)."""
        policy, registered = self.config.validation.sample_weights, robot.num_samples
        if policy == "equal":
            return 1
        if policy == "registered":
            return registered
        if claimed != registered and policy == "strict":
            raise InvalidArgumentError(
                f"the update claims {claimed} samples but robot {robot.robot_id!r} registered "
                f"{registered} (validation.sample_weights: strict): re-register with the count"
            )
        if claimed > registered and robot.robot_id not in self._overclaimed:
            # once per robot: a robot_node registers with the frames it had buffered when it
            # joined and trains on more later, every round
            self._overclaimed.add(robot.robot_id)
            log.warning(
                "robot %s claims %d samples, registered %d: weighted %d (said once per robot)",
                robot.robot_id,
                claimed,
                registered,
                registered,
            )
        return min(claimed, registered)

    def _check_not_duplicate(self, robot_id: str, rnd: int) -> None:
        assert self._round is not None
        if robot_id in self._round.reported:
            raise AlreadyExistsError(
                f"robot {robot_id!r} already uploaded its update for round {rnd}"
            )
        if robot_id in self._round.uploading:
            raise AbortedError(
                f"an upload from robot {robot_id!r} for round {rnd} is still in progress and "
                "nothing is recorded yet: retry shortly (it is accepted or dropped when it ends)"
            )

    def tick(self) -> float | None:
        """Close the open round if its deadline passed with a quorum; seconds to its deadline."""
        with self._cond:
            self._maybe_close()
            if self._round is None:
                return None
            return max(0.0, self._round.record.deadline - self.clock())

    def _maybe_close(self) -> None:
        r = self._round
        if r is None:
            return
        n, selected = len(r.reported), len(r.record.selected)
        if n == selected:
            self._close_round("all reported")
        elif n >= self._quorum(selected) and self.clock() >= r.record.deadline:
            self._close_round("quorum at deadline")

    def _close_round(self, closed_by: str) -> None:
        assert self._round is not None and self._strategy is not None
        r = self._round
        rnd = r.record.round
        t0 = time.monotonic()
        order = self._model_order
        updates = []
        for robot_id in sorted(r.reported):
            rec = r.reported[robot_id]
            try:
                reader = BlobReader(self.store, rec.blob)
            except (CorruptBlobError, OSError, KeyError, ValueError) as exc:
                # changed on disk since it was accepted: never aggregated (nor served)
                where = self.store.quarantine_blob(rec.blob)
                log.error(
                    "round %d: the accepted update of robot %s is left out of the aggregate: "
                    "%s; moved to %s",
                    rnd,
                    robot_id,
                    exc,
                    where or "(kept in place)",
                )
                del r.reported[robot_id]
                continue
            updates.append(
                ClientUpdate(
                    cid=robot_id,
                    state=reader.lazy(STATE, order),
                    num_samples=rec.num_samples,
                    num_steps=rec.num_steps,
                    extra={g.name: reader.lazy(g.name) for g in reader.layout.groups[1:]},
                    metrics=dict(rec.metrics),
                )
            )
        try:
            self._strategy.aggregate_train(rnd, updates)
            self._rounds_done = rnd + 1
            checkpoint = self._write_checkpoint()
        except Exception:
            log.exception("aggregating round %d failed; reloading the last checkpoint", rnd)
            assert self._checkpoint is not None
            self._load_checkpoint(self._checkpoint)
            raise
        more = self._rounds_done < self.config.rounds.num_rounds
        next_round = self._new_round(self._rounds_done) if more else None
        closed = replace(
            r.record,
            closed_at=self.clock(),
            reported=tuple(sorted(r.reported)),
            closed_by=closed_by,
        )
        self.store.close_round(closed, checkpoint, next_round)
        old = self._checkpoint
        self._checkpoint = checkpoint
        self._history.append(closed)
        self._round = None if next_round is None else _OpenRound(next_round)
        self._finished = next_round is None
        for rec in r.reported.values():
            self.store.delete_blob(rec.blob)
        if old is not None:
            self.store.delete_blob(old.blob)
        log.info(
            "round %d/%d closed (%s): %d/%d updates, quorum %d, open %.1f s, aggregated in "
            "%.2f s; %s",
            rnd + 1,
            self.config.rounds.num_rounds,
            closed_by,
            len(r.reported),
            len(r.record.selected),
            self._quorum(len(r.record.selected)),
            self.clock() - r.record.opened_at,
            time.monotonic() - t0,
            f"round {next_round.round} opened" if next_round else "run finished",
        )
        self._cond.notify_all()

    # -- routing and views -------------------------------------------------------------------
    def route(
        self,
        caller: str,
        descriptor: Descriptor | None,
        *,
        include_model: bool,
        labels: Mapping[str, str] | None = None,
        summaries: Mapping[str, np.ndarray] | None = None,
    ) -> RouteStream:
        """The clusters serving an unseen sequence and, optionally, their averaged model."""
        self._check_summary_values(summaries or {})
        with self._cond:
            if caller in self._robots:
                self._touch(caller)
            strategy = self._require_strategy()
            if descriptor is not None:
                self._check_descriptor("", descriptor)
            route_fn: Callable[..., RouteDecision] = strategy.route
            kwargs: dict[str, Any] = {}
            accepted = inspect.signature(route_fn).parameters
            for name, value in (("labels", labels), ("extra", summaries)):
                if value:
                    if name not in accepted:
                        raise FailedPreconditionError(
                            f"strategy {strategy.name} routes by descriptor only; drop {name}"
                        )
                    kwargs[name] = dict(value)
            try:
                decision = route_fn(descriptor, **kwargs)
            except ValueError as exc:
                raise InvalidArgumentError(f"cannot route: {exc}") from exc
        layout = Layout.of({STATE: decision.state}) if include_model else None
        header = RouteHeader(
            tuple(int(k) for k in decision.clusters),
            tuple(float(w) for w in decision.weights),
            layout,
        )
        return RouteStream(
            header, self._payload([decision.state] if include_model else [], caller)
        )

    def cluster_map(self) -> ClusterMap:
        with self._cond:
            s = self._strategy
            name = self.config.strategy.name
            if not isinstance(s, ClusteredStrategy):
                return ClusterMap(clustered=False, strategy=name)
            ids = [c.cid for c in s.clients]
            clusters = tuple(tuple(ids[int(j)] for j in np.flatnonzero(row)) for row in s.M_star)
            tau = getattr(s, "tau", None)
            return ClusterMap(True, name, None if tau is None else float(tau), clusters)

    def fleet_status(self) -> FleetStatus:
        with self._cond:
            now = time.monotonic()
            r = self._round
            selected = set(r.record.selected) if r else set()
            counts: dict[str, int] = {}
            for h in self._history:
                for rid in h.reported:
                    counts[rid] = counts.get(rid, 0) + 1
            robots = tuple(
                RobotStatus(
                    robot_id=rid,
                    num_samples=rec.num_samples,
                    labels=dict(rec.labels),
                    has_descriptor=rec.descriptor is not None,
                    member=rid in self._member_set,
                    clusters=self._clusters_of(rid),
                    selected=rid in selected,
                    reported=r is not None and rid in r.reported,
                    updates_accepted=counts.get(rid, 0),
                    last_seen_s=now - self._last_seen[rid] if rid in self._last_seen else -1.0,
                )
                for rid, rec in sorted(self._robots.items())
            )
            history = tuple(
                RoundSummary(
                    round=h.round,
                    selected=len(h.selected),
                    accepted=len(h.reported),
                    duration_s=(h.closed_at or h.opened_at) - h.opened_at,
                    closed_by=h.closed_by,
                )
                for h in self._history
            )
            return FleetStatus(
                phase=self.phase,
                strategy=self.config.strategy.name,
                round=r.record.round if r else self._rounds_done,
                num_rounds=self.config.rounds.num_rounds,
                min_robots=self.config.rounds.min_robots,
                deadline_unix=r.record.deadline if r else 0.0,
                quorum=self._quorum(len(selected)) if r else 0,
                robots=robots,
                history=history,
                model_card=self.model_card,
            )

    def final_states(self) -> dict[str, State]:
        """Every member's current model (for tests and tools running in-process)."""
        with self._cond:
            s = self._require_strategy()
            return {rid: dict(s.model_for(rid)) for rid in self._members}
