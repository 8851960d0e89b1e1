"""NeWCRFs family: PPM first estimate, then neural window fully-connected CRF levels.

Mechanism as in NeWCRFs (Yuan et al., CVPR 2022): a pyramid pooling module on the deepest map
gives the first estimate; each CRF level, from coarse to fine, runs window multi-head attention in
which queries and keys come from the image features at that level and values from the coarser
estimate (the CRF's unary potential), with a relative position bias and two blocks per level,
the second on windows shifted by half a window; PixelShuffle(2) carries each level's output to
the next finer one; a 3x3 conv and a sigmoid give a normalised depth at stride 4, upsampled to
the input size and multiplied by ``max_depth``.

Differences from upstream, all for arbitrary input sizes: a coarser estimate whose PixelShuffle
size differs from the next map (odd sizes) is resized to it; window padding tokens are masked out
of the attention (upstream lets them in as keys).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fedepth.models.base import ConvBNAct, DepthModel, DepthOutput, resize_to
from fedepth.models.encoders import Encoder
from fedepth.models.registry import register_model

_MASKED = -100.0  # attention bias of excluded pairs, as in Swin / NeWCRFs


def window_partition(x: torch.Tensor, ws: int) -> torch.Tensor:
    """(B, H, W, C) with H, W multiples of ``ws`` -> (B * nW, ws * ws, C)."""
    b, h, w, c = x.shape
    x = x.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, ws * ws, c)


def window_reverse(windows: torch.Tensor, ws: int, h: int, w: int) -> torch.Tensor:
    """Inverse of :func:`window_partition`: (B * nW, ws * ws, C) -> (B, H, W, C)."""
    c = windows.shape[-1]
    b = windows.shape[0] // ((h // ws) * (w // ws))
    x = windows.view(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, c)


def window_mask(h: int, w: int, ws: int, shift: int, device: torch.device) -> torch.Tensor | None:
    """Additive attention mask (nW, N, N) for an (h, w) map padded to window multiples.

    Masks keys that are padding and, for shifted windows, pairs from different regions of the
    cyclic shift (Swin's mask). ``None`` when nothing is masked.
    """
    hp, wp = -(-h // ws) * ws, -(-w // ws) * ws
    if shift == 0 and (hp, wp) == (h, w):
        return None
    pad = torch.zeros(1, hp, wp, 1, device=device)
    pad[:, h:, :, :] = 1.0
    pad[:, :, w:, :] = 1.0
    region = torch.zeros(1, hp, wp, 1, device=device)
    if shift > 0:
        cnt = 0
        for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                region[:, hs, wsl, :] = cnt
                cnt += 1
        pad = torch.roll(pad, shifts=(-shift, -shift), dims=(1, 2))
    pad_w = window_partition(pad, ws).squeeze(-1)  # (nW, N)
    reg_w = window_partition(region, ws).squeeze(-1)
    mask = (reg_w[:, None, :] != reg_w[:, :, None]).float() * _MASKED
    return mask + pad_w[:, None, :] * _MASKED


def single_window(
    h: int, w: int, ws: int, shift: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An (h, w) map with h, w <= ``ws`` as ONE window without its padding tokens.

    Returns each token's position (row-major, (h * w,)) in the padded, cyclically shifted
    ``ws`` x ``ws`` window that :func:`window_partition` would make of it, and the additive mask
    (1, h * w, h * w) of the shift's regions (``None`` when one region holds every token): the
    same attention as the padded window's, whose padding keys :func:`window_mask` hides anyway,
    at a fraction of the cost (the two coarsest NeWCRFs levels of a 64 x 96 input are 2 x 3 and
    4 x 6 maps in 7 x 7 windows).
    """
    rows = torch.arange(h, device=device)
    cols = torch.arange(w, device=device)
    positions = (((rows - shift) % ws)[:, None] * ws + ((cols - shift) % ws)[None, :]).flatten()
    if shift == 0 or (h <= shift and w <= shift):
        return positions, None
    # after the roll, rows (columns) below the shift wrap to the window's last region
    region = ((rows < shift).long()[:, None] * 2 + (cols < shift).long()[None, :]).flatten()
    mask = (region[:, None] != region[None, :]).float() * _MASKED
    return positions, mask.unsqueeze(0)


class WindowCRFAttention(nn.Module):
    """Window multi-head attention: q, k from features, v from the estimate, relative bias."""

    relative_position_index: torch.Tensor

    def __init__(self, dim: int, window_size: int, num_heads: int) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"CRF dim {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        ws = window_size
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * ws - 1) ** 2, num_heads))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        coords = torch.stack(
            torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")
        ).flatten(1)  # (2, N)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (ws - 1)
        index = rel[..., 0] * (2 * ws - 1) + rel[..., 1]
        self.register_buffer("relative_position_index", index, persistent=False)
        self.qk = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(
        self,
        x: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B * nW, N, C) windows of features and estimate; ``positions``: the tokens' places
        in a ``ws`` x ``ws`` window when N is not all of it (:func:`single_window`)."""
        bw, n, c = x.shape
        nh = self.num_heads
        qk = self.qk(x).reshape(bw, n, 2, nh, c // nh).permute(2, 0, 3, 1, 4)
        q, k = qk[0] * self.scale, qk[1]
        attn = q @ k.transpose(-2, -1)  # (bw, nh, N, N)
        index = self.relative_position_index
        if positions is not None:
            index = index[positions][:, positions]
        bias = self.relative_position_bias_table[index.reshape(-1)]
        attn = attn + bias.view(n, n, nh).permute(2, 0, 1).unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = attn.view(bw // nw, nw, nh, n, n) + mask[None, :, None]
            attn = attn.view(bw, nh, n, n)
        attn = attn.softmax(dim=-1)
        vh = v.reshape(bw, n, nh, c // nh).transpose(1, 2)
        out = (attn @ vh).transpose(1, 2).reshape(bw, n, c)
        result: torch.Tensor = self.proj(out)
        return result


class CRFBlock(nn.Module):
    """One (shifted) window CRF block: ``x + attn(norm(x), v)``, then ``x + mlp(norm(x))``."""

    def __init__(
        self, dim: int, *, num_heads: int, window_size: int, shift: int, mlp_ratio: float
    ) -> None:
        super().__init__()
        self.window_size = window_size
        self.shift = shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowCRFAttention(dim, window_size, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(
        self,
        x: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x``, ``v``: (B, H, W, C) features and estimate; ``mask`` from :func:`window_mask`,
        or with ``positions`` from :func:`single_window` for a map that fits in one window."""
        b, h, w, c = x.shape
        ws, s = self.window_size, self.shift
        shortcut = x
        x = self.norm1(x)
        if positions is not None:
            out = self.attn(x.reshape(b, h * w, c), v.reshape(b, h * w, c), mask, positions)
            x = shortcut + out.view(b, h, w, c)
            return x + self.mlp(self.norm2(x))
        pad_b, pad_r = (-h) % ws, (-w) % ws
        x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
        v = F.pad(v, (0, 0, 0, pad_r, 0, pad_b))
        hp, wp = h + pad_b, w + pad_r
        if s:
            x = torch.roll(x, shifts=(-s, -s), dims=(1, 2))
            v = torch.roll(v, shifts=(-s, -s), dims=(1, 2))
        out = self.attn(window_partition(x, ws), window_partition(v, ws), mask)
        out = window_reverse(out, ws, hp, wp)
        if s:
            out = torch.roll(out, shifts=(s, s), dims=(1, 2))
        x = shortcut + out[:, :h, :w, :]
        return x + self.mlp(self.norm2(x))


