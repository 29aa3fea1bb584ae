"""The client conformance scenarios of clients/CONFORMANCE.md, C01-C14,
against real `fencekv serve` processes."""

from __future__ import annotations

import os
import ssl
import threading
import time
from typing import Any, Dict, List

import pytest

import fencekv
from conftest import Server, wait_for
from helpers import Cluster, CutProxy, SilentListener, tls_auth_server


def in_thread(fn: Any, *args: Any, **kw: Any) -> Dict[str, Any]:
    """Run fn in a thread; the dict gets "result" or "error", and "done"."""
    out: Dict[str, Any] = {"done": threading.Event()}

    def run() -> None:
        try:
            out["result"] = fn(*args, **kw)
        except BaseException as e:  # noqa: BLE001
            out["error"] = e
        out["done"].set()

    threading.Thread(target=run, daemon=True).start()
    return out


def test_C01_seed(server: Server) -> None:
    """A holds L (t), is paused past its TTL; B, waiting, gets t' > t and
    writes k; A's write with t is refused stale_token with fence t'."""
    with fencekv.Client(server.addr) as a, fencekv.Client(server.addr) as b:
        ga = a.acquire("C01", ttl=0.3, holder="A")
        wait_b = in_thread(b.acquire, "C01", ttl=5, wait=5, holder="B")
        wait_for(lambda: a.lock_info("C01").waiters == 1, what="B queued")
        # A is paused: it renews nothing, and its lease runs out.
        assert wait_b["done"].wait(5), "B was not granted after A's lease ran out"
        gb = wait_b["result"]
        assert gb.token > ga.token
        b.put("C01/k", b"B", token=gb.token)
        with pytest.raises(fencekv.StaleToken) as ei:
            a.put("C01/k", b"A", token=ga.token)
        assert ei.value.fence == gb.token
        assert a.get("C01/k").value == b"B"


def test_C02_held_write_after_expiry(client: fencekv.Client) -> None:
    g = client.acquire("C02", ttl=0.2)
    client.put("C02/k", b"v1", token=g.token, lock="C02")
    wait_for(lambda: (lambda i: not i.held or i.ttl == 0)(client.lock_info("C02")),
             what="the lease to run out")
    with pytest.raises((fencekv.LeaseExpired, fencekv.NotHolder)) as ei:
        client.put("C02/k", b"v2", token=g.token, lock="C02")
    if isinstance(ei.value, fencekv.LeaseExpired):
        assert ei.value.token == g.token
    e = client.get("C02/k")
    assert e.value == b"v1" and e.fence == g.token


def test_C03_fence_survives_delete(client: fencekv.Client) -> None:
    client.put("C03/k", b"x", token=5)
    d = client.delete("C03/k", token=5)
    assert d.deleted and d.fence == 5
    with pytest.raises(fencekv.StaleToken) as ei:
        client.put("C03/k", b"y", token=4)
    assert ei.value.fence == 5
    e = client.get("C03/k")
    assert not e.found and e.fence == 5 and e.value is None


def test_C04_fifo_queued_acquires(server: Server) -> None:
    with fencekv.Client(server.addr) as a, fencekv.Client(server.addr) as b, \
            fencekv.Client(server.addr) as c:
        ga = a.acquire("C04", ttl=10, holder="A")
        wb = in_thread(b.acquire, "C04", ttl=10, wait=10, holder="B")
        wait_for(lambda: a.lock_info("C04").waiters == 1, what="B queued")
        wc = in_thread(c.acquire, "C04", ttl=10, wait=10, holder="C")
        wait_for(lambda: a.lock_info("C04").waiters == 2, what="C queued")
        a.release("C04", ga.token)
        assert wb["done"].wait(5)
        gb = wb["result"]
        info = a.lock_info("C04")
        assert info.holder == "B" and info.token == gb.token and info.waiters == 1
        assert not wc["done"].is_set()
        b.release("C04", gb.token)
        assert wc["done"].wait(5)
        gc = wc["result"]
        assert gb.token > ga.token and gc.token > gb.token


