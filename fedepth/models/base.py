"""The contract every depth model shares: forward, forward_features, forward_train and loss.

* ``forward(rgb)``: (B, 3, H, W) float RGB in [0, 1] -> metric depth (B, 1, H, W) at the input
  resolution, clamped to ``[min_depth, max_depth]``. The model applies ImageNet normalisation
  itself, so callers never normalise.
* ``forward_features(rgb, layers)``: the encoder maps the client descriptor GeM-pools, each
  passed through a ReLU (a list of (B, C_i, h_i, w_i)): by default (``"shallow"``) every map of
  stride at most :data:`DESCRIPTOR_MAX_STRIDE`, ``"deepest"`` the deepest map alone. The ReLU is
  a no-op on ResNet maps (already post-ReLU) and clamps the negative part of Hardswish / SiLU /
  LayerNorm outputs of the other encoders. Why shallow: docs/results.md, "Which encoder maps
  describe a robot".
* ``forward_train(rgb)`` -> :class:`DepthOutput` (``depth`` plus head-specific auxiliaries) and
  ``loss(out, gt, valid)`` -> ``(loss, {term: float})``: the only two methods the trainer uses,
  so every registered model trains through the same loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from fedepth.depth_range import check_depth_range
from fedepth.losses import silog_loss
from fedepth.models.encoders import Encoder

#: which encoder maps the descriptor pools (:meth:`DepthModel.forward_features`)
DescriptorLayers = Literal["shallow", "deepest"]
DESCRIPTOR_LAYERS: tuple[str, ...] = get_args(DescriptorLayers)
#: the largest stride (input pixels per map cell) of a map in the "shallow" descriptor: the
#: first three maps of a CNN encoder (strides 2, 4, 8), the first two of a ViT's (4, 8)
DESCRIPTOR_MAX_STRIDE = 8

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class DepthOutput:
    """What ``forward_train`` returns: metric depth (B, 1, H, W) at input resolution, unclamped.

    Heads subclass it to carry the auxiliaries their loss needs (bin edges, DCT coefficients).
    """

    depth: torch.Tensor


class FeatureExtractor(nn.Module):
    """An :class:`Encoder` behind ImageNet normalisation: the maps a descriptor pools.

    Alone it is the frozen ImageNet encoder a robot can describe its data with before it holds
    any depth model (:meth:`imagenet`); :class:`DepthModel` adds a depth head to it.
    """

    _mean: torch.Tensor
    _std: torch.Tensor

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder
        # Constants, not state: non-persistent, so they never enter a federated state.
        self.register_buffer(
            "_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False
        )
        self.register_buffer("_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    @classmethod
    def imagenet(cls, encoder: str) -> FeatureExtractor:
        """The frozen ImageNet encoder ``encoder`` (torchvision's checkpoint, verified), in
        eval mode with no parameter requiring gradients."""
        out = cls(Encoder(encoder, init="imagenet")).eval()
        out.requires_grad_(False)
        return out

    def normalize(self, rgb: torch.Tensor) -> torch.Tensor:
        """Check an RGB batch in [0, 1] and apply ImageNet normalisation."""
        if rgb.ndim != 4 or rgb.shape[1] != 3:
            raise ValueError(f"expected an RGB batch (B, 3, H, W), got shape {tuple(rgb.shape)}")
        if not rgb.is_floating_point():
            raise ValueError(f"expected a float RGB batch in [0, 1], got dtype {rgb.dtype}")
        return (rgb - self._mean.to(rgb.dtype)) / self._std.to(rgb.dtype)

    def encode(self, rgb: torch.Tensor) -> list[torch.Tensor]:
        """Encoder feature maps of an RGB batch in [0, 1], shallow to deep."""
        return self.encoder(self.normalize(rgb))

    def forward_features(
        self, rgb: torch.Tensor, layers: DescriptorLayers = "shallow"
    ) -> list[torch.Tensor]:
        """ReLU of the encoder maps the descriptor GeM-pools, shallow to deep: every map of
        stride <= :data:`DESCRIPTOR_MAX_STRIDE` (``"shallow"``), or the deepest (``"deepest"``)."""
        if layers not in DESCRIPTOR_LAYERS:
            raise ValueError(
                f"descriptor layers must be one of {', '.join(DESCRIPTOR_LAYERS)}, got {layers!r}"
            )
        maps = self.encode(rgb)
        if layers == "deepest":
            return [F.relu(maps[-1])]
        strides = self.encoder.reductions
        return [
            F.relu(m) for m, r in zip(maps, strides, strict=True) if r <= DESCRIPTOR_MAX_STRIDE
        ]


class DepthModel(FeatureExtractor):
    """Base class of all registered models: an :class:`Encoder` plus a depth head.

    Subclasses implement :meth:`forward_train` and, when the head adds loss terms, :meth:`loss`.
    """

    model_name: str
    model_config: dict[str, Any]
    #: (height, width) the weights were trained at, recorded on the model card; None: unknown
    input_size: tuple[int, int] | None

    def __init__(
        self, *, encoder: Encoder, min_depth: float, max_depth: float, variance_focus: float = 0.85
    ) -> None:
        super().__init__(encoder)
        check_depth_range(min_depth, max_depth, "a depth model")
        self.min_depth = float(min_depth)
        self.max_depth = float(max_depth)
        self.variance_focus = float(variance_focus)
        self.model_name = type(self).__name__
        self.model_config = {}
        self.input_size = None

    def forward_train(self, rgb: torch.Tensor) -> DepthOutput:
        """Depth and the auxiliaries of this head's loss."""
        raise NotImplementedError

    def forward(self, rgb: torch.Tensor) -> torch.Tensor:
        """Metric depth (B, 1, H, W) at input resolution, within [min_depth, max_depth]."""
        return self.forward_train(rgb).depth.clamp(self.min_depth, self.max_depth)

    def loss(
        self, out: DepthOutput, gt: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """SILog (AdaBins / NeWCRFs form) of ``out.depth`` against ``gt`` on ``valid`` pixels.

        ``gt`` is metric depth (B, 1, H, W) at the prediction's resolution, ``valid`` a bool
        mask of the same shape. Returns the scalar loss and its terms as floats.
        """
        check_target(out.depth, gt, valid)
        si = silog_loss(out.depth, gt, valid, variance_focus=self.variance_focus)
        return si, {"silog": float(si.detach())}


def check_target(pred: torch.Tensor, gt: torch.Tensor, valid: torch.Tensor) -> None:
    """Prediction, ground truth and mask must all be (B, 1, H, W) of one shape."""
    if gt.shape != pred.shape or valid.shape != pred.shape:
        raise ValueError(
            f"prediction {tuple(pred.shape)}, ground truth {tuple(gt.shape)} and valid mask "
            f"{tuple(valid.shape)} must have the same (B, 1, H, W) shape"
        )


def resize_to(x: torch.Tensor, size: tuple[int, int] | torch.Size) -> torch.Tensor:
    """Bilinear resize of (B, C, h, w) to ``size`` (no-op when already that size)."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)


class ConvBNAct(nn.Sequential):
    """Conv2d -> BatchNorm2d -> activation (ReLU by default)."""

    def __init__(
        self,
        in_ch: int,
        out_ch: int,
        kernel_size: int = 3,
        *,
        stride: int = 1,
        groups: int = 1,
        act: type[nn.Module] | None = nn.ReLU,
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(
                in_ch, out_ch, kernel_size, stride, kernel_size // 2, groups=groups, bias=False
            ),
            nn.BatchNorm2d(out_ch),
        ]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)
