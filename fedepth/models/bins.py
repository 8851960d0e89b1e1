"""AdaBins family: decoder, mini-ViT, adaptive bins from token 0, range-attention queries.

Mechanism as in AdaBins (Bhat et al., CVPR 2021): a U-Net decoder gives a (B, C, H/2, W/2) map;
a mini-ViT over its patches outputs token 0 -> MLP -> normalised bin widths, and tokens
1..Q -> range-attention queries dotted with every pixel's embedding; a 1x1 conv + softmax over
the Q range-attention maps gives per-pixel bin probabilities; depth is their weighted sum of bin
centres, with bin edges starting at ``min_depth``. Loss: SILog + 0.1 x bin-centre chamfer.

Small inputs: upstream fails when the patch grid has fewer than Q + 1 tokens. Here the patch
grid adapts: the effective patch size shrinks (the map is resampled so each smaller patch fills
the fixed ``patch_size`` embedding kernel) until there are at least Q + 1 tokens, and the learned
2-D positional grid is interpolated to the token grid. The query count Q is a fixed, configured
number (the output conv depends on it); small configurations use fewer queries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fedepth.losses import bin_chamfer_loss, silog_loss
from fedepth.models.base import DepthModel, DepthOutput, check_target, resize_to
from fedepth.models.encoders import Encoder
from fedepth.models.registry import register_model


@dataclass
class BinsOutput(DepthOutput):
    """AdaBins output: depth plus bin edges (B, n_bins + 1) and bin centres (B, n_bins)."""

    bin_edges: torch.Tensor
    bin_centers: torch.Tensor


class UpSampleBN(nn.Module):
    """AdaBins decoder block: upsample, concatenate the skip, two conv-BN-LeakyReLU."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_ch, out_ch, 3, padding=1),
            nn.BatchNorm2d(out_ch),
            nn.LeakyReLU(),
            nn.Conv2d(out_ch, out_ch, 3, padding=1),
            nn.BatchNorm2d(out_ch),
            nn.LeakyReLU(),
        )

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        up = F.interpolate(x, size=skip.shape[-2:], mode="bilinear", align_corners=True)
        return self.net(torch.cat([up, skip], dim=1))


class BinsDecoder(nn.Module):
    """1x1 bottleneck on the deepest map, then one :class:`UpSampleBN` per shallower map."""

    def __init__(self, channels: tuple[int, ...], *, width: int, out_channels: int) -> None:
        super().__init__()
        self.bottleneck = nn.Conv2d(channels[-1], width, 1)
        widths = [max(width >> i, 16) for i in range(len(channels))]
        self.ups = nn.ModuleList(
            UpSampleBN(widths[i] + skip, widths[i + 1]) for i, skip in enumerate(channels[-2::-1])
        )
        self.out = nn.Conv2d(widths[-1], out_channels, 3, padding=1)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottleneck(feats[-1])
        for up, skip in zip(self.ups, feats[-2::-1], strict=True):
            x = up(x, skip)
        return self.out(x)


