"""Credentials file, the auth interceptor on a live server, and TLS / mutual TLS."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedepth_coordinator.auth import CredentialStore, add_principal, hash_token, read_credentials
from fedepth_coordinator.client import (
    ClientTls,
    CoordinatorCallError,
    CoordinatorClient,
    open_channel,
)
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.server import CoordinatorServer, running
from fedepth_coordinator.simulate import robot_profile


def test_credentials_file_keeps_only_token_hashes(tmp_path: Path) -> None:
    path = tmp_path / "c" / "creds.yaml"
    token = add_principal(path, "robot-1")
    text = path.read_text()
    assert token not in text and hash_token(token) in text
    assert path.stat().st_mode & 0o777 == 0o600
    principals = read_credentials(path)
    assert principals["robot-1"].role == "robot"
    store = CredentialStore(path)
    assert store.verify("robot-1", token) is not None
    assert store.verify("robot-1", token + "x") is None and store.verify("nobody", token) is None
    new = add_principal(path, "robot-1")  # re-keying revokes the old token
    assert store.verify("robot-1", token) is None and store.verify("robot-1", new) is not None
    with pytest.raises(ValueError, match="must match"):
        add_principal(path, "bad id!")


def test_credentials_errors_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--add-robot ID"):
        read_credentials(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump({"principals": {"r": {"role": "admin", "token_sha256": "0" * 64}}})
    )
    with pytest.raises(ValueError, match="needs a role"):
        read_credentials(bad)


def test_robots_added_while_running_can_call_at_once(
    server: CoordinatorServer, creds: Any, connect: Callable[..., CoordinatorClient]
) -> None:
    token = creds.add("robot-new")
    p = robot_profile("robot-new")
    reg = connect(server.port, "robot-new", token).register(p.num_samples, p.labels)
    assert not reg.member
    with pytest.raises(CoordinatorCallError) as err:
        connect(server.port, "robot-000", token).register(10)
    assert err.value.status == "UNAUTHENTICATED"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    """A CA, a server certificate for localhost / 127.0.0.1 and client certificates of the
    principals ``ops`` and ``robot-000`` (their common names)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path / "pki"
    d.mkdir()
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=fedepth test CA", cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, ext in (("server", ["-extfile", "san.ext"]), ("ops", []), ("robot-000", [])):
        _openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *ext, cwd=d)  # fmt: skip
    return d


@pytest.mark.parametrize("mutual", [False, True])
def test_tls_and_mutual_tls(
    mutual: bool, pki: Path, config_factory: Callable[..., CoordinatorConfig], creds: Any
) -> None:
    tls = {"cert_file": str(pki / "server.pem"), "key_file": str(pki / "server.key")}
    if mutual:
        tls["client_ca_file"] = str(pki / "ca.pem")
    with running(config_factory(tls=tls)) as server:
        target = f"localhost:{server.port}"
        robot_tls = ClientTls(
            ca_file=str(pki / "ca.pem"),
            cert_file=str(pki / "ops.pem"),
            key_file=str(pki / "ops.key"),
        )
        with CoordinatorClient(
            open_channel(target, tls=robot_tls), "ops", creds.tokens["ops"]
        ) as c:
            assert c.fleet_status().min_robots == 4
        with CoordinatorClient(open_channel(target), "ops", creds.tokens["ops"], timeout_s=3) as c:
            with pytest.raises(CoordinatorCallError) as err:
                c.fleet_status()  # plaintext to a TLS port
            assert err.value.status == "UNAVAILABLE"
        no_cert = ClientTls(ca_file=str(pki / "ca.pem"))
        with CoordinatorClient(
            open_channel(target, tls=no_cert), "ops", creds.tokens["ops"], timeout_s=3
        ) as c:
            if mutual:
                with pytest.raises(CoordinatorCallError) as err:
                    c.fleet_status()
                assert err.value.status == "UNAVAILABLE"
            else:
                assert c.fleet_status().phase.value == "waiting_for_fleet"


def test_mutual_tls_certificate_is_bound_to_its_principal(
    pki: Path, config_factory: Callable[..., CoordinatorConfig], creds: Any
) -> None:
    """Issue 14, item 11: robot-000's certificate with robot-001's (stolen) token is refused."""
    tls = {
        "cert_file": str(pki / "server.pem"),
        "key_file": str(pki / "server.key"),
        "client_ca_file": str(pki / "ca.pem"),
    }
    robot_tls = ClientTls(
        ca_file=str(pki / "ca.pem"),
        cert_file=str(pki / "robot-000.pem"),
        key_file=str(pki / "robot-000.key"),
    )
    with running(config_factory(tls=tls)) as server:
        target = f"localhost:{server.port}"
        with CoordinatorClient(
            open_channel(target, tls=robot_tls), "robot-001", creds.tokens["robot-001"]
        ) as thief:
            with pytest.raises(CoordinatorCallError) as err:
                thief.register(10)
            assert err.value.status == "UNAUTHENTICATED"
            assert "does not name principal 'robot-001'" in err.value.details
        assert server.store.load().robots == []  # nothing recorded for the stolen identity
        with CoordinatorClient(
            open_channel(target, tls=robot_tls), "robot-000", creds.tokens["robot-000"]
        ) as own:
            assert not own.register(10).member  # its own certificate and token: served
            assert own.health() == "SERVING"
    with running(config_factory(tls={**tls, "bind_principal": False})) as server:
        channel = open_channel(f"localhost:{server.port}", tls=robot_tls)
        with CoordinatorClient(channel, "robot-001", creds.tokens["robot-001"]) as other:
            assert not other.register(10).member  # binding switched off: the token decides
