"""Plain types of the coordinator's requests and answers, shared by handlers, serde and client.

Generated protobuf types never leave :mod:`fedepth_coordinator.serde`; everything else (the
handlers, the client's return values, the fleet report) speaks these dataclasses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from fedepth.recipe import TrainRecipe
from fedepth_coordinator.tensors import Layout, iter_chunks


class Phase(StrEnum):
    """Where the run stands."""

    WAITING_FOR_FLEET = "waiting_for_fleet"
    TRAINING = "training"
    FINISHED = "finished"


class PlanAction(StrEnum):
    """What a robot should do next."""

    WAIT = "wait"
    TRAIN = "train"
    FINISHED = "finished"


@dataclass(frozen=True)
class Registration:
    phase: Phase
    member: bool
    #: the served model's card as JSON (``fedepth.models.ModelCard``); None: no card
    model_card: str | None = None
    #: the data summaries the served strategy needs (``Strategy.client_summaries``): a robot
    #: sends these with its descriptor and no others
    summaries: tuple[str, ...] = ()


@dataclass(frozen=True)
class DescriptorAck:
    phase: Phase
    member: bool
    clusters: tuple[int, ...] = ()


@dataclass(frozen=True)
class RoundPlan:
    action: PlanAction
    phase: Phase
    round: int
    num_rounds: int
    deadline_unix: float = 0.0
    model_bytes: int = 0
    reason: str = ""


@dataclass(frozen=True)
class ModelHeader:
    """What precedes a model download: the round, the client hook, the training recipe and the
    tensor layout.

    Group ``state`` is the model; any further groups are the hook's state (by name).
    ``recipe`` is None for a latest-model download (nothing to train).
    """

    round: int
    layout: Layout
    hook: str | None = None
    hook_params: Mapping[str, float] = field(default_factory=dict)
    recipe: TrainRecipe | None = None
    #: the served model's card as JSON (``fedepth.models.ModelCard``); None: no card
    card: str | None = None


@dataclass
class Payload:
    """Arrays whose bytes follow a header, in chunks of ``chunk_bytes``.

    With ``slots``, the chunks only flow while holding one of the coordinator's transfer slots,
    which bounds how many streams (and so how much buffered data) are in flight at once.
    """

    groups: list[Mapping[str, np.ndarray]]
    chunk_bytes: int
    slots: threading.Semaphore | None = None
    #: Called once when the stream ends or is abandoned (see :meth:`close`).
    on_close: Callable[[], None] | None = None

    def chunks(self, frame: Callable[[int], bytes] | None = None) -> Iterator[bytes]:
        try:
            if self.slots is None:
                yield from iter_chunks(self.groups, self.chunk_bytes, frame=frame)
                return
            with self.slots:
                yield from iter_chunks(self.groups, self.chunk_bytes, frame=frame)
        finally:
            self.close()

    def close(self) -> None:
        """Release what the stream holds (idempotent; also when :meth:`chunks` never ran)."""
        done, self.on_close = self.on_close, None
        if done is not None:
            done()


@dataclass
class ModelStream:
    """A download: its header, then the payload."""

    header: ModelHeader
    payload: Payload


@dataclass(frozen=True)
class UpdateHeader:
    """What precedes an uploaded update; group ``state`` first, then the algorithm extras."""

    robot_id: str
    round: int
    num_samples: int
    layout: Layout
    num_steps: int = 0
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class UploadReceipt:
    round: int
    accepted: int
    selected: int


@dataclass(frozen=True)
class RoundRelease:
    """What ReleaseRound did: ``released`` when the call opened ``round`` (False: it was open
    already)."""

    round: int
    released: bool


@dataclass(frozen=True)
class RouteHeader:
    clusters: tuple[int, ...]
    weights: tuple[float, ...]
    layout: Layout | None


@dataclass
class RouteStream:
    """The routing decision, then the routed model (an empty payload unless requested)."""

    header: RouteHeader
    payload: Payload


@dataclass(frozen=True)
class ClusterMap:
    clustered: bool
    strategy: str
    tau: float | None = None
    clusters: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class RobotStatus:
    robot_id: str
    num_samples: int
    labels: Mapping[str, str] = field(default_factory=dict)
    has_descriptor: bool = False
    member: bool = False
    clusters: tuple[int, ...] = ()
    selected: bool = False
    reported: bool = False
    updates_accepted: int = 0
    last_seen_s: float = -1.0


@dataclass(frozen=True)
class ClusterComposition:
    """One cluster by the labels its members declared at Register: ``counts`` of each
    ``platform/environment`` (most first; ``?`` for an undeclared label) and ``label``, the
    counts as one line (``"spot/forest x3, car/forest x1"``)."""

    index: int
    members: tuple[str, ...]
    counts: Mapping[str, int] = field(default_factory=dict)
    label: str = ""


@dataclass(frozen=True)
class CoMemberShares:
    """Mean over a clustered fleet's members of the share of their co-members (the other
    members of any cluster they belong to) that declared the same platform, environment, both
    (None: no member compares); ``alone``: members without co-members, left out."""

    platform: float | None = None
    environment: float | None = None
    both: float | None = None
    alone: int = 0


@dataclass(frozen=True)
class RoundSummary:
    round: int
    selected: int
    accepted: int
    duration_s: float
    closed_by: str


@dataclass(frozen=True)
class FleetStatus:
    phase: Phase
    strategy: str
    round: int
    num_rounds: int
    min_robots: int
    deadline_unix: float = 0.0
    quorum: int = 0
    robots: tuple[RobotStatus, ...] = ()
    history: tuple[RoundSummary, ...] = ()
    #: the served model's card as JSON (``fedepth.models.ModelCard``); None: no card
    model_card: str | None = None
    #: once a clustered strategy has formed the fleet: each cluster's composition
    clusters: tuple[ClusterComposition, ...] = ()
    #: and how alike its co-members are (None: no clusters)
    co_members: CoMemberShares | None = None
