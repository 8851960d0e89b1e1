"""Model registry: ``@register_model`` factories, ``create_model(name, ...)``, ``list_models``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from fedepth.depth_range import FLEET, check_depth_range
from fedepth.models.base import DepthModel

Factory = Callable[..., DepthModel]
F = TypeVar("F", bound=Factory)

_REGISTRY: dict[str, Factory] = {}


def register_model(fn: F) -> F:
    """Register a model factory under its function name with ``_`` spelled ``-``.

    ``def adabins_lite(*, min_depth, max_depth, **cfg)`` registers ``"adabins-lite"``. A factory
    takes keyword-only arguments, including ``min_depth`` and ``max_depth``, and returns a
    :class:`~fedepth.models.base.DepthModel`.
    """
    name = fn.__name__.replace("_", "-")
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is already registered")
    _REGISTRY[name] = fn
    return fn


def list_models() -> list[str]:
    """The registered model names, sorted."""
    return sorted(_REGISTRY)


def default_encoder(name: str) -> str:
    """The encoder model ``name`` is built on unless its configuration names another."""
    import inspect

    if name not in _REGISTRY:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
    return str(inspect.signature(_REGISTRY[name]).parameters["encoder"].default)


def create_model(
    name: str,
    *,
    min_depth: float = FLEET.min_depth,
    max_depth: float = FLEET.max_depth,
    weights: str | Path | None = None,
    variance_focus: float | None = None,
    **cfg: Any,
) -> DepthModel:
    """Build the registered model ``name``; load ``weights`` (a local safetensors file) strictly.

    ``cfg`` holds the factory's own keyword arguments (encoder, encoder_init, encoder_weights,
    head sizes). ``encoder_init`` is how the encoder's weights begin: ``"imagenet"`` (every
    factory's default: torchvision's checkpoint, found and verified on disk by
    :mod:`fedepth.models.checkpoints`; a missing or altered file raises
    :class:`~fedepth.models.checkpoints.CheckpointError` naming it) or ``"random"``.
    ``min_depth``/``max_depth`` are the metric range of the output (:mod:`fedepth.depth_range`;
    default: the fleet's, indoors and out).
    ``variance_focus`` is the SILog loss's lambda (None: the model's default, 0.85 as in
    AdaBins / NeWCRFs); lower values weigh the global scale of a prediction more.

    Convolution weights are kept channels-last (NHWC), which carries the activations through
    the convolutions in the same layout: a training step of the lite models is 1.07-1.29x faster
    on CPU than in the default layout (``benchmarks/models.py``, docs/results.md "Training step
    speed"); the state, the files and the results are layout-free.
    """
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown model {name!r}; known models: {', '.join(list_models())}"
        ) from None
    check_depth_range(min_depth, max_depth, f"model {name!r}")
    try:
        model = factory(min_depth=float(min_depth), max_depth=float(max_depth), **cfg)
    except TypeError as exc:
        raise TypeError(f"bad configuration for model {name!r}: {exc}") from exc
    if variance_focus is not None:
        if not 0.0 <= variance_focus <= 1.0:
            raise ValueError(f"variance_focus must be in [0, 1], got {variance_focus}")
        model.variance_focus = float(variance_focus)
    model.to(memory_format=torch.channels_last)
    model.model_name = name
    # the encoder and its start as built, defaults included, so that the card reproduces them
    model.model_config = {
        "min_depth": float(min_depth),
        "max_depth": float(max_depth),
        **cfg,
        "encoder": model.encoder.name,
        "encoder_init": model.encoder.init,
    }
    if weights is not None:
        from fedepth.models.state import load_weights

        load_weights(model, weights)
    return model
