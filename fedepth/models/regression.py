"""Regression baseline: an encoder-decoder with skip connections (FastDepth / monodepth style)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fedepth.models.base import ConvBNAct, DepthModel, DepthOutput, resize_to
from fedepth.models.encoders import Encoder
from fedepth.models.registry import register_model


class UpBlock(nn.Module):
    """Upsample to the skip's size, concatenate it, fuse with a depthwise-separable conv."""

    def __init__(self, in_ch: int, skip_ch: int, out_ch: int) -> None:
        super().__init__()
        ch = in_ch + skip_ch
        self.fuse = nn.Sequential(
            ConvBNAct(ch, ch, 5, groups=ch),  # FastDepth: 5x5 depthwise, then pointwise
            ConvBNAct(ch, out_ch, 1),
        )

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.fuse(torch.cat([resize_to(x, skip.shape[-2:]), skip], dim=1))


class RegressionDepth(DepthModel):
    """Encoder -> 1x1 bottleneck -> one :class:`UpBlock` per shallower encoder map -> 3x3 conv.

    Decoder widths halve at every level from ``decoder_width`` (floor 16). The output is
    ``min_depth + (max_depth - min_depth) * sigmoid(x)`` at the finest decoder level, bilinearly
    resized to the input resolution.
    """

    def __init__(
        self,
        *,
        encoder: Encoder,
        min_depth: float,
        max_depth: float,
        decoder_width: int = 256,
        variance_focus: float = 0.85,
    ) -> None:
        super().__init__(
            encoder=encoder,
            min_depth=min_depth,
            max_depth=max_depth,
            variance_focus=variance_focus,
        )
        chans = list(encoder.channels)
        widths = [max(decoder_width >> i, 16) for i in range(len(chans))]
        self.bottleneck = ConvBNAct(chans[-1], widths[0], 1)
        skips = chans[-2::-1]
        self.ups = nn.ModuleList(
            UpBlock(widths[i], skip, widths[i + 1]) for i, skip in enumerate(skips)
        )
        self.head = nn.Conv2d(widths[-1], 1, 3, padding=1)

    def forward_train(self, rgb: torch.Tensor) -> DepthOutput:
        feats = self.encode(rgb)
        x = self.bottleneck(feats[-1])
        for up, skip in zip(self.ups, feats[-2::-1], strict=True):
            x = up(x, skip)
        unit = torch.sigmoid(self.head(x))
        depth = self.min_depth + (self.max_depth - self.min_depth) * unit
        return DepthOutput(depth=resize_to(depth, rgb.shape[-2:]))


@register_model
def regression_lite(
    *,
    min_depth: float,
    max_depth: float,
    encoder: str = "mobilenet_v2",
    encoder_init: str = "imagenet",
    encoder_weights: str | Path | None = None,
    decoder_width: int = 256,
) -> RegressionDepth:
    """CPU baseline: MobileNetV2 encoder (ImageNet start), FastDepth-style decoder."""
    return RegressionDepth(
        encoder=Encoder(encoder, init=encoder_init, weights=encoder_weights),
        min_depth=min_depth,
        max_depth=max_depth,
        decoder_width=decoder_width,
    )


@register_model
def regression(
    *,
    min_depth: float,
    max_depth: float,
    encoder: str = "resnet50",
    encoder_init: str = "imagenet",
    encoder_weights: str | Path | None = None,
    decoder_width: int = 512,
) -> RegressionDepth:
    """GPU-size baseline: ResNet-50 encoder, the same decoder."""
    return RegressionDepth(
        encoder=Encoder(encoder, init=encoder_init, weights=encoder_weights),
        min_depth=min_depth,
        max_depth=max_depth,
        decoder_width=decoder_width,
    )
