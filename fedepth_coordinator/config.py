"""The coordinator's one typed configuration: a YAML file, then command-line overrides.

``load_config(path, overrides)`` reads the file, applies ``section.key=value`` overrides (values
parsed as YAML), checks every key and type, and returns a frozen :class:`CoordinatorConfig`.
Unknown keys and wrong types are errors that name the key. Relative paths are relative to the
working directory. The server saves the resolved copy as ``<state dir>/config.resolved.yaml``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedepth.atomic import atomic_write_text
from fedepth.depth_range import FLEET, check_depth_range
from fedepth.recipe import TrainRecipe, round_lr
from fedepth.strategies.aggregate import AGGREGATIONS
from fedepth.updates import UpdateBounds
from fedepth_coordinator.tensors import BOUND_SETTINGS


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and says what is expected."""


@dataclass(frozen=True)
class ServerConfig:
    #: Interface to bind ("0.0.0.0" for a fleet, "127.0.0.1" for local runs).
    host: str = "0.0.0.0"
    #: TCP port; 0 picks a free one (see --port-file).
    port: int = 50051
    #: Worker threads. Waiting robots hold one each: keep it above the fleet size.
    max_workers: int = 128
    #: Largest gRPC message accepted or sent, in bytes.
    max_message_bytes: int = 4 << 20
    #: Size of the chunks weights are streamed in (<= max_message_bytes - 64 KiB).
    chunk_bytes: int = 1 << 20
    #: Weight streams (downloads, uploads) in flight at once; the others wait their turn with
    #: little buffered. The coordinator's transfer buffers stay near max_transfers x 5 chunks.
    max_transfers: int = 16
    #: HTTP/2 BDP probing grows flow-control windows for fast single streams, but the
    #: coordinator then buffers whole uploads of many robots at once, even those waiting for a
    #: transfer slot; off bounds that, at some cost in throughput on high-latency links.
    bdp_probe: bool = False
    #: Weight streams one principal may have in flight at once (the others are
    #: RESOURCE_EXHAUSTED), so that one robot cannot hold every transfer slot.
    max_transfers_per_robot: int = 2
    #: A weight stream that moves no chunk for this long (a robot that stopped reading or
    #: sending) is cancelled and frees its slot, in seconds; null: never.
    stream_idle_s: float | None = 60.0
    #: Calls one principal may have in flight at once (long polls, streams, anything); more
    #: are RESOURCE_EXHAUSTED, so that one robot cannot hold every worker. Below max_workers.
    max_calls_per_robot: int = 4
    #: Longest a GetRoundPlan call waits for a new round, in seconds.
    max_wait_s: float = 20.0
    #: Seconds in-flight calls get to finish on shutdown.
    grace_s: float = 5.0


@dataclass(frozen=True)
class TlsConfig:
    #: PEM server certificate chain and private key; both unset: plaintext (loopback only!).
    cert_file: str | None = None
    key_file: str | None = None
    #: PEM CA bundle that signs robot certificates; set: mutual TLS (clients must present one).
    client_ca_file: str | None = None
    #: With mutual TLS, a call's principal must be named by its client certificate (common
    #: name or a subject alternative name); false: any certificate the CA signed may carry any
    #: principal's token.
    bind_principal: bool = True

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None


@dataclass(frozen=True)
class AuthConfig:
    #: YAML file of principals (robot id -> role and token hash); create entries with
    #: `fedepth-coordinator --config FILE --add-robot ID`. Kept apart from state.dir, so
    #: wiping the state keeps the credentials; a missing file means no robots yet.
    credentials_file: str = "runs/credentials/coordinator.yaml"


