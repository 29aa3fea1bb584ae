"""What the sync and asyncio clients share: params, results, watch resumes.

Nothing here does I/O.
"""

from __future__ import annotations

import datetime
import os
import secrets
import socket
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import msgpack

from . import errors
from .types import Bytes, Duration, Event, TxnResult, event_of, write_result_of

#: Methods that change nothing: their outcome is never in doubt.
READS = frozenset(("ping", "get", "scan", "lock_info", "locks", "status", "members", "term",
                   "refusals", "watch", "unwatch", "auth", "backup_read"))

#: The most a server's answer may take before it is a protocol error.
MAX_BUFFER = 64 << 20

DEFAULT_PORT = 7420


def unpacker() -> msgpack.Unpacker:
    # Holders and messages may quote bytes that are not UTF-8 (PROTOCOL §3).
    return msgpack.Unpacker(raw=False, unicode_errors="surrogateescape",
                            max_buffer_size=MAX_BUFFER, strict_map_key=False)


_packer_opts = dict(use_bin_type=True, unicode_errors="surrogateescape")


def pack_request(msgid: int, method: str, params: Optional[Mapping[str, Any]]) -> bytes:
    return msgpack.packb([0, msgid, method, [params] if params else []], **_packer_opts)


def pack_notification(method: str, params: Optional[Mapping[str, Any]]) -> bytes:
    return msgpack.packb([2, method, [params] if params else []], **_packer_opts)


def seconds(d: Duration) -> float:
    if isinstance(d, datetime.timedelta):
        return d.total_seconds()
    return float(d)


def ms(d: Duration) -> int:
    """A duration as the integer milliseconds of the protocol (rounded up)."""
    s = seconds(d)
    n = int(s * 1000)
    if n < s * 1000:
        n += 1
    return n


def data(b: Bytes) -> Union[bytes, str]:
    """A key, value or name to send: str as str, anything else as bin."""
    if isinstance(b, (bytes, str)):
        return b
    if isinstance(b, (bytearray, memoryview)):
        return bytes(b)
    raise TypeError(f"want bytes or str, not {type(b).__name__}")


def as_bytes(b: Bytes) -> bytes:
    if isinstance(b, str):
        return b.encode("utf-8", "surrogateescape")
    return bytes(b)


def as_name(b: Bytes) -> str:
    if isinstance(b, str):
        return b
    return bytes(b).decode("utf-8", "surrogateescape")


def parse_addrs(addrs: Union[str, Sequence[str]]) -> List[Tuple[str, int]]:
    if isinstance(addrs, str):
        addrs = [a for a in addrs.split(",") if a.strip()]
    out = []
    for a in addrs:
        a = a.strip()
        host, sep, port = a.rpartition(":")
        if not sep:
            host, port = a, str(DEFAULT_PORT)
        host = host.strip("[]") or "127.0.0.1"
        out.append((host, int(port)))
    if not out:
        raise ValueError("no server address given")
    return out


def write_params(key: Bytes, token: int, strict: bool, lock: Optional[Bytes],
                 lease: Any) -> Dict[str, Any]:
    """The params of a write: key and its fencing (a lease gives token and lock)."""
    p: Dict[str, Any] = {"key": data(key)}
    if lease is not None:
        lease.check()
        token = lease.token
        lock = lease.name
    if token:
        p["token"] = token
    if strict:
        p["strict"] = True
    if lock is not None:
        p["lock"] = data(lock)
    return p


def txn_params(ops: Iterable[Any], compare: Optional[Iterable[Any]], token: int, strict: bool,
               lock: Optional[Bytes], lease: Any) -> Dict[str, Any]:
    out = []
    for op in ops:
        if isinstance(op, Mapping):
            out.append({k: data(v) if k in ("key", "value") else v for k, v in op.items()})
            continue
        kind, *args = op
        if kind == "put":
            k, v = args
            out.append({"op": "put", "key": data(k), "value": data(v)})
        elif kind == "delete":
            (k,) = args
            out.append({"op": "delete", "key": data(k)})
        elif kind == "incr":
            k, d = args
            out.append({"op": "incr", "key": data(k), "delta": d})
        else:
            out.append({"op": kind})  # the server says what is wrong with it
    p = write_params(b"", token, strict, lock, lease)
    del p["key"]
    p["ops"] = out
    if compare is not None:
        cmp = []
        for c in compare:
            if isinstance(c, Mapping):
                cmp.append({"key": data(c["key"]), "revision": c["revision"]})
            else:
                k, rev = c
                cmp.append({"key": data(k), "revision": rev})
        p["compare"] = cmp
    return p


