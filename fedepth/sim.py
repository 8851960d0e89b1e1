"""In-process federation: Strategy + LocalTrainer driven round by round over a scenario's clients.

The simulation uses the same objects the coordinator and the robots use (a
:class:`~fedepth.strategies.Strategy` on the server side; :func:`fedepth.client.train_round`,
the one client-round function, and the descriptor extractor on the client side), so its
numbers are those of a deployed fleet minus the network. Every task carries the round's
:class:`~fedepth.recipe.TrainRecipe` (:meth:`SimConfig.recipe`), as the coordinator's do.
Client training runs through an executor: :class:`SequentialExecutor` (default, in this
process) or :class:`RayExecutor` (Ray tasks on the CPUs/GPUs of one or many machines); both
give the same result for the same seed.

Per round it records the test metrics of every unseen sequence (routed by the strategy, no
test-time training), the bytes each client downloads and uploads, and the time spent in local
training versus federation overhead (descriptors, clustering, aggregation, serialization).
Final numbers are the mean over the last ``last_rounds`` rounds, as in the paper.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import torch
from tqdm import tqdm

from fedepth import clustering
from fedepth.client import RoundResult, train_round
from fedepth.data.crops import evaluation_crop
from fedepth.data.scenario import Client, Scenario
from fedepth.data.sequence import Sequence as RGBDSequence
from fedepth.data.torchdata import FrameDataset, resize_frame
from fedepth.depth_range import FLEET
from fedepth.descriptor import Descriptor, DescriptorExtractor
from fedepth.metrics import compute_errors, mean_errors
from fedepth.models import DepthModel, create_model, set_state
from fedepth.recipe import TrainRecipe, round_lr
from fedepth.recipe import client_seed as client_seed  # re-exported: fedepth.sim.client_seed
from fedepth.strategies import (
    ClientInfo,
    RouteDecision,
    Strategy,
    TrainTask,
    create_strategy,
)
from fedepth.strategies.aggregate import State
from fedepth.strategies.pacfl import BASIS_KEY
from fedepth.training import LocalTrainer, OptimizerConfig, TrainConfig

log = logging.getLogger(__name__)

#: The metrics reported in tables (the paper's seven).
TABLE_METRICS = ("abs_rel", "sq_rel", "rmse", "rmse_log", "d1", "d2", "d3")


#: torch threads of :func:`pretrain` unless configured otherwise
PRETRAIN_THREADS = 2
#: version of :func:`pretrain`'s recipe, part of the checkpoint cache key: bump it when the
#: code changes what a pretraining run with the same settings produces
PRETRAIN_REGIME = 3

_RECIPE = TrainRecipe()


@dataclass(frozen=True)
class SimConfig:
    """Everything that determines a simulated run (saved next to the results)."""

    model: str = "newcrfs-lite"
    # the client recipe's settings default to fedepth.recipe.TrainRecipe's (:meth:`recipe`)
    image_size: tuple[int, int] = _RECIPE.image_size
    rounds: int = 10
    local_steps: int = _RECIPE.local_steps
    batch_size: int = _RECIPE.batch_size
    lr: float = _RECIPE.lr
    weight_decay: float = _RECIPE.weight_decay
    #: optimizer of the local rounds: adamw | adam | sgd
    optimizer: str = _RECIPE.optimizer
    #: max global gradient norm of the local steps (None: no clipping)
    grad_clip: float | None = _RECIPE.grad_clip
    #: learning-rate schedule within a round's local steps: constant | cosine (to
    #: lr * final_lr_fraction at the last step), after warmup_steps of linear warmup
    schedule: str = _RECIPE.schedule
    warmup_steps: int = _RECIPE.warmup_steps
    final_lr_fraction: float = _RECIPE.final_lr_fraction
    #: learning-rate schedule ACROSS rounds (fedepth.recipe.round_lr): constant | cosine (to
    #: lr * round_final_lr_fraction in the last round); every client of a round gets its lr
    round_schedule: str = "constant"
    round_final_lr_fraction: float = 0.1
    #: left-right flip augmentation of the local rounds
    flip: bool = _RECIPE.flip
    min_depth: float = FLEET.min_depth
    max_depth: float = FLEET.max_depth
    #: lambda of the SILog loss, in pretraining and in every client round (None: the model's
    #: own, 0.85); lower values weigh a prediction's global scale more
    variance_focus: float | None = _RECIPE.variance_focus
    descriptor_frames: int = 32
    pacfl_basis: int = 3
    eval_frames: int = 8
    last_rounds: int = 5
    eval_every: int = 0
    pretrain_steps: int = 300
    pretrain_batch: int = 8
    pretrain_lr: float = 1e-3
    #: fraction of the pretraining steps spent in linear learning-rate warmup
    pretrain_warmup: float = 0.1
    #: torch threads for pretraining. Fixed rather than the machine's default because the
    #: checkpoint depends on it (CPU kernels reduce in a thread-dependent order); 2 is what the
    #: documented small-profile checkpoints were trained with.
    pretrain_threads: int = PRETRAIN_THREADS
    seed: int = 0
    #: torch threads per client job; the same number in every executor gives identical results
    threads: int = 1
    method_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def recipe(self, rnd: int = 0) -> TrainRecipe:
        """The recipe every client trains round ``rnd`` with: the lr of ``round_schedule``
        for that round, the rest the same every round (CL's pooled participant gets
        ``local_steps * num_clients`` steps, see :meth:`Simulation.run`)."""
        lr = round_lr(self.lr, rnd, self.rounds, self.round_schedule, self.round_final_lr_fraction)
        return TrainRecipe(
            local_steps=self.local_steps,
            batch_size=self.batch_size,
            optimizer=self.optimizer,  # type: ignore[arg-type]
            lr=lr,
            weight_decay=self.weight_decay,
            grad_clip=self.grad_clip,
            schedule=self.schedule,  # type: ignore[arg-type]
            warmup_steps=self.warmup_steps,
            final_lr_fraction=self.final_lr_fraction,
            image_size=self.image_size,
            flip=self.flip,
            seed=self.seed,
            variance_focus=self.variance_focus,
        )

    def train_config(self, seed: int) -> TrainConfig:
        """The LocalTrainer settings of a client round trained with ``seed``."""
        return self.recipe().train_config(seed)

    def build_model(self) -> DepthModel:
        """The configured model; its card records ``image_size`` as the input size."""
        model = create_model(
            self.model,
            min_depth=self.min_depth,
            max_depth=self.max_depth,
            variance_focus=self.variance_focus,
        )
        model.input_size = (int(self.image_size[0]), int(self.image_size[1]))
        return model

    def pretrain_key(self) -> str:
        """A short stable hash of every setting the pretrained checkpoint depends on (its cache
        key: change any of them and the checkpoint is trained anew)."""
        fields = {
            k: getattr(self, k)
            for k in (
                "model",
                "image_size",
                "min_depth",
                "max_depth",
                "weight_decay",
                "pretrain_steps",
                "pretrain_batch",
                "pretrain_lr",
                "pretrain_warmup",
                "pretrain_threads",
                "variance_focus",
                "seed",
            )
        }
        text = json.dumps({**fields, "regime": PRETRAIN_REGIME}, sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:10]


@dataclass
class ClientJob:
    """One client's local round: what an executor needs to run it anywhere.

    The task carries the recipe (steps, optimizer, input size, flips, base seed); the client
    trains with the seed derived from it, the round and its id (:func:`client_seed`).
    """

    cid: str
    sequences: list[RGBDSequence]
    task: TrainTask
    memory: dict[str, State]
    #: the round (keyword-only, so that a job built the old way, with a seed, fails loudly)
    rnd: int = field(kw_only=True)


#: What a client job returns (:class:`fedepth.client.RoundResult`).
JobResult = RoundResult


def run_job(config: SimConfig, job: ClientJob, model: DepthModel | None = None) -> JobResult:
    """Train one client for one round (the client side of a round, minus the network):
    :func:`fedepth.client.train_round` with the task's recipe (``config.recipe(rnd)`` for a
    task without one)."""
    return train_round(
        model or config.build_model(),
        job.task,
        job.sequences,
        cid=job.cid,
        rnd=job.rnd,
        memory=job.memory,
        fallback=config.recipe(job.rnd),
    )


class Router(Protocol):
    """What evaluation needs of a strategy: routing an unseen sequence to a model (a
    :class:`~fedepth.strategies.Strategy`, or a client of a coordinator running one)."""

    def route(
        self,
        descriptor: Descriptor | None,
        *,
        labels: Mapping[str, str] | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> RouteDecision: ...


class Executor(Protocol):
    """Runs a round's client jobs; results in the order of the jobs."""

    def map(self, config: SimConfig, jobs: Sequence[ClientJob]) -> list[JobResult]: ...

    def close(self) -> None: ...