@dataclass(frozen=True)
class RoundsConfig:
    #: Rounds to run.
    num_rounds: int = 10
    #: Robots that must have registered and sent a descriptor before round 0 starts.
    min_robots: int = 2
    #: Fraction of the members selected each round (seeded, reproducible).
    fraction: float = 1.0
    #: Fraction of the selected robots that must report before the deadline can close a round.
    quorum: float = 0.6
    #: Seconds after a round opens when it may close on quorum.
    deadline_s: float = 600.0
    #: Seed of the per-round selection.
    seed: int = 0
    #: Rounds after whose close the next round is held: robots wait (GetRoundPlan) until an
    #: operator calls ReleaseRound, say once the closed round's models were evaluated; its
    #: deadline counts from the release. A hold is not durable: a restarted coordinator opens
    #: the round. Default: none.
    hold_after: tuple[int, ...] = ()


@dataclass(frozen=True)
class StrategyConfig:
    #: Method name, one of fedepth.strategies.list_strategies().
    name: str = "fedepth"
    #: Keyword arguments of the strategy (fedepth: overlap or tau, merge and routing rules).
    params: Mapping[str, Any] = field(default_factory=lambda: {"overlap": 0.2})


_RECIPE = TrainRecipe()  # the defaults of the training section (those of fedepth.sim.SimConfig)


@dataclass(frozen=True)
class TrainingConfig:
    """How every robot trains every round: sent with each task (fedepth.recipe.TrainRecipe)."""

    #: Optimizer steps per robot per round, of batch_size frames (whatever its data size).
    local_steps: int = _RECIPE.local_steps
    batch_size: int = _RECIPE.batch_size
    #: adamw | adam | sgd (momentum applies to sgd only).
    optimizer: str = _RECIPE.optimizer
    lr: float = _RECIPE.lr
    weight_decay: float = _RECIPE.weight_decay
    momentum: float = _RECIPE.momentum
    #: Max global gradient norm; null: no clipping.
    grad_clip: float | None = _RECIPE.grad_clip
    #: Learning-rate schedule within a round: constant | cosine (to lr * final_lr_fraction at
    #: the last local step), after warmup_steps of linear warmup.
    schedule: str = _RECIPE.schedule
    warmup_steps: int = _RECIPE.warmup_steps
    final_lr_fraction: float = _RECIPE.final_lr_fraction
    #: [height, width] frames are resized to for training.
    image_size: tuple[int, int] = _RECIPE.image_size
    #: Left-right flip augmentation.
    flip: bool = _RECIPE.flip
    #: Base seed of the robots' training seeds (robot R, round N: crc32("seed/N/R")).
    seed: int = _RECIPE.seed
    #: Lambda of the SILog loss; null: the model's own (0.85).
    variance_focus: float | None = _RECIPE.variance_focus
    #: Learning-rate schedule ACROSS the rounds: constant | cosine (from lr in the first round
    #: to lr * round_final_lr_fraction in the last). Each round's task carries its lr.
    round_schedule: str = "constant"
    round_final_lr_fraction: float = 0.1

    def recipe(self, rnd: int = 0, num_rounds: int = 1) -> TrainRecipe:
        """The :class:`~fedepth.recipe.TrainRecipe` of round ``rnd`` of ``num_rounds``
        (raises ValueError)."""
        data = dataclasses.asdict(self)
        schedule, final = data.pop("round_schedule"), data.pop("round_final_lr_fraction")
        data["lr"] = round_lr(data["lr"], rnd, num_rounds, schedule, final)
        return TrainRecipe.from_dict(data)


