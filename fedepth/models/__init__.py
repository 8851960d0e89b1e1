"""Depth models behind one registry: ``create_model(name, ...)``, ``list_models()``.

Every model shares the contract of :class:`~fedepth.models.base.DepthModel`; the heads live one
per file (``regression``, ``bins``, ``crf``, ``dct``) over torchvision encoders (``encoders``).
"""

from fedepth.models import bins, crf, dct, regression
from fedepth.models.base import DepthModel, DepthOutput
from fedepth.models.bins import BinsOutput
from fedepth.models.card import (
    CardMismatchError,
    ModelCard,
    card_of,
    check_card,
    load_model,
    read_card,
)
from fedepth.models.checkpoints import CheckpointError
from fedepth.models.dct import DCTOutput
from fedepth.models.encoders import Encoder, list_encoders
from fedepth.models.registry import create_model, default_encoder, list_models, register_model
from fedepth.models.state import (
    buffer_names,
    get_state,
    load_state,
    load_weights,
    save_state,
    save_weights,
    set_state,
    trainable_names,
)

__all__ = [
    "BinsOutput",
    "CardMismatchError",
    "CheckpointError",
    "DCTOutput",
    "DepthModel",
    "DepthOutput",
    "Encoder",
    "ModelCard",
    "bins",
    "buffer_names",
    "card_of",
    "check_card",
    "create_model",
    "crf",
    "dct",
    "default_encoder",
    "get_state",
    "list_encoders",
    "list_models",
    "load_model",
    "load_state",
    "load_weights",
    "read_card",
    "register_model",
    "regression",
    "save_state",
    "save_weights",
    "set_state",
    "trainable_names",
]
