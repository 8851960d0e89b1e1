"""Mechanism tests of the heads: AdaBins bins and token grid, NeWCRFs windows, DCDepth DCT."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.fft import dctn, idctn

from fedepth.models import create_model
from fedepth.models.bins import BinsOutput, PatchTransformer, token_grid
from fedepth.models.crf import (
    CRFBlock,
    CRFLevel,
    single_window,
    window_mask,
    window_partition,
    window_reverse,
)
from fedepth.models.dct import (
    DIAGONAL_GROUPS,
    PATCH,
    DCTOutput,
    DCTUpdate,
    dct_matrix,
    diagonal_indices,
)

# ---------------------------------------------------------------- AdaBins


def test_token_grid_keeps_the_patch_size_when_there_are_enough_tokens() -> None:
    # 240 x 320 decoder map, 16-pixel patches: 15 x 20 = 300 >= 129 tokens
    assert token_grid(240, 320, 16, 129) == (15, 20, 16)


def test_token_grid_shrinks_the_patch_for_small_maps() -> None:
    # 24 x 32 map, 129 tokens: p=2 gives 12 x 16 = 192 (p=3 gives 8 x 10 = 80, too few)
    assert token_grid(24, 32, 16, 129) == (12, 16, 2)


def test_token_grid_upsamples_maps_smaller_than_the_token_count() -> None:
    # 3 x 4 = 12 pixels < 33 tokens: scale by k=2 -> 6 x 8 = 48
    assert token_grid(3, 4, 8, 33) == (6, 8, 0)


@pytest.mark.parametrize("size", [(3, 4), (24, 32), (64, 80)])
def test_patch_transformer_gives_enough_tokens(size: tuple[int, int]) -> None:
    pt = PatchTransformer(8, patch_size=8, embed_dim=16, num_heads=2, num_layers=1, ff_dim=32)
    tokens = pt(torch.rand(2, 8, *size), 33)
    assert tokens.shape[0] == 2 and tokens.shape[1] >= 33 and tokens.shape[2] == 16


def test_adabins_bins_span_the_depth_range() -> None:
    torch.manual_seed(0)
    model = create_model("adabins-lite", min_depth=0.5, max_depth=20.0).eval()
    with torch.no_grad():
        out = model.forward_train(torch.rand(2, 3, 48, 64))
    assert isinstance(out, BinsOutput)
    edges, centers = out.bin_edges, out.bin_centers
    assert edges.shape == (2, 129) and centers.shape == (2, 128)
    torch.testing.assert_close(edges[:, 0], torch.full((2,), 0.5))
    torch.testing.assert_close(edges[:, -1], torch.full((2,), 20.0))
    assert (edges.diff(dim=1) > 0).all()
    torch.testing.assert_close(centers, 0.5 * (edges[:, 1:] + edges[:, :-1]))
    assert out.depth.min() >= centers.min() - 1e-5 and out.depth.max() <= centers.max() + 1e-5


def test_adabins_loss_adds_weighted_chamfer() -> None:
    torch.manual_seed(0)
    model = create_model("adabins-lite")
    out = model.forward_train(torch.rand(1, 3, 48, 64))
    gt = torch.full((1, 1, 48, 64), 3.0)
    valid = torch.ones_like(gt, dtype=torch.bool)
    total, terms = model.loss(out, gt, valid)
    assert math.isclose(
        float(total.detach()), terms["silog"] + 0.1 * terms["chamfer"], rel_tol=1e-5
    )


# ---------------------------------------------------------------- NeWCRFs


def test_window_partition_round_trip() -> None:
    x = torch.arange(2 * 14 * 21 * 3, dtype=torch.float32).view(2, 14, 21, 3)
    windows = window_partition(x, 7)
    assert windows.shape == (2 * 2 * 3, 49, 3)
    torch.testing.assert_close(window_reverse(windows, 7, 14, 21), x)


def test_window_mask_absent_without_padding_or_shift() -> None:
    assert window_mask(14, 14, 7, 0, torch.device("cpu")) is None


def test_window_mask_hides_padding_keys() -> None:
    mask = window_mask(3, 4, 4, 0, torch.device("cpu"))  # one 4 x 4 window, last row padded
    assert mask is not None and mask.shape == (1, 16, 16)
    padded_keys = torch.tensor([12, 13, 14, 15])
    assert (mask[0][:, padded_keys] < 0).all()
    assert (mask[0][:, :12] == 0).all()


def test_shifted_window_mask_separates_regions() -> None:
    mask = window_mask(8, 8, 4, 2, torch.device("cpu"))
    assert mask is not None and mask.shape == (4, 16, 16)
    assert (mask[0] == 0).all()  # the top-left window holds one region only
    assert (mask[3] < 0).any()  # the bottom-right window mixes four rolled regions
    torch.testing.assert_close(mask, mask.transpose(1, 2))


@pytest.mark.parametrize("size", [(2, 3), (4, 6), (5, 7), (7, 7), (1, 1)])
@pytest.mark.parametrize("shift", [0, 3])
def test_single_window_is_the_padded_window_attention(size: tuple[int, int], shift: int) -> None:
    # a map that fits in one window: its tokens alone (positions and region mask from
    # single_window) give what the padded, shifted window gives, outputs and gradients
    torch.manual_seed(0)
    block = CRFBlock(16, num_heads=2, window_size=7, shift=shift, mlp_ratio=2.0)
    torch.nn.init.normal_(block.attn.relative_position_bias_table, std=1.0)  # a bias that matters
    h, w = size
    x, v = torch.randn(2, h, w, 16), torch.randn(2, h, w, 16)
    padded_mask = window_mask(h, w, 7, shift, x.device)
    positions, mask = single_window(h, w, 7, shift, x.device)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    padded = block(x1, v, padded_mask)
    padded_grads = torch.autograd.grad(padded.square().sum(), [x1, *block.parameters()])
    single = block(x2, v, mask, positions)
    single_grads = torch.autograd.grad(single.square().sum(), [x2, *block.parameters()])
    torch.testing.assert_close(single, padded, rtol=1e-5, atol=1e-5)
    for a, b in zip(single_grads, padded_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_single_window_masks_the_shifted_regions_only() -> None:
    # 4 x 6 map, window 7, shift 3: rows 0-2 and row 3 fall into different regions, and so
    # do columns 0-2 and 3-5; unshifted, or when every token lies below the shift, one region
    assert single_window(4, 6, 7, 0, torch.device("cpu"))[1] is None
    assert single_window(2, 3, 7, 3, torch.device("cpu"))[1] is None
    positions, mask = single_window(4, 6, 7, 3, torch.device("cpu"))
    assert positions.shape == (24,) and len(set(positions.tolist())) == 24
    assert mask is not None and mask.shape == (1, 24, 24)
    same = mask[0] == 0
    assert same[0, 1] and same[0, 6] and not same[0, 3] and not same[0, 18]
    assert same[18, 20] and not same[18, 23]


def test_crf_level_handles_odd_sizes_and_coarse_estimates() -> None:
    level = CRFLevel(10, embed_dim=16, v_dim=8, window_size=7, num_heads=2)
    out = level(torch.rand(2, 10, 5, 9), torch.rand(2, 8, 2, 4))
    assert out.shape == (2, 16, 5, 9)
    assert torch.isfinite(out).all()


def test_newcrfs_depth_is_sigmoid_times_max_depth() -> None:
    model = create_model("newcrfs-lite", max_depth=80.0).eval()
    with torch.no_grad():
        out = model.forward_train(torch.rand(1, 3, 64, 64))
    assert out.depth.min() > 0 and out.depth.max() < 80.0


# ---------------------------------------------------------------- DCDepth


def test_dct_matrix_is_scipy_orthonormal_dct() -> None:
    t = dct_matrix(PATCH).double().numpy()
    np.testing.assert_allclose(t @ t.T, np.eye(PATCH), atol=1e-6)
    x = np.random.default_rng(0).normal(size=(PATCH, PATCH))
    np.testing.assert_allclose(t @ x @ t.T, dctn(x, norm="ortho"), atol=1e-6)


def test_diagonal_groups_cover_every_coefficient_low_to_high() -> None:
    order = [i for group in DIAGONAL_GROUPS for i in diagonal_indices(group)]
    assert sorted(order) == list(range(64))
    sums = [(i // PATCH) + (i % PATCH) for i in order]
    assert sums == sorted(sums)
    assert [len(diagonal_indices(g)) for g in DIAGONAL_GROUPS] == [1, 2, 3, 4, 5, 6, 15, 28]


def test_inverse_dct_matches_scipy_per_patch() -> None:
    upd = DCTUpdate(hidden_dim=8, input_dim=8, log_scale=2.0, seq_dropout=0.0)
    rng = np.random.default_rng(1)
    coeffs = rng.normal(size=(1, 64, 2, 3)).astype(np.float32)
    got = upd.to_log_depth(torch.from_numpy(coeffs))[0, 0].numpy()
    scale = 2.0 * PATCH * 0.5
    for i in range(2):
        for j in range(3):
            patch = idctn(coeffs[0, :, i, j].reshape(PATCH, PATCH), norm="ortho") * scale
            np.testing.assert_allclose(
                got[i * 8 : (i + 1) * 8, j * 8 : (j + 1) * 8], patch, rtol=1e-4, atol=1e-5
            )


def test_dc_coefficient_gives_a_constant_patch() -> None:
    upd = DCTUpdate(hidden_dim=8, input_dim=8, log_scale=math.log(10.0), seq_dropout=0.0)
    coeffs = torch.zeros(1, 64, 1, 1)
    coeffs[0, 0] = 1.0
    # orthonormal DC basis is 1/8 per pixel, scaled by log(10) * 8 / 2
    expected = torch.full((1, 1, 8, 8), math.log(10.0) / 2)
    torch.testing.assert_close(upd.to_log_depth(coeffs), expected)


def test_dcdepth_steps_weights_and_outputs() -> None:
    torch.manual_seed(0)
    model = create_model("dcdepth-lite").train()
    out = model.forward_train(torch.rand(1, 3, 48, 64))
    assert isinstance(out, DCTOutput)
    assert len(out.log_depths) == len(out.freq_regs) == 9
    assert all(ld.shape == (1, 1, 48, 64) for ld in out.log_depths)
    torch.testing.assert_close(out.depth, out.log_depths[-1].exp())
    w = model.step_weights(9)
    assert math.isclose(sum(w), 1.0) and w == sorted(w)
    assert math.isclose(w[-1] / w[-2], 1 / 0.8)
    gt = torch.full((1, 1, 48, 64), 2.0)
    total, terms = model.loss(out, gt, gt > 0)
    expected = sum(
        wk * (terms[f"silog_{k}"] + 0.002 * terms[f"freq_{k}"]) for k, wk in enumerate(w)
    )
    assert math.isclose(float(total.detach()), expected, rel_tol=1e-5)


def test_dcdepth_input_not_multiple_of_eight() -> None:
    model = create_model("dcdepth-lite").eval()
    with torch.no_grad():
        depth = model(torch.rand(1, 3, 52, 68))
    assert depth.shape == (1, 1, 52, 68)
