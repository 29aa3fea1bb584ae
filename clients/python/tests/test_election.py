"""fencekv.election (wire/PROTOCOL.md §12) against a real `fencekv serve`."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

import pytest

import fencekv
from conftest import Server, wait_for
from fencekv import election


def in_thread(fn: Any, *args: Any, **kw: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {"done": threading.Event()}

    def run() -> None:
        try:
            out["result"] = fn(*args, **kw)
        except BaseException as e:  # noqa: BLE001
            out["error"] = e
        out["done"].set()

    threading.Thread(target=run, daemon=True).start()
    return out


def waiters(c: fencekv.Client, name: str, n: int) -> None:
    wait_for(lambda: c.lock_info(name).waiters == n, what=f"{n} queued on {name}")


def test_C16_campaign_waits_for_resign(server: Server) -> None:
    with fencekv.Client(server.addr, timeout=5) as ca, fencekv.Client(server.addr, timeout=5) as cb:
        assert election.leader(ca, "e") == election.Leader("e", False, "", 0, 0.0)
        a = election.campaign(ca, "e", "a", ttl=10)
        assert a.value == "a" and a.epoch > 0
        got = election.leader(cb, "e")
        assert (got.held, got.value, got.epoch) == (True, "a", a.epoch)
        b = in_thread(election.campaign, cb, "e", "b", ttl=10)
        waiters(ca, "e", 1)
        assert not b["done"].is_set()
        a.resign()
        assert b["done"].wait(10) and "error" not in b, b
        bl = b["result"]
        assert bl.epoch > a.epoch and bl.value == "b"
        assert election.leader(ca, "e")[1:3] == (True, "b")
        a.resign()  # again: nothing
        # The deposed epoch's fenced write is refused, the leader's accepted.
        with pytest.raises(fencekv.NotHolder):
            ca.put("e/out", b"a", token=a.epoch, lock="e")
        cb.put("e/out", b"b", lease=bl.lease)
        with bl:
            pass
        assert not election.leader(ca, "e").held


def test_C16_lost_leadership(server: Server) -> None:
    with fencekv.Client(server.addr, timeout=5) as c:
        a = election.campaign(c, "e", "a", ttl=1)
        c.release("e", a.epoch)  # taken away behind its back
        wait_for(a.lost.is_set, what="the loss to be noticed")
        with pytest.raises(fencekv.LeaseLost):
            a.check()
        b = election.campaign(c, "e", "b", ttl=10)
        assert b.epoch > a.epoch
        with pytest.raises(fencekv.LeaseLost):
            c.put("e/out", b"a", lease=a.lease)
        c.put("e/out2", b"b", token=b.epoch)
        with pytest.raises(fencekv.StaleToken):
            c.put("e/out2", b"a", token=a.epoch)
        a.resign()
        assert election.leader(c, "e").value == "b"
        b.resign()


def test_C16_paused_leader_deposed(make_server: Any) -> None:
    """The leader can renew no more (its client is closed, as if its
    process had stopped): its leadership is lost on its own clock, b leads
    after the TTL with a higher epoch, and a's epoch is refused."""
    s = make_server()
    with fencekv.Client(s.addr, timeout=5) as ca, fencekv.Client(s.addr, timeout=5) as cb:
        a = election.campaign(ca, "e", "a", ttl=0.6)
        b = in_thread(election.campaign, cb, "e", "b", ttl=0.6)
        waiters(cb, "e", 1)
        ca.close()  # a can renew no more: its lease runs out on the server
        wait_for(a.lost.is_set, what="a to notice")
        assert b["done"].wait(10) and "error" not in b, b
        assert b["result"].epoch > a.epoch
        with pytest.raises(fencekv.NotHolder):
            cb.put("e/out", b"a", token=a.epoch, lock="e")
        b["result"].resign()


