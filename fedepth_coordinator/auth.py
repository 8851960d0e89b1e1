"""Per-robot credentials: the credentials file, token hashing, and the one auth interceptor.

Each principal (a robot, or an operator tool) has a random token; the coordinator keeps only its
SHA-256 in the credentials file (YAML: ``principals: {id: {role, token_sha256}}``), which
``fedepth-coordinator --add-robot ID`` extends. Calls carry ``x-fedepth-principal: ID`` and
``authorization: Bearer TOKEN``. :class:`AuthInterceptor` checks them on the
``fedepth.v1.Coordinator`` service only (health and reflection stay open), aborts with
UNAUTHENTICATED on a missing or wrong credential and PERMISSION_DENIED when the role may not
call the method. Handlers then compare :func:`caller_id` with the robot id in the request, so a
robot cannot act as another.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from fedepth.atomic import atomic_write_text
from fedepth_coordinator.errors import shown
from fedepth_coordinator.state.base import ID_PATTERN, valid_id

log = logging.getLogger(__name__)

PRINCIPAL_KEY = "x-fedepth-principal"
AUTHORIZATION_KEY = "authorization"
SERVICE_PREFIX = "/fedepth.v1.Coordinator/"
ROLES = ("robot", "operator")

#: Methods an operator principal may call; robots may call every other method.
OPERATOR_METHODS = frozenset({"Route", "GetClusterMap", "GetFleetStatus", "ReleaseRound"})
#: Methods only operators may call (a robot may not open a held round).
OPERATOR_ONLY_METHODS = frozenset({"ReleaseRound"})

_DUMMY_HASH = hashlib.sha256(b"no such principal").hexdigest()


@dataclass(frozen=True)
class Principal:
    role: str
    token_sha256: str


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits)."""
    return secrets.token_urlsafe(32)


def read_credentials(path: str | Path) -> dict[str, Principal]:
    """The principals of a credentials file; errors say which entry is wrong."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"no credentials file at {p}; create robots with "
            "`fedepth-coordinator --config FILE --add-robot ID` (it prints the robot's token)"
        )
    data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    entries = data.get("principals") if isinstance(data, Mapping) else None
    if not isinstance(entries, Mapping):
        raise ValueError(f"{p}: expected a mapping 'principals: {{id: {{role, token_sha256}}}}'")
    out: dict[str, Principal] = {}
    for pid, entry in entries.items():
        if not isinstance(pid, str) or not valid_id(pid):
            raise ValueError(f"{p}: principal id {shown(pid)} must match {ID_PATTERN.pattern}")
        if not isinstance(entry, Mapping) or entry.get("role") not in ROLES:
            raise ValueError(f"{p}: principal {pid!r} needs a role, one of {ROLES}")
        digest = str(entry.get("token_sha256", ""))
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"{p}: principal {pid!r}: token_sha256 must be 64 hex digits")
        out[pid] = Principal(role=str(entry["role"]), token_sha256=digest)
    return out


def add_principal(path: str | Path, principal_id: str, role: str = "robot") -> str:
    """Add (or re-key) a principal in the credentials file and return its new token."""
    if not valid_id(principal_id):
        raise ValueError(f"id {shown(principal_id)} must match {ID_PATTERN.pattern}")
    if role not in ROLES:
        raise ValueError(f"role {role!r} must be one of {ROLES}")
    p = Path(path)
    current = read_credentials(p) if p.exists() else {}
    token = new_token()
    current[principal_id] = Principal(role, hash_token(token))
    body = {
        "principals": {
            pid: {"role": pr.role, "token_sha256": pr.token_sha256}
            for pid, pr in sorted(current.items())
        }
    }
    p.parent.mkdir(parents=True, exist_ok=True)
    header = "# fedepth coordinator credentials: principal id -> role and SHA-256 of its token.\n"
    atomic_write_text(p, header + yaml.safe_dump(body, sort_keys=False), mode=0o600, fsync=True)
    return token


class CredentialStore:
    """The principals of a credentials file, re-read when the file changes.

    A file that does not exist yet holds no principals (every call is refused) until
    ``--add-robot`` creates it; it is then picked up without a restart.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp = self._stat() if self.path.exists() else (-1, -1)
        self._bad_stamp: tuple[int, int] | None = None
        self._principals = read_credentials(self.path) if self.path.exists() else {}

    def _stat(self) -> tuple[int, int]:
        st = self.path.stat()
        return st.st_mtime_ns, st.st_size

    def principals(self) -> dict[str, Principal]:
        with self._lock:
            if self._stamp == (-1, -1) and not self.path.exists():
                return self._principals  # not created yet: no principals
            stamp: tuple[int, int] | None = None
            try:
                stamp = self._stat()
                if stamp != self._stamp:
                    self._principals = read_credentials(self.path)
                    self._stamp = stamp
                    log.info("reloaded %d principals from %s", len(self._principals), self.path)
            except (OSError, ValueError, TypeError, yaml.YAMLError) as exc:
                # a typo while editing the file must not lock every robot out: keep serving
                # the last good principals, and say so once per version of the file
                if stamp is None or stamp != self._bad_stamp:
                    log.error(
                        "credentials file %s is invalid, keeping the previous %d principals "
                        "until it is fixed: %s",
                        self.path,
                        len(self._principals),
                        str(exc).replace("\n", " "),
                    )
                    self._bad_stamp = stamp
            return self._principals

    def verify(self, principal_id: str, token: str) -> Principal | None:
        """The principal if the token is its token (constant time whether the id exists)."""
        found = self.principals().get(principal_id)
        expected = found.token_sha256 if found else _DUMMY_HASH
        ok = hmac.compare_digest(hash_token(token), expected)
        return found if ok and found is not None else None


