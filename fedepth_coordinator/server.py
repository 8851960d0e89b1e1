"""Builds and runs the coordinator's gRPC server: service, auth, health, reflection, deadlines.

``with serve(config) as port:`` starts a server (port 0: a free port) and stops it on exit;
:class:`CoordinatorServer` is the same with the handler object exposed for in-process tools.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from safetensors.numpy import load_file

from fedepth.models import ModelCard, card_of, create_model, get_state, read_card, set_state
from fedepth.models.state import State
from fedepth.strategies import Strategy
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2 as pb
from fedepth_coordinator.auth import AuthInterceptor, CredentialStore
from fedepth_coordinator.config import CoordinatorConfig, ModelConfig, save_resolved
from fedepth_coordinator.handlers import Coordinator
from fedepth_coordinator.limits import CallLimitInterceptor
from fedepth_coordinator.servicer import CoordinatorServicer, add_to_server
from fedepth_coordinator.state import Store, open_store
from fedepth_coordinator.tensors import STATE

log = logging.getLogger(__name__)

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["Coordinator"].full_name


def synthetic_model(num_tensors: int, size_mb: float, seed: int = 0) -> State:
    """Deterministic float32 tensors of about ``size_mb`` MB in total (for trials and tests)."""
    rng = np.random.default_rng(seed)
    per = max(1, int(size_mb * 1e6 / 4 / num_tensors))
    return {
        f"layer{i}.weight": rng.standard_normal(per, dtype=np.float32) * 0.01
        for i in range(num_tensors)
    }


@dataclass(frozen=True)
class InitialModel:
    """The served starting model: its state, its card (None: no card) and where it came from."""

    state: State
    card: ModelCard | None
    source: str


def pretrained_weights(cfg: ModelConfig, input_size: tuple[int, int] | None) -> Path:
    """The checkpoint of a fresh ``cfg.name`` network pretrained for depth (``cfg.pretrain``):
    the benchmark's own pretraining on the synthetic HPE scenario's pretraining split at that
    profile, at ``input_size``, seeded by ``cfg.seed``; generated (that split alone) and
    trained here the first time (logged before and after), then taken from
    ``cfg.cache_dir``, where a benchmark's pretraining of the same settings serves too."""
    from fedepth.bench import BenchSpec, sim_config
    from fedepth.bench.inputs import ensure_data, ensure_weights
    from fedepth.data.scenario import load_scenario

    assert cfg.name is not None
    sim = sim_config(
        "hpe",
        cfg.pretrain,
        model=cfg.name,
        encoder_init=cfg.encoder_init,
        seed=cfg.seed,
        image_size=input_size,
        min_depth=cfg.min_depth,
        max_depth=cfg.max_depth,
    )
    cache = Path(cfg.cache_dir)
    spec = BenchSpec("hpe", cfg.pretrain, (), cache, sim, cache_dir=cache, progress=False)
    note = log.info
    scenario = load_scenario(ensure_data(spec, note, pretraining_only=True))
    try:
        return ensure_weights(spec, scenario, note)
    finally:
        scenario.close()