def test_C16_observe(server: Server) -> None:
    with fencekv.Client(server.addr, timeout=5) as c:
        a = election.campaign(c, "e", "a", ttl=10)
        seen: List[election.Leader] = []
        obs = election.observe(c, "e")
        got = threading.Event()

        def run() -> None:
            for s in obs:
                seen.append(s)
                got.set()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        wait_for(lambda: len(seen) >= 1, what="the first state")
        assert (seen[0].held, seen[0].value, seen[0].epoch) == (True, "a", a.epoch)
        x = c.acquire("ex", 10)  # shares the prefix: not reported
        c.release("ex", x.token)
        c.put("e", b"key noise")
        b = in_thread(election.campaign, c, "e", "b", ttl=10)
        waiters(c, "e", 1)
        a.resign()
        assert b["done"].wait(10)
        bl = b["result"]
        wait_for(lambda: len(seen) >= 2, what="b's leadership")
        assert (seen[1].held, seen[1].value, seen[1].epoch) == (True, "b", bl.epoch)
        bl.resign()
        wait_for(lambda: len(seen) >= 3, what="no leader")
        assert not seen[2].held
        last = None
        for i in range(15):
            last = election.campaign(c, "e", f"c{i}", ttl=10)
            if i < 14:
                last.resign()
        assert last is not None
        wait_for(lambda: seen[-1].epoch == last.epoch, what="the final leader")
        assert seen[-1].value == "c14"
        held = [s.epoch for s in seen if s.held]
        assert held == sorted(set(held)), held
        obs.close()
        t.join(10)
        assert not t.is_alive()
        last.resign()


def test_C16_timeout_leaves_nothing(server: Server) -> None:
    with fencekv.Client(server.addr, timeout=5) as ca, fencekv.Client(server.addr, timeout=5) as cb:
        a = election.campaign(ca, "e", "a", ttl=10)
        with pytest.raises(fencekv.Timeout):
            election.campaign(cb, "e", "b", ttl=10, timeout=0.3)
        a.resign()
        wait_for(lambda: not ca.lock_info("e").held and ca.lock_info("e").waiters == 0,
                 what="no lease left")


@pytest.mark.parametrize("name,value,ttl,margin,err", [
    ("", "v", 1, None, fencekv.BadRequest),
    ("e", "", 1, None, fencekv.BadRequest),
    ("e", "v" * 4097, 1, None, fencekv.TooLarge),
    ("e", "v", 0, None, fencekv.BadRequest),
    ("e", "v", 1, 1, fencekv.BadRequest),
    ("e", "v", 0.01, 0, fencekv.BadRequest),  # under the server's minimum TTL
])
def test_C16_bad_input(client: fencekv.Client, name: str, value: str, ttl: float, margin: Any,
                   err: type) -> None:
    with pytest.raises(err):
        election.campaign(client, name, value, ttl=ttl, margin=margin)
    if name:
        assert not client.lock_info(name[:4096]).held


def test_bad_names(client: fencekv.Client) -> None:
    with pytest.raises(fencekv.BadRequest):
        election.leader(client, "")
    with pytest.raises(fencekv.BadRequest):
        election.observe(client, "")


def test_C16_fifo_hand_over_rising_epochs(server: Server) -> None:
    """A leads; B then C campaign. A resigns: B leads (queued first), not C,
    above A's epoch; B resigns: C leads above B. Once C wrote with its
    epoch, B's plain fenced write is stale."""
    with fencekv.Client(server.addr, timeout=5) as ca, fencekv.Client(server.addr, timeout=5) as cb, \
            fencekv.Client(server.addr, timeout=5) as cc:
        a = election.campaign(ca, "e", "a", ttl=10)
        b = in_thread(election.campaign, cb, "e", "b", ttl=10)
        waiters(ca, "e", 1)
        c = in_thread(election.campaign, cc, "e", "c", ttl=10)
        waiters(ca, "e", 2)
        assert not b["done"].is_set() and not c["done"].is_set()
        a.resign()
        assert b["done"].wait(10) and "error" not in b, b
        bl = b["result"]
        assert bl.value == "b" and bl.epoch > a.epoch
        assert ca.lock_info("e").waiters == 1
        assert not c["done"].is_set()
        got = election.leader(ca, "e")
        assert (got.held, got.value, got.epoch) == (True, "b", bl.epoch)
        with pytest.raises(fencekv.NotHolder):
            ca.put("e/out", b"a", token=a.epoch, lock="e")
        cb.put("e/out", b"b", lease=bl.lease)
        bl.resign()
        assert c["done"].wait(10) and "error" not in c, c
        cl = c["result"]
        assert cl.value == "c" and cl.epoch > bl.epoch
        got = election.leader(ca, "e")
        assert (got.held, got.value, got.epoch) == (True, "c", cl.epoch)
        cc.put("e/fenced", b"c", token=cl.epoch)
        with pytest.raises(fencekv.StaleToken):
            cb.put("e/fenced", b"b", token=bl.epoch)
        assert ca.get("e/fenced").value == b"c"
        cl.resign()
        assert not election.leader(ca, "e").held