def _single(metadata: Sequence[tuple[str, Any]] | None, key: str) -> str | None:
    """The one value of a metadata key; None when absent or repeated."""
    values = [v for k, v in (metadata or ()) if k == key]
    if len(values) != 1 or not isinstance(values[0], str):
        return None
    return values[0]


def caller_id(context: grpc.ServicerContext) -> str:
    """The principal of a call that passed :class:`AuthInterceptor` (verified there)."""
    pid = _single(context.invocation_metadata(), PRINCIPAL_KEY)
    if pid is None:
        raise RuntimeError("call reached the servicer without a verified principal")
    return pid


def call_metadata(principal_id: str, token: str) -> tuple[tuple[str, str], ...]:
    """The metadata a client attaches to every call."""
    return ((PRINCIPAL_KEY, principal_id), (AUTHORIZATION_KEY, f"Bearer {token}"))


def _aborting(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> Any:
    def abort(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(code, message)

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    factory: Callable[..., Any]
    if handler.request_streaming and handler.response_streaming:
        factory = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        factory = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        factory = grpc.unary_stream_rpc_method_handler
    else:
        factory = grpc.unary_unary_rpc_method_handler
    return factory(abort, **kwargs)


def guarded(
    handler: grpc.RpcMethodHandler,
    enter: Callable[[grpc.ServicerContext], None],
    leave: Callable[[], None] | None = None,
) -> Any:
    """``handler`` with ``enter(context)`` run before its behaviour (it may abort the call) and
    ``leave()`` after it ends (only when ``enter`` returned), for every kind of RPC."""

    def unary(behavior: Callable[[Any, grpc.ServicerContext], Any]) -> Any:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            enter(context)
            try:
                return behavior(request, context)
            finally:
                if leave is not None:
                    leave()

        return call

    def streaming(behavior: Callable[[Any, grpc.ServicerContext], Any]) -> Any:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            enter(context)
            try:
                yield from behavior(request, context)
            finally:
                if leave is not None:
                    leave()

        return call

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary), **kwargs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), **kwargs)
    return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), **kwargs)


def certificate_names(context: grpc.ServicerContext) -> set[str]:
    """The names a verified client certificate carries (common name and subject alternative
    names); empty without one."""
    auth = context.auth_context()
    names: set[str] = set()
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth.get(key, []):
            names.add(value.decode(errors="replace") if isinstance(value, bytes) else str(value))
    return names


class AuthInterceptor(grpc.ServerInterceptor):
    """Checks the principal and token of every call to our service; others pass untouched.

    With ``bind_certificates`` (mutual TLS), the principal must also be named by the client
    certificate of the connection (its common name or a subject alternative name), so that a
    stolen token is of no use without that robot's certificate and key.
    """

    def __init__(self, credentials: CredentialStore, *, bind_certificates: bool = False) -> None:
        self.credentials = credentials
        self.bind_certificates = bind_certificates

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method
        if not method.startswith(SERVICE_PREFIX):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        md = handler_call_details.invocation_metadata
        pid = _single(md, PRINCIPAL_KEY)
        auth = _single(md, AUTHORIZATION_KEY)
        if pid is None or auth is None or not auth.startswith("Bearer "):
            return _aborting(
                handler,
                grpc.StatusCode.UNAUTHENTICATED,
                f"missing credentials: send '{PRINCIPAL_KEY}: ID' and "
                f"'{AUTHORIZATION_KEY}: Bearer TOKEN' metadata",
            )
        principal = self.credentials.verify(pid, auth[len("Bearer ") :])
        if principal is None:
            log.warning("rejected %s: bad credentials for principal %s", method, shown(pid))
            return _aborting(
                handler,
                grpc.StatusCode.UNAUTHENTICATED,
                f"invalid credentials for principal {shown(pid)}: check its token "
                "(re-issue with `fedepth-coordinator --add-robot ID`)",
            )
        name = method[len(SERVICE_PREFIX) :]
        allowed = (
            name in OPERATOR_METHODS
            if principal.role != "robot"
            else name not in OPERATOR_ONLY_METHODS
        )
        if not allowed:
            return _aborting(
                handler,
                grpc.StatusCode.PERMISSION_DENIED,
                f"principal {pid!r} has role {principal.role!r}, which may not call {name}",
            )
        if self.bind_certificates:
            return guarded(handler, lambda context: self._check_certificate(pid, context))
        return handler

    @staticmethod
    def _check_certificate(pid: str, context: grpc.ServicerContext) -> None:
        names = certificate_names(context)
        if pid not in names:
            log.warning(
                "rejected a call of principal %r: its client certificate names %s",
                pid,
                shown(sorted(names)),
            )
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"the client certificate does not name principal {pid!r} (common name or "
                "subject alternative name): each robot connects with its own certificate",
            )
