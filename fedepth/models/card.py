"""The model card every weights file carries: what a checkpoint is and how it must be used.

A :class:`ModelCard` names the registry model and its configuration (encoder and how its
weights began, ``encoder_init``), the ImageNet checkpoint the encoder started from (file name and
SHA-256), the metric depth range, the input size it was trained at, the input normalisation and
the fedepth version that wrote it. :func:`fedepth.models.save_weights` stores it in the
safetensors metadata (key ``fedepth.card``, JSON); :func:`fedepth.models.load_weights` checks
it against the model being loaded, and :func:`load_model` builds the model FROM the card, so no
separate model name or depth range has to be kept in step with a weights file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from torch import nn

from fedepth.depth_range import FLEET, check_depth_range
from fedepth.models.base import IMAGENET_MEAN, IMAGENET_STD

log = logging.getLogger(__name__)

#: safetensors metadata key of the card (JSON).
CARD_KEY = "fedepth.card"
#: Factory arguments that only say how to initialise, not what the model is (not compared).
_INIT_ONLY = ("encoder_weights", "min_depth", "max_depth")
#: the encoders of the lite families before they started from ImageNet: a card written then
#: names neither its encoder nor its start (both were these defaults, from random weights)
_LEGACY_ENCODERS = {
    "regression-lite": "mobilenet_v3_large",
    "adabins-lite": "efficientnet_b0",
    "newcrfs-lite": "mobilenet_v3_large",
    "dcdepth-lite": "mobilenet_v3_large",
    "regression": "resnet50",
    "adabins": "efficientnet_b5",
    "newcrfs": "swin_b",
    "dcdepth": "swin_b",
}


class CardMismatchError(ValueError):
    """Weights whose card does not fit the model they are loaded into."""


def _norm(mean: Any = IMAGENET_MEAN, std: Any = IMAGENET_STD) -> dict[str, Any]:
    return {
        "input": "RGB float in [0, 1]",
        "mean": [round(float(x), 6) for x in mean],
        "std": [round(float(x), 6) for x in std],
    }


def _version() -> str:
    import fedepth

    return str(fedepth.__version__)


@dataclass(frozen=True)
class ModelCard:
    """Architecture, depth range, input size and normalisation of a weights file."""

    #: registry name (``fedepth.models.list_models()``)
    model: str
    #: the factory's own keyword arguments (encoder, head sizes), JSON values
    config: Mapping[str, Any] = field(default_factory=dict)
    min_depth: float = FLEET.min_depth
    max_depth: float = FLEET.max_depth
    #: (height, width) the weights were trained at; None: not recorded
    input_size: tuple[int, int] | None = None
    #: what ``forward`` expects; the models normalise internally with this mean / std
    normalization: Mapping[str, Any] = field(default_factory=_norm)
    fedepth_version: str = field(default_factory=_version)
    #: the ImageNet checkpoint the encoder started from (``{"file": ..., "sha256": ...}``);
    #: None: a random start. :meth:`build` needs the same file on this machine.
    encoder_checkpoint: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        check_depth_range(self.min_depth, self.max_depth, f"the model card of {self.model}")

    def to_json(self) -> str:
        d = asdict(self)
        d["config"] = dict(self.config)
        d["normalization"] = dict(self.normalization)
        d["input_size"] = None if self.input_size is None else list(self.input_size)
        d["encoder_checkpoint"] = (
            None if self.encoder_checkpoint is None else dict(self.encoder_checkpoint)
        )
        return json.dumps(d, sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str, source: str = "card") -> ModelCard:
        """Parse a card (raises ValueError naming ``source`` on a malformed one)."""
        try:
            d = json.loads(text)
            size = d.get("input_size")
            ckpt = d.get("encoder_checkpoint")
            return cls(
                model=str(d["model"]),
                config=dict(d.get("config") or {}),
                min_depth=float(d["min_depth"]),
                max_depth=float(d["max_depth"]),
                input_size=None if size is None else (int(size[0]), int(size[1])),
                normalization=dict(d.get("normalization") or _norm()),
                fedepth_version=str(d.get("fedepth_version", "")),
                encoder_checkpoint=None
                if ckpt is None
                else {"file": str(ckpt["file"]), "sha256": str(ckpt["sha256"])},
            )
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"{source}: malformed model card ({exc!r})") from None

    def describe(self) -> str:
        """One line: ``newcrfs-lite {encoder: ...} depth 0.001-80 m, input 64x96``."""
        cfg = " " + json.dumps(dict(self.config), sort_keys=True) if self.config else ""
        size = f"{self.input_size[0]}x{self.input_size[1]}" if self.input_size else "any"
        return f"{self.model}{cfg}, depth {self.min_depth:g}-{self.max_depth:g} m, input {size}"

    def differences(self, other: ModelCard) -> list[str]:
        """The fields in which ``other`` describes a different model (input size and version
        are informational: every model is fully convolutional)."""
        out = []
        if self.model != other.model:
            out.append("model")
        if _identity(self.config) != _identity(other.config):
            out.append("config")
        for name in ("min_depth", "max_depth"):
            if abs(getattr(self, name) - getattr(other, name)) > 1e-9:
                out.append(name)
        if _norm(**_ms(self.normalization)) != _norm(**_ms(other.normalization)):
            out.append("normalization")
        return out

    def build(self) -> nn.Module:
        """A fresh registry model as this card describes it (no weights loaded).

        An ImageNet start needs the card's checkpoint here too: a missing or altered one raises
        :class:`~fedepth.models.checkpoints.CheckpointError` naming it, and nothing is built.
        """
        from fedepth.models.registry import create_model

        model = create_model(
            self.model,
            min_depth=self.min_depth,
            max_depth=self.max_depth,
            **_identity(self.config),
        )
        if self.encoder_checkpoint is not None:
            found = model.encoder.checkpoint
            want = self.encoder_checkpoint
            have = (
                None if found is None else {"file": found.checkpoint.file, "sha256": found.sha256}
            )
            if have != {"file": want.get("file"), "sha256": want.get("sha256")}:
                from fedepth.models.checkpoints import CheckpointError

                raise CheckpointError(
                    f"the model card names encoder checkpoint {want.get('file')!r} (SHA-256 "
                    f"{str(want.get('sha256'))[:12]}), but this machine starts "
                    f"{self.config.get('encoder')} from "
                    + ("nothing" if have is None else f"{have['file']!r}")
                    + ": install the card's checkpoint or use weights made with this one"
                )
        model.input_size = self.input_size
        return model


def _upgrade(card: ModelCard) -> ModelCard:
    """A weights file's card with the encoder and its start spelled out: a file written before
    ImageNet starts names neither (its encoder was the model's old default, from random)."""
    if "encoder_init" in card.config:
        return card
    config = {**card.config, "encoder_init": "random"}
    if "encoder" not in config and card.model in _LEGACY_ENCODERS:
        config["encoder"] = _LEGACY_ENCODERS[card.model]
    return replace(card, config=config)


def _ms(norm: Mapping[str, Any]) -> dict[str, Any]:
    return {"mean": norm.get("mean", IMAGENET_MEAN), "std": norm.get("std", IMAGENET_STD)}


def _identity(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in _INIT_ONLY}


def card_of(model: nn.Module, *, input_size: tuple[int, int] | None = None) -> ModelCard:
    """The card of a registry model (``input_size`` None: the model's ``input_size``)."""
    name = getattr(model, "model_name", None)
    if not name:
        raise ValueError(f"{type(model).__name__} was not built by create_model: no model card")
    config = dict(getattr(model, "model_config", {}) or {})
    size = input_size if input_size is not None else getattr(model, "input_size", None)
    mean = getattr(model, "_mean", None)
    std = getattr(model, "_std", None)
    norm = _norm() if mean is None or std is None else _norm(mean.flatten(), std.flatten())
    found = getattr(getattr(model, "encoder", None), "checkpoint", None)
    return ModelCard(
        model=str(name),
        config=json.loads(json.dumps(_identity(config), default=str)),
        min_depth=float(
            getattr(model, "min_depth", None) or config.get("min_depth", FLEET.min_depth)
        ),
        max_depth=float(
            getattr(model, "max_depth", None) or config.get("max_depth", FLEET.max_depth)
        ),
        input_size=None if size is None else (int(size[0]), int(size[1])),
        normalization=norm,
        encoder_checkpoint=None
        if found is None
        else {"file": found.checkpoint.file, "sha256": str(found.sha256)},
    )


def check_card(card: ModelCard | None, model: nn.Module, source: str) -> None:
    """Raise :class:`CardMismatchError` (one line naming both sides) unless ``card`` fits
    ``model``; a missing card (weights from before cards) is only a warning."""
    if card is None:
        log.warning(
            "%s has no model card (written before fedepth cards); loading it unchecked", source
        )
        return
    try:
        mine = card_of(model)
    except ValueError:
        return  # not a registry model (a bare module): nothing to compare with
    diff = card.differences(mine)
    if diff:
        raise CardMismatchError(
            f"{source} is {card.describe()}, but the model is {mine.describe()} "
            f"(differs in {', '.join(diff)}); build the model from the card "
            "(fedepth.models.load_model) or use weights made for this model"
        )


def read_metadata(path: str | Path) -> dict[str, str]:
    """The safetensors metadata of a weights file (empty when it has none)."""
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"weights file {str(p)!r} does not exist")
    with safe_open(str(p), framework="numpy") as f:
        return dict(f.metadata() or {})


def card_from_metadata(metadata: Mapping[str, str], source: str) -> ModelCard | None:
    """The card in a file's metadata, None when it has none (a file from before ImageNet
    starts gets its encoder and ``encoder_init: random`` spelled out)."""
    text = metadata.get(CARD_KEY)
    return None if text is None else _upgrade(ModelCard.from_json(text, source))


def read_card(path: str | Path) -> ModelCard | None:
    """The card of a weights file, None for a file written before cards."""
    return card_from_metadata(read_metadata(path), repr(str(path)))


def load_model(path: str | Path) -> nn.Module:
    """Build the model a weights file's card describes and load the weights into it."""
    from fedepth.models.state import load_weights

    card = read_card(path)
    if card is None:
        raise ValueError(
            f"weights file {str(path)!r} has no model card: build the model yourself "
            "(create_model(name, min_depth=..., max_depth=...)) and load_weights into it"
        )
    model = card.build()
    load_weights(model, path)
    return model