class CRFLevel(nn.Module):
    """A NeWCRFs level: project features and estimate, a window block and a shifted one, norm."""

    def __init__(
        self,
        input_dim: int,
        *,
        embed_dim: int,
        v_dim: int,
        window_size: int,
        num_heads: int,
        depth: int = 2,
        mlp_ratio: float = 4.0,
        proj_kernel: int = 3,
    ) -> None:
        super().__init__()
        self.window_size = window_size
        self.proj_x: nn.Module = (
            nn.Conv2d(input_dim, embed_dim, proj_kernel, padding=proj_kernel // 2)
            if input_dim != embed_dim
            else nn.Identity()
        )
        self.proj_v: nn.Module = (
            nn.Conv2d(v_dim, embed_dim, 3, padding=1) if v_dim != embed_dim else nn.Identity()
        )
        self.blocks = nn.ModuleList(
            CRFBlock(
                embed_dim,
                num_heads=num_heads,
                window_size=window_size,
                shift=0 if i % 2 == 0 else window_size // 2,
                mlp_ratio=mlp_ratio,
            )
            for i in range(depth)
        )
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, feat: torch.Tensor, estimate: torch.Tensor) -> torch.Tensor:
        """(B, Cin, H, W) features, (B, Cv, h, w) coarser estimate -> (B, embed_dim, H, W)."""
        x = self.proj_x(feat)
        v = self.proj_v(resize_to(estimate, feat.shape[-2:]))
        h, w = x.shape[-2:]
        x = x.permute(0, 2, 3, 1)
        v = v.permute(0, 2, 3, 1)
        ws = self.window_size
        layouts: dict[int, tuple[torch.Tensor | None, torch.Tensor | None]] = {}
        for blk in self.blocks:
            assert isinstance(blk, CRFBlock)
            if blk.shift not in layouts:
                layouts[blk.shift] = (
                    single_window(h, w, ws, blk.shift, x.device)
                    if h <= ws and w <= ws
                    else (None, window_mask(h, w, ws, blk.shift, x.device))
                )
            positions, mask = layouts[blk.shift]
            x = blk(x, v, None if mask is None else mask.to(x.dtype), positions)
        return self.norm(x).permute(0, 3, 1, 2).contiguous()