@dataclass(frozen=True)
class SyntheticModelConfig:
    #: Number of float32 tensors and their total size, for trying the service end to end.
    num_tensors: int = 4
    size_mb: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class ModelConfig:
    #: registry name of the served depth network (``fedepth.models.list_models()``; default the
    #: benchmark's backbone); null: the synthetic test model below (no depth network). The card
    #: of ``initial_weights`` wins over it.
    name: str | None = "newcrfs-lite"
    #: how a fresh model's encoder begins: "imagenet" (torchvision's checkpoint, found and
    #: verified on disk; `fedepth weights` lists them) or "random" (a weights file's card wins).
    encoder_init: str = "imagenet"
    #: metric depth range of a fresh model (a weights file's card wins).
    min_depth: float = FLEET.min_depth
    max_depth: float = FLEET.max_depth
    #: torch seed of a fresh model (no initial_weights).
    seed: int = 0
    #: safetensors file with the starting weights (with a model card); unset: a fresh seeded
    #: ``name`` model (pretrained as ``pretrain`` says), or the synthetic model when ``name``
    #: is null too.
    initial_weights: str | None = None
    #: what a fresh ``name`` network learns before it is served (no initial_weights): "small"
    #: pretrains it for depth on the synthetic HPE scenario's pretraining split with the
    #: benchmark's small-profile recipe (data generated and the network trained on this
    #: machine at the first start, a few minutes, logged; then cached in ``cache_dir`` and
    #: reused; never downloaded), "smoke" does the same at the smoke profile (seconds: for
    #: trials and tests), "none" serves the encoder's start untrained.
    pretrain: str = "small"
    #: where that data and checkpoint are cached (the same cache as ``fedepth bench``'s).
    cache_dir: str = ".cache/fedepth"
    synthetic: SyntheticModelConfig = field(default_factory=SyntheticModelConfig)


#: Values of model.pretrain.
PRETRAIN_PROFILES = ("small", "smoke", "none")

#: Values of validation.sample_weights.
SAMPLE_WEIGHTS = ("clipped", "registered", "strict", "equal")


@dataclass(frozen=True)
class ValidationConfig:
    #: Largest accepted L2 distance between an update and the model it was trained from; also
    #: the largest L2 norm of each extra group (SCAFFOLD control deltas, ...).
    max_update_norm: float | None = None
    #: Bounds by group name ("state", "control_delta", ...) that override max_update_norm.
    max_group_norms: Mapping[str, float] = field(default_factory=dict)
    #: Largest descriptor dimension accepted.
    max_descriptor_dim: int = 8192
    #: Descriptor dimension of the fleet (that of the encoder's features); null: the dimension
    #: most robots sent before the fleet formed (never just the first robot's).
    descriptor_dim: int | None = None
    #: Descriptor means must lie in [-b, b] and variances in [1/b, b], so that divergences
    #: between any two descriptors stay finite.
    descriptor_bound: float = 1e8
    #: Most algorithm extra groups (control variates, ...) an update may carry.
    max_extra_groups: int = 4
    #: Largest total size of a robot's inline summaries (PACFL basis, ...), in bytes.
    max_summary_bytes: int = 1 << 20
    #: Most columns (p) of a PACFL subspace basis: formation computes N^2 principal angles,
    #: each an SVD of a p x p product, so p bounds its work.
    max_basis_columns: int = 32
    #: Aggregation weight of an update, given the sample count in its header and the one the
    #: robot registered: "clipped" (the header's, at most the registered one), "registered"
    #: (always the registered one), "strict" (a header that differs is INVALID_ARGUMENT) or
    #: "equal" (every update weighs 1). The header's count alone is never trusted.
    sample_weights: str = "clipped"
    #: How each cluster's model is made from its members' updates: "mean" (weighted by
    #: sample_weights), "trimmed_mean" (coordinate-wise, dropping the trim_fraction lowest and
    #: highest values of each coordinate) or "median" (coordinate-wise); the robust rules
    #: weigh every update equally and bound what a minority of a cluster can do.
    robust_aggregation: str = "mean"
    #: Fraction of a cluster's updates trimmed at each end by "trimmed_mean" ([0, 0.5)).
    trim_fraction: float = 0.2

    def update_bounds(self) -> UpdateBounds:
        """The norm bounds of max_update_norm and max_group_norms (fedepth.updates owns the
        rule; the in-process simulation takes the same settings)."""
        return UpdateBounds(
            self.max_update_norm,
            dict(self.max_group_norms),
            settings=BOUND_SETTINGS,
        )


@dataclass(frozen=True)
class StateConfig:
    #: Directory of the durable state (SQLite + blobs) and the resolved config.
    dir: str = "runs/coordinator"
    #: "sqlite" (durable) or "memory" (lost on exit; tests and dry runs).
    backend: str = "sqlite"
    #: Blobs the state has no record of while it records no run (state.db lost, replaced or
    #: corrupted): "refuse" to start, naming them and how to recover; "quarantine": move them
    #: to <dir>/quarantine (never deleted) and start a fresh run.
    unaccounted_blobs: str = "refuse"