def test_C05_lost_grant_found(server: Server) -> None:
    proxy = CutProxy(server.addr)
    try:
        with fencekv.Client(proxy.addr, timeout=5) as c, fencekv.Client(server.addr) as direct:
            before = direct.status().last_token
            proxy.drop_answer_after(b"acquire")
            with c.lock("C05", ttl=5) as lease:
                assert proxy.dropped.is_set(), "the acquire's answer was not dropped"
                assert lease.found, "the grant was not found by its holder name"
                info = direct.lock_info("C05")
                assert info.held and info.holder == lease.holder and info.token == lease.token
                assert direct.status().last_token == before + 1 == lease.token  # one grant only
                c.put("C05/k", b"v", lease=lease)
            assert not direct.lock_info("C05").held
    finally:
        proxy.close()


def test_C06_lease_kept_through_restart(server: Server) -> None:
    with fencekv.Client(server.addr, timeout=2) as c:
        with c.lock("C06", ttl=4) as lease:
            token = lease.token
            server.kill9()
            restarted = time.monotonic()
            server.start()
            # A renew sent after the restart succeeded: the deadline moved on.
            wait_for(lambda: lease.deadline - (lease.ttl - lease.margin) > restarted,
                     timeout=lease.ttl, what="a renew on the new process")
            assert not lease.lost.is_set()
            lease.check()
            assert lease.token == token
            info = c.lock_info("C06")
            assert info.held and info.token == token and info.holder == lease.holder
            c.put("C06/k", b"v", lease=lease)


def test_C07_loss_signalled_before_expiry(server: Server) -> None:
    ttl = 1.5
    with fencekv.Client(server.addr, timeout=2) as c:
        lease = c.lock("C07", ttl=ttl)
        sent_before = time.monotonic()  # the acquire is sent after this
        with pytest.raises(fencekv.LeaseLost):
            with lease:
                server.sigstop()  # before the first renew (a third of the TTL)
                try:
                    assert lease.lost.wait(ttl + 1), "loss never signalled"
                    at = time.monotonic()
                    # The server cannot expire the lease before the grant
                    # time + TTL, and the grant came after sent_before.
                    assert at < sent_before + ttl, f"signalled {at - sent_before:.3f}s after send"
                    assert at >= sent_before + ttl - lease.margin - 0.05
                    with pytest.raises(fencekv.LeaseLost):
                        lease.check()
                    with pytest.raises(fencekv.LeaseLost):
                        c.put("C07/k", b"v", lease=lease)  # not even sent
                finally:
                    server.sigcont()
        # Released on exit: the server (resumed) may still have held it.
        wait_for(lambda: not c.lock_info("C07").held, what="the lock to be free")
        assert not c.get("C07/k").found


def test_C08_leader_kill_under_held_writes(fencekv_bin: str) -> None:
    cluster = Cluster(fencekv_bin).start()
    try:
        leader = cluster.leader()
        addrs = [leader.addr] + [a for a in cluster.addrs if a != leader.addr]
        acked: List[tuple] = []  # (key, value, token)
        unknown: List[str] = []
        tokens: List[int] = []
        killed_at = None
        with fencekv.Client(addrs, timeout=10) as c:
            i = 0
            until = time.monotonic() + 60
            while time.monotonic() < until and (killed_at is None or len(acked) < killed_at + 15):
                try:
                    with c.lock("C08", ttl=8, wait=10) as lease:
                        assert not tokens or lease.token > tokens[-1], "tokens must only rise"
                        tokens.append(lease.token)
                        while time.monotonic() < until and (killed_at is None
                                                            or len(acked) < killed_at + 15):
                            i += 1
                            key, value = f"C08/{i:04d}", f"{i}:{lease.token}".encode()
                            try:
                                c.put(key, value, lease=lease)
                                acked.append((key, value, lease.token))
                            except fencekv.Unavailable as e:
                                if e.outcome_unknown:
                                    unknown.append(key)  # reported as such, not retried
                            if len(acked) == 10 and killed_at is None:
                                # Killed while the loop goes on: a write may be in flight.
                                threading.Thread(target=leader.kill9, daemon=True).start()
                                killed_at = len(acked)
                except fencekv.LeaseLost:
                    continue  # acquire again: the new token must be higher
                except fencekv.Unavailable:
                    continue
        print(f"C08: {len(acked)} acknowledged, {len(unknown)} unknown, leases {tokens}")
        assert killed_at is not None and len(acked) >= killed_at + 15, \
            f"only {len(acked)} acknowledged writes ({len(unknown)} unknown)"
        survivors = [a for a in cluster.addrs if a != leader.addr]
        with fencekv.Client(survivors, timeout=10) as c:
            for key, value, token in acked:
                t0 = time.monotonic()
                try:
                    e = c.get(key)
                except fencekv.Error as err:
                    # Evidence for the next time this fails (it timed out
                    # once, under load, and has not been reproduced since):
                    # how long, on which node, and what each survivor says.
                    raise AssertionError(
                        f"get {key} via {c.addr} failed after {time.monotonic() - t0:.2f}s: "
                        f"{err!r}; survivors: {cluster.describe(survivors)}") from err
                assert e.found and e.value == value, f"acknowledged write {key} lost"
                assert e.fence == token
        # Tokens rose with every write: each write's token >= the one before.
        ws = [t for _, _, t in acked]
        assert ws == sorted(ws)
    finally:
        cluster.stop()


