"""docker/: compose.yaml, the Dockerfiles and docker/README.md against the coordinator's and the
nodes' configuration (there is no Docker engine here: this static check is what we have).

compose.yaml is parsed with PyYAML; every command is parsed with the coordinator's own argument
parser or checked against the launch file it runs, every path against a mount, every secret
against the coordinator's credentials format, every port against the coordinator's config.
The credential commands of docker/README.md are run as written.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from fedepth.models import list_models
from fedepth_coordinator.auth import hash_token, read_credentials
from fedepth_coordinator.cli import _overrides, build_parser
from fedepth_coordinator.config import CoordinatorConfig, load_config
from fedepth_coordinator.state.base import ID_PATTERN

from .test_launch_files import MODELS

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE: dict[str, Any] = yaml.safe_load((DOCKER / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
#: where Dockerfile.coordinator puts config/*.yaml
ETC = PurePosixPath("/etc/fedepth")


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DOCKER / dockerfile).read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _secret_targets(service: dict[str, Any]) -> dict[str, str]:
    """secret name -> where compose mounts it in the service (/run/secrets/<name>)."""
    out = {}
    for entry in service.get("secrets", []):
        name = entry if isinstance(entry, str) else entry["source"]
        target = name if isinstance(entry, str) else entry.get("target", name)
        out[name] = target if target.startswith("/") else f"/run/secrets/{target}"
    return out


def _mounts(service: dict[str, Any]) -> dict[PurePosixPath, str]:
    """target -> source of a service's volumes (``${VAR:-default}`` read as its default)."""
    out = {}
    for volume in service.get("volumes", []):
        spec = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(volume))
        source, target = spec.split(":")[:2]
        out[PurePosixPath(target)] = source
    return out


def _mount_targets(service: dict[str, Any]) -> list[PurePosixPath]:
    return list(_mounts(service))


def _under(path: str, roots: list[PurePosixPath]) -> bool:
    p = PurePosixPath(path)
    return any(p == r or r in p.parents for r in roots)


def _coordinator_config(argv: list[str]) -> tuple[CoordinatorConfig, Any]:
    """The config a ``fedepth-coordinator ARGS`` command runs with in the image."""
    assert argv[0] == "fedepth-coordinator", argv
    args = build_parser().parse_args(argv[1:])
    config = PurePosixPath(args.config)
    assert config.parent == ETC, f"--config {config}: the image has config/*.yaml in {ETC}"
    # Dockerfile.coordinator copies config/*.yaml there
    assert any(
        word == "RUN" and f"cp config/*.yaml {ETC}/" in rest
        for word, rest in _instructions("Dockerfile.coordinator")
    )
    return load_config(ROOT / "config" / config.name, _overrides(args)), args


def _robots() -> dict[str, dict[str, Any]]:
    return {
        name: svc
        for name, svc in SERVICES.items()
        if svc.get("build", {}).get("dockerfile") == "docker/Dockerfile.robot"
    }


def test_the_coordinator_reads_its_credentials_from_the_mounted_secret() -> None:
    svc = SERVICES["coordinator"]
    config, args = _coordinator_config(svc["command"])
    secrets = _secret_targets(svc)
    # the credentials file is the secret compose mounts, in the coordinator's format (below)
    assert config.auth.credentials_file in secrets.values(), (config.auth, secrets)
    (name,) = [n for n, t in secrets.items() if t == config.auth.credentials_file]
    source = COMPOSE["secrets"][name]["file"]
    assert source == "./secrets/coordinator_credentials.yaml"
    # state in the volume, credentials apart from it (wiping the state keeps the robots)
    mounts = _mount_targets(svc)
    assert _under(config.state.dir, mounts), (config.state.dir, mounts)
    assert not _under(config.auth.credentials_file, [PurePosixPath(config.state.dir)])
    # one port: --port, the health check's FEDEPTH_PORT and the image's EXPOSE
    assert args.port == config.server.port == int(svc["environment"]["FEDEPTH_PORT"])
    exposed = [rest for word, rest in _instructions("Dockerfile.coordinator") if word == "EXPOSE"]
    assert exposed == [str(config.server.port)]
    assert config.server.host == "0.0.0.0"  # reachable from the robots' containers
    # a real depth network, whose card the robots build their model from
    assert config.model.name in list_models() and config.model.initial_weights is None


def test_the_image_default_command_matches_compose() -> None:
    (cmd,) = [rest for word, rest in _instructions("Dockerfile.coordinator") if word == "CMD"]
    argv = yaml.safe_load(cmd)  # exec form: a JSON list
    assert argv[:2] == ["sh", "-c"]
    words = shlex.split(argv[2].replace('"$FEDEPTH_PORT"', "50051"))
    assert words[0] == "exec"
    image, _ = _coordinator_config(words[1:])
    compose, _ = _coordinator_config(SERVICES["coordinator"]["command"])
    assert image.auth == compose.auth and image.state == compose.state
    assert image.server.port == compose.server.port