@dataclass(frozen=True)
class CoordinatorConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    rounds: RoundsConfig = field(default_factory=RoundsConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    state: StateConfig = field(default_factory=StateConfig)
    #: Python logging level name.
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        _check(self)


def _check(c: CoordinatorConfig) -> None:
    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ConfigError(f"{key}: {what}")

    s, r = c.server, c.rounds
    need(0 <= s.port <= 65535, "server.port", f"must lie in [0, 65535], got {s.port}")
    need(s.max_workers >= 4, "server.max_workers", f"must be >= 4, got {s.max_workers}")
    need(
        0 < s.chunk_bytes <= s.max_message_bytes - (64 << 10),
        "server.chunk_bytes",
        f"must be > 0 and leave 64 KiB under server.max_message_bytes "
        f"({s.max_message_bytes}), got {s.chunk_bytes}",
    )
    need(s.max_wait_s >= 0, "server.max_wait_s", "must be >= 0")
    need(s.max_transfers >= 1, "server.max_transfers", f"must be >= 1, got {s.max_transfers}")
    need(s.max_transfers_per_robot >= 1, "server.max_transfers_per_robot", "must be >= 1")
    need(
        1 <= s.max_calls_per_robot < s.max_workers,
        "server.max_calls_per_robot",
        f"must lie in [1, server.max_workers), got {s.max_calls_per_robot}",
    )
    need(
        s.stream_idle_s is None or s.stream_idle_s > 0,
        "server.stream_idle_s",
        "must be > 0 or null",
    )
    need(r.num_rounds >= 1, "rounds.num_rounds", f"must be >= 1, got {r.num_rounds}")
    need(r.min_robots >= 1, "rounds.min_robots", f"must be >= 1, got {r.min_robots}")
    need(0 < r.fraction <= 1, "rounds.fraction", f"must lie in (0, 1], got {r.fraction}")
    need(0 < r.quorum <= 1, "rounds.quorum", f"must lie in (0, 1], got {r.quorum}")
    need(r.deadline_s > 0, "rounds.deadline_s", f"must be > 0, got {r.deadline_s}")
    need(
        all(0 <= h < r.num_rounds - 1 for h in r.hold_after),
        "rounds.hold_after",
        f"must list rounds in [0, rounds.num_rounds - 1), got {list(r.hold_after)}",
    )
    need(
        (c.tls.cert_file is None) == (c.tls.key_file is None),
        "tls",
        "cert_file and key_file must be set together",
    )
    need(
        c.tls.client_ca_file is None or c.tls.enabled,
        "tls.client_ca_file",
        "mutual TLS needs tls.cert_file and tls.key_file too",
    )
    need(
        c.state.backend in ("sqlite", "memory"),
        "state.backend",
        f"must be 'sqlite' or 'memory', got {c.state.backend!r}",
    )
    need(
        c.state.unaccounted_blobs in ("refuse", "quarantine"),
        "state.unaccounted_blobs",
        f"must be 'refuse' or 'quarantine', got {c.state.unaccounted_blobs!r}",
    )
    v = c.validation
    try:  # the norm bounds' rule is fedepth.updates.UpdateBounds'
        v.update_bounds()
    except ValueError as exc:
        raise ConfigError(f"validation.{exc}") from None
    need(v.max_extra_groups >= 0, "validation.max_extra_groups", "must be >= 0")
    need(v.max_basis_columns >= 1, "validation.max_basis_columns", "must be >= 1")
    need(
        v.descriptor_dim is None or 1 <= v.descriptor_dim <= v.max_descriptor_dim,
        "validation.descriptor_dim",
        "must be null or in [1, validation.max_descriptor_dim]",
    )
    need(v.descriptor_bound > 1, "validation.descriptor_bound", "must be > 1")
    need(
        v.sample_weights in SAMPLE_WEIGHTS,
        "validation.sample_weights",
        f"must be one of {', '.join(SAMPLE_WEIGHTS)}, got {v.sample_weights!r}",
    )
    need(
        v.robust_aggregation in AGGREGATIONS,
        "validation.robust_aggregation",
        f"must be one of {', '.join(AGGREGATIONS)}, got {v.robust_aggregation!r}",
    )
    need(0 <= v.trim_fraction < 0.5, "validation.trim_fraction", "must lie in [0, 0.5)")
    need(c.model.synthetic.size_mb > 0, "model.synthetic.size_mb", "must be > 0")
    try:
        check_depth_range(c.model.min_depth, c.model.max_depth, "model")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    need(
        c.model.pretrain in PRETRAIN_PROFILES,
        "model.pretrain",
        f"must be one of {', '.join(PRETRAIN_PROFILES)}, got {c.model.pretrain!r}",
    )
    need(
        c.model.encoder_init in ("imagenet", "random"),
        "model.encoder_init",
        f"must be imagenet or random, got {c.model.encoder_init!r}",
    )
    if c.model.name is not None:
        from fedepth.models import list_models

        need(
            c.model.name in list_models(),
            "model.name",
            f"unknown model {c.model.name!r}; known: {', '.join(list_models())}",
        )
    try:
        c.training.recipe()
    except ValueError as exc:
        raise ConfigError(f"training: {str(exc).removeprefix('TrainRecipe: ')}") from None
    need(c.model.synthetic.num_tensors >= 1, "model.synthetic.num_tensors", "must be >= 1")


# -- loading ------------------------------------------------------------------------------------
def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, key)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return _build(tp, value, key)
    if origin is tuple and typing.get_args(tp)[1:] == (Ellipsis,):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        inner = typing.get_args(tp)[0]
        return tuple(_convert(inner, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise ConfigError(f"{key}: expected a list of {len(args)} values, got {value!r}")
        items = enumerate(zip(args, value, strict=True))
        return tuple(_convert(a, v, f"{key}[{i}]") for i, (a, v) in items)
    if origin is not None and issubclass(origin, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    raise ConfigError(f"{key}: unsupported type {tp}")


def _build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        where = prefix or "top level"
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))}; "
            f"known: {', '.join(sorted(names))}"
        )
    kwargs = {k: _convert(hints[k], v, f"{prefix}.{k}" if prefix else k) for k, v in data.items()}
    return cls(**kwargs)


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: {p} is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``section.key=value`` -> (key, YAML-parsed value)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r}: expected section.key=value")
    return key.strip(), yaml.safe_load(raw) if raw.strip() else None


