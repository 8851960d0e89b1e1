"""DCDepth family: progressive prediction of depth's DCT coefficients, low to high frequency.

Mechanism as in DCDepth (Wang et al., NeurIPS 2024): log-depth is cut into 8x8 patches at stride 8
and represented by the orthonormal 2-D DCT of each patch; a ConvGRU on the stride-8 grid predicts
the coefficients group by group along the anti-diagonals (u + v = 0, 1, ..., 5, then {6, 7}, then
{8..14}), each step refining all coefficients predicted so far, and a last step refining all 64.
Each step's log-depth is the inverse DCT of the coefficients so far (scaled, as upstream, by
``4 log(max_depth)``, here floored at 4 for max depths below e) and gets its own SILog term,
weighted ``beta^(n-1-k)`` (normalised; beta = 0.8, the last step weighs most), plus a
frequency-sparsity term (weight 0.002) on each step's coefficients. The features feeding the GRU
come, as upstream, from a pyramid feature fusion first estimate refined by three NeWCRFs levels
(strides 32, 16, 8) plus stride-4 context.

Cheaper than upstream, as the issue asks: the coefficient tokenizer is one 1x1 embedding of the
64-channel coefficient map (upstream runs a conv stack per coefficient and a cross-attention), and
the log-depth input is a 3x3 conv over its 8x8 patches unshuffled to 64 channels. The step heads
apply DCDepth's pyramid pooling before their 3x3 conv (``head_ppm``; off in the lite size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fedepth.losses import frequency_sparsity, silog_from_log
from fedepth.models.base import ConvBNAct, DepthModel, DepthOutput, check_target, resize_to
from fedepth.models.crf import CRFLevel
from fedepth.models.encoders import Encoder
from fedepth.models.registry import register_model

PATCH = 8
#: Anti-diagonal groups (u + v) predicted at each step before the final all-coefficient step.
DIAGONAL_GROUPS: tuple[tuple[int, ...], ...] = (
    (0,),
    (1,),
    (2,),
    (3,),
    (4,),
    (5,),
    (6, 7),
    (8, 9, 10, 11, 12, 13, 14),
)


def dct_matrix(n: int) -> torch.Tensor:
    """Orthonormal DCT-II matrix T (n x n): ``coeffs = T @ X @ T.T``, ``X = T.T @ coeffs @ T``."""
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    t = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    t[0] /= math.sqrt(2.0)
    return t.float()


def diagonal_indices(diagonals: Sequence[int], n: int = PATCH) -> list[int]:
    """Flat indices ``u * n + v`` of the coefficients with ``u + v`` in ``diagonals``."""
    return [u * n + (s - u) for s in diagonals for u in range(n) if 0 <= s - u < n]


@dataclass
class DCTOutput(DepthOutput):
    """DCDepth output: final depth plus every step's log-depth and frequency-sparsity term."""

    log_depths: list[torch.Tensor]
    freq_regs: list[torch.Tensor]


class SepConvGRU(nn.Module):
    """Separable ConvGRU (RAFT / DCDepth): a 1x5 GRU update, then a 5x1 one.

    The update (z) and reset (r) gates of each direction share one conv with 2 x hidden outputs.
    """

    def __init__(self, hidden: int, inp: int) -> None:
        super().__init__()
        ch = hidden + inp
        self.convzr1 = nn.Conv2d(ch, 2 * hidden, (1, 5), padding=(0, 2))
        self.convq1 = nn.Conv2d(ch, hidden, (1, 5), padding=(0, 2))
        self.convzr2 = nn.Conv2d(ch, 2 * hidden, (5, 1), padding=(2, 0))
        self.convq2 = nn.Conv2d(ch, hidden, (5, 1), padding=(2, 0))

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        for czr, cq in ((self.convzr1, self.convq1), (self.convzr2, self.convq2)):
            z, r = torch.sigmoid(czr(torch.cat([h, x], dim=1))).chunk(2, dim=1)
            q = torch.tanh(cq(torch.cat([r * h, x], dim=1)))
            h = (1 - z) * h + z * q
        return h


