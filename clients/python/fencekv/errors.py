"""The exceptions of fencekv: one class per refusal code of the server.

Every refusal the server sends (wire/PROTOCOL.md, section 6) is raised as
the subclass of :class:`Error` named after its code, carrying the code's
facts as attributes (``StaleToken.fence``, ``LockHeld.retry_after``, ...).
A code this client does not know is raised as :class:`Error` itself, with
its ``code`` and ``message``.

Failures of the client's own making are subclasses too:
:class:`ConnectionLost` and :class:`Timeout` (both :class:`Unavailable`,
saying whether the outcome of the request is unknown), :class:`LeaseLost`,
:class:`ClientClosed` and :class:`ProtocolError`.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "Error",
    "StaleToken",
    "NotHolder",
    "LeaseExpired",
    "LockHeld",
    "CompareFailed",
    "NotInteger",
    "TooLarge",
    "BadRequest",
    "UnknownMethod",
    "Unavailable",
    "NotLeader",
    "LimitExceeded",
    "LimitMismatch",
    "Internal",
    "Compacted",
    "Unauthenticated",
    "PermissionDenied",
    "ConnectionLost",
    "Timeout",
    "LeaseLost",
    "ClientClosed",
    "ProtocolError",
]


class Error(Exception):
    """A request the server refused, or that failed on the way.

    ``code`` is the server's stable code (switch on the class, or on this);
    ``message`` its explanation (not stable: do not parse it); ``facts``
    every field of the error map but those two.
    """

    code: str = "error"

    def __init__(self, message: str = "", *, code: Optional[str] = None,
                 facts: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.facts: Dict[str, Any] = dict(facts or {})

    def __str__(self) -> str:
        if self.message:
            return f"{self.code}: {self.message}"
        return self.code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class StaleToken(Error):
    """A write's token is below the key's fence (or not above it, strict).

    ``fence`` is the key's current fence.
    """

    code = "stale_token"

    @property
    def fence(self) -> int:
        return int(self.facts.get("fence", 0))


class NotHolder(Error):
    """The lock is free or held by another token.

    ``token`` is the current holder's token, 0 if the lock is free.
    """

    code = "not_holder"

    @property
    def token(self) -> int:
        return int(self.facts.get("token", 0))


class LeaseExpired(Error):
    """The token is the lock's latest grant, but its lease has run out.

    ``token`` is the caller's token.
    """

    code = "lease_expired"

    @property
    def token(self) -> int:
        return int(self.facts.get("token", 0))


class LockHeld(Error):
    """An acquire could not be granted now, or its wait ended first.

    ``holder`` and ``token`` are the current holder's (``""`` and 0 during
    a lock-delay); ``retry_after`` is the earliest time in seconds the lock
    may become free (a hint), ``retry_ms`` the same in milliseconds.
    """

    code = "lock_held"

    @property
    def holder(self) -> str:
        return str(self.facts.get("holder", ""))

    @property
    def token(self) -> int:
        return int(self.facts.get("token", 0))

    @property
    def retry_ms(self) -> int:
        return int(self.facts.get("retry_ms", 0))

    @property
    def retry_after(self) -> float:
        return self.retry_ms / 1000.0


class CompareFailed(Error):
    """A cas (or a txn's compare) found another revision.

    ``revision`` is the key's current revision (0 if absent); ``key`` the
    failing key of a txn, else None.
    """

    code = "compare_failed"

    @property
    def revision(self) -> int:
        return int(self.facts.get("revision", 0))

    @property
    def key(self) -> Optional[bytes]:
        return self.facts.get("key")


class NotInteger(Error):
    """incr found a value that is not a 64-bit decimal integer, or overflowed."""

    code = "not_integer"


class TooLarge(Error):
    """A key, lock name, holder, value or message over its limit."""

    code = "too_large"


class BadRequest(Error):
    """Malformed params, a missing or ill-typed param, a value out of range."""

    code = "bad_request"


class UnknownMethod(Error):
    """The method is not one the server knows."""

    code = "unknown_method"


class Unavailable(Error):
    """The store could not serve the request.

    ``outcome_unknown`` is True when the request may have been applied (and
    may yet be applied later): read before retrying a write that is not
    idempotent. False means it was not applied.
    """

    code = "unavailable"

    @property
    def outcome_unknown(self) -> bool:
        return self.facts.get("outcome") == "unknown"


class NotLeader(Error):
    """A cluster node that does not lead was sent a forwarded request."""

    code = "not_leader"

    @property
    def leader(self) -> str:
        return str(self.facts.get("leader", ""))


class LimitExceeded(Error):
    """A server limit was reached (in-flight calls, waiters, connections)."""

    code = "limit_exceeded"


class LimitMismatch(Error):
    """An acquire's ``limit`` (1 when not given) is not the lock's while any
    of its permits is live: a plain acquire of a semaphore, a semaphore
    acquire of a held plain lock, or another limit (PROTOCOL.md §5.2).
    Nothing changed and the acquire was not queued. The code has no facts:
    :meth:`Client.lock_info` tells the lock's ``limit``.
    """

    code = "limit_mismatch"


class Internal(Error):
    """A bug in the server: it recovered from a panic serving the request."""

    code = "internal"


class Compacted(Error):
    """A watch asked to start before the history the server keeps.

    ``revision`` is the oldest revision kept.
    """

    code = "compacted"

    @property
    def revision(self) -> int:
        return int(self.facts.get("revision", 0))


class Unauthenticated(Error):
    """No (or a wrong) name and secret, on a server with an auth file."""

    code = "unauthenticated"


class PermissionDenied(Error):
    """The principal has no right to this method, key or lock name."""

    code = "permission_denied"


class TLSRequired(Error):
    """A TLS server was sent plain bytes (the server's error notification).

    A configuration error: nothing was served, so no outcome is in doubt.
    Connect with ``ssl=``.
    """

    code = "tls_required"


class ConnectionLost(Unavailable):
    """The connection broke before the answer came, or none could be made.

    ``outcome_unknown`` is True when the request was sent and changes state
    (a write or lock method): it may or may not have been applied. ``addr``
    is the server address (or the addresses tried).
    """

    code = "connection_lost"

    def __init__(self, message: str, *, addr: str = "", outcome_unknown: bool = False) -> None:
        super().__init__(message, facts={"outcome": "unknown"} if outcome_unknown else None)
        self.addr = addr


class Timeout(ConnectionLost):
    """No answer came within the call's timeout (see ConnectionLost)."""

    code = "timeout"


class LeaseLost(Error):
    """The lease may have been lost: stop working on what it protects.

    Raised by ``Lease.check()`` and by a held write once a renew was
    refused, or once no renew succeeded within the TTL less the margin.
    """

    code = "lease_lost"


class ClientClosed(Error):
    """The client was closed."""

    code = "client_closed"


class ProtocolError(Error):
    """The server sent something that is not a valid answer."""

    code = "protocol_error"


_BY_CODE: Dict[str, Type[Error]] = {
    cls.code: cls
    for cls in (StaleToken, NotHolder, LeaseExpired, LockHeld, CompareFailed, NotInteger,
                TooLarge, BadRequest, UnknownMethod, Unavailable, NotLeader, LimitExceeded,
                LimitMismatch, Internal, Compacted, Unauthenticated, PermissionDenied, TLSRequired)
}


def from_wire(err: Any) -> Error:
    """The exception for an error map the server sent."""
    if not isinstance(err, dict):
        return ProtocolError(f"error slot is not a map: {err!r}")
    code = err.get("code")
    if not isinstance(code, str):
        return ProtocolError(f"error map without a code: {err!r}")
    message = err.get("message")
    if not isinstance(message, str):
        message = ""
    facts = {k: v for k, v in err.items() if k not in ("code", "message")}
    cls = _BY_CODE.get(code)
    if cls is None:
        return Error(message, code=code, facts=facts)
    return cls(message, facts=facts)
