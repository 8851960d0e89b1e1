"""Encoders: declared channels and strides match torchvision; ImageNet starts load torchvision's
own checkpoint strictly, verified; nothing else is taken for one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision
from safetensors.torch import save_file

from fedepth.models import Encoder, list_encoders
from fedepth.models.encoders import read_state_file

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


def test_imagenet_start_is_torchvisions_checkpoint() -> None:
    enc = Encoder("mobilenet_v2", init="imagenet")
    assert enc.checkpoint is not None and enc.checkpoint.ok
    ref = torchvision.models.mobilenet_v2(weights=None)
    ref.load_state_dict(torch.load(enc.checkpoint.path, map_location="cpu", weights_only=True))
    mine = enc.body.state_dict()
    for name in ("features.0.0.weight", "features.18.1.running_var"):
        torch.testing.assert_close(mine[name], ref.state_dict()[name], rtol=0, atol=0)


def test_random_start_loads_no_file() -> None:
    assert Encoder("mobilenet_v2").checkpoint is None
    with pytest.raises(ValueError, match="needs encoder_init: imagenet"):
        Encoder("mobilenet_v2", init="random", weights="mobilenet_v2-b0353104.pth")
    with pytest.raises(ValueError, match="encoder_init must be one of imagenet, random"):
        Encoder("mobilenet_v2", init="pretrained")


def test_a_given_file_that_is_not_torchvisions_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(3)
    path = tmp_path / "mine.safetensors"
    state = torchvision.models.mobilenet_v2(weights=None).state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    with pytest.raises(ValueError, match=r"mine\.safetensors.*not torchvision's"):
        Encoder("mobilenet_v2", init="imagenet", weights=path)


def test_missing_encoder_weights_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"absent\.pth"):
        read_state_file(tmp_path / "absent.pth")
    with pytest.raises(ValueError, match=r"resnet18-f37072fd\.pth.*absent\.pth"):
        Encoder("resnet18", init="imagenet", weights=tmp_path / "absent.pth")