class PyramidPooling(nn.Module):
    """DCDepth's step-head PPM: aspect-aware pooled 1x1 branches, depthwise-separable squeeze."""

    def __init__(self, dim: int, scales: Sequence[int] = (1, 2, 3, 6)) -> None:
        super().__init__()
        self.scales = tuple(scales)
        self.pool_convs = nn.ModuleList(nn.Conv2d(dim, dim, 1) for _ in self.scales)
        ch = dim * (len(self.scales) + 1)
        self.squeeze = nn.Sequential(
            nn.Conv2d(ch, ch, 7, padding=3, groups=ch, padding_mode="replicate"),
            nn.Conv2d(ch, dim, 1),
            nn.Hardswish(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if h >= w:
            sizes = [(max(round(h / w * s), 1), s) for s in self.scales]
        else:
            sizes = [(s, max(round(w / h * s), 1)) for s in self.scales]
        outs = [x] + [
            F.interpolate(conv(F.adaptive_avg_pool2d(x, s)), size=(h, w), mode="bilinear")
            for conv, s in zip(self.pool_convs, sizes, strict=True)
        ]
        out: torch.Tensor = self.squeeze(torch.cat(outs, dim=1))
        return out


class PyramidFeatureFusion(nn.Module):
    """First estimate at stride 32 from all four levels (DCDepth's PFF replacing the PPM)."""

    def __init__(self, in_channels: Sequence[int], channels: int) -> None:
        super().__init__()
        self.lateral = nn.ModuleList(ConvBNAct(c, channels, 1) for c in in_channels)
        self.fuse = ConvBNAct(channels * len(in_channels), channels, 3)

    def forward(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        size = (int(feats[-1].shape[-2]), int(feats[-1].shape[-1]))
        outs = [
            lat(F.adaptive_avg_pool2d(f, size)) for lat, f in zip(self.lateral, feats, strict=True)
        ]
        out: torch.Tensor = self.fuse(torch.cat(outs, dim=1))
        return out


class DCTUpdate(nn.Module):
    """The progressive DCT coefficient predictor on the stride-8 grid (DCDepth's update module)."""

    _idct: torch.Tensor
    _freq_weight: torch.Tensor

    def __init__(
        self,
        *,
        hidden_dim: int,
        input_dim: int,
        log_scale: float,
        seq_dropout: float,
        head_ppm: bool = True,
    ) -> None:
        super().__init__()
        self.log_scale = float(log_scale)
        self.seq_dropout = float(seq_dropout)
        p2 = PATCH * PATCH
        cumulative: list[int] = []
        steps: list[torch.Tensor] = []
        for group in DIAGONAL_GROUPS:
            cumulative += diagonal_indices(group)
            steps.append(torch.tensor(cumulative))
        steps.append(torch.arange(p2))  # final step: all coefficients
        self.n_steps = len(steps)
        for k, idx in enumerate(steps):
            self.register_buffer(f"_idx{k}", idx, persistent=False)
        t = dct_matrix(PATCH)
        self.register_buffer("_idct", torch.kron(t.t(), t.t()), persistent=False)
        u, v = torch.meshgrid(torch.arange(PATCH), torch.arange(PATCH), indexing="ij")
        weight = 1.2 ** (u + v).double() - 1.0
        self.register_buffer(
            "_freq_weight", (weight / weight.sum()).float().flatten(), persistent=False
        )

        mid = input_dim
        self.depth_in = nn.Sequential(
            nn.Conv2d(p2, mid, 3, padding=1, padding_mode="replicate"), nn.Hardswish()
        )
        self.coeff_embed = nn.Conv2d(p2, mid, 1)  # one embedding of the whole coefficient map
        self.step_embed = nn.Parameter(torch.zeros(self.n_steps, mid, 1, 1))
        self.fuse = nn.Sequential(nn.Conv2d(2 * mid, input_dim, 1), nn.Hardswish())
        self.gru = SepConvGRU(hidden_dim, input_dim)
        self.idx_embed = nn.Parameter(torch.empty(self.n_steps, hidden_dim, 1, 1))
        self.ppm: nn.Module = PyramidPooling(hidden_dim) if head_ppm else nn.Identity()
        self.heads = nn.ModuleList(
            nn.Conv2d(hidden_dim, len(idx), 3, padding=1, padding_mode="replicate")
            for idx in steps
        )
        with torch.no_grad():
            nn.init.trunc_normal_(self.idx_embed, std=1e-4)
            for k, conv in enumerate(self.heads):
                assert isinstance(conv, nn.Conv2d)
                if k < self.n_steps - 1:
                    nn.init.trunc_normal_(conv.weight, std=0.02 * 0.8**k)
                else:
                    nn.init.zeros_(conv.weight)
                assert conv.bias is not None
                nn.init.zeros_(conv.bias)

    def indices(self, k: int) -> torch.Tensor:
        idx: torch.Tensor = getattr(self, f"_idx{k}")
        return idx

    def to_log_depth(self, coeffs: torch.Tensor) -> torch.Tensor:
        """(B, 64, h, w) coefficients -> log-depth (B, 1, 8h, 8w) by per-patch inverse DCT.

        The 2-D inverse DCT of a patch is one 64 x 64 matrix (``kron(T.T, T.T)``) applied as a
        1x1 conv; PixelShuffle(8) lays each patch's 64 values out as its 8x8 pixels.
        """
        with torch.autocast(device_type=coeffs.device.type, enabled=False):
            pixels = F.conv2d(coeffs.float(), self._idct[:, :, None, None])
        return F.pixel_shuffle(pixels * (self.log_scale * PATCH * 0.5), PATCH)

    def forward(self, hidden: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Every step's log-depth (B, 1, 8h, 8w) and frequency-sparsity term.

        Coefficients accumulate, and the inverse DCT runs, in float32 even under autocast.
        """
        b, _, h, w = hidden.shape
        coeffs = hidden.new_zeros(b, PATCH * PATCH, h, w, dtype=torch.float32)
        log_depths: list[torch.Tensor] = []
        regs: list[torch.Tensor] = []
        log_depth = coeffs.new_zeros(b, 1, h * PATCH, w * PATCH)
        for k in range(self.n_steps):
            if k > 0:
                depth_feat = self.depth_in(F.pixel_unshuffle(log_depth.detach(), PATCH))
                coeff_feat = self.coeff_embed(coeffs.detach()) + self.step_embed[k]
                inp = self.fuse(torch.cat([depth_feat, coeff_feat], dim=1))
                new_hidden = self.gru(hidden, inp)
                if self.training and self.seq_dropout > 0:
                    keep = torch.bernoulli(hidden.new_full((b, 1, 1, 1), 1.0 - self.seq_dropout))
                    hidden = new_hidden * keep + hidden * (1.0 - keep)
                else:
                    hidden = new_hidden
            out = self.heads[k](self.ppm(hidden + self.idx_embed[k])).float()
            idx = self.indices(k)
            update = (
                out
                if idx.numel() == PATCH * PATCH
                else coeffs.new_zeros(coeffs.shape).index_copy(1, idx, out)
            )
            coeffs = update + coeffs.detach()
            flat = coeffs.permute(0, 2, 3, 1)
            regs.append(frequency_sparsity(flat, self._freq_weight) if k > 0 else flat.sum() * 0.0)
            log_depth = self.to_log_depth(coeffs)
            log_depths.append(log_depth)
        return log_depths, regs


class DCDepth(DepthModel):
    """DCDepth over the four deepest maps (strides 4..32) of any :class:`Encoder`.

    ``crf_dims`` are the CRF widths at strides 8, 16, 32 (the stride-8 level's width is the GRU
    hidden size); each of the two coarser ones must be divisible by 4 (PixelShuffle(2)).
    """

    def __init__(
        self,
        *,
        encoder: Encoder,
        min_depth: float,
        max_depth: float,
        crf_dims: Sequence[int] = (192, 512, 1024),
        num_heads: Sequence[int] = (8, 16, 32),
        fusion_channels: int = 512,
        input_dim: int = 128,
        window_size: int = 7,
        mlp_ratio: float = 4.0,
        proj_kernel: int = 3,
        seq_dropout: float = 0.3,
        head_ppm: bool = True,
        beta: float = 0.8,
        freq_reg_weight: float = 0.002,
        variance_focus: float = 0.85,
    ) -> None:
        super().__init__(
            encoder=encoder,
            min_depth=min_depth,
            max_depth=max_depth,
            variance_focus=variance_focus,
        )
        if len(encoder.channels) < 4 or len(crf_dims) != 3 or len(num_heads) != 3:
            raise ValueError("DCDepth needs 4 encoder levels, 3 CRF dims and 3 head counts")
        if crf_dims[1] % 4 or crf_dims[2] % 4:
            raise ValueError(f"CRF dims at strides 16, 32 must be divisible by 4, got {crf_dims}")
        self.beta = float(beta)
        self.freq_reg_weight = float(freq_reg_weight)
        chans = encoder.channels[-4:]
        hidden = crf_dims[0]
        self.decoder = PyramidFeatureFusion(chans, fusion_channels)
        v_dims = (crf_dims[1] // 4, crf_dims[2] // 4, fusion_channels)
        self.crfs = nn.ModuleList(
            CRFLevel(
                chans[i + 1],
                embed_dim=crf_dims[i],
                v_dim=v_dims[i],
                window_size=window_size,
                num_heads=num_heads[i],
                mlp_ratio=mlp_ratio,
                proj_kernel=proj_kernel,
            )
            for i in range(3)
        )
        self.context = ConvBNAct(chans[0], chans[0], 3, stride=2)
        self.project_hidden = nn.Conv2d(hidden + chans[0], hidden, 3, padding=1)
        self.update = DCTUpdate(
            hidden_dim=hidden,
            input_dim=input_dim,
            log_scale=max(math.log(max_depth), 1.0),
            seq_dropout=seq_dropout,
            head_ppm=head_ppm,
        )

    def step_weights(self, n: int) -> list[float]:
        """Per-step loss weights ``beta^(n-1-k) / sum``: later (finer) steps weigh more."""
        ys = [self.beta**j for j in range(n)]
        total = sum(ys)
        return [y / total for y in reversed(ys)]

    def forward_train(self, rgb: torch.Tensor) -> DCTOutput:
        height, width = rgb.shape[-2:]
        feats = self.encode(rgb)[-4:]
        estimate = self.decoder(feats)
        for i in (2, 1, 0):
            estimate = self.crfs[i](feats[i + 1], estimate)
            if i:
                estimate = F.pixel_shuffle(estimate, 2)
        grid = (-(-height // PATCH), -(-width // PATCH))
        context = resize_to(self.context(feats[0]), grid)
        hidden = torch.tanh(
            self.project_hidden(torch.cat([resize_to(estimate, grid), context], 1))
        )
        log_depths, regs = self.update(hidden)
        log_depths = [ld[..., :height, :width] for ld in log_depths]
        return DCTOutput(depth=torch.exp(log_depths[-1]), log_depths=log_depths, freq_regs=regs)

    def loss(
        self, out: DepthOutput, gt: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Sum over steps of ``w_k (SILog(log-depth_k) + freq_reg_weight * sparsity_k)``."""
        if not isinstance(out, DCTOutput):
            raise TypeError(f"DCDepth.loss needs a DCTOutput, got {type(out).__name__}")
        check_target(out.depth, gt, valid)
        total = out.depth.new_zeros(())
        terms: dict[str, float] = {}
        weights = self.step_weights(len(out.log_depths))
        for k, (ld, reg, wk) in enumerate(
            zip(out.log_depths, out.freq_regs, weights, strict=True)
        ):
            si = silog_from_log(ld, gt, valid, variance_focus=self.variance_focus)
            total = total + wk * (si + self.freq_reg_weight * reg)
            terms[f"silog_{k}"] = float(si.detach())
            terms[f"freq_{k}"] = float(reg.detach())
        terms["silog"] = terms[f"silog_{len(weights) - 1}"]
        return total, terms


@register_model
def dcdepth_lite(
    *,
    min_depth: float,
    max_depth: float,
    encoder: str = "mobilenet_v2",
    encoder_init: str = "imagenet",
    encoder_weights: str | Path | None = None,
    window_size: int = 7,
) -> DCDepth:
    """CPU DCDepth: MobileNetV2 encoder (ImageNet start), 32-d GRU on the stride-8 grid, CRF 192.

    The step heads are plain 3x3 convs (no per-step pyramid pooling) to stay within the CPU
    frame budget.
    """
    return DCDepth(
        encoder=Encoder(encoder, init=encoder_init, weights=encoder_weights),
        min_depth=min_depth,
        max_depth=max_depth,
        crf_dims=(32, 96, 192),
        num_heads=(2, 4, 8),
        fusion_channels=64,
        input_dim=32,
        window_size=window_size,
        mlp_ratio=2.0,
        proj_kernel=1,
        head_ppm=False,
    )


@register_model
def dcdepth(
    *,
    min_depth: float,
    max_depth: float,
    encoder: str = "swin_b",
    encoder_init: str = "imagenet",
    encoder_weights: str | Path | None = None,
    window_size: int = 7,
) -> DCDepth:
    """Paper DCDepth: Swin-B encoder (torchvision's closest to the paper's Swin-L), GRU 192-d."""
    return DCDepth(
        encoder=Encoder(encoder, init=encoder_init, weights=encoder_weights),
        min_depth=min_depth,
        max_depth=max_depth,
        window_size=window_size,
    )