class SequentialExecutor:
    """Client jobs one after another in this process, reusing one model instance."""

    def __init__(self) -> None:
        self._model: DepthModel | None = None

    def map(self, config: SimConfig, jobs: Sequence[ClientJob]) -> list[JobResult]:
        if self._model is None:
            self._model = config.build_model()
        before = torch.get_num_threads()
        torch.set_num_threads(config.threads)
        try:
            return [run_job(config, job, self._model) for job in jobs]
        finally:
            torch.set_num_threads(before)

    def close(self) -> None:
        self._model = None


class RayExecutor:
    """Client jobs as Ray tasks, one CPU (or GPU) each, on a local or existing Ray cluster.

    ``address=None`` starts a local Ray runtime (``num_cpus`` of this machine); pass the address
    of a running cluster (``ray start --head`` ...) to spread clients over several machines.
    """

    def __init__(
        self,
        *,
        address: str | None = None,
        num_cpus: int | None = None,
        gpus_per_client: float = 0.0,
    ) -> None:
        import ray

        self._ray = ray
        if not ray.is_initialized():
            ray.init(
                address=address,
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        self._remote = ray.remote(num_cpus=1, num_gpus=gpus_per_client)(_ray_job)

    def map(self, config: SimConfig, jobs: Sequence[ClientJob]) -> list[JobResult]:
        refs = [self._remote.remote(config, job) for job in jobs]
        return list(self._ray.get(refs))

    def close(self) -> None:
        self._ray.shutdown()


def _ray_job(config: SimConfig, job: ClientJob) -> JobResult:
    torch.set_num_threads(config.threads)
    return run_job(config, job)


def make_executor(name: str, **kwargs: Any) -> Executor:
    """``sequential`` (default) or ``ray``."""
    if name == "sequential":
        return SequentialExecutor()
    if name == "ray":
        return RayExecutor(**kwargs)
    raise ValueError(f"unknown executor {name!r}; choose sequential or ray")


def state_nbytes(state: Mapping[str, np.ndarray]) -> int:
    return int(sum(np.asarray(t).nbytes for t in state.values()))


def _wire_encode(groups: Sequence[Mapping[str, np.ndarray]]) -> bytes:
    """The bytes the coordinator streams for a payload: every tensor's raw little-endian C-order
    bytes, concatenated (one copy; see fedepth_coordinator.tensors)."""
    return b"".join(
        np.ascontiguousarray(a, dtype=np.asarray(a).dtype.newbyteorder("<")).reshape(-1).data
        for g in groups
        for a in g.values()
    )


def _wire_decode(payload: bytes, like: Sequence[Mapping[str, np.ndarray]]) -> bool:
    """What the coordinator does with an upload: rebuild the arrays from the bytes (one copy
    into place) and check that every float is finite before it may touch an aggregate.
    False when the coordinator would reject the upload."""
    buf = np.frombuffer(payload, dtype=np.uint8).copy()
    offset, finite = 0, True
    for g in like:
        for a in g.values():
            arr = np.asarray(a)
            view = buf[offset : offset + arr.nbytes].view(arr.dtype.newbyteorder("<"))
            offset += arr.nbytes
            if arr.dtype.kind == "f":
                finite &= bool(np.isfinite(view).all())
    return finite


def distinct_payloads(
    payloads: Sequence[Sequence[Mapping[str, np.ndarray]]],
) -> list[Sequence[Mapping[str, np.ndarray]]]:
    """The non-empty payloads that differ in at least one array object, first occurrence kept:
    a coordinator encodes a model once however many robots download it."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for groups in payloads:
        key = tuple(id(a) for g in groups for a in g.values())
        if key and key not in seen:
            seen.add(key)
            out.append(groups)
    return out


def wire_seconds(
    downloads: Sequence[Sequence[Mapping[str, np.ndarray]]],
    uploads: Sequence[Sequence[Mapping[str, np.ndarray]]],
) -> tuple[float, list[int]]:
    """Seconds the coordinator's wire format costs for one round, measured by doing it: encode
    each distinct download payload once (robots that get the same model share one stream), and
    encode + decode + check every upload. Also the indices of the uploads the coordinator would
    reject for non-finite values."""
    t0 = time.perf_counter()
    rejected = []
    for groups in distinct_payloads(downloads):
        _wire_encode(groups)
    for i, groups in enumerate(uploads):
        if any(groups) and not _wire_decode(_wire_encode(groups), groups):
            rejected.append(i)
    return time.perf_counter() - t0, rejected


@dataclass
class Fleet:
    """A scenario prepared for simulation: client infos with descriptors, test-time queries."""

    scenario: Scenario
    infos: list[ClientInfo]
    test_queries: list[tuple[RGBDSequence, Descriptor, dict[str, np.ndarray]]]
    descriptor_seconds: float

    @property
    def clients(self) -> list[Client]:
        return self.scenario.clients


def _client_rgb(client: Client) -> _ConcatenatedFrames:
    """A lazy indexable over the RGB frames of all of a client's sequences."""
    return _ConcatenatedFrames([s.rgb_frames() for s in client.sequences])


class _ConcatenatedFrames:
    """Several lazy frame sequences read as one, in order (frame i of the whole)."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self.offsets = np.cumsum([0] + [len(p) for p in parts])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int) -> Any:
        k = int(np.searchsorted(self.offsets, i, side="right") - 1)
        return self.parts[k][int(i - self.offsets[k])]


def prepare_fleet(
    scenario: Scenario, encoder_model: DepthModel, config: SimConfig, *, progress: bool = True
) -> Fleet:
    """Descriptors (and PACFL subspace bases) of every client and test sequence.

    Training clients describe n frames sampled over their data; an unseen test sequence is
    described from its first n frames, as a robot would at the start of a deployment.
    """
    t0 = time.perf_counter()
    size = config.image_size

    def to_tensor(img: Any) -> torch.Tensor:
        rgb = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float().div_(255.0)
        return torch.nn.functional.interpolate(
            rgb[None], size=size, mode="bilinear", align_corners=False, antialias=True
        )[0]

    extractor = DescriptorExtractor(
        encoder_model.forward_features, num_frames=config.descriptor_frames, seed=config.seed
    )
    infos = []
    for c in tqdm(
        scenario.clients, desc="descriptors", unit="client", leave=False, disable=not progress
    ):
        frames = _client_rgb(c)
        desc, feats = extractor.extract_with_features(frames, to_tensor=to_tensor)
        basis = clustering.subspace_basis(feats.T, config.pacfl_basis)
        infos.append(
            ClientInfo(
                c.name,
                c.num_samples,
                desc,
                labels={"platform": c.platform, "environment": c.environment},
                extra={BASIS_KEY: basis},
            )
        )
    queries = []
    for seq in scenario.test:
        n = min(len(seq), config.descriptor_frames)
        first = _FirstFrames(seq.rgb_frames(), n)
        desc, feats = extractor.extract_with_features(first, to_tensor=to_tensor)
        queries.append(
            (seq, desc, {BASIS_KEY: clustering.subspace_basis(feats.T, config.pacfl_basis)})
        )
    return Fleet(scenario, infos, queries, time.perf_counter() - t0)


class _FirstFrames:
    """The first ``n`` frames of a lazy frame sequence (what a robot has seen at the start of a
    deployment)."""

    def __init__(self, frames: Any, n: int) -> None:
        self.frames, self.n = frames, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.frames[int(i)]


def eval_indices(n: int, k: int) -> list[int]:
    """k frame indices spread evenly over a sequence of n frames."""
    return sorted({int(i) for i in np.linspace(0, n - 1, min(k, n)).round()})


def evaluate_sequence(
    model: DepthModel, seq: RGBDSequence, config: SimConfig
) -> tuple[dict[str, float], list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Mean metrics over a sequence's evaluation frames (at the training resolution, inside
    its source benchmark's crop: :func:`~fedepth.data.crops.evaluation_crop`), and the
    (rgb, gt, pred) of its first evaluation frame for pictures."""
    rows: list[dict[str, float]] = []
    sample: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    model.eval()
    with torch.inference_mode():
        for i in eval_indices(len(seq), config.eval_frames):
            rgb, depth = resize_frame(seq[i], config.image_size)
            pred = model(rgb[None])[0, 0].numpy()
            gt = depth[0].numpy()
            crop = evaluation_crop(seq.meta.source, (gt.shape[0], gt.shape[1]))
            valid = (gt > seq.meta.min_depth) & (gt < seq.meta.max_depth)
            if crop is not None:
                valid &= crop
            if not valid.any():
                continue
            rows.append(
                compute_errors(gt, pred, seq.meta.min_depth, seq.meta.max_depth, mask=crop)
            )
            if not sample:
                sample.append((rgb.permute(1, 2, 0).numpy(), gt, pred))
    if not rows:
        raise ValueError(f"test sequence {seq.name!r} has no valid depth in its eval frames")
    return mean_errors(rows), sample


@dataclass
class RoundRecord:
    """What one round produced."""

    round: int
    train_seconds: float
    aggregate_seconds: float  # strategy.configure_train + aggregate_train
    wire_seconds: float  # encoding downloads, encoding + decoding + checking uploads
    mean_loss: float
    download_bytes: dict[str, int]
    upload_bytes: dict[str, int]
    test: dict[str, dict[str, float]] | None = None
    routes: dict[str, list[int]] | None = None

    @property
    def overhead_seconds(self) -> float:
        return self.aggregate_seconds + self.wire_seconds


@dataclass
class MethodRun:
    """A method's run: per-round records, final metrics, per-group metrics, cluster map."""

    method: str
    rounds: list[RoundRecord]
    final: dict[str, float]
    per_sequence: dict[str, dict[str, float]]
    groups: dict[str, dict[str, float]]
    clusters: list[list[int]]
    descriptor_seconds: float  # the fleet's descriptors (shared by every method of a run)
    setup_seconds: float  # strategy.initialize: clustering, tau calibration
    samples: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]
    params: dict[str, Any]
    strategy: Strategy

    def summary(self) -> dict[str, Any]:
        train = sum(r.train_seconds for r in self.rounds)
        per_round = sum(r.overhead_seconds for r in self.rounds)
        over = per_round + self.setup_seconds + self.descriptor_seconds
        return {
            **{k: self.final[k] for k in TABLE_METRICS if k in self.final},
            "final_all": self.final,
            "groups": self.groups,
            "per_sequence": self.per_sequence,
            "clusters": self.clusters,
            "params": self.params,
            "curves": {
                "round": [r.round for r in self.rounds],
                "train_loss": [r.mean_loss for r in self.rounds],
                "abs_rel": [
                    None if r.test is None else r.test["all"]["abs_rel"] for r in self.rounds
                ],
            },
            "timing": {
                "train_seconds": train,
                "overhead_seconds": over,
                "overhead_fraction": over / max(train + over, 1e-9),
                "round_overhead_fraction": per_round / max(train + per_round, 1e-9),
                "descriptor_seconds": self.descriptor_seconds,
                "setup_seconds": self.setup_seconds,
                "aggregate_seconds": sum(r.aggregate_seconds for r in self.rounds),
                "wire_seconds": sum(r.wire_seconds for r in self.rounds),
            },
            "bytes_per_round": {
                "download_mean": float(
                    np.mean([np.mean(list(r.download_bytes.values())) for r in self.rounds])
                ),
                "upload_mean": float(
                    np.mean([np.mean(list(r.upload_bytes.values())) for r in self.rounds])
                ),
                "per_round": [
                    {"download": r.download_bytes, "upload": r.upload_bytes} for r in self.rounds
                ],
            },
            "routes": self.rounds[-1].routes if self.rounds else None,
        }