def config_from_dict(
    data: Mapping[str, Any], overrides: Sequence[tuple[str, Any]] = ()
) -> CoordinatorConfig:
    merged: dict[str, Any] = yaml.safe_load(yaml.safe_dump(dict(data))) or {}
    for key, value in overrides:
        _set_path(merged, key, value)
    config: CoordinatorConfig = _build(CoordinatorConfig, merged)
    return config


def load_config(
    path: str | Path | None, overrides: Sequence[tuple[str, Any]] = ()
) -> CoordinatorConfig:
    """The config in ``path`` (None: the defaults) with overrides applied."""
    data: Any = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: no such config file")
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML ({exc})") from exc
        if not isinstance(data, Mapping):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
    return config_from_dict(data, overrides)


def to_dict(config: CoordinatorConfig) -> dict[str, Any]:
    out: dict[str, Any] = dataclasses.asdict(config)
    out["training"]["image_size"] = list(config.training.image_size)
    out["rounds"]["hold_after"] = list(config.rounds.hold_after)
    return out


def save_resolved(config: CoordinatorConfig, directory: str | Path) -> Path:
    """Write the resolved config into ``directory`` (atomically) and return its path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = d / "config.resolved.yaml"
    text = "# The resolved coordinator configuration of the last start (file + overrides).\n"
    atomic_write_text(path, text + yaml.safe_dump(to_dict(config), sort_keys=False), mode=0o600)
    return path
