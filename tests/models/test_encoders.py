"""Encoders: declared channels and strides match torchvision, weights load strictly from disk."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision
from safetensors.torch import save_file

from fedepth.models import Encoder, list_encoders

HEAVY = {"efficientnet_b5", "swin_b", "resnet50", "convnext_tiny", "swin_t"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in list_encoders()],
)
def test_declared_channels_and_strides(name: str) -> None:
    enc = Encoder(name).eval()
    with torch.no_grad():
        feats = enc(torch.rand(1, 3, 64, 96))
    assert [f.shape[1] for f in feats] == list(enc.channels)
    assert [64 // f.shape[2] for f in feats] == list(enc.reductions)
    assert [96 // f.shape[3] for f in feats] == list(enc.reductions)


def test_unknown_encoder_lists_known() -> None:
    with pytest.raises(KeyError, match="mobilenet_v3_large"):
        Encoder("vgg16")


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_local_weights_load_strictly(tmp_path: Path, suffix: str) -> None:
    torch.manual_seed(3)
    source = torchvision.models.mobilenet_v3_large(weights=None)
    path = tmp_path / f"mnv3{suffix}"
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    if suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save(state, path)
    enc = Encoder("mobilenet_v3_large", weights=path)
    first = enc.body.state_dict()["features.0.0.weight"]
    torch.testing.assert_close(first, source.features[0][0].weight)

    del state["classifier.3.bias"]
    save_file(state, str(tmp_path / "partial.safetensors"))
    with pytest.raises(ValueError, match=r"partial\.safetensors.*classifier\.3\.bias"):
        Encoder("mobilenet_v3_large", weights=tmp_path / "partial.safetensors")


def test_missing_encoder_weights_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"absent\.pth"):
        Encoder("resnet18", weights=tmp_path / "absent.pth")
