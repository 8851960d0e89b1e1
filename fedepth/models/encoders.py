"""torchvision encoders as multi-scale feature extractors (``create_feature_extractor``).

Weights never download: every torchvision model is built with ``weights=None`` and, for an
ImageNet start, loaded strictly from torchvision's own checkpoint file found and verified on disk
by :mod:`fedepth.models.checkpoints` (a plain ``state_dict`` file read with
``torch.load(weights_only=True)``, or safetensors).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fedepth.models.checkpoints import ENCODER_INITS, Found, resolve


@dataclass(frozen=True)
class EncoderSpec:
    """Which torchvision nodes an encoder taps, their channels and strides (shallow to deep)."""

    nodes: tuple[str, ...]
    channels: tuple[int, ...]
    reductions: tuple[int, ...]
    channels_last: bool = False  # Swin stages return (B, H, W, C)


_CNN_STRIDES = (2, 4, 8, 16, 32)
_VIT_STRIDES = (4, 8, 16, 32)
_RESNET_NODES = ("relu", "layer1", "layer2", "layer3", "layer4")
_EFFNET_NODES = ("features.1", "features.2", "features.3", "features.5", "features.8")
_STAGE_NODES = ("features.1", "features.3", "features.5", "features.7")

ENCODERS: dict[str, EncoderSpec] = {
    "resnet18": EncoderSpec(_RESNET_NODES, (64, 64, 128, 256, 512), _CNN_STRIDES),
    "resnet34": EncoderSpec(_RESNET_NODES, (64, 64, 128, 256, 512), _CNN_STRIDES),
    "resnet50": EncoderSpec(_RESNET_NODES, (64, 256, 512, 1024, 2048), _CNN_STRIDES),
    # MobileNetV2: the last block of each stride; features.18 is the 1x1 conv to 1280 channels
    "mobilenet_v2": EncoderSpec(
        ("features.1", "features.3", "features.6", "features.13", "features.18"),
        (16, 24, 32, 96, 1280),
        _CNN_STRIDES,
    ),
    "mobilenet_v3_large": EncoderSpec(
        ("features.1", "features.3", "features.6", "features.12", "features.16"),
        (16, 24, 40, 112, 960),
        _CNN_STRIDES,
    ),
    "efficientnet_b0": EncoderSpec(_EFFNET_NODES, (16, 24, 40, 112, 1280), _CNN_STRIDES),
    "efficientnet_b5": EncoderSpec(_EFFNET_NODES, (24, 40, 64, 176, 2048), _CNN_STRIDES),
    "convnext_tiny": EncoderSpec(_STAGE_NODES, (96, 192, 384, 768), _VIT_STRIDES),
    "swin_t": EncoderSpec(_STAGE_NODES, (96, 192, 384, 768), _VIT_STRIDES, channels_last=True),
    "swin_b": EncoderSpec(_STAGE_NODES, (128, 256, 512, 1024), _VIT_STRIDES, channels_last=True),
}


def list_encoders() -> list[str]:
    """Names accepted by :class:`Encoder`."""
    return sorted(ENCODERS)


def read_state_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a local weights file: safetensors, or a ``state_dict`` saved by ``torch.save``.

    Pickled files are read with ``weights_only=True`` (tensors only, no code execution).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"weights file {str(p)!r} does not exist")
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(p))
    obj = torch.load(str(p), map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"weights file {str(p)!r} does not hold a state_dict of tensors")
    return dict(obj)


def load_module_strict(module: nn.Module, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Copy ``tensors`` into ``module``; every name and shape must match (errors name the file)."""
    expected = module.state_dict()
    missing = [k for k in expected if k not in tensors]
    unexpected = [k for k in tensors if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensor(s) {missing[:5]}" + (" ..." if len(missing) > 5 else ""))
        if unexpected:
            parts.append(
                f"unexpected tensor(s) {unexpected[:5]}" + (" ..." if len(unexpected) > 5 else "")
            )
        raise ValueError(f"weights file {source!r} does not match the model: " + "; ".join(parts))
    for k, ref in expected.items():
        if tuple(tensors[k].shape) != tuple(ref.shape):
            raise ValueError(
                f"weights file {source!r}: tensor {k!r} has shape {tuple(tensors[k].shape)}, "
                f"the model expects {tuple(ref.shape)}"
            )
    module.load_state_dict(tensors, strict=True)


class Encoder(nn.Module):
    """A torchvision backbone returning its multi-scale feature maps, shallow to deep, NCHW.

    Input is an ImageNet-normalised (B, 3, H, W) batch. ``channels`` and ``reductions`` (stride of
    each map relative to the input) describe the outputs. ``init`` is how the weights begin:
    ``"random"`` (torch's initialisation, under the caller's seed) or ``"imagenet"``:
    torchvision's ImageNet checkpoint of the *whole* model (classifier included), at ``weights``
    when given, else where :func:`fedepth.models.checkpoints.find` finds it, verified by the hash
    in its name and loaded strictly (``checkpoint`` then records what was loaded).
    """

    def __init__(
        self, name: str, *, init: str = "random", weights: str | Path | None = None
    ) -> None:
        super().__init__()
        if name not in ENCODERS:
            raise KeyError(
                f"unknown encoder {name!r}; known encoders: {', '.join(list_encoders())}"
            )
        if init not in ENCODER_INITS:
            raise ValueError(
                f"encoder_init must be one of {', '.join(ENCODER_INITS)}, got {init!r}"
            )
        if weights is not None and init != "imagenet":
            raise ValueError(
                f"encoder_weights {str(weights)!r} is an ImageNet checkpoint: it needs "
                f"encoder_init: imagenet, not {init!r}"
            )
        # torchvision is imported here, not at module level: it pulls in torch._dynamo (seconds
        # of start-up) that processes only aggregating weights, like the coordinator, never need
        import torchvision
        from torchvision.models.feature_extraction import create_feature_extractor

        spec = ENCODERS[name]
        backbone: nn.Module = getattr(torchvision.models, name)(weights=None)
        self.checkpoint: Found | None = None
        if init == "imagenet":
            found = resolve(name, weights)
            assert found.path is not None
            load_module_strict(backbone, read_state_file(found.path), str(found.path))
            self.checkpoint = found
        self.name = name
        self.init = init
        self.channels: tuple[int, ...] = spec.channels
        self.reductions: tuple[int, ...] = spec.reductions
        self._channels_last = spec.channels_last
        self.body = create_feature_extractor(
            backbone, return_nodes={node: str(i) for i, node in enumerate(spec.nodes)}
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = self.body(x)
        feats = [out[str(i)] for i in range(len(self.channels))]
        if self._channels_last:
            feats = [f.permute(0, 3, 1, 2).contiguous() for f in feats]
        return feats