def test_C09_watch_resumed(server: Server) -> None:
    with fencekv.Client(server.addr, timeout=5) as c:
        for i in range(5):
            r = c.put(f"C09/{i}", str(i).encode())
        start = r.revision - 2
        got: List[fencekv.Event] = []
        with c.watch("C09/", start_revision=start) as w:
            def consume() -> None:
                for ev in w:
                    got.append(ev)
            t = threading.Thread(target=consume, daemon=True)
            t.start()
            wait_for(lambda: len(got) == 3, what="the replay")
            c.txn([("put", "C09/t1", b"a"), ("put", "C09/t2", b"b")])
            wait_for(lambda: len(got) == 5, what="the txn's events")
            server.kill9()
            server.start()
            for i in range(5, 10):
                c.put(f"C09/{i}", str(i).encode())
            wait_for(lambda: len(got) == 10, what="events after the restart")
            assert w.reconnects >= 1
        revs = [e.revision for e in got]
        assert revs == sorted(revs) and revs[0] == start
        keys = [e.key for e in got]
        assert len(set(keys)) == len(keys), f"a repeat: {keys}"
        assert keys[:3] == [b"C09/2", b"C09/3", b"C09/4"]
        assert keys[-5:] == [f"C09/{i}".encode() for i in range(5, 10)]
        # The history is durable: the restarted server still replays
        # every event from the first revision on.
        replay: List[fencekv.Event] = []
        with c.watch("C09/", start_revision=1) as w2:
            for ev in w2:
                replay.append(ev)
                if len(replay) == 12:
                    break
        assert [e.revision for e in replay] == sorted(e.revision for e in replay)
        assert replay[0].revision == 1 and replay[0].key == b"C09/0"
        assert [e.key for e in replay][-5:] == keys[-5:]


def test_C09_watch_resumed_across_cuts(server: Server) -> None:
    """No gap and no repeat when the watch's connection is cut mid-stream."""
    proxy = CutProxy(server.addr)
    try:
        with fencekv.Client(server.addr) as c, fencekv.Client(proxy.addr) as pc:
            with pc.watch("w/") as w:
                n = 200
                done = threading.Event()

                def write() -> None:
                    for i in range(1, n + 1):
                        c.txn([("put", "w/k", str(i).encode()), ("put", "w/j", str(i).encode())])
                        c.put("other", b"x")
                        if i in (60, 130):
                            proxy.cut()
                    done.set()

                threading.Thread(target=write, daemon=True).start()
                seen = []
                for ev in w:
                    seen.append((ev.key, ev.value))
                    if len(seen) == 2 * n:
                        break
                want = [(k, str(i).encode()) for i in range(1, n + 1) for k in (b"w/k", b"w/j")]
                assert seen == want
                assert w.reconnects >= 1
                assert done.wait(10)
    finally:
        proxy.close()


def test_C10_tls_and_auth(make_server: Any, fencekv_bin: str, tmp_path: Any) -> None:
    server, ctx = tls_auth_server(make_server, fencekv_bin, tmp_path)
    with fencekv.Client(server.addr, ssl=ctx, user="alice", secret="s3cret") as c:
        with c.lock("a-lock", ttl=2) as lease:
            c.put("a/x", b"1", lease=lease)
        assert c.get("a/x").value == b"1"
        with pytest.raises(fencekv.PermissionDenied):
            c.put("b/x", b"1")
        with pytest.raises(fencekv.PermissionDenied):
            c.status()
        # Every connection authenticates: after a reconnect too.
        server.restart()
        assert c.get("a/x").value == b"1"
    with pytest.raises(fencekv.Unauthenticated):
        fencekv.Client(server.addr, ssl=ctx, user="alice", secret="wrong")
    with fencekv.Client(server.addr, ssl=ctx) as anon:
        with pytest.raises(fencekv.Unauthenticated):
            anon.get("a/x")
    with pytest.raises(fencekv.ConnectionLost) as ei:
        fencekv.Client(server.addr, connect_timeout=2)  # plain, at a TLS server
    assert "TLS" in str(ei.value)


