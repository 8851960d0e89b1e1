"""Numpy states in and out of modules, and safetensors files.

A *state* is a dict name -> numpy array: a module's ``state_dict`` (parameters and persistent
buffers) as host arrays, the unit ``fedepth.strategies.aggregate`` averages and the wire carries.

BatchNorm in federation: running means / variances and ``num_batches_tracked`` are persistent
buffers, so they are part of the state and are averaged with the weights (FedAvg-style BN; the
aggregation rounds the integer counter). The trainer updates them during local steps (train
mode, momentum 0.1). A strategy that keeps BN local (FedBN) can leave out the names that
:func:`buffer_names` lists; the FL hooks (FedProx, SCAFFOLD, FedDyn) act on trainable parameters
only (:func:`trainable_names`), never on buffers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedepth.models.encoders import load_module_strict

#: A model's weights as numpy arrays by tensor name: the one definition of a *state*, read-only
#: (functions that make a fresh state return ``dict[str, np.ndarray]``). The strategies, the
#: coordinator and the nodes all import it from here (``fedepth.strategies.State`` re-exports it).
State = Mapping[str, np.ndarray]


def _c_order(a: np.ndarray) -> np.ndarray:
    """A C-contiguous array of the same shape (``np.ascontiguousarray`` turns 0-d into 1-d)."""
    arr = np.asarray(a)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def get_state(module: nn.Module) -> dict[str, np.ndarray]:
    """The module's ``state_dict`` as numpy copies on the host (bfloat16/half -> float32)."""
    out: dict[str, np.ndarray] = {}
    for name, t in module.state_dict().items():
        t = t.detach()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        out[name] = t.cpu().numpy().copy()
    return out


def set_state(module: nn.Module, state: State, *, source: str = "state") -> None:
    """Load a numpy state into ``module`` strictly (same names and shapes; dtypes are cast)."""
    ref = module.state_dict()
    tensors = {
        k: torch.from_numpy(_c_order(v)).to(ref[k].dtype) if k in ref else torch.empty(0)
        for k, v in state.items()
    }
    load_module_strict(module, tensors, source)


def trainable_names(module: nn.Module) -> list[str]:
    """Names of the parameters that require gradients (what the FL hooks cover)."""
    return [n for n, p in module.named_parameters() if p.requires_grad]


def buffer_names(module: nn.Module) -> list[str]:
    """Names of the persistent buffers in the state (BatchNorm statistics and counters)."""
    params = {n for n, _ in module.named_parameters()}
    return [n for n in module.state_dict() if n not in params]


def save_state(
    path: str | Path, state: State, *, metadata: Mapping[str, str] | None = None
) -> None:
    """Write a numpy state to a safetensors file."""
    from safetensors.numpy import save_file

    arrays = {k: _c_order(v) for k, v in state.items()}
    save_file(arrays, str(path), metadata=dict(metadata) if metadata else None)


def load_state(path: str | Path) -> dict[str, np.ndarray]:
    """Read a safetensors file into a numpy state."""
    from safetensors.numpy import load_file

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"weights file {str(p)!r} does not exist")
    return dict(load_file(str(p)))


def save_weights(
    model: nn.Module, path: str | Path, *, input_size: tuple[int, int] | None = None
) -> None:
    """Save ``model``'s state to safetensors with its model card in the metadata.

    ``input_size`` (height, width) is the training resolution recorded on the card (None: the
    model's ``input_size`` attribute, set by the benchmark's pretraining).
    """
    from fedepth.models.card import CARD_KEY, card_of

    metadata = {}
    name = getattr(model, "model_name", None)
    if name:
        metadata["fedepth.model"] = str(name)
        metadata[CARD_KEY] = card_of(model, input_size=input_size).to_json()
    config = getattr(model, "model_config", None)
    if config:
        metadata["fedepth.config"] = json.dumps(config, default=str, sort_keys=True)
    save_state(path, get_state(model), metadata=metadata)


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load a safetensors file into ``model`` strictly, after checking its model card (a
    mismatch raises :class:`~fedepth.models.card.CardMismatchError` naming both sides; a file
    without a card loads with a warning). Errors name the file and the tensor."""
    from fedepth.models.card import card_from_metadata, check_card, read_metadata

    source = f"weights file {str(path)!r}"
    card = card_from_metadata(read_metadata(path), source)
    check_card(card, model, source)
    set_state(model, load_state(path), source=str(path))
    if card is not None and card.input_size is not None and hasattr(model, "input_size"):
        setattr(model, "input_size", card.input_size)  # noqa: B010 (nn.Module typing)
