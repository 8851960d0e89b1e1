"""Registry-wide contract tests: every registered model, tiny inputs, shape, range, gradients."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

from fedepth.descriptor import DescriptorExtractor, gem
from fedepth.losses import valid_mask
from fedepth.models import (
    DepthModel,
    buffer_names,
    create_model,
    get_state,
    list_models,
    load_state,
    save_state,
    save_weights,
    set_state,
)

MIN_DEPTH, MAX_DEPTH = 0.1, 10.0
LITE = [n for n in list_models() if n.endswith("-lite")]
FULL = [n for n in list_models() if not n.endswith("-lite")]


def _rgb(b: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(seed))


def _depth(b: int, h: int, w: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    d = 0.5 + 8.0 * torch.rand(b, 1, h, w, generator=g)
    d[:, :, : h // 4] = 0.0  # invalid rows
    return d


def test_required_names_are_registered() -> None:
    required = {
        "regression-lite",
        "adabins-lite",
        "newcrfs-lite",
        "dcdepth-lite",
        "adabins",
        "newcrfs",
        "dcdepth",
    }
    assert required <= set(list_models())


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="adabins-lite"):
        create_model("adabins-tiny")


def test_unknown_config_key_names_the_model() -> None:
    with pytest.raises(TypeError, match="regression-lite"):
        create_model("regression-lite", n_bins=3)


def test_bad_depth_range_is_rejected() -> None:
    with pytest.raises(ValueError, match="min_depth"):
        create_model("regression-lite", min_depth=5.0, max_depth=1.0)


@pytest.mark.parametrize("name", LITE)
def test_lite_model_contract(name: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = create_model(name, min_depth=MIN_DEPTH, max_depth=MAX_DEPTH)
    assert isinstance(model, DepthModel)
    n_params = sum(p.numel() for p in model.parameters())
    assert 1e6 <= n_params <= 5e6, f"{name}: {n_params} parameters"

    # training: forward_train -> loss -> backward, gradients finite and reaching the encoder
    model.train()
    rgb, gt = _rgb(2, 48, 64), _depth(2, 48, 64)
    out = model.forward_train(rgb)
    assert out.depth.shape == (2, 1, 48, 64)
    loss, terms = model.loss(out, gt, valid_mask(gt, MIN_DEPTH, MAX_DEPTH))
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert terms and all(np.isfinite(v) for v in terms.values())
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.parameters())

    # inference at both small sizes: shape, range, no NaN
    model.eval()
    with torch.no_grad():
        for h, w in ((48, 64), (96, 128), (50, 70)):
            depth = model(_rgb(1, h, w))
            assert depth.shape == (1, 1, h, w)
            assert torch.isfinite(depth).all()
            assert depth.min() >= MIN_DEPTH and depth.max() <= MAX_DEPTH
            (deepest,) = model.forward_features(_rgb(1, h, w), "deepest")
            assert deepest.ndim == 4 and deepest.shape[1] == model.encoder.channels[-1]
            assert (deepest >= 0).all()
            shallow = model.forward_features(_rgb(1, h, w))
            enc = model.encoder
            want = [c for c, r in zip(enc.channels, enc.reductions, strict=True) if r <= 8]
            assert [f.shape[1] for f in shallow] == want and len(want) >= 2
            assert all(f.ndim == 4 and (f >= 0).all() for f in shallow)

    # weights round-trip through a local safetensors file, loaded strictly
    path = tmp_path / f"{name}.safetensors"
    save_weights(model, path)
    clone = create_model(name, min_depth=MIN_DEPTH, max_depth=MAX_DEPTH, weights=path).eval()
    ref, got = get_state(model), get_state(clone)
    assert ref.keys() == got.keys()
    assert all(np.array_equal(ref[k], got[k]) for k in ref)
    x = _rgb(1, 48, 64, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(clone(x), model(x))


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL)
def test_paper_size_model_builds_and_runs(name: str) -> None:
    # their ImageNet checkpoints (Swin-B, ResNet-50, EfficientNet-B5) are not installed here
    model = create_model(name, min_depth=MIN_DEPTH, max_depth=80.0, encoder_init="random").train()
    gt = _depth(1, 64, 64)
    loss, _ = model.loss(model.forward_train(_rgb(1, 64, 64)), gt, valid_mask(gt, MIN_DEPTH, 80.0))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.no_grad():
        depth = model(_rgb(1, 64, 64))
        feats = model.forward_features(_rgb(1, 64, 64))
    assert depth.shape == (1, 1, 64, 64)
    assert torch.isfinite(depth).all()
    assert depth.min() >= MIN_DEPTH and depth.max() <= 80.0
    assert all((f >= 0).all() for f in feats) and len(feats) >= 2


def test_state_holds_batchnorm_statistics_but_no_constants() -> None:
    model = create_model("regression-lite")
    state = get_state(model)
    bn = buffer_names(model)
    assert any(n.endswith("running_mean") for n in bn)
    assert any(n.endswith("num_batches_tracked") for n in bn)
    assert set(bn) <= set(state)
    assert not any(n.endswith(("_mean", "_std")) and "running" not in n for n in state)


def test_set_state_round_trips_numpy() -> None:
    torch.manual_seed(0)
    a = create_model("regression-lite")
    torch.manual_seed(1)
    b = create_model("regression-lite")
    set_state(b, get_state(a))
    sa, sb = get_state(a), get_state(b)
    assert all(np.array_equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("name", LITE)
def test_convolutions_are_channels_last_and_the_layout_stays_out_of_states(name: str) -> None:
    torch.manual_seed(0)
    model = create_model(name, min_depth=MIN_DEPTH, max_depth=MAX_DEPTH)
    convs = [p for p in model.parameters() if p.ndim == 4]
    assert convs and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
    state = get_state(model)
    assert all(a.flags.c_contiguous for a in state.values())
    # loading a state keeps the layout, and the layout does not change what the model computes
    other = create_model(name, min_depth=MIN_DEPTH, max_depth=MAX_DEPTH)
    set_state(other, state)
    assert all(
        p.is_contiguous(memory_format=torch.channels_last)
        for p in other.parameters()
        if p.ndim == 4
    )
    plain = create_model(name, min_depth=MIN_DEPTH, max_depth=MAX_DEPTH)
    plain.to(memory_format=torch.contiguous_format)
    set_state(plain, state)
    rgb = _rgb(2, 48, 64)
    with torch.no_grad():
        out = model.eval()(rgb)
        ref = plain.eval()(rgb)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_weights_errors_name_file_and_tensor(tmp_path: Path) -> None:
    model = create_model("regression-lite")
    state = get_state(model)
    name = next(iter(state))

    missing = tmp_path / "missing.safetensors"
    save_state(missing, {k: v for k, v in state.items() if k != name})
    with pytest.raises(ValueError, match=rf"missing\.safetensors.*{name}"):
        create_model("regression-lite", weights=missing)

    wrong = dict(state)
    wrong[name] = np.zeros((1, 2, 3), dtype=np.float32)
    bad_shape = tmp_path / "shape.safetensors"
    save_state(bad_shape, wrong)
    with pytest.raises(ValueError, match=rf"shape\.safetensors.*{name}"):
        create_model("regression-lite", weights=bad_shape)

    with pytest.raises(FileNotFoundError, match=r"nowhere\.safetensors"):
        create_model("regression-lite", weights=tmp_path / "nowhere.safetensors")


def test_saved_file_carries_model_name(tmp_path: Path) -> None:
    from safetensors import safe_open

    model = create_model("newcrfs-lite", max_depth=80.0)
    path = tmp_path / "w.safetensors"
    save_weights(model, path)
    with safe_open(str(path), "np") as f:
        meta = f.metadata()
    assert meta["fedepth.model"] == "newcrfs-lite"
    assert '"max_depth": 80.0' in meta["fedepth.config"]
    assert load_state(path).keys() == get_state(model).keys()


def test_forward_features_feeds_the_descriptor() -> None:
    model = create_model("regression-lite")
    frames = [np.full((48, 64, 3), 40 * i, dtype=np.uint8) for i in range(5)]
    desc = DescriptorExtractor(model.forward_features, num_frames=4, batch_size=2).extract(frames)
    maps = model.forward_features(_rgb(1, 48, 64))
    assert desc.dim == sum(f.shape[1] for f in maps) == sum(model.encoder.channels[:3])
    assert desc.num_frames == 4
    # each map GeM-pooled on its own, the vectors concatenated in order, shallow to deep
    extractor = DescriptorExtractor(model.forward_features)
    pooled = extractor.pooled(_rgb(1, 48, 64))
    torch.testing.assert_close(pooled, torch.cat([gem(f) for f in maps], dim=1))
    deepest = DescriptorExtractor(functools.partial(model.forward_features, layers="deepest"))
    assert deepest.pooled(_rgb(1, 48, 64)).shape == (1, model.encoder.channels[-1])
    with pytest.raises(ValueError, match="descriptor layers must be one of shallow, deepest"):
        model.forward_features(_rgb(1, 48, 64), "middle")  # type: ignore[arg-type]