def initial_model(cfg: ModelConfig, input_size: tuple[int, int] | None = None) -> InitialModel:
    """The starting model: ``initial_weights`` (the model its card names; a file without a
    card must fit ``name``), else a seeded fresh ``name`` model with its card (``input_size``
    recorded on it), pretrained for depth unless ``pretrain`` is "none"
    (:func:`pretrained_weights`), else (``name`` null) the synthetic test model (no card)."""
    if cfg.initial_weights is None and cfg.name is not None and cfg.pretrain != "none":
        from fedepth.bench.fleet_summary import weights_sha256

        path = pretrained_weights(cfg, input_size)
        card = read_card(path)
        state = dict(load_file(str(path)))
        assert card is not None  # pretraining saves the card
        set_state(card.build(), state, source=str(path))
        digest = weights_sha256(path)
        return InitialModel(
            state,
            card,
            f"{cfg.name} pretrained for depth on the synthetic HPE pretraining split "
            f"({cfg.pretrain} profile, seed {cfg.seed}; {path}, SHA-256 {digest[:12]})",
        )
    if cfg.initial_weights is not None:
        path = Path(cfg.initial_weights)
        if not path.is_file():
            raise FileNotFoundError(
                f"model.initial_weights: no such file {path}; make one with `fedepth pretrain "
                "--out FILE`, or unset it to serve a fresh model.name network"
            )
        card = read_card(path)
        state = dict(load_file(str(path)))
        if card is None and cfg.name is not None:
            # weights from before cards: they must load into the named model
            model = create_model(
                cfg.name,
                min_depth=cfg.min_depth,
                max_depth=cfg.max_depth,
                encoder_init=cfg.encoder_init,
            )
            try:
                set_state(model, state, source=str(path))
            except ValueError as exc:
                raise ValueError(
                    f"{exc}; it has no model card, so it must fit model.name {cfg.name!r} "
                    "(set model.name to its architecture, or null to serve it card-less)"
                ) from None
            card = card_of(model, input_size=input_size)
        elif card is not None:
            if cfg.name is not None and card.model != cfg.name:
                log.warning(
                    "model.initial_weights %s is %s: serving that (its card wins over "
                    "model.name %r)",
                    path,
                    card.describe(),
                    cfg.name,
                )
            set_state(card.build(), state, source=str(path))  # fits the model its card names
        return InitialModel(state, card, f"weights file {path}")
    if cfg.name is not None:
        torch.manual_seed(cfg.seed)
        model = create_model(
            cfg.name,
            min_depth=cfg.min_depth,
            max_depth=cfg.max_depth,
            encoder_init=cfg.encoder_init,
        )
        card = card_of(model, input_size=input_size)
        return InitialModel(
            get_state(model),
            card,
            f"a FRESH model ({cfg.encoder_init} encoder, no depth pretraining), seed {cfg.seed}",
        )
    s = cfg.synthetic
    return InitialModel(
        synthetic_model(s.num_tensors, s.size_mb, s.seed),
        None,
        "the SYNTHETIC test model (no depth network: set model.name to serve one)",
    )


def load_initial_model(cfg: ModelConfig) -> State:
    """The starting weights (see :func:`initial_model`)."""
    return initial_model(cfg).state


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it resolves to whatever the network says
        return False


def startup_warnings(config: CoordinatorConfig) -> list[str]:
    """What an operator must hear about an unsafe configuration before robots connect."""
    out = []
    host = config.server.host
    if not config.tls.enabled and not is_loopback(host):
        out.append(
            f"serving PLAINTEXT on {host}:{config.server.port}, which is not a loopback "
            "address: robot tokens and models cross the network unencrypted, so anyone on it "
            "can read a token and act as that robot. Set tls.cert_file and tls.key_file (and "
            "tls.client_ca_file for mutual TLS), or server.host: 127.0.0.1 for a local trial"
        )
    v = config.validation
    if v.max_update_norm is None and STATE not in v.max_group_norms:
        out.append(
            "no update norm bound (validation.max_update_norm is null): one robot's update can "
            "move its clusters' models arbitrarily far in a round; set "
            "validation.max_update_norm (e.g. a few times the honest updates' norms) and/or "
            "validation.robust_aggregation"
        )
    m = config.model
    if m.name is not None and m.initial_weights is None and m.pretrain == "none":
        out.append(
            f"serving {m.name} untrained for depth (model.initial_weights is null, "
            f"model.pretrain: none): its depth is meaningless until the rounds teach it"
            + (
                ", and its random encoder is every descriptor's, so clusters and routes mean "
                "little"
                if m.encoder_init == "random"
                else ""
            )
            + "; set model.pretrain: small, or model.initial_weights to pretrained weights "
            "(`fedepth pretrain`)"
        )
    return out


