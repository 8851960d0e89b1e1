"""Issue 14: attacks by one robot on a real coordinator; each is rejected (its status code), the
state is left alone, and honest robots are still served."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import grpc
import numpy as np
import pytest
import yaml

from fedepth.clustering import subspace_basis
from fedepth.descriptor import Descriptor
from fedepth.strategies import ClientUpdate
from fedepth.strategies.pacfl import PACFL
from fedepth_coordinator import serde, wire
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2 as pb
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2_grpc as pb_grpc
from fedepth_coordinator.auth import call_metadata
from fedepth_coordinator.cli import main as cli_main
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient, open_channel
from fedepth_coordinator.config import CoordinatorConfig, to_dict
from fedepth_coordinator.domain import UpdateHeader
from fedepth_coordinator.robot import RobotLoop
from fedepth_coordinator.server import CoordinatorServer, running
from fedepth_coordinator.simulate import deterministic_train, robot_ids, robot_profile
from fedepth_coordinator.state import SqliteStore
from fedepth_coordinator.state.base import StateError
from fedepth_coordinator.tensors import Layout, iter_chunks

ROBOTS = robot_ids(4)
A, B = ROBOTS[0], ROBOTS[1]
MALLORY = "robot-005"  # has credentials; not one of the honest ROBOTS


@dataclass
class World:
    """A formed fleet in round 0 (robots A..D registered with a descriptor)."""

    server: CoordinatorServer
    clients: dict[str, CoordinatorClient]
    channel: grpc.Channel
    stub: pb_grpc.CoordinatorStub
    tokens: dict[str, str]

    def md(self, principal: str = B) -> tuple[tuple[str, str], ...]:
        return call_metadata(principal, self.tokens[principal])

    def update(self, rid: str = B) -> ClientUpdate:
        task = self.clients[rid].download_model(0).task
        return deterministic_train(rid, robot_profile(rid).num_samples)(0, task)

    def upload_raw(
        self,
        update: ClientUpdate,
        *,
        extra: dict[str, dict[str, np.ndarray]] | None = None,
        **hdr: Any,
    ) -> Any:
        groups = {"state": dict(update.state), **(extra or {})}
        header = UpdateHeader(update.cid, 0, update.num_samples, Layout.of(groups))
        msg = serde.update_header_to_pb(replace(header, **hdr))

        def messages() -> Iterator[Any]:
            yield pb.UploadMessage(header=msg)
            yield from iter_chunks(list(groups.values()), 4096, frame=wire.frame)

        upload = self.channel.stream_unary(
            "/fedepth.v1.Coordinator/UploadUpdate",
            request_serializer=wire.serialize,
            response_deserializer=pb.UploadUpdateReply.FromString,
        )
        return upload(messages(), metadata=self.md(update.cid), timeout=20)

    def snapshot(self) -> tuple[Any, ...]:
        status = self.server.coordinator.fleet_status()
        robots = tuple(replace(r, last_seen_s=0.0) for r in status.robots)
        snap = self.server.store.load()
        return (
            replace(status, robots=robots),
            snap.updates,
            snap.robots.__repr__(),
            self.server.store.blob_keys(),
        )

    def honest_robots_are_served(self, expected_accepted: int = 1) -> None:
        assert self.clients[A].health() == "SERVING"
        receipt = self.clients[A].upload_update(0, self.update(A))
        assert receipt.accepted == expected_accepted

    def refused(
        self, err: grpc.RpcError, code: grpc.StatusCode, says: str, before: tuple[Any, ...]
    ) -> None:
        """The attack got ``code`` with ``says`` in its details, left the state as ``before``
        and honest robots are still served."""
        assert err.code() == code, err.details()
        assert says in (err.details() or "")
        assert self.snapshot() == before
        self.honest_robots_are_served()


@pytest.fixture
def world_factory(
    config_factory: Callable[..., CoordinatorConfig], creds: Any
) -> Iterator[Callable[..., World]]:
    stack: list[tuple[Any, grpc.Channel]] = []

    def factory(
        *,
        first: Callable[[CoordinatorClient], None] | None = None,
        summaries: Callable[[str], dict[str, np.ndarray]] | None = None,
        **sections: dict[str, Any],
    ) -> World:
        """A formed fleet; ``first`` runs as the attacker (MALLORY) before anyone registers."""
        sections.setdefault("rounds", {"num_rounds": 2, "min_robots": 4})
        ctx = running(config_factory(**sections))
        server = ctx.__enter__()
        channel = open_channel(f"127.0.0.1:{server.port}")
        stack.append((ctx, channel))
        if first is not None:
            first(CoordinatorClient(channel, MALLORY, creds.tokens[MALLORY]))
        clients = {r: CoordinatorClient(channel, r, creds.tokens[r]) for r in ROBOTS}
        for rid, client in clients.items():
            p = robot_profile(rid)
            client.register(p.num_samples, p.labels)
            client.upload_descriptor(p.descriptor, summaries(rid) if summaries else None)
        return World(server, clients, channel, pb_grpc.CoordinatorStub(channel), creds.tokens)

    yield factory
    for ctx, channel in reversed(stack):
        channel.close()
        ctx.__exit__(None, None, None)


@pytest.fixture
def world(world_factory: Callable[..., World]) -> World:
    return world_factory()


def _rejected(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


# -- (1) GetRoundPlan wait_s NaN / inf / negative ------------------------------------------------
@pytest.mark.parametrize("wait_s", [math.nan, math.inf, -math.inf, -1.0])
def test_round_plan_with_non_finite_or_negative_wait_is_rejected_without_spinning(
    wait_s: float, world: World
) -> None:
    before = world.snapshot()
    cpu0, t0 = time.process_time(), time.monotonic()
    err = _rejected(
        lambda: world.stub.GetRoundPlan(
            pb.GetRoundPlanRequest(robot_id=B, after_round=0, wait_s=wait_s),
            metadata=world.md(),
            timeout=10,
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "wait_s must be a finite number" in (err.details() or "")
    assert time.monotonic() - t0 < 5.0
    assert time.process_time() - cpu0 < 2.0  # no server thread left spinning
    assert world.snapshot() == before
    world.honest_robots_are_served()


# -- (4) the sample count in the upload header is not trusted -------------------------------------
def test_inflated_sample_count_is_weighted_by_the_registered_count(world: World) -> None:
    registered = robot_profile(B).num_samples
    world.upload_raw(world.update(), num_samples=10**12)
    (rec,) = [u for u in world.server.store.load().updates if u.robot_id == B]
    assert rec.num_samples == registered
    world.honest_robots_are_served(expected_accepted=2)


def test_inflated_sample_count_is_rejected_in_strict_mode(
    world_factory: Callable[..., World],
) -> None:
    world = world_factory(validation={"sample_weights": "strict"})
    before = world.snapshot()
    err = _rejected(lambda: world.upload_raw(world.update(), num_samples=10**12))
    world.refused(err, grpc.StatusCode.INVALID_ARGUMENT, "registered", before)
    world.upload_raw(world.update())  # the honest count is accepted


# -- (6) max_update_norm bounds every group, extras (SCAFFOLD control deltas) included -----------
@pytest.mark.parametrize("value", [3e38, np.inf])
def test_huge_control_delta_is_rejected_by_the_norm_bound(
    value: float, world_factory: Callable[..., World]
) -> None:
    world = world_factory(validation={"max_update_norm": 1e6})
    update = world.update()
    huge = {k: np.full_like(v, value) for k, v in update.state.items()}
    before = world.snapshot()
    err = _rejected(lambda: world.upload_raw(update, extra={"scaffold.control_delta": huge}))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "extra group 'scaffold.control_delta'" in (err.details() or "") or (
        "NaN or Inf" in (err.details() or "")
    )
    assert world.snapshot() == before
    world.honest_robots_are_served()
    small = {k: np.full_like(v, 1e-3) for k, v in update.state.items()}
    assert world.upload_raw(update, extra={"scaffold.control_delta": small}).accepted == 2


def test_per_group_norm_bound_overrides_max_update_norm(
    world_factory: Callable[..., World],
) -> None:
    world = world_factory(
        validation={"max_update_norm": 1e6, "max_group_norms": {"scaffold.control_delta": 0.5}}
    )
    update = world.update()
    delta = {k: np.full_like(v, 1e-2) for k, v in update.state.items()}  # norm ~2.2
    err = _rejected(lambda: world.upload_raw(update, extra={"scaffold.control_delta": delta}))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "exceeds the bound 0.5" in (err.details() or "")
    world.honest_robots_are_served()


# -- (7) one robot cannot stop the fleet from forming ---------------------------------------------
def _mallory_registers(client: CoordinatorClient) -> None:
    client.register(50, {})


def _descriptor(mean: float | list[float], var: float | list[float], dim: int = 8) -> Descriptor:
    m = np.broadcast_to(np.asarray(mean, dtype=np.float64), (dim,)).copy()
    v = np.broadcast_to(np.asarray(var, dtype=np.float64), (dim,)).copy()
    return Descriptor(mean=m, var=v, num_frames=4)


def test_first_descriptor_of_another_dimension_does_not_fix_the_fleets(
    world_factory: Callable[..., World],
) -> None:
    def first(mallory: CoordinatorClient) -> None:
        _mallory_registers(mallory)
        mallory.upload_descriptor(_descriptor(0.0, 1.0, dim=3))

    world = world_factory(first=first)
    status = world.server.coordinator.fleet_status()
    assert status.phase.name == "TRAINING"
    assert sorted(r.robot_id for r in status.robots if r.member) == ROBOTS
    before = world.snapshot()
    err = _rejected(
        lambda: world.stub.UploadDescriptor(
            pb.UploadDescriptorRequest(
                robot_id=MALLORY,
                descriptor=pb.Descriptor(mean=[0.0] * 3, var=[1.0] * 3, num_frames=4),
            ),
            metadata=world.md(MALLORY),
            timeout=20,
        )
    )
    world.refused(err, grpc.StatusCode.INVALID_ARGUMENT, "the fleet's have 8", before)


def test_configured_descriptor_dimension_rejects_any_other(
    world_factory: Callable[..., World],
) -> None:
    rejected: list[grpc.StatusCode] = []

    def first(mallory: CoordinatorClient) -> None:
        _mallory_registers(mallory)
        try:
            mallory.upload_descriptor(_descriptor(0.0, 1.0, dim=3))
        except CoordinatorCallError as exc:
            rejected.append(exc.code)

    world = world_factory(first=first, validation={"descriptor_dim": 8})
    assert rejected == [grpc.StatusCode.INVALID_ARGUMENT]
    assert world.server.coordinator.fleet_status().phase.name == "TRAINING"
    world.honest_robots_are_served()


@pytest.mark.parametrize(
    "mean, var", [(1e300, 1.0), (0.0, 1e-300), ([1e300, -1e300] * 4, 1e-300), (0.0, 1e300)]
)
def test_extreme_descriptor_is_rejected_and_the_fleet_still_forms(
    mean: float, var: float, world_factory: Callable[..., World]
) -> None:
    rejected: list[tuple[grpc.StatusCode, str]] = []

    def first(mallory: CoordinatorClient) -> None:
        _mallory_registers(mallory)
        try:
            mallory.upload_descriptor(_descriptor(mean, var))
        except CoordinatorCallError as exc:
            rejected.append((exc.code, exc.details))

    world = world_factory(first=first)
    assert [c for c, _ in rejected] == [grpc.StatusCode.INVALID_ARGUMENT]
    assert "validation.descriptor_bound" in rejected[0][1]
    assert world.server.coordinator.fleet_status().phase.name == "TRAINING"
    snap = world.server.store.load()
    assert next(r for r in snap.robots if r.robot_id == MALLORY).descriptor is None
    cmap = world.clients[A].cluster_map()
    assert cmap.clustered and sorted({m for c in cmap.clusters for m in c}) == ROBOTS
    world.honest_robots_are_served()


def _basis(rid: str, dim: int = 8, p: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(rid.encode()))
    return {"pacfl_basis": subspace_basis(rng.normal(size=(dim, 12)), p)}


@pytest.mark.parametrize(
    "basis",
    [np.ones((3, 8)), np.ones((8,)), np.ones((8, 9)), np.full((8, 2), 1.0), np.zeros((8, 0))],
    ids=["transposed", "1-d", "too many columns", "not orthonormal", "empty"],
)
def test_malformed_pacfl_basis_is_rejected_at_upload(
    basis: np.ndarray, world_factory: Callable[..., World]
) -> None:
    rejected: list[grpc.StatusCode] = []

    def first(mallory: CoordinatorClient) -> None:
        _mallory_registers(mallory)
        try:
            mallory.upload_descriptor(_descriptor(0.0, 1.0), {"pacfl_basis": basis})
        except CoordinatorCallError as exc:
            rejected.append(exc.code)

    world = world_factory(first=first, summaries=_basis, strategy={"name": "pacfl", "params": {}})
    assert rejected == [grpc.StatusCode.INVALID_ARGUMENT]
    status = world.server.coordinator.fleet_status()
    assert status.phase.name == "TRAINING"
    assert sorted(r.robot_id for r in status.robots if r.member) == ROBOTS
    world.honest_robots_are_served()


# -- (3) "already accepted" and "still streaming" are two status codes ---------------------------
def test_retry_while_the_first_upload_streams_is_aborted_not_already_exists(
    world: World,
) -> None:
    update = world.update()
    groups = {"state": dict(update.state)}
    header = UpdateHeader(B, 0, update.num_samples, Layout.of(groups))
    chunks = list(iter_chunks([update.state], 4096, frame=wire.frame))
    release = threading.Event()

    def stalled() -> Iterator[Any]:
        yield pb.UploadMessage(header=serde.update_header_to_pb(header))
        yield chunks[0]
        release.wait(20)
        yield from chunks[1:]

    upload = world.channel.stream_unary(
        "/fedepth.v1.Coordinator/UploadUpdate",
        request_serializer=wire.serialize,
        response_deserializer=pb.UploadUpdateReply.FromString,
    )
    first = upload.future(stalled(), metadata=world.md(B), timeout=30)
    deadline = time.monotonic() + 10
    while B not in getattr(world.server.coordinator._round, "uploading", ()):
        assert time.monotonic() < deadline, "the first upload never started"
        time.sleep(0.02)
    before = world.snapshot()
    err = _rejected(lambda: world.upload_raw(update))
    world.refused(err, grpc.StatusCode.ABORTED, "still in progress", before)
    release.set()
    assert first.result(timeout=20).accepted == 2
    err = _rejected(lambda: world.upload_raw(update))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "already uploaded" in (err.details() or "")


class _LyingClient(CoordinatorClient):
    """Answers the first upload with ALREADY_EXISTS without sending it (an ambiguous reply)."""

    lied = False

    def upload_update(self, round: int, update: ClientUpdate) -> Any:
        if not self.lied:
            self.lied = True
            raise CoordinatorCallError("UploadUpdate", grpc.StatusCode.ALREADY_EXISTS, "stale")
        return super().upload_update(round, update)


def test_robot_loop_counts_a_duplicate_only_once_the_coordinator_recorded_it(
    world: World, creds: Any
) -> None:
    client = _LyingClient(world.channel, B, creds.tokens[B])
    p = robot_profile(B)
    stop = threading.Event()
    loop = RobotLoop(client, p, deterministic_train(B, p.num_samples), stop=stop, poll_s=0.2)
    delivered: list[bool] = []
    update = world.update()
    delivered.append(loop._deliver(0, update))
    assert client.lied and delivered == [True]
    assert B in {u.robot_id for u in world.server.store.load().updates}
    world.honest_robots_are_served(expected_accepted=2)


# -- (8) a typo in the credentials file while running keeps the previous credentials --------------
@pytest.mark.parametrize(
    "broken",
    [
        "principals: {robot-000: {role: robot, token_sha256: [unclosed\n",  # YAML syntax
        "principals:\n  robot-000: {role: admiral, token_sha256: abc}\n",  # bad entry
        "- just\n- a list\n",
    ],
    ids=["yaml syntax", "bad entry", "not a mapping"],
)
def test_credentials_typo_while_running_keeps_the_previous_credentials(
    broken: str, world: World, creds: Any, caplog: pytest.LogCaptureFixture
) -> None:
    good = creds.path.read_text()
    before = world.snapshot()
    creds.path.write_text(broken)
    with caplog.at_level("ERROR", logger="fedepth_coordinator.auth"):
        for _ in range(3):
            assert world.clients[B].round_plan(0).round == 0
        # a wrong token is still refused under the kept credentials
        err = _rejected(
            lambda: world.stub.Register(
                pb.RegisterRequest(robot_id=B, num_samples=5),
                metadata=call_metadata(B, "not-the-token"),
                timeout=20,
            )
        )
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert world.snapshot() == before
        world.honest_robots_are_served()
    assert sum("keeping the previous" in r.message for r in caplog.records) == 1
    creds.path.write_text(good)
    token = creds.add("robot-new")  # the fixed file is picked up again
    reg = CoordinatorClient(world.channel, "robot-new", token).register(10, {})
    assert not reg.member


# -- (2) idle streams time out on the server; one robot cannot hold every transfer slot ----------
def _download_header_only(world: World, rid: str) -> Any:
    call = world.stub.DownloadModel(
        pb.DownloadModelRequest(robot_id=rid, round=0), metadata=world.md(rid)
    )
    first = next(call)
    assert first.WhichOneof("body") == "header"
    return call


def test_one_robot_cannot_hold_every_transfer_slot(world_factory: Callable[..., World]) -> None:
    world = world_factory(
        server={"max_transfers": 4, "max_transfers_per_robot": 2, "stream_idle_s": 30.0},
        model={"synthetic": {"num_tensors": 4, "size_mb": 16.0}},
    )
    held = [_download_header_only(world, B) for _ in range(2)]
    before = world.snapshot()
    err = _rejected(lambda: _download_header_only(world, B))
    world.refused(err, grpc.StatusCode.RESOURCE_EXHAUSTED, "max_transfers_per_robot", before)
    for call in held:
        call.cancel()
    deadline = time.monotonic() + 10
    while world.server.coordinator._streams.get(B):
        assert time.monotonic() < deadline, "cancelled downloads kept their slots"
        time.sleep(0.05)
    assert world.update().cid == B  # B may download again


def test_download_reading_only_the_header_is_cancelled_when_idle(
    world_factory: Callable[..., World],
) -> None:
    world = world_factory(
        server={"max_transfers": 1, "stream_idle_s": 1.0},
        model={"synthetic": {"num_tensors": 4, "size_mb": 16.0}},
    )
    call = _download_header_only(world, B)  # holds the only transfer slot
    before = world.snapshot()
    t0 = time.monotonic()
    world.honest_robots_are_served()  # waits for the slot, which the idle watch frees
    assert time.monotonic() - t0 < 15
    err = _rejected(lambda: list(call))
    assert err.code() == grpc.StatusCode.CANCELLED
    assert world.snapshot()[2] == before[2]


def test_slowloris_upload_without_deadline_is_cancelled_when_idle(
    world_factory: Callable[..., World],
) -> None:
    world = world_factory(server={"stream_idle_s": 1.0})
    update = world.update()
    header = UpdateHeader(B, 0, update.num_samples, Layout.of({"state": dict(update.state)}))
    chunks = list(iter_chunks([update.state], 4096, frame=wire.frame))
    stop = threading.Event()

    def slow() -> Iterator[Any]:
        yield pb.UploadMessage(header=serde.update_header_to_pb(header))
        yield chunks[0]
        stop.wait(30)

    upload = world.channel.stream_unary(
        "/fedepth.v1.Coordinator/UploadUpdate",
        request_serializer=wire.serialize,
        response_deserializer=pb.UploadUpdateReply.FromString,
    )
    before = world.snapshot()
    t0 = time.monotonic()
    err = _rejected(lambda: upload(slow(), metadata=world.md(B)))  # no deadline
    stop.set()
    assert err.code() == grpc.StatusCode.CANCELLED, err.details()
    assert time.monotonic() - t0 < 10
    assert world.snapshot() == before
    world.honest_robots_are_served()
    assert world.upload_raw(update).accepted == 2  # B's own retry is taken


# -- (5) losing state.db never deletes the blobs: the coordinator refuses to start --------------
def _state_with_a_run(config: CoordinatorConfig, creds: Any) -> list[str]:
    """Run a fleet into round 0 with one accepted update; the blob keys left in the state."""
    with running(config) as server:
        channel = open_channel(f"127.0.0.1:{server.port}")
        clients = {r: CoordinatorClient(channel, r, creds.tokens[r]) for r in ROBOTS}
        for rid, c in clients.items():
            p = robot_profile(rid)
            c.register(p.num_samples, p.labels)
            c.upload_descriptor(p.descriptor)
        task = clients[A].download_model(0).task
        clients[A].upload_update(0, deterministic_train(A, 10)(0, task))
        blobs = server.store.blob_keys()
        channel.close()
    assert any(k.startswith("upd-") for k in blobs) and "initial" in blobs
    return blobs


def _files(directory: Any) -> dict[str, bytes]:
    """The blob files under ``directory`` and their bytes."""
    found = [p for p in directory.rglob("*") if p.suffix == ".safetensors"]
    return {str(p.relative_to(directory)): p.read_bytes() for p in found}


def test_lost_state_db_refuses_to_start_and_names_the_blobs(
    config_factory: Callable[..., CoordinatorConfig], creds: Any, tmp_path: Any
) -> None:
    config = config_factory()
    _state_with_a_run(config, creds)
    state = tmp_path / "state"
    blobs = _files(state)
    for f in state.glob("state.db*"):
        f.unlink()  # the database is lost
    with pytest.raises(StateError) as err:
        CoordinatorServer(config)
    msg = str(err.value)
    assert "state.db is missing" in msg and "initial.safetensors" in msg and "backup" in msg
    assert _files(state) == blobs and not (state / "state.db").exists()  # nothing touched


def test_replaced_state_db_refuses_to_start_unless_told_to_quarantine(
    config_factory: Callable[..., CoordinatorConfig],
    creds: Any,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = config_factory()
    blobs = _state_with_a_run(config, creds)
    state = tmp_path / "state"
    files = _files(state)
    for f in state.glob("state.db*"):
        f.unlink()
    SqliteStore(tmp_path / "empty").close()  # a fresh database put in its place
    (tmp_path / "empty" / "state.db").replace(state / "state.db")
    with pytest.raises(StateError, match="has no record of") as err:
        CoordinatorServer(config)
    assert "state.unaccounted_blobs=quarantine" in str(err.value)
    assert _files(state) == files  # nothing moved or deleted

    config = config_factory(state={"unaccounted_blobs": "quarantine"})
    with caplog.at_level("WARNING"), running(config) as server:
        assert server.store.blob_keys() == []
        quarantined = sorted(
            p.name.removesuffix(".safetensors")
            for p in (state / "quarantine").glob("*.safetensors")
        )
        assert quarantined == blobs  # nothing deleted
        assert any("moved aside, not deleted" in r.message for r in caplog.records)
        channel = open_channel(f"127.0.0.1:{server.port}")
        c = CoordinatorClient(channel, A, creds.tokens[A])
        p = robot_profile(A)
        assert not c.register(p.num_samples, p.labels).member  # a fresh run can form
        assert c.health() == "SERVING"
        channel.close()


def test_corrupt_checkpoint_blob_refuses_to_start(
    config_factory: Callable[..., CoordinatorConfig], creds: Any, tmp_path: Any
) -> None:
    config = config_factory()
    blobs = _state_with_a_run(config, creds)
    (ckpt,) = [k for k in blobs if k.startswith("ckpt-")]
    path = tmp_path / "state" / "blobs" / f"{ckpt}.safetensors"
    data = bytearray(path.read_bytes())
    data[-8:] = np.full(2, np.nan, np.float32).tobytes()  # NaN bytes written on disk
    path.write_bytes(bytes(data))
    with pytest.raises(StateError, match=f"CorruptBlobError: blob '{ckpt}' is corrupt"):
        CoordinatorServer(config)
    assert path.read_bytes() == bytes(data)  # left for the operator to inspect


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_state_db_ends_in_one_cannot_start_line(
    damage: str,
    config_factory: Callable[..., CoordinatorConfig],
    creds: Any,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = config_factory()
    _state_with_a_run(config, creds)
    db = tmp_path / "state" / "state.db"
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x13" * len(data))
    file = tmp_path / "coordinator.yaml"
    file.write_text(yaml.safe_dump(to_dict(config)))
    with caplog.at_level("DEBUG"):
        assert cli_main(["--config", str(file)]) == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None
    msg = errors[0].getMessage()
    assert msg.startswith("cannot start: ") and "state.db" in msg and "backup" in msg
    assert "\n" not in msg


def test_corrupt_state_db_prints_no_traceback(
    config_factory: Callable[..., CoordinatorConfig], creds: Any, tmp_path: Any
) -> None:
    config = config_factory()
    _state_with_a_run(config, creds)
    (tmp_path / "state" / "state.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 8192)
    file = tmp_path / "coordinator.yaml"
    file.write_text(yaml.safe_dump(to_dict(config)))
    proc = subprocess.run(
        [sys.executable, "-m", "fedepth_coordinator", "--config", str(file)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "cannot start" in ln]
    assert len(lines) == 1 and "state.db" in lines[0], proc.stderr


# -- (10) a blob changed on disk after it was accepted is never aggregated or served ------------
def test_corrupt_accepted_update_blob_is_left_out_and_quarantined(
    world: World, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    world.upload_raw(world.update(B))
    key = next(u.blob for u in world.server.store.load().updates if u.robot_id == B)
    path = tmp_path / "state" / "blobs" / f"{key}.safetensors"
    data = bytearray(path.read_bytes())
    data[-64:] = np.full(16, np.nan, np.float32).tobytes()  # NaN bytes written on disk
    path.write_bytes(bytes(data))
    with caplog.at_level("ERROR", logger="fedepth_coordinator.handlers"):
        for rid in ROBOTS:
            if rid != B:
                world.clients[rid].upload_update(0, world.update(rid))  # closes round 0
    (closed,) = world.server.coordinator.fleet_status().history
    assert closed.accepted == len(ROBOTS) - 1  # B's corrupt update was not aggregated
    assert any(f"{key!r} is corrupt" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "state" / "quarantine" / f"{key}.safetensors").read_bytes() == data
    assert key not in world.server.store.blob_keys()
    for rid in ROBOTS:  # every served model is the honest aggregate: finite
        model = world.clients[rid].download_model(latest=True)
        assert model.round == 1
        assert all(np.isfinite(v).all() for v in model.task.state.values())


# -- (9) the duplicate tensor-name check of an upload header is linear ---------------------------
def test_huge_header_of_repeated_names_is_checked_in_linear_time() -> None:
    from fedepth_coordinator.errors import InvalidArgumentError
    from fedepth_coordinator.tensors import Group, TensorSpec

    specs = tuple(TensorSpec(f"t{i}", "F32", (1,)) for i in range(100_000))
    t0 = time.process_time()
    Layout((Group("state", specs),))
    with pytest.raises(InvalidArgumentError, match="repeats tensor names"):
        Layout((Group("state", specs + specs[:50_000]),))
    assert time.process_time() - t0 < 2.0


# -- (11) safe defaults, bounded echoes, exact id pattern -----------------------------------------
def test_plaintext_on_a_network_address_and_no_norm_bound_are_warned_at_start() -> None:
    from fedepth_coordinator.config import config_from_dict
    from fedepth_coordinator.server import startup_warnings

    # 0.0.0.0, no TLS, no norm bound (the default model is pretrained for depth)
    default = startup_warnings(config_from_dict({}))
    assert len(default) == 2
    assert "PLAINTEXT on 0.0.0.0" in default[0] and "tls.cert_file" in default[0]
    assert "server.host: 127.0.0.1" in default[0]
    assert "validation.max_update_norm" in default[1]
    # an untrained served model is warned about, the more so with a random encoder
    untrained = startup_warnings(config_from_dict({"model": {"pretrain": "none"}}))
    assert "serving newcrfs-lite untrained for depth" in untrained[2]
    assert "model.pretrain: small" in untrained[2] and "descriptor" not in untrained[2]
    random = {"model": {"pretrain": "none", "encoder_init": "random"}}
    assert "clusters and routes mean little" in startup_warnings(config_from_dict(random))[2]
    local = config_from_dict(
        {
            "server": {"host": "127.0.0.1"},
            "validation": {"max_update_norm": 10.0},
            "model": {"name": None},
        }
    )
    assert startup_warnings(local) == []
    ipv6 = {"server": {"host": "::1"}, "model": {"name": None}}
    assert len(startup_warnings(config_from_dict(ipv6))) == 1


def test_default_bind_logs_the_plaintext_warning_when_it_starts(
    config_factory: Callable[..., CoordinatorConfig], caplog: pytest.LogCaptureFixture
) -> None:
    config = config_factory(server={"host": "0.0.0.0"})
    with caplog.at_level("WARNING", logger="fedepth_coordinator.server"), running(config):
        pass
    assert sum("PLAINTEXT" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("rid", ["robot-000\n", "robot-000\n\n", "a" * 65, "robot 0"])
def test_robot_id_pattern_matches_the_whole_id(rid: str, creds: Any) -> None:
    from fedepth_coordinator.auth import add_principal
    from fedepth_coordinator.state.base import valid_id

    assert not valid_id(rid)
    with pytest.raises(ValueError, match="must match"):
        add_principal(creds.path, rid)
    assert valid_id("robot-000")


def test_route_summaries_obey_max_summary_bytes(world_factory: Callable[..., World]) -> None:
    world = world_factory(validation={"max_summary_bytes": 4096})
    big = serde.inline_to_pb({"pacfl_basis": np.zeros((64, 16))})  # 8 KiB
    before = world.snapshot()
    err = _rejected(
        lambda: list(
            world.stub.Route(
                pb.RouteRequest(
                    descriptor=serde.descriptor_to_pb(robot_profile(A).descriptor),
                    summaries=big,
                ),
                metadata=world.md(),
                timeout=20,
            )
        )
    )
    world.refused(err, grpc.StatusCode.RESOURCE_EXHAUSTED, "validation.max_summary_bytes", before)


def test_attacker_sized_ids_are_bounded_in_replies_and_logs(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    huge = "x" * 5000 + "\nFAKE LOG LINE"
    before = world.snapshot()
    with caplog.at_level("INFO"):
        err = _rejected(
            lambda: world.stub.Register(
                pb.RegisterRequest(robot_id=huge, num_samples=5), metadata=world.md(), timeout=20
            )
        )
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert len(err.details() or "") < 400 and "5014 characters" in (err.details() or "")
        err = _rejected(
            lambda: world.stub.Register(
                pb.RegisterRequest(robot_id=B, num_samples=5),
                metadata=call_metadata("y" * 5000, "bad"),
                timeout=20,
            )
        )
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert len(err.details() or "") < 400
    assert all(len(r.getMessage()) < 1000 for r in caplog.records)
    assert not any("FAKE LOG LINE" in r.getMessage() for r in caplog.records)
    assert world.snapshot() == before
    world.honest_robots_are_served()


# -- (9) one robot cannot exhaust the workers; formation runs outside the lock and is bounded ----
def test_one_robot_cannot_fill_every_worker_with_long_polls(
    world_factory: Callable[..., World],
) -> None:
    world = world_factory(server={"max_workers": 8, "max_calls_per_robot": 2, "max_wait_s": 10.0})
    polls = [
        world.stub.GetRoundPlan.future(
            pb.GetRoundPlanRequest(robot_id=B, after_round=0, wait_s=10.0),
            metadata=world.md(),
            timeout=30,
        )
        for _ in range(8)  # as many as there are workers
    ]
    t0 = time.monotonic()
    refused = []
    for f in polls:
        try:
            f.result(timeout=3)
        except grpc.FutureTimeoutError:
            continue  # still waiting: one of the two it may hold
        except grpc.RpcError as err:
            refused.append(err)
    assert len(refused) == 6, [e.details() for e in refused]
    assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refused)
    assert "server.max_calls_per_robot" in (refused[0].details() or "")
    assert world.server.call_limit.in_flight(B) == 2
    world.honest_robots_are_served()  # health answers, A downloads and uploads
    assert time.monotonic() - t0 < 10
    for f in polls:
        f.cancel()
    deadline = time.monotonic() + 10
    while world.server.call_limit.in_flight(B):
        assert time.monotonic() < deadline, "cancelled long polls kept their count"
        time.sleep(0.05)


def test_pacfl_basis_with_too_many_columns_is_rejected(
    world_factory: Callable[..., World],
) -> None:
    rejected: list[tuple[grpc.StatusCode, str]] = []

    def first(mallory: CoordinatorClient) -> None:
        _mallory_registers(mallory)
        try:
            mallory.upload_descriptor(_descriptor(0.0, 1.0), _basis(MALLORY, p=5))
        except CoordinatorCallError as exc:
            rejected.append((exc.code, exc.details))

    world = world_factory(
        first=first,
        summaries=_basis,
        strategy={"name": "pacfl", "params": {}},
        validation={"max_basis_columns": 4},
    )
    assert [c for c, _ in rejected] == [grpc.StatusCode.INVALID_ARGUMENT]
    assert "validation.max_basis_columns" in rejected[0][1]
    assert world.server.coordinator.fleet_status().phase.name == "TRAINING"
    world.honest_robots_are_served()


class _SlowPACFL(PACFL):
    """PACFL whose formation takes until ``release`` is set (a huge principal-angle matrix)."""

    started = threading.Event()
    release = threading.Event()

    def initialize(self, clients: Any, initial: Any) -> None:
        self.started.set()
        assert self.release.wait(30), "formation was never released"
        super().initialize(clients, initial)


def test_pacfl_formation_does_not_hold_the_lock_other_calls_need(
    config_factory: Callable[..., CoordinatorConfig], creds: Any
) -> None:
    config = config_factory(strategy={"name": "pacfl", "params": {}})
    _SlowPACFL.started.clear()
    _SlowPACFL.release.clear()
    with running(config, strategy_factory=_SlowPACFL) as server:
        channel = open_channel(f"127.0.0.1:{server.port}")
        clients = {r: CoordinatorClient(channel, r, creds.tokens[r]) for r in ROBOTS}
        for rid in ROBOTS:
            clients[rid].register(robot_profile(rid).num_samples, robot_profile(rid).labels)
        for rid in ROBOTS[:-1]:
            clients[rid].upload_descriptor(robot_profile(rid).descriptor, _basis(rid))
        last = ROBOTS[-1]
        acks: list[Any] = []
        forming = threading.Thread(
            target=lambda: acks.append(
                clients[last].upload_descriptor(robot_profile(last).descriptor, _basis(last))
            )
        )
        forming.start()
        assert _SlowPACFL.started.wait(20)
        try:
            t0 = time.monotonic()
            ops = CoordinatorClient(channel, "ops", creds.tokens["ops"])
            assert ops.fleet_status().phase.name == "WAITING_FOR_FLEET"
            assert clients[A].health() == "SERVING"
            mallory = CoordinatorClient(channel, MALLORY, creds.tokens[MALLORY])
            assert not mallory.register(50, {}).member  # not in the formation: served
            mallory.upload_descriptor(robot_profile(MALLORY).descriptor, _basis(MALLORY))
            assert time.monotonic() - t0 < 5  # none of them waited for the formation
            with pytest.raises(CoordinatorCallError) as err:  # B is being formed with
                clients[B].upload_descriptor(_descriptor(0.5, 1.0), _basis(B))
            assert err.value.code == grpc.StatusCode.ABORTED
        finally:
            _SlowPACFL.release.set()
        forming.join(30)
        assert acks and acks[0].member
        status = server.coordinator.fleet_status()
        assert status.phase.name == "TRAINING"
        members = sorted(r.robot_id for r in status.robots if r.member)
        assert members == sorted([*ROBOTS, MALLORY])  # MALLORY joined once it was formed
        channel.close()


# -- robust aggregation per cluster: a poisoned update cannot drag the cluster model -------------
def test_poisoned_update_is_outvoted_by_the_coordinate_median(
    world_factory: Callable[..., World],
) -> None:
    from fedepth.strategies.aggregate import coordinate_median

    world = world_factory(
        strategy={"name": "fedavg", "params": {}}, validation={"robust_aggregation": "median"}
    )
    updates = {rid: world.update(rid) for rid in ROBOTS}
    poisoned = {k: v + np.float32(1e6) for k, v in updates[B].state.items()}
    world.upload_raw(replace(updates[B], state=poisoned))
    for rid in ROBOTS:
        if rid != B:
            world.clients[rid].upload_update(0, updates[rid])
    expected = coordinate_median([poisoned if r == B else updates[r].state for r in ROBOTS])
    model = world.clients[A].download_model(latest=True)
    assert model.round == 1
    for name, value in model.task.state.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6)
        assert np.abs(value).max() < 1e3  # the honest values' range, not the attacker's


def test_robust_aggregation_with_a_strategy_of_its_own_rule_refuses_to_start(
    config_factory: Callable[..., CoordinatorConfig],
) -> None:
    config = config_factory(
        strategy={"name": "scaffold", "params": {}}, validation={"robust_aggregation": "median"}
    )
    with pytest.raises(ValueError, match="aggregates by its own rule"):
        CoordinatorServer(config)
