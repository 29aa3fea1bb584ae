"""The values fencekv's methods return.

Durations are seconds (float), as with :mod:`time`; keys and values are
bytes; holders and lock names str (decoded leniently: bytes that are not
UTF-8 come back as surrogate escapes).
"""

from __future__ import annotations

import datetime
from typing import Any, List, Mapping, NamedTuple, Optional, Tuple, Union

__all__ = [
    "Bytes",
    "Duration",
    "Entry",
    "WriteResult",
    "TxnResult",
    "Grant",
    "LockInfo",
    "Holder",
    "Status",
    "Member",
    "Refusal",
    "Event",
    "BackupInfo",
]

#: A key, value, prefix or lock name: str is sent as its UTF-8 bytes.
Bytes = Union[bytes, bytearray, memoryview, str]
#: A duration: seconds, or a timedelta.
Duration = Union[float, int, datetime.timedelta]


class Entry(NamedTuple):
    """A key as get and scan report it."""

    key: bytes
    value: Optional[bytes]  # None when not found
    fence: int
    revision: int  # 0 when not found
    found: bool = True


class WriteResult(NamedTuple):
    """The result of put, delete, cas and incr (and of each op of a txn)."""

    fence: int
    revision: int
    deleted: Optional[bool] = None  # delete only
    value: Optional[int] = None  # incr only
    key: Optional[bytes] = None  # txn results only


class TxnResult(NamedTuple):
    revision: int
    results: List[WriteResult]


class Grant(NamedTuple):
    """A lock granted by acquire."""

    lock: str
    token: int
    ttl: float


class Holder(NamedTuple):
    """A live permit of a semaphore (or a plain lock's live lease)."""

    holder: str
    token: int
    ttl: float  # lease time left


class LockInfo(NamedTuple):
    lock: str
    held: bool
    holder: str  # a semaphore's: the newest live permit's
    token: int
    ttl: float  # lease time left; 0 when not held
    waiters: int
    lock_delay: float  # lock-delay time left
    #: permits: 1 for a plain lock, 2..256 for a semaphore (PROTOCOL.md §5.2)
    limit: int = 1
    #: the live permits in token order: a semaphore's every one, a plain
    #: lock's one holder while held, else empty
    holders: Tuple[Holder, ...] = ()

    def token_of(self, holder: str) -> Optional[int]:
        """The token of the live permit (or plain lease) held under holder,
        or None: how a lock helper finds a grant whose answer was lost."""
        for h in self.holders:
            if h.holder == holder and h.token:
                return h.token
        return None


class Status(NamedTuple):
    version: str = ""
    node: str = ""
    role: str = ""
    leader: str = ""
    term: int = 0
    commit_index: int = 0
    applied_index: int = 0
    last_token: int = 0
    revision: int = 0
    keys: int = 0
    locks: int = 0
    waiters: int = 0
    commits: int = 0
    commands: int = 0
    data_size: int = 0
    sync_us: int = 0
    checkpoints: int = 0
    checkpoint_us: int = 0


class Member(NamedTuple):
    node: str
    client_addr: str
    raft_addr: str
    gossip_addr: str
    state: str
    voter: bool
    raft_role: str


class Refusal(NamedTuple):
    seq: int
    time_ms: int
    code: str
    op: str
    key: bytes
    lock: str
    token: int
    fence: int
    holder_token: int
    granted_lock: str
    granted_holder: str
    client: str
    known: bool


class Event(NamedTuple):
    """A change a watch reports.

    ``type`` is ``put``, ``delete``, or with locks ``acquired``,
    ``released``, ``expired``; key events have ``key`` (and ``value`` for a
    put) and ``fence``, lock events ``lock`` and ``token``.
    """

    type: str
    revision: int
    key: Optional[bytes] = None
    value: Optional[bytes] = None
    fence: int = 0
    lock: Optional[str] = None
    token: int = 0


class BackupInfo(NamedTuple):
    size: int
    index: int
    last_token: int
    revision: int
    crc32c: int


def _fields(cls: Any, m: Mapping[str, Any]) -> dict:
    return {k: v for k, v in m.items() if k in cls._fields and v is not None}


def status_of(m: Mapping[str, Any]) -> Status:
    return Status(**_fields(Status, m))


def member_of(m: Mapping[str, Any]) -> Member:
    return Member(
        node=m.get("node", ""), client_addr=m.get("client_addr", ""),
        raft_addr=m.get("raft_addr", ""), gossip_addr=m.get("gossip_addr", ""),
        state=m.get("state", ""), voter=bool(m.get("voter", False)),
        raft_role=m.get("raft_role", ""))


def refusal_of(m: Mapping[str, Any]) -> Refusal:
    return Refusal(
        seq=m.get("seq", 0), time_ms=m.get("time_ms", 0), code=m.get("code", ""),
        op=m.get("op", ""), key=m.get("key") or b"", lock=m.get("lock", ""),
        token=m.get("token", 0), fence=m.get("fence", 0),
        holder_token=m.get("holder_token", 0), granted_lock=m.get("granted_lock", ""),
        granted_holder=m.get("granted_holder", ""), client=m.get("client", ""),
        known=bool(m.get("known", False)))


def _name(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "surrogateescape")
    return v or ""


def lock_info_of(m: Mapping[str, Any], name: Optional[str] = None) -> LockInfo:
    held = bool(m.get("held", False))
    holder, token, ttl = _name(m.get("holder")), m.get("token", 0), m.get("ttl_ms", 0) / 1000.0
    if "limit" in m:  # a semaphore
        holders = tuple(Holder(_name(h.get("holder")), h.get("token", 0),
                               h.get("ttl_ms", 0) / 1000.0)
                        for h in m.get("holders") or [] if isinstance(h, dict))
    else:
        holders = (Holder(holder, token, ttl),) if held else ()
    return LockInfo(
        lock=_name(m.get("lock")) if name is None else name,
        held=held, holder=holder, token=token, ttl=ttl,
        waiters=m.get("waiters", 0), lock_delay=m.get("lock_delay_ms", 0) / 1000.0,
        limit=m.get("limit", 1), holders=holders)


def entry_of(m: Mapping[str, Any], key: Optional[bytes] = None) -> Entry:
    found = m.get("found", True)
    value = m.get("value")
    if found and value is None:
        value = b""
    return Entry(key=m.get("key", key) if key is None else key, value=value if found else None,
                 fence=m.get("fence", 0), revision=m.get("revision", 0), found=bool(found))


def write_result_of(m: Mapping[str, Any]) -> WriteResult:
    return WriteResult(fence=m.get("fence", 0), revision=m.get("revision", 0),
                       deleted=m.get("deleted"), value=m.get("value"), key=m.get("key"))


def event_of(m: Mapping[str, Any]) -> Event:
    lock = m.get("lock")
    return Event(type=m.get("type", ""), revision=m.get("revision", 0), key=m.get("key"),
                 value=m.get("value"), fence=m.get("fence", 0),
                 lock=None if lock is None else _name(lock), token=m.get("token", 0))