def _read(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


def _server_credentials(config: CoordinatorConfig) -> grpc.ServerCredentials | None:
    tls = config.tls
    if not tls.enabled:
        return None
    key, cert = _read(tls.key_file), _read(tls.cert_file)
    assert key is not None and cert is not None
    ca = _read(tls.client_ca_file)
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


class CoordinatorServer:
    """A running coordinator: gRPC server, handlers and the deadline ticker."""

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
        strategy_factory: Callable[[], Strategy] | None = None,
        interceptors: Sequence[grpc.ServerInterceptor] = (),
    ) -> None:
        """``interceptors`` run after authentication and the per-robot call limit (metrics,
        audit logs: they see only verified principals' calls)."""
        self.config = config
        state_dir = Path(config.state.dir)
        self.store = store or open_store(config.state.backend, state_dir)
        save_resolved(config, state_dir)
        self.initial = initial_model(
            config.model, (config.training.image_size[0], config.training.image_size[1])
        )
        card = self.initial.card
        log.info(
            "serving %s: %s",
            self.initial.source,
            "no model card" if card is None else card.describe(),
        )
        try:
            self.coordinator = Coordinator(
                config,
                self.store,
                self.initial.state,
                clock=clock,
                strategy_factory=strategy_factory,
                model_card=None if card is None else card.to_json(),
            )
        except BaseException:
            self.store.close()
            raise
        self.credentials = CredentialStore(config.auth.credentials_file)
        self.call_limit = CallLimitInterceptor(config.server.max_calls_per_robot)
        limit = config.server.max_message_bytes
        self._server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=config.server.max_workers, thread_name_prefix="coordinator"
            ),
            # auth first: only verified principals are counted by the call limit
            interceptors=[
                AuthInterceptor(
                    self.credentials,
                    bind_certificates=config.tls.client_ca_file is not None
                    and config.tls.bind_principal,
                ),
                self.call_limit,
                *interceptors,
            ],
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.so_reuseport", 0),
                ("grpc.http2.bdp_probe", int(config.server.bdp_probe)),
                # find robots that vanished mid-stream (and free their transfer slot) in ~40 s
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.http2.max_pings_without_data", 0),
            ],
        )
        servicer = CoordinatorServicer(self.coordinator, idle_s=config.server.stream_idle_s)
        add_to_server(servicer, self._server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            [SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], self._server
        )
        address = f"{config.server.host}:{config.server.port}"
        creds = _server_credentials(config)
        try:
            if creds is None:
                self.port = self._server.add_insecure_port(address)
            else:
                self.port = self._server.add_secure_port(address, creds)
        except RuntimeError as exc:
            raise RuntimeError(f"cannot listen on {address}: {exc}") from exc
        if self.port == 0:
            raise RuntimeError(f"cannot listen on {address} (in use, or not a local address)")
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick_loop, name="deadlines", daemon=True)

    def start(self) -> int:
        self._server.start()
        for name in ("", SERVICE_NAME):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._ticker.start()
        if not self.credentials.principals():
            log.warning(
                "no robots can connect yet: %s holds no credentials; add one with "
                "`fedepth-coordinator --config FILE --add-robot robot-01` (picked up without a "
                "restart; it prints the robot's token)",
                self.credentials.path,
            )
        for warning in startup_warnings(self.config):
            log.warning("%s", warning)
        tls = self.config.tls
        mode = "mutual TLS" if tls.client_ca_file else "TLS" if tls.enabled else "plaintext"
        log.info(
            "coordinator listening on %s:%d (%s), strategy %s, state in %s (%s)",
            self.config.server.host,
            self.port,
            mode,
            self.config.strategy.name,
            self.config.state.dir,
            self.config.state.backend,
        )
        return self.port

    def _tick_loop(self) -> None:
        while not self._stop.is_set():
            try:
                due = self.coordinator.tick()
            except Exception:
                log.exception("closing the round at its deadline failed")
                due = 5.0
            self._stop.wait(1.0 if due is None else min(1.0, due + 0.01))

    def stop(self, grace: float | None = None) -> None:
        self._health.enter_graceful_shutdown()
        self._stop.set()
        self._server.stop(self.config.server.grace_s if grace is None else grace).wait()
        if self._ticker.is_alive():
            self._ticker.join(timeout=5.0)
        self.store.close()
        log.info("coordinator stopped")

    def wait(self) -> None:
        self._server.wait_for_termination()


@contextmanager
def running(
    config: CoordinatorConfig,
    *,
    store: Store | None = None,
    clock: Callable[[], float] = time.time,
    strategy_factory: Callable[[], Strategy] | None = None,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
) -> Iterator[CoordinatorServer]:
    """A started :class:`CoordinatorServer`, stopped on exit."""
    server = CoordinatorServer(
        config,
        store=store,
        clock=clock,
        strategy_factory=strategy_factory,
        interceptors=interceptors,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop(grace=0.5)


@contextmanager
def serve(config: CoordinatorConfig) -> Iterator[int]:
    """Run a coordinator for the duration of the block; yields the bound port."""
    with running(config) as server:
        yield server.port