def test_C16_lost_acquire_answer_looked_up(server: Server) -> None:
    """The grant's answer is lost (the proxy drops it and cuts the
    connection): the campaign looks the lock up, finds it held under its
    value, releases it and goes on to a new, higher grant, well within the
    TTL (the lost grant is not waited out)."""
    from helpers import CutProxy
    p = CutProxy(server.addr)
    first: Dict[str, Any] = {}
    try:
        with fencekv.Client(p.addr, timeout=2) as cb, fencekv.Client(server.addr, timeout=5) as c:
            cb.ping()
            p.on_drop = lambda: first.setdefault("info", c.lock_info("e"))
            p.drop_answer_after(b"acquire")
            start = time.monotonic()
            bl = election.campaign(cb, "e", "b", ttl=30, timeout=15)
            took = time.monotonic() - start
            assert p.dropped.is_set(), "no answer was dropped"
            info = first["info"]
            assert info.held and info.holder == "b", info
            assert bl.epoch > info.token, (bl.epoch, info.token)
            assert took < 15, f"took {took:.1f}s: the lost grant was waited out"
            now = c.lock_info("e")
            assert (now.held, now.holder, now.token) == (True, "b", bl.epoch)
            with pytest.raises(fencekv.NotHolder):
                c.put("e/out", b"x", token=info.token, lock="e")
            c.put("e/out", b"b", token=bl.epoch, lock="e")
            bl.resign()
            assert not c.lock_info("e").held
    finally:
        p.close()


def test_C16_server_killed_during_campaign(make_server: Any) -> None:
    """kill -9 and restart (same data, same port) while B's campaign is
    queued: A keeps its lease (renewed on the new process), B queues again
    and leads after A resigns, with a higher epoch."""
    s = make_server()
    with fencekv.Client(s.addr, timeout=2) as ca, fencekv.Client(s.addr, timeout=2) as cb:
        a = election.campaign(ca, "e", "a", ttl=5)
        b = in_thread(election.campaign, cb, "e", "b", ttl=5)
        waiters(ca, "e", 1)
        s.kill9()
        s.start()
        waiters(ca, "e", 1)
        assert not b["done"].is_set(), b
        assert not a.lost.is_set(), "a's lease was lost across the restart"
        got = election.leader(ca, "e")
        assert (got.held, got.value, got.epoch) == (True, "a", a.epoch)
        a.resign()
        assert b["done"].wait(15) and "error" not in b, b
        bl = b["result"]
        assert bl.epoch > a.epoch
        assert election.leader(ca, "e").value == "b"
        bl.resign()
        assert not election.leader(ca, "e").held


def test_C16_observe_across_restart(make_server: Any) -> None:
    """observe goes on across a kill -9 and restart: the states after it
    are seen, no repeats, held epochs only rising."""
    s = make_server()
    with fencekv.Client(s.addr, timeout=2) as c, fencekv.Client(s.addr, timeout=2) as ob:
        seen: List[election.Leader] = []
        obs = election.observe(ob, "e")

        def run() -> None:
            for st in obs:
                seen.append(st)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        wait_for(lambda: len(seen) >= 1, what="the first state")
        assert not seen[0].held
        a = election.campaign(c, "e", "a", ttl=10)
        wait_for(lambda: len(seen) >= 2, what="a's leadership")
        a.resign()
        wait_for(lambda: len(seen) >= 3, what="no leader")
        assert [(x.held, x.value) for x in seen[:3]] == [(False, ""), (True, "a"), (False, "")]
        assert seen[1].epoch == a.epoch
        s.kill9()
        s.start()
        r = election.campaign(c, "e", "r", ttl=10)
        wait_for(lambda: seen[-1].held and seen[-1].epoch == r.epoch, timeout=20,
                 what="r's leadership after the restart")
        assert seen[-1].value == "r"
        r.resign()
        wait_for(lambda: not seen[-1].held, what="no leader after r")
        top = 0
        for i, st in enumerate(seen):
            if i:
                assert (st.held, st.value, st.epoch) != (seen[i - 1].held, seen[i - 1].value,
                                                         seen[i - 1].epoch), seen
            if st.held:
                assert st.epoch > top, seen
                top = st.epoch
        obs.close()
        t.join(10)
        assert not t.is_alive()