def token_grid(h: int, w: int, patch_size: int, min_tokens: int) -> tuple[int, int, int]:
    """Token grid (gh, gw) and effective patch size for an (h, w) map.

    The largest patch size <= ``patch_size`` giving at least ``min_tokens`` tokens; 0 as the
    patch size means even 1x1 patches are too few and the map must be upsampled to (gh, gw).
    """
    for p in range(patch_size, 0, -1):
        if (h // p) * (w // p) >= min_tokens:
            return h // p, w // p, p
    k = math.ceil(math.sqrt(min_tokens / (h * w)))
    while (h * k) * (w * k) < min_tokens:
        k += 1
    return h * k, w * k, 0


class PatchTransformer(nn.Module):
    """Patch embedding + learned 2-D positions + a transformer encoder (AdaBins' mViT body)."""

    def __init__(
        self,
        in_ch: int,
        *,
        patch_size: int,
        embed_dim: int,
        num_heads: int,
        num_layers: int,
        ff_dim: int,
        pos_grid: tuple[int, int] = (16, 16),
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.embed = nn.Conv2d(in_ch, embed_dim, patch_size, stride=patch_size)
        self.pos = nn.Parameter(torch.rand(1, embed_dim, *pos_grid))
        layer = nn.TransformerEncoderLayer(
            embed_dim, num_heads, dim_feedforward=ff_dim, dropout=dropout, batch_first=True
        )
        self.transformer = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor, min_tokens: int) -> torch.Tensor:
        """Tokens (B, L, E) of the map ``x``, with L >= ``min_tokens``."""
        h, w = x.shape[-2:]
        p = self.patch_size
        gh, gw, p_eff = token_grid(h, w, p, min_tokens)
        region = x[..., : gh * p_eff, : gw * p_eff] if p_eff else x
        if p_eff != p:
            region = F.interpolate(
                region, size=(gh * p, gw * p), mode="bilinear", align_corners=False
            )
        tokens = self.embed(region)  # (B, E, gh, gw)
        pos = F.interpolate(self.pos, size=(gh, gw), mode="bilinear", align_corners=False)
        tokens = (tokens + pos).flatten(2).transpose(1, 2)
        out: torch.Tensor = self.transformer(tokens)
        return out


class MiniViT(nn.Module):
    """AdaBins' mViT: normalised bin widths from token 0, range-attention maps from tokens 1..Q."""

    def __init__(
        self,
        in_ch: int,
        *,
        n_bins: int,
        n_queries: int,
        patch_size: int,
        embed_dim: int,
        num_heads: int,
        num_layers: int,
        ff_dim: int,
        mlp_dim: int,
    ) -> None:
        super().__init__()
        self.n_queries = n_queries
        self.patch_transformer = PatchTransformer(
            in_ch,
            patch_size=patch_size,
            embed_dim=embed_dim,
            num_heads=num_heads,
            num_layers=num_layers,
            ff_dim=ff_dim,
        )
        self.conv3x3 = nn.Conv2d(in_ch, embed_dim, 3, padding=1)
        self.regressor = nn.Sequential(
            nn.Linear(embed_dim, mlp_dim),
            nn.LeakyReLU(),
            nn.Linear(mlp_dim, mlp_dim),
            nn.LeakyReLU(),
            nn.Linear(mlp_dim, n_bins),
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.patch_transformer(x, self.n_queries + 1)
        head, queries = tokens[:, 0], tokens[:, 1 : self.n_queries + 1]
        # range attention: each pixel's embedding dotted with each query, (B, Q, H, W)
        ram = torch.einsum("bchw,bqc->bqhw", self.conv3x3(x), queries)
        y = torch.relu(self.regressor(head)) + 0.1  # AdaBins' "linear" bin-width norm
        return y / y.sum(dim=1, keepdim=True), ram


class AdaBins(DepthModel):
    """AdaBins depth network over any :class:`Encoder` (see the module docstring)."""

    def __init__(
        self,
        *,
        encoder: Encoder,
        min_depth: float,
        max_depth: float,
        n_bins: int = 256,
        n_queries: int = 128,
        decoder_width: int = 2048,
        embed_dim: int = 128,
        patch_size: int = 16,
        num_heads: int = 4,
        num_layers: int = 4,
        ff_dim: int = 1024,
        mlp_dim: int = 256,
        chamfer_weight: float = 0.1,
        variance_focus: float = 0.85,
    ) -> None:
        super().__init__(
            encoder=encoder,
            min_depth=min_depth,
            max_depth=max_depth,
            variance_focus=variance_focus,
        )
        self.chamfer_weight = float(chamfer_weight)
        self.decoder = BinsDecoder(encoder.channels, width=decoder_width, out_channels=embed_dim)
        self.adaptive_bins = MiniViT(
            embed_dim,
            n_bins=n_bins,
            n_queries=n_queries,
            patch_size=patch_size,
            embed_dim=embed_dim,
            num_heads=num_heads,
            num_layers=num_layers,
            ff_dim=ff_dim,
            mlp_dim=mlp_dim,
        )
        self.conv_out = nn.Conv2d(n_queries, n_bins, 1)

    def forward_train(self, rgb: torch.Tensor) -> BinsOutput:
        unet_out = self.decoder(self.encode(rgb))
        widths_normed, ram = self.adaptive_bins(unet_out)
        probs = torch.softmax(self.conv_out(ram), dim=1)
        widths = (self.max_depth - self.min_depth) * widths_normed
        edges = torch.cumsum(F.pad(widths, (1, 0), value=self.min_depth), dim=1)
        centers = 0.5 * (edges[:, :-1] + edges[:, 1:])
        depth = (probs * centers[:, :, None, None]).sum(dim=1, keepdim=True)
        return BinsOutput(
            depth=resize_to(depth, rgb.shape[-2:]), bin_edges=edges, bin_centers=centers
        )

    def loss(
        self, out: DepthOutput, gt: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """SILog + ``chamfer_weight`` x bin-centre chamfer loss."""
        if not isinstance(out, BinsOutput):
            raise TypeError(f"AdaBins.loss needs a BinsOutput, got {type(out).__name__}")
        check_target(out.depth, gt, valid)
        si = silog_loss(out.depth, gt, valid, variance_focus=self.variance_focus)
        chamfer = bin_chamfer_loss(out.bin_centers, gt, valid)
        total = si + self.chamfer_weight * chamfer
        return total, {"silog": float(si.detach()), "chamfer": float(chamfer.detach())}


@register_model
def adabins_lite(
    *,
    min_depth: float,
    max_depth: float,
    encoder: str = "mobilenet_v2",
    encoder_init: str = "imagenet",
    encoder_weights: str | Path | None = None,
    n_bins: int = 128,
    n_queries: int = 32,
    patch_size: int = 8,
) -> AdaBins:
    """CPU AdaBins: MobileNetV2 encoder (ImageNet start), 128 bins, 32 queries, 32-d mini-ViT."""
    return AdaBins(
        encoder=Encoder(encoder, init=encoder_init, weights=encoder_weights),
        min_depth=min_depth,
        max_depth=max_depth,
        n_bins=n_bins,
        n_queries=n_queries,
        decoder_width=128,
        embed_dim=32,
        patch_size=patch_size,
        num_heads=4,
        num_layers=4,
        ff_dim=128,
        mlp_dim=64,
    )


@register_model
def adabins(
    *,
    min_depth: float,
    max_depth: float,
    encoder: str = "efficientnet_b5",
    encoder_init: str = "imagenet",
    encoder_weights: str | Path | None = None,
    n_bins: int = 256,
    n_queries: int = 128,
    patch_size: int = 16,
) -> AdaBins:
    """Paper AdaBins: EfficientNet-B5 encoder, 2048-wide decoder, 256 bins, 128 queries."""
    return AdaBins(
        encoder=Encoder(encoder, init=encoder_init, weights=encoder_weights),
        min_depth=min_depth,
        max_depth=max_depth,
        n_bins=n_bins,
        n_queries=n_queries,
        patch_size=patch_size,
    )