#: One test sequence's picture for the report: (rgb, ground truth, prediction).
Sample = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass
class RunState:
    """A method's run after ``rounds_done`` rounds: everything resuming it exactly needs."""

    method: str
    rounds_done: int
    #: :meth:`Strategy.state_dict` (JSON-able metadata, named states) of the server side
    strategy_meta: dict[str, Any]
    strategy_states: dict[str, State]
    #: every participant's client-hook memory (SCAFFOLD's c_i, FedDyn's g_i), by client id
    memory: dict[str, dict[str, State]]
    records: list[RoundRecord]
    #: the pictures of the latest evaluation
    samples: dict[str, list[Sample]]


class Checkpointer(Protocol):
    """Where :meth:`Simulation.run` keeps a method's state after every round (see
    :class:`fedepth.runstate.RunCheckpoint` for the one on disk)."""

    def load(self) -> RunState | None: ...

    def save(self, state: RunState) -> None: ...


class Simulation:
    """Runs methods on one prepared fleet from one initial state."""

    def __init__(
        self, fleet: Fleet, initial: State, config: SimConfig, executor: Executor | None = None
    ) -> None:
        self.fleet = fleet
        self.initial = dict(initial)
        self.config = config
        self.executor = executor or SequentialExecutor()
        self._eval_model = config.build_model()

    def _strategy(self, method: str) -> Strategy:
        return create_strategy(method, **dict(self.config.method_params.get(method, {})))

    def run(
        self,
        method: str,
        *,
        progress: bool = True,
        on_round: Callable[[RoundRecord], None] | None = None,
        checkpoint: Checkpointer | None = None,
    ) -> MethodRun:
        """Run ``method`` for the configured rounds.

        With a ``checkpoint``, the run starts from the state it holds (if any: the strategy's
        server state, the clients' hook memory, the rounds recorded so far and the latest
        pictures) and saves that state after every round, so that an interrupted run resumes
        from its last finished round and ends with the numbers of an uninterrupted one.
        ``on_round`` is called after each round, once its state is saved.
        """
        cfg = self.config
        t0 = time.perf_counter()
        strategy = self._strategy(method)
        pooled = bool(getattr(strategy, "pooled", False))
        clients = self.fleet.clients
        if pooled:
            pooled_info = ClientInfo("pooled", sum(c.num_samples for c in clients))
            strategy.initialize([pooled_info], self.initial)
            participants: list[tuple[str, list[RGBDSequence]]] = [
                ("pooled", [s for c in clients for s in c.sequences])
            ]
        else:
            strategy.initialize(self.fleet.infos, self.initial)
            participants = [(c.name, c.sequences) for c in clients]
        setup = time.perf_counter() - t0
        memory: dict[str, dict[str, State]] = {cid: {} for cid, _ in participants}
        records: list[RoundRecord] = []
        samples: dict[str, list[Sample]] = {}
        saved = checkpoint.load() if checkpoint is not None else None
        if saved is not None:
            if saved.method != method or set(saved.memory) != set(memory):
                raise ValueError(
                    f"the checkpoint holds a run of {saved.method} over {len(saved.memory)} "
                    f"participants; cannot resume {method} over {len(memory)} from it"
                )
            strategy.load_state_dict(saved.strategy_meta, saved.strategy_states)
            memory.update(saved.memory)
            records, samples = list(saved.records), dict(saved.samples)
        start = saved.rounds_done if saved is not None else 0
        bar = tqdm(
            range(start, cfg.rounds),
            desc=method,
            unit="round",
            initial=start,
            total=cfg.rounds,
            disable=not progress,
        )
        for rnd in bar:
            recipe = cfg.recipe(rnd)
            if pooled:
                # CL takes as many steps per round as the whole federation, so the upper bound
                # sees the same number of gradient steps (and samples) as every federated method.
                recipe = replace(recipe, local_steps=cfg.local_steps * len(clients))
            t_cfg = time.perf_counter()
            tasks = {
                cid: replace(task, recipe=recipe)
                for cid, task in strategy.configure_train(
                    rnd, [cid for cid, _ in participants]
                ).items()
            }
            configure_s = time.perf_counter() - t_cfg
            jobs = [
                ClientJob(cid, seqs, tasks[cid], memory[cid], rnd=rnd)
                for cid, seqs in participants
            ]
            t_train = time.perf_counter()
            results = self.executor.map(cfg, jobs)
            train_s = time.perf_counter() - t_train
            for res in results:
                memory[res.update.cid] = res.memory
            wire_s, rejected = wire_seconds(
                [[t.state, *t.hook_state.values()] for t in tasks.values()],
                [[r.update.state, *r.update.extra.values()] for r in results],
            )
            if rejected:
                log.warning(
                    "%s round %d: non-finite updates from %s (a coordinator rejects them)",
                    method,
                    rnd,
                    ", ".join(results[i].update.cid for i in rejected),
                )
            t_agg = time.perf_counter()
            strategy.aggregate_train(rnd, [r.update for r in results])
            aggregate_s = time.perf_counter() - t_agg + configure_s
            rec = RoundRecord(
                round=rnd,
                train_seconds=train_s,
                aggregate_seconds=aggregate_s,
                wire_seconds=wire_s,
                mean_loss=float(np.mean([r.update.metrics["loss"] for r in results])),
                download_bytes={
                    cid: state_nbytes(t.state)
                    + sum(state_nbytes(s) for s in t.hook_state.values())
                    for cid, t in tasks.items()
                },
                upload_bytes={
                    r.update.cid: state_nbytes(r.update.state)
                    + sum(state_nbytes(s) for s in r.update.extra.values())
                    for r in results
                },
            )
            last = rnd >= cfg.rounds - cfg.last_rounds
            if last or (cfg.eval_every and (rnd + 1) % cfg.eval_every == 0):
                rec.test, rec.routes, samples = self.evaluate(strategy)
            records.append(rec)
            if checkpoint is not None:
                meta, states = strategy.state_dict()
                checkpoint.save(RunState(method, rnd + 1, meta, states, memory, records, samples))
            if rec.test is not None:
                bar.set_postfix(
                    abs_rel=f"{rec.test['all']['abs_rel']:.3f}", loss=f"{rec.mean_loss:.3f}"
                )
            else:
                bar.set_postfix(loss=f"{rec.mean_loss:.3f}")
            if on_round:
                on_round(rec)
        final, groups, per_seq = final_metrics(records, cfg.last_rounds)
        clusters, params = strategy_outputs(
            strategy, self.config.method_params.get(method, {}), pooled=pooled
        )
        return MethodRun(
            method,
            records,
            final,
            per_seq,
            groups,
            clusters,
            self.fleet.descriptor_seconds,
            setup,
            samples,
            params,
            strategy,
        )

    def evaluate(
        self, strategy: Router
    ) -> tuple[
        dict[str, dict[str, float]],
        dict[str, list[int]],
        dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]],
    ]:
        """Metrics of every test sequence with its routed model (no test-time training):
        overall (mean over sequences), per platform and environment group, per sequence."""
        per_seq: dict[str, dict[str, float]] = {}
        routes: dict[str, list[int]] = {}
        samples = {}
        groups: dict[str, list[dict[str, float]]] = {}
        for seq, desc, extra in self.fleet.test_queries:
            labels = {"platform": seq.meta.platform, "environment": seq.meta.environment}
            decision = strategy.route(desc, labels=labels, extra=extra)
            routes[seq.name] = decision.clusters
            set_state(self._eval_model, decision.state)
            metrics, sample = evaluate_sequence(self._eval_model, seq, self.config)
            per_seq[seq.name] = metrics
            samples[seq.name] = sample
            groups.setdefault(f"platform:{seq.meta.platform}", []).append(metrics)
            groups.setdefault(f"environment:{seq.meta.environment}", []).append(metrics)
        out = {"all": _mean_dicts(list(per_seq.values()))}
        out.update({g: _mean_dicts(rows) for g, rows in groups.items()})
        out.update({f"seq:{k}": v for k, v in per_seq.items()})
        return out, routes, samples


