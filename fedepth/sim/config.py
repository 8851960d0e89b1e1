"""The configuration of a simulated run: :class:`SimConfig` and its JSON form.

Everything that determines a run: the model, the clients' training recipe (round by round),
rounds, evaluation and pretraining settings; :func:`config_dict` is the copy saved with the
results.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fedepth.data.holdout import check_share
from fedepth.depth_range import FLEET
from fedepth.models import DepthModel, create_model
from fedepth.models.base import DESCRIPTOR_LAYERS, DescriptorLayers
from fedepth.models.checkpoints import ENCODER_INITS
from fedepth.optconfig import TrainConfig
from fedepth.recipe import TrainRecipe, round_lr
from fedepth.strategies.pacfl import BASIS_SIZE
from fedepth.updates import UpdateBounds

#: torch threads of :func:`pretrain` unless configured otherwise
PRETRAIN_THREADS = 2

#: version of :func:`pretrain`'s recipe, part of the checkpoint cache key: bump it when the
#: code changes what a pretraining run with the same settings produces (4: channels-last
#: convolution weights and NeWCRFs' one-window coarse levels round differently; 5: the lite
#: families on MobileNetV2 from ImageNet)
PRETRAIN_REGIME = 5

_RECIPE = TrainRecipe()
#: values of SimConfig.descriptor_encoder
DESCRIPTOR_ENCODERS = ("model", "imagenet")


@dataclass(frozen=True)
class SimConfig:
    """Everything that determines a simulated run (saved next to the results)."""

    model: str = "newcrfs-lite"
    #: how the encoder's weights begin before pretraining: imagenet (torchvision's checkpoint,
    #: fedepth.models.checkpoints) | random (the ablation)
    encoder_init: str = "imagenet"
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
    #: the encoder maps the descriptor pools (DepthModel.forward_features): shallow | deepest.
    #: Robots and depth_node always describe with the default, so only an in-process benchmark
    #: can use another.
    descriptor_layers: DescriptorLayers = "shallow"
    #: whose encoder the descriptor reads: model (the initial checkpoint's, pretrained for
    #: depth) | imagenet (the frozen ImageNet encoder of the model's architecture, untouched by
    #: pretraining). Robots and depth_node describe with the model's, so only an in-process
    #: benchmark can use imagenet.
    descriptor_encoder: str = "model"
    pacfl_basis: int = BASIS_SIZE
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
    #: the coordinator's norm bounds (its validation.max_update_norm, max_group_norms), applied
    #: to every client update in-process as well (fedepth.updates.UpdateBounds): the largest
    #: L2 distance of an update's state to the model it was trained from, and of each extra
    #: group's norm; by group name (``state`` included), overriding max_update_norm. Off (None,
    #: no group bounds) by default, as in the coordinator.
    max_update_norm: float | None = None
    max_group_norms: Mapping[str, float] = field(default_factory=dict)
    #: the share of every training client's frames held out of its training as its
    #: validation split: the tail of each of its sequences (fedepth.data.holdout), scored
    #: with the model the client downloads in every evaluated round; in [0, 1), 0: none
    validation_share: float = 0.0

    def __post_init__(self) -> None:
        self.update_bounds()  # a bound <= 0 is refused now, not in the first round
        check_share(self.validation_share)
        if self.encoder_init not in ENCODER_INITS:
            raise ValueError(
                f"encoder_init must be one of {', '.join(ENCODER_INITS)}, got "
                f"{self.encoder_init!r}"
            )
        if self.descriptor_encoder not in DESCRIPTOR_ENCODERS:
            raise ValueError(
                f"descriptor_encoder must be one of {', '.join(DESCRIPTOR_ENCODERS)}, got "
                f"{self.descriptor_encoder!r}"
            )
        if self.descriptor_layers not in DESCRIPTOR_LAYERS:
            raise ValueError(
                f"descriptor_layers must be one of {', '.join(DESCRIPTOR_LAYERS)}, got "
                f"{self.descriptor_layers!r}"
            )

    def update_bounds(self) -> UpdateBounds:
        """The norm bounds every client update is checked against (the coordinator's rule)."""
        return UpdateBounds(self.max_update_norm, dict(self.max_group_norms))

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

    def model_key(self) -> tuple[Any, ...]:
        """Every setting :meth:`build_model` reads: equal keys build the same model."""
        size = (int(self.image_size[0]), int(self.image_size[1]))
        return (
            self.model,
            self.encoder_init,
            self.min_depth,
            self.max_depth,
            self.variance_focus,
            size,
        )

    def build_model(self) -> DepthModel:
        """The configured model; its card records ``image_size`` as the input size."""
        name, encoder_init, min_depth, max_depth, variance_focus, size = self.model_key()
        model = create_model(
            name,
            min_depth=min_depth,
            max_depth=max_depth,
            variance_focus=variance_focus,
            encoder_init=encoder_init,
        )
        model.input_size = size
        return model

    def pretrain_key(self) -> str:
        """A short stable hash of every setting the pretrained checkpoint depends on (its cache
        key: change any of them and the checkpoint is trained anew)."""
        fields = {
            k: getattr(self, k)
            for k in (
                "model",
                "encoder_init",
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


def config_dict(config: SimConfig) -> dict[str, Any]:
    d = asdict(config)
    d["image_size"] = list(config.image_size)
    d["method_params"] = {k: dict(v) for k, v in config.method_params.items()}
    d["max_group_norms"] = dict(config.max_group_norms)
    return d
