"""The fedepth-coordinator command, the default config file and `fedepth fleet status`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fedepth import composition
from fedepth.models import create_model, get_state
from fedepth_cli.main import main as fedepth_main
from fedepth_coordinator.auth import read_credentials
from fedepth_coordinator.cli import main
from fedepth_coordinator.client import CoordinatorClient
from fedepth_coordinator.config import ConfigError, CoordinatorConfig, load_config
from fedepth_coordinator.server import CoordinatorServer
from fedepth_coordinator.simulate import robot_ids, robot_profile

REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "config" / "coordinator.yaml"


def test_default_config_serves_a_depth_network_with_no_robots_yet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    config = load_config(DEFAULT)
    assert config.auth.credentials_file and config.strategy.name == "fedepth"
    assert config == load_config(None)  # the file documents exactly the defaults
    assert config.model.name == "newcrfs-lite" and config.model.initial_weights is None
    assert config.model.pretrain == "small" and config.model.encoder_init == "imagenet"
    assert not Path(config.auth.credentials_file).is_relative_to(config.state.dir)
    config = load_config(
        DEFAULT,
        [
            ("state.dir", str(tmp_path / "s")),
            ("server.port", 0),
            ("server.host", "127.0.0.1"),
            ("auth.credentials_file", str(tmp_path / "creds" / "none.yaml")),
            # the default's pretraining at the smoke profile: seconds instead of minutes
            ("model.pretrain", "smoke"),
            ("model.cache_dir", str(tmp_path / "cache")),
        ],
    )
    with caplog.at_level("INFO"):
        server = CoordinatorServer(config)
        port = server.start()
    try:
        card = server.initial.card
        assert card is not None and card.model == "newcrfs-lite" and card.max_depth == 80.0
        assert card.encoder_checkpoint is not None  # from ImageNet, then pretrained for depth
        assert card.input_size == tuple(config.training.image_size)
        assert "pretraining newcrfs-lite for 30 steps" in caplog.text  # the first start
        assert "pretrained for depth on the synthetic HPE" in caplog.text
        # the first start generates the pretraining split alone, not the whole scenario
        (data,) = (tmp_path / "cache" / "data").iterdir()
        assert data.name.endswith("-pretrain") and not (data / "train").exists()
        assert "--add-robot" in caplog.text
        fresh = create_model("newcrfs-lite")
        moved = [
            k
            for k, v in get_state(fresh).items()
            if not np.array_equal(v, server.initial.state[k])
        ]
        assert moved, "the served network is the fresh one"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop(grace=0.1)
    # the second start takes the cached checkpoint: no pretraining
    caplog.clear()
    config = replace(config, state=replace(config.state, dir=str(tmp_path / "s2")))
    with caplog.at_level("INFO"):
        again = CoordinatorServer(config)
    again.stop(grace=0.0)
    assert "pretraining newcrfs-lite" not in caplog.text and "pretrained for depth" in caplog.text
    for k, v in server.initial.state.items():
        np.testing.assert_array_equal(again.initial.state[k], v)


def test_overrides_and_errors_name_the_key(tmp_path: Path) -> None:
    config = load_config(DEFAULT, [("rounds.num_rounds", 3), ("strategy.params", {"tau": 1.5})])
    assert config.rounds.num_rounds == 3 and config.strategy.params == {"tau": 1.5}
    bad = [
        ([("rounds.num_round", 3)], "rounds: unknown key(s) num_round"),
        ([("rounds.quorum", "most")], "rounds.quorum: expected a number"),
        ([("rounds.quorum", 1.5)], "rounds.quorum: must lie in (0, 1]"),
        ([("server.chunk_bytes", 8 << 20)], "server.chunk_bytes"),
        ([("tls.client_ca_file", "ca.pem")], "mutual TLS needs"),
    ]
    for overrides, message in bad:
        with pytest.raises(ConfigError) as err:
            load_config(DEFAULT, overrides)
        assert message in str(err.value)


def test_held_rounds_are_a_list_of_rounds_before_the_last(tmp_path: Path) -> None:
    from fedepth_coordinator.config import save_resolved

    assert load_config(DEFAULT).rounds.hold_after == ()
    config = load_config(DEFAULT, [("rounds.num_rounds", 4), ("rounds.hold_after", [0, 2])])
    assert config.rounds.hold_after == (0, 2)
    assert load_config(save_resolved(config, tmp_path)) == config  # YAML list back to a tuple
    bad = [
        ([("rounds.hold_after", 3)], "rounds.hold_after: expected a list"),
        ([("rounds.hold_after", ["x"])], "rounds.hold_after[0]: expected an integer"),
        ([("rounds.hold_after", [9])], "rounds.hold_after: must list rounds in [0, "),
        ([("rounds.hold_after", [-1])], "rounds.hold_after: must list rounds in [0, "),
    ]
    for overrides, message in bad:
        with pytest.raises(ConfigError) as err:
            load_config(DEFAULT, overrides)
        assert message in str(err.value)


def test_training_section_is_the_recipe_every_task_carries(tmp_path: Path) -> None:
    from fedepth.recipe import TrainRecipe
    from fedepth.sim import SimConfig
    from fedepth_coordinator.config import save_resolved

    assert load_config(DEFAULT).training.recipe() == TrainRecipe() == SimConfig().recipe(0)
    config = load_config(
        DEFAULT,
        [
            ("training.image_size", [32, 48]),
            ("training.schedule", "cosine"),
            ("training.warmup_steps", 2),
            ("training.grad_clip", None),
        ],
    )
    recipe = config.training.recipe()
    assert recipe.image_size == (32, 48) and recipe.schedule == "cosine"
    assert recipe.warmup_steps == 2 and recipe.grad_clip is None
    saved = save_resolved(config, tmp_path)  # YAML lists back into the tuple
    assert load_config(saved) == config
    bad = [
        ([("training.lr", 0)], "training: lr must be a number > 0"),
        ([("training.optimizer", "lamb")], "training: unknown optimizer 'lamb'"),
        ([("training.warmup_steps", 5)], "training: warmup_steps must be an integer in"),
        ([("training.image_size", [48])], "training.image_size: expected a list of 2 values"),
        ([("training.image_size", [48, "x"])], "training.image_size[1]: expected an integer"),
        ([("training.learning_rate", 1)], "training: unknown key(s) learning_rate"),
    ]
    for overrides, message in bad:
        with pytest.raises(ConfigError) as err:
            load_config(DEFAULT, overrides)
        assert message in str(err.value)


def test_add_robot_prints_a_token_once_and_print_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    creds = tmp_path / "creds.yaml"
    args = ["--config", str(DEFAULT), "--set", f"auth.credentials_file={creds}"]
    assert main([*args, "--add-robot", "robot-7"]) == 0
    out = capsys.readouterr()
    token = out.out.strip()
    assert len(token) > 30 and "robot-7" in out.err
    assert token not in creds.read_text() and read_credentials(creds)["robot-7"].role == "robot"
    assert main([*args, "--add-robot", "ops", "--role", "operator"]) == 0
    assert read_credentials(creds)["ops"].role == "operator"
    capsys.readouterr()
    assert main([*args, "--print-config", "--set", "rounds.min_robots=7"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["rounds"]["min_robots"] == 7
    assert main([*args, "--set", "rounds.bogus=1"]) == 2


def test_resolved_config_is_saved_in_the_state_dir(
    server: CoordinatorServer, config_factory: Callable[..., CoordinatorConfig]
) -> None:
    saved = Path(server.config.state.dir) / "config.resolved.yaml"
    assert yaml.safe_load(saved.read_text())["server"]["host"] == "127.0.0.1"


def test_fleet_status_prints_the_table_and_cluster_map(
    server: CoordinatorServer,
    creds: Any,
    connect: Callable[..., CoordinatorClient],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for rid in robot_ids(4):
        p = robot_profile(rid)
        client = connect(server.port, rid)
        client.register(p.num_samples, p.labels)
        client.upload_descriptor(p.descriptor)
    token_file = tmp_path / "ops.token"
    token_file.write_text(creds.tokens["ops"] + "\n")
    target = f"127.0.0.1:{server.port}"
    args = ["fleet", "status", "--coordinator", target, "--token-file", str(token_file)]
    assert fedepth_main(args) == 0
    out = capsys.readouterr().out
    assert "phase: training" in out and "cluster map:" in out
    for rid in robot_ids(4):
        assert rid in out
    # each cluster by the labels its robots declared at Register, and the co-member shares
    cmap = connect(server.port, "ops").cluster_map()
    for k, members in enumerate(cmap.clusters):
        labels = [robot_profile(rid).labels for rid in members]
        made_of = composition.composition_label(
            composition.composition_counts(range(len(members)), labels)
        )
        assert f"  cluster {k}: {made_of}: {', '.join(members)}" in out
    assert "co-members with the robot's label (mean over robots): platform" in out
    assert fedepth_main([*args, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["fleet"]["phase"] == "training"
    assert [c["members"] for c in printed["fleet"]["clusters"]] == [list(m) for m in cmap.clusters]
    assert set(printed["fleet"]["co_members"]) == {"platform", "environment", "both", "alone"}
    token_file.write_text("wrong")
    assert fedepth_main(args) == 2
    assert "UNAUTHENTICATED" in capsys.readouterr().err