def txn_result(r: Mapping[str, Any]) -> TxnResult:
    return TxnResult(revision=r.get("revision", 0),
                     results=[write_result_of(x) for x in r.get("results") or []])


def acquire_params(name: Bytes, ttl: Duration, wait: Duration, holder: Optional[Bytes],
                   lock_delay: Duration, limit: Optional[int] = None) -> Dict[str, Any]:
    p: Dict[str, Any] = {"lock": data(name), "ttl_ms": ms(ttl)}
    if limit is not None:
        # Sent as given, also 0 or out of range: the server's bad_request
        # is the one rule for the limit (1..256, PROTOCOL.md §5.2).
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, not {type(limit).__name__}")
        p["limit"] = limit
    if holder:
        p["holder"] = data(holder)
    w = ms(wait)
    if w > 0:
        p["wait_ms"] = w
    d = ms(lock_delay)
    if d > 0:
        p["lock_delay_ms"] = d
    return p


def page_params(prefix: Optional[Bytes], start: Optional[Bytes], limit: int,
                consistency: Optional[str]) -> Dict[str, Any]:
    p: Dict[str, Any] = {}
    if prefix:
        p["prefix"] = data(prefix)
    if start:
        p["start"] = data(start)
    if limit:
        p["limit"] = limit
    if consistency:
        p["consistency"] = consistency
    return p


def result_map(r: Any, method: str) -> Dict[str, Any]:
    if not isinstance(r, dict):
        raise errors.ProtocolError(f"{method}: result is not a map: {r!r}")
    return r


def unique_holder() -> str:
    """host:pid:random, a holder name no other client uses."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"


def unknown_outcome(err: BaseException) -> bool:
    return isinstance(err, errors.Unavailable) and err.outcome_unknown


def retryable(err: BaseException) -> bool:
    """Whether a lock call that failed with err may succeed if sent again."""
    return isinstance(err, (errors.Unavailable, errors.NotLeader))


def requeue(err: BaseException) -> bool:
    """A queued acquire its leader dropped, unapplied: queue again."""
    return (isinstance(err, (errors.Unavailable, errors.NotLeader))
            and not isinstance(err, errors.ConnectionLost)
            and not unknown_outcome(err))


class WatchResume:
    """Where a watch resumes: no gap, no repeat (PROTOCOL.md, watch).

    Keeps the revision of the last event delivered and how many of its
    events were; after a reconnect the watch starts again at that revision
    and skips those.
    """

    def __init__(self, start_revision: int) -> None:
        self.last_rev = start_revision - 1 if start_revision > 0 else 0
        self.seen = 0
        self.started = start_revision > 0
        self._skip = 0
        self._skip_rev = 0

    def started_at(self, revision: int) -> None:
        """The server's revision when a watch from now began."""
        if not self.started:
            self.started = True
            self.last_rev = revision

    def resume_from(self) -> int:
        if self.seen == 0:
            return self.last_rev + 1
        return self.last_rev

    def begin(self, start: int = -1) -> None:
        """A new connection: skip what was delivered of the last revision.
        A watch started from now (start 0: lock events of a store at
        revision 0 cannot be replayed) replays nothing, so skips nothing."""
        self._skip, self._skip_rev = self.seen, self.last_rev
        if start == 0:
            self._skip = 0

    def after_restart(self, oldest: int) -> bool:
        """Whether a compacted refusal with the server's oldest revision still
        allows a resume with no gap: the server (restarted) keeps everything
        after what was delivered, though not the revision delivered last."""
        if self.seen and oldest == self.last_rev + 1:
            self.seen = 0
            return True
        return False

    def events(self, raw: Any) -> List[Event]:
        if not isinstance(raw, list):
            raise errors.ProtocolError(f"watch: events is not an array: {raw!r}")
        out = []
        for m in raw:
            e = event_of(m)
            if e.revision < self._skip_rev or (e.revision == self._skip_rev and self._skip > 0):
                if e.revision == self._skip_rev:
                    self._skip -= 1
                continue  # delivered before the reconnect
            if e.revision != self.last_rev:
                self.last_rev, self.seen = e.revision, 0
            self.seen += 1
            out.append(e)
        return out


def watch_params(prefix: Optional[Bytes], locks: bool, start: int) -> Dict[str, Any]:
    p: Dict[str, Any] = {"prefix": data(prefix or b""), "locks": bool(locks)}
    if start > 0:
        p["start_revision"] = start
    return p


# CRC-32C (Castagnoli), to check a backup copy.
def _crc_table() -> List[int]:
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_CRC = _crc_table()


def crc32c(b: bytes, crc: int = 0) -> int:
    c = crc ^ 0xFFFFFFFF
    t = _CRC
    for x in b:
        c = t[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