def final_metrics(
    records: Sequence[RoundRecord], last_rounds: int
) -> tuple[dict[str, float], dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """A run's numbers: the mean over the evaluations of its last ``last_rounds`` rounds,
    overall, per platform/environment group and per test sequence."""
    tests = [r.test for r in records[-last_rounds:] if r.test is not None]
    last = tests[-1] if tests else {}
    final = _mean_dicts([t["all"] for t in tests])
    groups = {
        g: _mean_dicts([t[g] for t in tests])
        for g in last
        if g != "all" and not g.startswith("seq:")
    }
    per_seq = {g[4:]: _mean_dicts([t[g] for t in tests]) for g in last if g.startswith("seq:")}
    return final, groups, per_seq


def strategy_outputs(
    strategy: Strategy, params: Mapping[str, Any], *, pooled: bool = False
) -> tuple[list[list[int]], dict[str, Any]]:
    """A trained strategy's cluster members (none for global or pooled methods) and its
    parameters with the thresholds it settled on (tau, PACFL's threshold)."""
    clusters = (
        [np.flatnonzero(r).tolist() for r in strategy.M_star]
        if hasattr(strategy, "M_star") and not pooled
        else []
    )
    out = dict(params)
    for key in ("tau", "threshold"):
        if getattr(strategy, key, None) is not None:
            out[key] = float(getattr(strategy, key))
    return clusters, out


def _mean_dicts(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    if not rows:
        return {}
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def pretrain(scenario: Scenario, config: SimConfig, *, progress: bool = True) -> DepthModel:
    """Train the initial checkpoint on the scenario's pretraining split (sequences no client
    sees): the stand-in for the ImageNet-pretrained encoders of the paper.

    Deterministic for a seed: it runs on ``config.pretrain_threads`` torch threads whatever the
    caller's setting (restored afterwards), so the checkpoint does not depend on the machine's
    core count.
    """
    if not scenario.pretrain:
        raise ValueError(f"scenario {scenario.root} has no pretraining split")
    before = torch.get_num_threads()
    torch.set_num_threads(config.pretrain_threads)
    try:
        return _pretrain(scenario, config, progress=progress)
    finally:
        torch.set_num_threads(before)


def _pretrain(scenario: Scenario, config: SimConfig, *, progress: bool) -> DepthModel:
    """One optimizer through the whole run: AdamW with ``pretrain_warmup`` of linear warmup,
    then a cosine decay to 2 % of ``pretrain_lr`` (a one-cycle shape)."""
    torch.manual_seed(config.seed)
    model = config.build_model()
    dataset = FrameDataset(scenario.pretrain, config.image_size, flip=True, seed=config.seed)
    steps = config.pretrain_steps
    trainer = LocalTrainer(
        model,
        config=TrainConfig(
            num_steps=steps,
            batch_size=config.pretrain_batch,
            optimizer=OptimizerConfig(
                lr=config.pretrain_lr,
                weight_decay=config.weight_decay,
                schedule="cosine",
                warmup_steps=min(round(config.pretrain_warmup * steps), steps - 1),
                final_lr_fraction=0.02,
            ),
            seed=config.seed,
        ),
    )
    bar = tqdm(total=steps, desc="pretrain", unit="step", disable=not progress)
    recent: list[float] = []

    def on_step(step: int, loss: float) -> None:
        recent.append(loss)
        bar.update(1)
        if (step + 1) % 25 == 0 or step + 1 == steps:
            bar.set_postfix(loss=f"{np.mean(recent[-25:]):.3f}")

    trainer.fit(dataset, on_step=on_step)
    bar.close()
    model.eval()
    return model


def initial_model(config: SimConfig, weights: str | None = None) -> DepthModel:
    """A seeded model, loaded strictly from ``weights`` when given."""
    torch.manual_seed(config.seed)
    model = config.build_model()
    if weights is not None:
        from fedepth.models import load_weights

        load_weights(model, weights)
    model.eval()
    return model


def config_dict(config: SimConfig) -> dict[str, Any]:
    d = asdict(config)
    d["image_size"] = list(config.image_size)
    d["method_params"] = {k: dict(v) for k, v in config.method_params.items()}
    return d
