"""fencekv.election (wire/PROTOCOL.md §12) against a real `fencekv serve`."""

from __future__ import annotations

import threading
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
