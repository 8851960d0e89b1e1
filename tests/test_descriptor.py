"""Tests of fedepth.descriptor: GeM by hand, frame sampling, streaming moments, the extractor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedepth.descriptor import (
    VAR_FLOOR,
    Descriptor,
    DescriptorExtractor,
    RunningMoments,
    check_descriptor,
    check_descriptors,
    gem,
    gem_descriptor,
    image_to_tensor,
    sample_indices,
)


def test_gem_by_hand() -> None:
    x = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])  # (1, 1, 2, 2)
    expected = ((1 + 8 + 27 + 64) / 4) ** (1 / 3)
    assert gem(x, p=3.0).item() == pytest.approx(expected, rel=1e-6)
    assert gem(x, p=1.0).item() == pytest.approx(2.5)


def test_gem_clamps_at_eps_and_returns_float32() -> None:
    x = torch.tensor([[[[-5.0, 0.0]]]], dtype=torch.float16)
    out = gem(x, p=3.0, eps=1e-2)
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(1e-2, rel=1e-4)  # both values clamp to eps
    assert gem(torch.rand(2, 5, 3, 4)).shape == (2, 5)
    with pytest.raises(ValueError, match="B, C, H, W"):
        gem(torch.rand(5, 3, 4))


def test_sample_indices() -> None:
    a = sample_indices(100, 10, seed=7)
    assert a.tolist() == sample_indices(100, 10, seed=7).tolist()
    assert len(set(a.tolist())) == 10 and (np.diff(a) > 0).all()
    assert sample_indices(5, 10, seed=0).tolist() == [0, 1, 2, 3, 4]  # n_c = min(n, |X_c|)
    assert sample_indices(100, 10, seed=8).tolist() != a.tolist()
    with pytest.raises(ValueError, match="at least one frame"):
        sample_indices(0, 10, seed=0)


def test_running_moments_match_numpy() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(103, 6)) * 3 + 10
    rm = RunningMoments(6)
    for b0 in range(0, 103, 17):
        rm.update(x[b0 : b0 + 17])
    np.testing.assert_allclose(rm.mean, x.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(rm.variance, x.var(axis=0), rtol=1e-10)


def _frames(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(8, 10, 3), dtype=np.uint8) for _ in range(n)]


def test_extractor_equals_direct_computation_and_is_batch_size_invariant() -> None:
    frames = _frames(30)

    def encoder(x: torch.Tensor) -> torch.Tensor:  # identity "encoder": GeM of the pixels
        return x

    d4 = DescriptorExtractor(encoder, num_frames=12, batch_size=4, seed=3).extract(frames)
    d7 = DescriptorExtractor(encoder, num_frames=12, batch_size=7, seed=3).extract(frames)
    idx = sample_indices(30, 12, seed=3)
    g = np.stack([gem(image_to_tensor(frames[i])[None]).numpy()[0] for i in idx])
    np.testing.assert_allclose(d4.mean, g.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(d4.var, np.maximum(g.var(axis=0), VAR_FLOOR), rtol=1e-5)
    np.testing.assert_allclose(d4.mean, d7.mean, rtol=1e-6)
    np.testing.assert_allclose(d4.var, d7.var, rtol=1e-5)
    assert d4.num_frames == 12 and d4.dim == 3
    # one pass for both the descriptor and PACFL's per-frame matrix gives what the two give
    both, feats = DescriptorExtractor(
        encoder, num_frames=12, batch_size=4, seed=3
    ).extract_with_features(frames)
    np.testing.assert_array_equal(both.mean, d4.mean)
    np.testing.assert_array_equal(both.var, d4.var)
    np.testing.assert_allclose(feats, g, rtol=1e-6)
    assert feats.dtype == np.float64 and feats.shape == (12, 3)


def test_extractor_variance_floor_and_single_frame() -> None:
    d = DescriptorExtractor(lambda x: x, num_frames=5, var_floor=1e-3).extract(_frames(1))
    assert d.num_frames == 1
    assert (d.var == 1e-3).all()  # one frame: zero empirical variance, raised to the floor


def test_extractor_runs_a_frozen_module_in_eval_mode() -> None:
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    net.train()
    before = net[1].running_mean.clone()
    ext = DescriptorExtractor(net.forward, num_frames=6, batch_size=3)
    d = ext.extract(_frames(6))
    assert not net.training
    assert torch.equal(net[1].running_mean, before)  # BN statistics untouched
    assert d.dim == 4 and np.isfinite(d.mean).all()
    assert ext.per_frame(_frames(6)).shape == (6, 4)


def test_descriptor_validation() -> None:
    with pytest.raises(ValueError, match="> 0"):
        Descriptor(mean=np.zeros(3), var=np.array([1.0, 0.0, 1.0]), num_frames=2)
    with pytest.raises(ValueError, match="NaN"):
        Descriptor(mean=np.array([np.nan]), var=np.ones(1), num_frames=2)


def test_check_descriptor_is_the_one_validity_check() -> None:
    check_descriptor(np.zeros(3), np.ones(3), 2)
    with pytest.raises(ValueError, match="malformed descriptor: 3 means but 2 variances"):
        check_descriptor(np.zeros(3), np.ones(2))
    with pytest.raises(ValueError, match="both must be 1-D"):
        check_descriptor(np.zeros((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="NaN or Inf"):
        check_descriptor(np.zeros(3), np.array([1.0, np.inf, 1.0]))
    with pytest.raises(ValueError, match="variances must be > 0"):
        check_descriptor(np.zeros(3), -np.ones(3))
    with pytest.raises(ValueError, match="num_frames must be > 0, got 0"):
        check_descriptor(np.zeros(3), np.ones(3), 0)
    Descriptor(mean=np.zeros(3), var=np.ones(3), num_frames=0)  # the fleet refuses it, not here


def test_check_descriptors_applies_the_one_rule_to_arrays_of_descriptors() -> None:
    m, v = check_descriptors([[0, 1]], [[1, 2]], "F.npz")
    assert m.dtype == v.dtype == np.float64 and m.shape == (1, 2)
    check_descriptors(np.zeros((0, 2)), np.ones((0, 2)))  # no clients: empty is allowed ...
    with pytest.raises(ValueError, match=r"^F\.npz: empty descriptors"):  # ... unless refused
        check_descriptors(np.zeros((0, 2)), np.ones((0, 2)), "F.npz", empty=False)
    with pytest.raises(ValueError, match=r"^F\.npz: means \(1, 2\) and variances \(1, 3\) differ"):
        check_descriptors([[0, 1]], [[1, 1, 1]], "F.npz")
    with pytest.raises(ValueError, match="are not both 2-D: they must both be N x D"):
        check_descriptors([0, 1], [1, 1])
    with pytest.raises(ValueError, match=r"^set a: variances contain NaN or Inf"):
        check_descriptors([[0.0]], [[np.inf]], "set a")
    # the same rule, and the same words, as one descriptor's
    for mean, var in (([np.nan, 0], [1, 1]), ([0, 0], [1, 0])):
        with pytest.raises(ValueError) as one:
            check_descriptor(np.array(mean, float), np.array(var, float))
        with pytest.raises(ValueError) as many:
            check_descriptors([mean], [var], "F.npz")
        assert str(many.value) == "F.npz: " + str(one.value).removeprefix("descriptor ")


def test_gem_descriptor_is_numpys_moments_bit_for_bit_and_the_extractors() -> None:
    rng = np.random.default_rng(3)
    for x in (rng.random((5, 7)), rng.random((40, 3)).astype(np.float32), np.ones((1, 4))):
        d = gem_descriptor(x)
        xf = np.asarray(x, dtype=np.float64)
        assert np.array_equal(d.mean, xf.mean(axis=0)) and d.num_frames == x.shape[0]
        assert np.array_equal(d.var, np.maximum(xf.var(axis=0), VAR_FLOOR))
    assert np.array_equal(gem_descriptor(np.ones((2, 3)), var_floor=0.5).var, np.full(3, 0.5))
    with pytest.raises(ValueError, match=r"expected \(n >= 1, D\) vectors"):
        gem_descriptor(np.zeros((0, 3)))
    frames = [rng.integers(0, 256, (6, 6, 3), dtype=np.uint8) for _ in range(5)]
    ex = DescriptorExtractor(lambda t: t.mean(dim=1, keepdim=True) + 1.0, batch_size=8)
    streamed, feats = ex.extract_with_features(frames)
    one_shot = gem_descriptor(feats)  # one batch: the streamed moments are the same numbers
    assert np.array_equal(streamed.mean, one_shot.mean)
    assert np.array_equal(streamed.var, one_shot.var)