def test_C11_refusal_codes(client: fencekv.Client) -> None:
    c = client
    c.put("C11/k", b"x", token=7)
    with pytest.raises(fencekv.StaleToken) as e1:
        c.put("C11/k", b"y", token=6)
    assert e1.value.fence == 7 and e1.value.code == "stale_token"

    g = c.acquire("C11/L", ttl=5, holder="me")
    with pytest.raises(fencekv.LockHeld) as e2:
        c.acquire("C11/L", ttl=5)
    assert e2.value.holder == "me" and e2.value.token == g.token
    assert 0 < e2.value.retry_after <= 5 and e2.value.retry_ms > 0

    with pytest.raises(fencekv.NotHolder) as e3:
        c.renew("C11/L", g.token + 100)
    assert e3.value.token == g.token

    g2 = c.acquire("C11/short", ttl=0.1)
    wait_for(lambda: c.lock_info("C11/short").ttl == 0, what="expiry")
    with pytest.raises(fencekv.LeaseExpired) as e4:
        c.renew("C11/short", g2.token)
    assert e4.value.token == g2.token

    r = c.put("C11/cas", b"1")
    with pytest.raises(fencekv.CompareFailed) as e5:
        c.cas("C11/cas", r.revision + 100, b"2")
    assert e5.value.revision == r.revision

    c.put("C11/n", b"abc")
    with pytest.raises(fencekv.NotInteger):
        c.incr("C11/n", 1)
    with pytest.raises(fencekv.TooLarge):
        c.put("k" * 5000, b"v")
    with pytest.raises(fencekv.BadRequest):
        c.acquire("C11/x", ttl=0.01)
    with pytest.raises(fencekv.UnknownMethod) as e9:
        c.call("no_such_method")
    assert e9.value.code == "unknown_method"
    for e in (e1, e2, e3, e4, e5, e9):
        assert isinstance(e.value, fencekv.Error) and e.value.message


def test_C12_bad_input(client: fencekv.Client) -> None:
    c = client
    c.put("C12/k", b"v")
    before = c.status()
    cases = [
        (fencekv.BadRequest, lambda: c.put("", b"v")),
        (fencekv.TooLarge, lambda: c.put(b"k" * 4097, b"v")),
        (fencekv.BadRequest, lambda: c.put("C12/k", b"w", strict=True)),
        (fencekv.BadRequest, lambda: c.acquire("C12/L", ttl=0.05)),
        (fencekv.BadRequest, lambda: c.acquire("C12/L", ttl=3601)),
        (fencekv.BadRequest, lambda: c.put("C12/k", b"w", lock="C12/L")),
    ]
    for cls, fn in cases:
        with pytest.raises(cls):
            fn()
    after = c.status()
    assert (after.revision, after.last_token, after.keys) == \
        (before.revision, before.last_token, before.keys)
    assert c.get("C12/k").value == b"v"


def test_C13_no_reuse_of_closed_connection(server: Server) -> None:
    with fencekv.Client(server.addr, timeout=5) as c:
        c.put("C13/k", b"1")
        first = c.connects
        server.kill9()
        server.start()
        assert c.get("C13/k").value == b"1"  # a read on a new connection
        c.put("C13/k", b"2")  # never sent on the dead one: no unknown outcome
        assert c.connects == first + 1
        server.restart()  # a graceful restart too
        c.put("C13/k", b"3")
        assert c.get("C13/k").value == b"3"


def test_C14_silent_node_passed_over(server: Server) -> None:
    silent = SilentListener()
    try:
        t = time.monotonic()
        with fencekv.Client([silent.addr, server.addr], timeout=3, connect_timeout=0.5) as c:
            assert c.put("C14/k", b"v").revision > 0
            assert time.monotonic() - t < 3
            assert c.addr == server.addr
    finally:
        silent.close()