class PSPHead(nn.Module):
    """Pyramid pooling module (PSPNet) + 3x3 bottleneck: NeWCRFs' first estimate.

    The 1x1 pooled branch uses GroupNorm (2 channels per group, as upstream) since BatchNorm
    cannot normalise one value per channel at batch size 1.
    """

    def __init__(
        self, in_ch: int, channels: int, pool_scales: Sequence[int] = (1, 2, 3, 6)
    ) -> None:
        super().__init__()
        self.stages = nn.ModuleList()
        for s in pool_scales:
            norm: nn.Module = (
                nn.GroupNorm(max(channels // 2, 1), channels)
                if s == 1
                else nn.BatchNorm2d(channels)
            )
            self.stages.append(
                nn.Sequential(
                    nn.AdaptiveAvgPool2d(s),
                    nn.Conv2d(in_ch, channels, 1, bias=False),
                    norm,
                    nn.ReLU(inplace=True),
                )
            )
        self.bottleneck = ConvBNAct(in_ch + len(pool_scales) * channels, channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        outs = [x] + [resize_to(stage(x), size) for stage in self.stages]
        out: torch.Tensor = self.bottleneck(torch.cat(outs, dim=1))
        return out


class NeWCRFs(DepthModel):
    """NeWCRFs depth network over the four deepest maps (strides 4..32) of any :class:`Encoder`.

    ``crf_dims`` are the CRF widths at strides 4, 8, 16, 32; each must be divisible by 4 so that
    PixelShuffle(2) hands ``dim / 4`` channels to the next finer level.
    """

    def __init__(
        self,
        *,
        encoder: Encoder,
        min_depth: float,
        max_depth: float,
        crf_dims: Sequence[int] = (128, 256, 512, 1024),
        num_heads: Sequence[int] = (4, 8, 16, 32),
        ppm_channels: int = 512,
        window_size: int = 7,
        mlp_ratio: float = 4.0,
        proj_kernel: int = 3,
        variance_focus: float = 0.85,
    ) -> None:
        super().__init__(
            encoder=encoder,
            min_depth=min_depth,
            max_depth=max_depth,
            variance_focus=variance_focus,
        )
        if len(encoder.channels) < 4 or len(crf_dims) != 4 or len(num_heads) != 4:
            raise ValueError("NeWCRFs needs 4 encoder levels, 4 CRF dims and 4 head counts")
        if any(d % 4 for d in crf_dims):
            raise ValueError(f"CRF dims must be divisible by 4 (PixelShuffle(2)), got {crf_dims}")
        chans = encoder.channels[-4:]
        self.decoder = PSPHead(chans[3], ppm_channels)
        v_dims = (crf_dims[1] // 4, crf_dims[2] // 4, crf_dims[3] // 4, ppm_channels)
        self.crfs = nn.ModuleList(
            CRFLevel(
                chans[i],
                embed_dim=crf_dims[i],
                v_dim=v_dims[i],
                window_size=window_size,
                num_heads=num_heads[i],
                mlp_ratio=mlp_ratio,
                proj_kernel=proj_kernel,
            )
            for i in range(4)
        )
        self.disp_head = nn.Conv2d(crf_dims[0], 1, 3, padding=1)

    def forward_train(self, rgb: torch.Tensor) -> DepthOutput:
        feats = self.encode(rgb)[-4:]
        estimate = self.decoder(feats[3])
        for i in (3, 2, 1, 0):
            estimate = self.crfs[i](feats[i], estimate)
            if i:
                estimate = F.pixel_shuffle(estimate, 2)
        disp = torch.sigmoid(self.disp_head(estimate))
        return DepthOutput(depth=resize_to(disp, rgb.shape[-2:]) * self.max_depth)


@register_model
def newcrfs_lite(
    *,
    min_depth: float,
    max_depth: float,
    encoder: str = "mobilenet_v2",
    encoder_init: str = "imagenet",
    encoder_weights: str | Path | None = None,
    window_size: int = 7,
) -> NeWCRFs:
    """CPU NeWCRFs: MobileNetV2 encoder (ImageNet start), CRF widths 24..192, 1x1 projections."""
    return NeWCRFs(
        encoder=Encoder(encoder, init=encoder_init, weights=encoder_weights),
        min_depth=min_depth,
        max_depth=max_depth,
        crf_dims=(24, 48, 96, 192),
        num_heads=(2, 4, 4, 8),
        ppm_channels=48,
        window_size=window_size,
        mlp_ratio=2.0,
        proj_kernel=1,
    )


@register_model
def newcrfs(
    *,
    min_depth: float,
    max_depth: float,
    encoder: str = "swin_b",
    encoder_init: str = "imagenet",
    encoder_weights: str | Path | None = None,
    window_size: int = 7,
) -> NeWCRFs:
    """Paper NeWCRFs: Swin-B encoder (torchvision), CRF widths 128..1024, PPM 512."""
    return NeWCRFs(
        encoder=Encoder(encoder, init=encoder_init, weights=encoder_weights),
        min_depth=min_depth,
        max_depth=max_depth,
        window_size=window_size,
    )