def test_every_robot_runs_a_launch_file_with_declared_arguments_and_mounted_paths() -> None:
    robots = _robots()
    assert len(robots) == 2
    port = _coordinator_config(SERVICES["coordinator"]["command"])[0].server.port
    ids = set()
    for name, svc in robots.items():
        cmd = svc["command"]
        assert cmd[:3] == ["ros2", "launch", "fedepth_ros"], cmd
        launch = MODELS[cmd[3]]  # a launch file of this package
        args = dict(a.split(":=", 1) for a in cmd[4:])
        unknown = set(args) - set(launch.declared)
        assert not unknown, f"{name}: {cmd[3]} declares no {sorted(unknown)}"
        assert svc["depends_on"]["coordinator"]["condition"] == "service_healthy"
        host, _, robot_port = args["coordinator"].partition(":")
        assert host in SERVICES and int(robot_port) == port, args["coordinator"]
        assert ID_PATTERN.match(args["robot_id"]) and args["robot_id"] not in ids
        ids.add(args["robot_id"])
        secrets = _secret_targets(svc)
        assert args["token_file"] in secrets.values(), (name, args["token_file"], secrets)
        (secret,) = [n for n, t in secrets.items() if t == args["token_file"]]
        assert COMPOSE["secrets"][secret]["file"] == f"./secrets/{args['robot_id']}.token"
        assert _under(args["bag"], _mount_targets(svc)), (name, args["bag"])
        # the bag folder is where docker/README.md writes the bags (relative to docker/)
        bags = _mounts(svc)[PurePosixPath("/bags")]
        assert bags == "./bags" and PurePosixPath(args["bag"]).parent == PurePosixPath("/bags")
        readme = (DOCKER / "README.md").read_text()
        assert f"--out docker/bags/{PurePosixPath(args['bag']).name}" in readme
        assert set(svc["networks"]) & set(SERVICES["coordinator"]["networks"])
        assert "weights" not in args  # no weights: the model of the served card
    robot_defaults = yaml.safe_load((ROOT / "config" / "robot.yaml").read_text())
    assert robot_defaults["/**/robot_node"]["ros__parameters"]["weights"] == ""
    # the robot image's default command is a launch file of the package too
    (cmd,) = [rest for word, rest in _instructions("Dockerfile.robot") if word == "CMD"]
    default = yaml.safe_load(cmd)
    assert default[:3] == ["ros2", "launch", "fedepth_ros"] and default[3] in MODELS


@pytest.mark.parametrize("dockerfile", ["Dockerfile.coordinator", "Dockerfile.robot"])
def test_every_copied_path_exists(dockerfile: str) -> None:
    for word, rest in _instructions(dockerfile):
        if word != "COPY" or "--from=" in rest:
            continue
        *sources, _dest = rest.split()
        for src in sources:
            assert (ROOT / src.rstrip("/")).exists(), f"{dockerfile}: COPY {src}: no such path"


def test_the_readme_credential_commands_write_what_compose_mounts(tmp_path: Path) -> None:
    text = (DOCKER / "README.md").read_text()
    block = re.search(r"```\n(.*?)```", text, re.S)
    assert block, "docker/README.md has no command block"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    run = [line for line in lines if line.startswith(("mkdir ", "fedepth-coordinator "))]
    assert sum(line.startswith("fedepth-coordinator ") for line in run) == 2
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "coordinator.yaml").write_text(
        (ROOT / "config" / "coordinator.yaml").read_text()
    )
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
    }
    for line in run:  # as written, from a checkout's root
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (line, done.stderr[-2000:])
    # every secret file compose mounts now exists, in the format its reader expects
    for secret in COMPOSE["secrets"].values():
        assert (tmp_path / "docker" / secret["file"]).is_file(), secret
    creds = read_credentials(tmp_path / "docker/secrets/coordinator_credentials.yaml")
    for svc in _robots().values():
        args = dict(a.split(":=", 1) for a in svc["command"][4:])
        token = (tmp_path / f"docker/secrets/{args['robot_id']}.token").read_text().strip()
        principal = creds[args["robot_id"]]
        assert principal.role == "robot" and principal.token_sha256 == hash_token(token)
    raw = (tmp_path / "docker/secrets/coordinator_credentials.yaml").read_text()
    assert "token_sha256" in raw and token not in raw  # hashes only, never the token
