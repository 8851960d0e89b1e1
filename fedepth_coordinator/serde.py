"""Conversions between the generated protobuf messages and fedepth / coordinator types.

Generated types stop here: the servicer and the client call these functions and everything
else speaks :mod:`fedepth_coordinator.domain`, :class:`fedepth.descriptor.Descriptor` and numpy.
Malformed input raises :class:`~fedepth_coordinator.errors.InvalidArgumentError`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedepth.descriptor import Descriptor
from fedepth.recipe import TrainRecipe
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2 as pb
from fedepth_coordinator.domain import (
    ClusterComposition,
    ClusterMap,
    CoMemberShares,
    DescriptorAck,
    FleetStatus,
    ModelHeader,
    Phase,
    PlanAction,
    Registration,
    RobotStatus,
    RoundPlan,
    RoundSummary,
    RouteHeader,
    UpdateHeader,
    UploadReceipt,
)
from fedepth_coordinator.errors import InvalidArgumentError, shown
from fedepth_coordinator.tensors import STATE, Group, Layout, TensorSpec

_PHASES = {
    Phase.WAITING_FOR_FLEET: pb.PHASE_WAITING_FOR_FLEET,
    Phase.TRAINING: pb.PHASE_TRAINING,
    Phase.FINISHED: pb.PHASE_FINISHED,
}
_PHASES_BACK = {v: k for k, v in _PHASES.items()}
_ACTIONS = {
    PlanAction.WAIT: pb.PLAN_ACTION_WAIT,
    PlanAction.TRAIN: pb.PLAN_ACTION_TRAIN,
    PlanAction.FINISHED: pb.PLAN_ACTION_FINISHED,
}
_ACTIONS_BACK = {v: k for k, v in _ACTIONS.items()}


def _phase(value: int) -> Phase:
    try:
        return _PHASES_BACK[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgumentError(f"unknown phase {value}") from None


# -- tensors ------------------------------------------------------------------------------------
def spec_to_pb(spec: TensorSpec) -> pb.TensorSpec:
    return pb.TensorSpec(name=spec.name, dtype=spec.dtype, shape=list(spec.shape))


def spec_from_pb(msg: pb.TensorSpec) -> TensorSpec:
    if not msg.name:
        raise InvalidArgumentError("a tensor has an empty name")
    return TensorSpec(msg.name, msg.dtype, tuple(int(d) for d in msg.shape))


def group_to_pb(group: Group) -> pb.TensorGroup:
    return pb.TensorGroup(name=group.name, tensors=[spec_to_pb(t) for t in group.tensors])


def group_from_pb(msg: pb.TensorGroup, name: str | None = None) -> Group:
    return Group(name if name is not None else msg.name, tuple(map(spec_from_pb, msg.tensors)))


def layout_to_pb(layout: Layout) -> tuple[pb.TensorGroup, list[pb.TensorGroup]]:
    """(the ``state`` group, the other groups) of a layout whose first group is the state."""
    if not layout.groups or layout.groups[0].name != STATE:
        raise ValueError(f"a payload layout starts with the {STATE!r} group")
    return group_to_pb(layout.groups[0]), [group_to_pb(g) for g in layout.groups[1:]]


def layout_from_pb(state: pb.TensorGroup, others: list[pb.TensorGroup] | None = None) -> Layout:
    groups = [group_from_pb(state, STATE)] + [group_from_pb(g) for g in others or ()]
    for g in groups[1:]:
        if g.name == STATE:
            raise InvalidArgumentError(f"only the first group may be named {STATE!r}")
    return Layout(tuple(groups))


def inline_to_pb(tensors: Mapping[str, np.ndarray]) -> list[pb.InlineTensor]:
    out = []
    for name, array in tensors.items():
        a = np.ascontiguousarray(array)
        spec = TensorSpec.of(name, a)
        out.append(pb.InlineTensor(spec=spec_to_pb(spec), data=a.astype(spec.np_dtype).tobytes()))
    return out


def inline_from_pb(items: list[pb.InlineTensor]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for item in items:
        spec = spec_from_pb(item.spec)
        if spec.name in out:
            raise InvalidArgumentError(f"summary {shown(spec.name)} is sent twice")
        if len(item.data) != spec.nbytes:
            raise InvalidArgumentError(
                f"summary {shown(spec.name)}: {len(item.data)} bytes for {spec.dtype}"
                f"{list(spec.shape)}, which needs {spec.nbytes}"
            )
        out[spec.name] = np.frombuffer(item.data, spec.np_dtype).reshape(spec.shape).copy()
    return out


# -- descriptors --------------------------------------------------------------------------------
def descriptor_to_pb(d: Descriptor) -> pb.Descriptor:
    return pb.Descriptor(mean=d.mean.tolist(), var=d.var.tolist(), num_frames=d.num_frames)


def descriptor_from_pb(msg: pb.Descriptor) -> Descriptor:
    """The descriptor of a message; INVALID_ARGUMENT when :func:`check_descriptor` refuses it."""
    mean = np.asarray(msg.mean, dtype=np.float64)
    var = np.asarray(msg.var, dtype=np.float64)
    try:
        return Descriptor(mean=mean, var=var, num_frames=int(msg.num_frames))
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc


# -- training recipe ----------------------------------------------------------------------------
def recipe_to_pb(r: TrainRecipe) -> pb.TrainRecipe:
    msg = pb.TrainRecipe(
        local_steps=r.local_steps,
        batch_size=r.batch_size,
        optimizer=r.optimizer,
        lr=r.lr,
        weight_decay=r.weight_decay,
        momentum=r.momentum,
        schedule=r.schedule,
        warmup_steps=r.warmup_steps,
        final_lr_fraction=r.final_lr_fraction,
        image_height=r.image_size[0],
        image_width=r.image_size[1],
        flip=r.flip,
        seed=r.seed,
    )
    if r.grad_clip is not None:
        msg.grad_clip = r.grad_clip
    if r.variance_focus is not None:
        msg.variance_focus = r.variance_focus
    return msg


def recipe_from_pb(msg: pb.TrainRecipe) -> TrainRecipe:
    try:
        return TrainRecipe(
            local_steps=int(msg.local_steps),
            batch_size=int(msg.batch_size),
            optimizer=msg.optimizer,  # type: ignore[arg-type]
            lr=msg.lr,
            weight_decay=msg.weight_decay,
            momentum=msg.momentum,
            grad_clip=msg.grad_clip if msg.HasField("grad_clip") else None,
            schedule=msg.schedule,  # type: ignore[arg-type]
            warmup_steps=int(msg.warmup_steps),
            final_lr_fraction=msg.final_lr_fraction,
            image_size=(int(msg.image_height), int(msg.image_width)),
            flip=bool(msg.flip),
            seed=int(msg.seed),
            variance_focus=msg.variance_focus if msg.HasField("variance_focus") else None,
        )
    except ValueError as exc:
        raise InvalidArgumentError(f"invalid training recipe: {exc}") from exc


# -- answers ------------------------------------------------------------------------------------
def registration_to_pb(r: Registration) -> pb.RegisterReply:
    return pb.RegisterReply(
        phase=_PHASES[r.phase],
        member=r.member,
        model_card=r.model_card or "",
        summaries=list(r.summaries),
    )


def registration_from_pb(msg: pb.RegisterReply) -> Registration:
    return Registration(
        _phase(msg.phase), msg.member, msg.model_card or None, tuple(msg.summaries)
    )


def ack_to_pb(a: DescriptorAck) -> pb.UploadDescriptorReply:
    return pb.UploadDescriptorReply(
        phase=_PHASES[a.phase], member=a.member, clusters=list(a.clusters)
    )


def ack_from_pb(msg: pb.UploadDescriptorReply) -> DescriptorAck:
    return DescriptorAck(_phase(msg.phase), msg.member, tuple(msg.clusters))


def plan_to_pb(p: RoundPlan) -> pb.RoundPlan:
    return pb.RoundPlan(
        action=_ACTIONS[p.action],
        phase=_PHASES[p.phase],
        round=p.round,
        num_rounds=p.num_rounds,
        deadline_unix=p.deadline_unix,
        model_bytes=p.model_bytes,
        reason=p.reason,
    )


def plan_from_pb(msg: pb.RoundPlan) -> RoundPlan:
    action = _ACTIONS_BACK.get(msg.action)
    if action is None:
        raise InvalidArgumentError(f"unknown plan action {msg.action}")
    return RoundPlan(
        action=action,
        phase=_phase(msg.phase),
        round=msg.round,
        num_rounds=msg.num_rounds,
        deadline_unix=msg.deadline_unix,
        model_bytes=msg.model_bytes,
        reason=msg.reason,
    )


def model_header_to_pb(h: ModelHeader) -> pb.DownloadHeader:
    state, hook_state = layout_to_pb(h.layout)
    msg = pb.DownloadHeader(
        round=h.round,
        hook=h.hook or "",
        hook_params=dict(h.hook_params),
        state=state,
        hook_state=hook_state,
        total_bytes=h.layout.total_bytes,
    )
    if h.recipe is not None:
        msg.recipe.CopyFrom(recipe_to_pb(h.recipe))
    if h.card:
        msg.model_card = h.card
    return msg


def model_header_from_pb(msg: pb.DownloadHeader) -> ModelHeader:
    layout = layout_from_pb(msg.state, list(msg.hook_state))
    if layout.total_bytes != msg.total_bytes:
        raise InvalidArgumentError(
            f"download header announces {msg.total_bytes} bytes, its tensors take "
            f"{layout.total_bytes}"
        )
    recipe = recipe_from_pb(msg.recipe) if msg.HasField("recipe") else None
    return ModelHeader(
        msg.round, layout, msg.hook or None, dict(msg.hook_params), recipe, msg.model_card or None
    )


def update_header_to_pb(h: UpdateHeader) -> pb.UploadHeader:
    state, extra = layout_to_pb(h.layout)
    return pb.UploadHeader(
        robot_id=h.robot_id,
        round=h.round,
        num_samples=h.num_samples,
        num_steps=h.num_steps,
        metrics=dict(h.metrics),
        state=state,
        extra=extra,
        total_bytes=h.layout.total_bytes,
    )


def update_header_from_pb(msg: pb.UploadHeader) -> UpdateHeader:
    layout = layout_from_pb(msg.state, list(msg.extra))
    if layout.total_bytes != msg.total_bytes:
        raise InvalidArgumentError(
            f"upload header announces {msg.total_bytes} bytes, its tensors take "
            f"{layout.total_bytes}"
        )
    return UpdateHeader(
        robot_id=msg.robot_id,
        round=msg.round,
        num_samples=msg.num_samples,
        layout=layout,
        num_steps=msg.num_steps,
        metrics=dict(msg.metrics),
    )


def receipt_to_pb(r: UploadReceipt) -> pb.UploadUpdateReply:
    return pb.UploadUpdateReply(round=r.round, accepted=r.accepted, selected=r.selected)


def receipt_from_pb(msg: pb.UploadUpdateReply) -> UploadReceipt:
    return UploadReceipt(msg.round, msg.accepted, msg.selected)


def route_header_to_pb(h: RouteHeader) -> pb.RouteHeader:
    msg = pb.RouteHeader(clusters=list(h.clusters), weights=list(h.weights))
    if h.layout is not None:
        msg.state.CopyFrom(layout_to_pb(h.layout)[0])
        msg.total_bytes = h.layout.total_bytes
    return msg


def route_header_from_pb(msg: pb.RouteHeader) -> RouteHeader:
    layout = layout_from_pb(msg.state) if msg.HasField("state") else None
    return RouteHeader(tuple(msg.clusters), tuple(msg.weights), layout)


def cluster_map_to_pb(c: ClusterMap) -> pb.ClusterMap:
    msg = pb.ClusterMap(
        clustered=c.clustered,
        strategy=c.strategy,
        clusters=[pb.Cluster(index=k, members=list(m)) for k, m in enumerate(c.clusters)],
    )
    if c.tau is not None:
        msg.tau = c.tau
    return msg


def cluster_map_from_pb(msg: pb.ClusterMap) -> ClusterMap:
    clusters = tuple(tuple(c.members) for c in sorted(msg.clusters, key=lambda c: c.index))
    tau = msg.tau if msg.HasField("tau") else None
    return ClusterMap(msg.clustered, msg.strategy, tau, clusters)


def _composition_to_pb(c: ClusterComposition) -> pb.ClusterComposition:
    return pb.ClusterComposition(
        index=c.index, members=list(c.members), counts=dict(c.counts), label=c.label
    )


def _composition_from_pb(msg: pb.ClusterComposition) -> ClusterComposition:
    # a map has no order on the wire: most first again (ties by name)
    counts = dict(sorted(msg.counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return ClusterComposition(msg.index, tuple(msg.members), counts, msg.label)


def _shares_to_pb(c: CoMemberShares) -> pb.CoMemberShares:
    msg = pb.CoMemberShares(alone=c.alone)
    for key in ("platform", "environment", "both"):
        value = getattr(c, key)
        if value is not None:
            setattr(msg, key, value)
    return msg


def _shares_from_pb(msg: pb.CoMemberShares) -> CoMemberShares:
    def get(key: str) -> float | None:
        return float(getattr(msg, key)) if msg.HasField(key) else None

    return CoMemberShares(get("platform"), get("environment"), get("both"), msg.alone)


def fleet_to_pb(f: FleetStatus) -> pb.FleetStatus:
    msg = pb.FleetStatus(
        phase=_PHASES[f.phase],
        strategy=f.strategy,
        round=f.round,
        num_rounds=f.num_rounds,
        min_robots=f.min_robots,
        deadline_unix=f.deadline_unix,
        quorum=f.quorum,
        robots=[
            pb.RobotStatus(
                robot_id=r.robot_id,
                labels=dict(r.labels),
                num_samples=r.num_samples,
                has_descriptor=r.has_descriptor,
                member=r.member,
                clusters=list(r.clusters),
                selected=r.selected,
                reported=r.reported,
                updates_accepted=r.updates_accepted,
                last_seen_s=r.last_seen_s,
            )
            for r in f.robots
        ],
        model_card=f.model_card or "",
        history=[
            pb.RoundSummary(
                round=h.round,
                selected=h.selected,
                accepted=h.accepted,
                duration_s=h.duration_s,
                closed_by=h.closed_by,
            )
            for h in f.history
        ],
        clusters=[_composition_to_pb(c) for c in f.clusters],
    )
    if f.co_members is not None:
        msg.co_members.CopyFrom(_shares_to_pb(f.co_members))
    return msg


def fleet_from_pb(msg: pb.FleetStatus) -> FleetStatus:
    return FleetStatus(
        phase=_phase(msg.phase),
        strategy=msg.strategy,
        round=msg.round,
        num_rounds=msg.num_rounds,
        min_robots=msg.min_robots,
        deadline_unix=msg.deadline_unix,
        quorum=msg.quorum,
        robots=tuple(
            RobotStatus(
                robot_id=r.robot_id,
                num_samples=r.num_samples,
                labels=dict(r.labels),
                has_descriptor=r.has_descriptor,
                member=r.member,
                clusters=tuple(r.clusters),
                selected=r.selected,
                reported=r.reported,
                updates_accepted=r.updates_accepted,
                last_seen_s=r.last_seen_s,
            )
            for r in msg.robots
        ),
        history=tuple(
            RoundSummary(h.round, h.selected, h.accepted, h.duration_s, h.closed_by)
            for h in msg.history
        ),
        model_card=msg.model_card or None,
        clusters=tuple(
            _composition_from_pb(c) for c in sorted(msg.clusters, key=lambda c: c.index)
        ),
        co_members=_shares_from_pb(msg.co_members) if msg.HasField("co_members") else None,
    )
