"""Domain errors of the coordinator; the servicer maps each class to one gRPC status code."""

from __future__ import annotations


class CoordinatorError(Exception):
    """Base of the errors a caller can act on; the message says what was wrong and what to do."""


class InvalidArgumentError(CoordinatorError):
    """The request itself is malformed (bad tensors, descriptor, ids): fix it and resend."""


class FailedPreconditionError(CoordinatorError):
    """The request is well formed but the coordinator is not in a state to accept it."""


class NotFoundError(CoordinatorError):
    """The robot (or object) named in the request is unknown to the coordinator."""


class AlreadyExistsError(CoordinatorError):
    """The request repeats something already accepted and recorded (a duplicate upload)."""


class AbortedError(CoordinatorError):
    """A request on the same object is still in progress (an upload streaming): nothing was
    recorded yet; retry after a short wait."""


class PermissionDeniedError(CoordinatorError):
    """The authenticated caller may not act on the robot named in the request."""


class ResourceExhaustedError(CoordinatorError):
    """A size limit was exceeded."""


def shown(text: object, limit: int = 80) -> str:
    """``repr`` of a caller-controlled value for logs and error details, at most about
    ``limit`` characters (control characters escaped, long values cut, with their length), so
    that a robot cannot flood the log or a reply with an id of its own making."""
    if isinstance(text, str) and len(text) > limit:
        return f"{text[:limit]!r}... ({len(text)} characters)"
    r = repr(text)
    return r if len(r) <= limit + 2 else f"{r[:limit]}... ({len(r)} characters)"
