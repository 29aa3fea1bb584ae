"""C15 Semaphores (clients/CONFORMANCE.md): acquire with a limit, permits
with tokens of their own, FIFO waiters, held writes by a permit's token,
lock_info's limit and holders, limit_mismatch and bad limits, the lock
helper holding a permit, and a lost permit found by its holder name."""

from __future__ import annotations

import time

import pytest

import fencekv
from conftest import Server, wait_for
from helpers import CutProxy
from test_conformance import in_thread


def test_C15_semaphore_permits_fifo(server: Server) -> None:
    """Limit 3: three holders with distinct rising tokens; a fourth waits
    and gets the first permit released; lock_info lists the holders."""
    with fencekv.Client(server.addr) as c, fencekv.Client(server.addr) as d:
        gs = [c.acquire("C15", ttl=10, holder=f"h{i}", limit=3) for i in range(3)]
        tokens = [g.token for g in gs]
        assert tokens == sorted(tokens) and len(set(tokens)) == 3, tokens
        info = c.lock_info("C15")
        assert info.held and info.limit == 3
        assert [(h.holder, h.token) for h in info.holders] == [
            ("h0", tokens[0]), ("h1", tokens[1]), ("h2", tokens[2])]
        assert all(0 < h.ttl <= 10 for h in info.holders)
        assert info.holder == "h2" and info.token == tokens[2]  # the newest permit
        with pytest.raises(fencekv.LockHeld) as ei:
            d.acquire("C15", ttl=10, holder="h3", limit=3)  # no wait: refused at once
        assert ei.value.token == tokens[0] and ei.value.holder == "h0"  # runs out first
        fourth = in_thread(d.acquire, "C15", ttl=10, wait=10, holder="h3", limit=3)
        wait_for(lambda: c.lock_info("C15").waiters == 1, what="the fourth queued")
        assert not fourth["done"].is_set()
        c.release("C15", tokens[0])
        assert fourth["done"].wait(10), "the fourth got no permit after a release"
        g4 = fourth["result"]
        assert g4.token > tokens[2]
        info = c.lock_info("C15")
        assert info.waiters == 0
        assert [(h.holder, h.token) for h in info.holders] == [
            ("h1", tokens[1]), ("h2", tokens[2]), ("h3", g4.token)]
        listed = [i for i in c.locks("C15") if i.lock == "C15"]
        assert len(listed) == 1 and listed[0].limit == 3
        assert [h.token for h in listed[0].holders] == [tokens[1], tokens[2], g4.token]
        for t in (tokens[1], tokens[2], g4.token):
            c.release("C15", t)
        info = c.lock_info("C15")
        assert not info.held and info.holders == ()


def test_C15_held_write_by_permit_token(client: fencekv.Client) -> None:
    """A held write with a permit's token is accepted while it holds the
    permit, refused not_holder after its release; the key is unchanged."""
    a = client.acquire("C15w", ttl=10, limit=2)
    b = client.acquire("C15w", ttl=10, limit=2)
    client.put("C15w/k", b"a", token=a.token, lock="C15w")
    client.put("C15w/k", b"b", token=b.token, lock="C15w")
    client.release("C15w", b.token)
    with pytest.raises(fencekv.NotHolder) as ei:
        client.put("C15w/k", b"late", token=b.token, lock="C15w")
    assert ei.value.token == 0
    e = client.get("C15w/k")
    assert e.value == b"b" and e.fence == b.token
    with pytest.raises((fencekv.NotHolder, fencekv.LeaseExpired)):
        client.renew("C15w", b.token)
    assert client.renew("C15w", a.token) == 10
    client.release("C15w", a.token)


def test_C15_limit_mismatch_and_bad_limits(client: fencekv.Client) -> None:
    """Another limit, a plain acquire of a semaphore, a semaphore acquire
    of a held plain lock: LimitMismatch; limit 0, negative, over 256:
    BadRequest; each changes nothing."""
    g = client.acquire("C15m", ttl=10, holder="a", limit=3)
    before = (client.lock_info("C15m"), client.status().last_token)

    def unchanged() -> None:
        info = client.lock_info("C15m")
        assert (info.limit, info.waiters) == (3, 0)
        assert [(h.holder, h.token) for h in info.holders] == [("a", g.token)]
        assert client.status().last_token == before[1]

    for limit in (2, 4, 256, None):
        with pytest.raises(fencekv.LimitMismatch) as ei:
            client.acquire("C15m", ttl=10, wait=1, holder="b", limit=limit)
        assert ei.value.code == "limit_mismatch" and isinstance(ei.value, fencekv.Error)
        unchanged()
    for limit in (0, -1, 257, 1 << 40):
        with pytest.raises(fencekv.BadRequest):
            client.acquire("C15m", ttl=10, holder="b", limit=limit)
        unchanged()
    with pytest.raises(fencekv.BadRequest):  # a lock-delay on a semaphore
        client.acquire("C15m", ttl=10, limit=3, lock_delay=1)
    unchanged()
    with pytest.raises(TypeError):
        client.acquire("C15m", ttl=10, limit="3")  # type: ignore[arg-type]
    client.release("C15m", g.token)
    # A held plain lock refuses a semaphore acquire; once free, any limit.
    p = client.acquire("C15m", ttl=10)
    with pytest.raises(fencekv.LimitMismatch):
        client.acquire("C15m", ttl=10, limit=3)
    info = client.lock_info("C15m")
    assert info.limit == 1 and [h.token for h in info.holders] == [p.token]
    client.release("C15m", p.token)
    assert client.acquire("C15m", ttl=10, limit=5).token > p.token
    assert client.lock_info("C15m").limit == 5


def test_C15_lock_helper_holds_a_permit(server: Server) -> None:
    """client.lock(..., limit=3): three helpers hold permits at once and keep
    them past their TTL by renewing; a fourth waits for the first to leave."""
    ttl = 1.0
    with fencekv.Client(server.addr) as c, fencekv.Client(server.addr) as d:
        leases = [c.lock("C15l", ttl=ttl, limit=3).acquire() for _ in range(3)]
        start = time.monotonic()
        fourth = in_thread(lambda: d.lock("C15l", ttl=ttl, wait=10, limit=3).acquire())
        wait_for(lambda: c.lock_info("C15l").waiters == 1, what="the fourth queued")
        # Past 2 TTLs the three permits are still theirs: they were renewed.
        wait_for(lambda: time.monotonic() > start + 2 * ttl, what="two TTLs")
        info = c.lock_info("C15l")
        assert sorted(h.token for h in info.holders) == sorted(l.token for l in leases)
        assert {h.holder for h in info.holders} == {l.holder for l in leases}
        for l in leases:
            l.check()
            c.put(f"C15l/{l.token}", b"v", lease=l)
        assert not fourth["done"].is_set()
        assert leases[0].release() is None
        assert fourth["done"].wait(10), "the fourth helper got no permit"
        f = fourth["result"]
        assert f.token > max(l.token for l in leases)
        d.put("C15l/f", b"v", lease=f)
        for l in leases[1:] + [f]:
            assert l.release() is None
        assert not c.lock_info("C15l").held


def test_C15_lost_permit_found(server: Server) -> None:
    """A permit whose acquire answer was lost is found among the holders by
    its holder name, also when a newer permit (another holder's) is the
    lock's newest; no second permit is taken."""
    proxy = CutProxy(server.addr)
    try:
        with fencekv.Client(proxy.addr, timeout=5) as c, fencekv.Client(server.addr) as direct:
            first = direct.acquire("C15f", ttl=10, holder="other-1", limit=3)
            later = {}
            # Before the lost answer's connection is cut, another holder
            # takes a newer permit: ours is not the newest one.
            proxy.on_drop = lambda: later.setdefault(
                "g", direct.acquire("C15f", ttl=10, holder="other-2", limit=3))
            proxy.drop_answer_after(b"acquire")
            with c.lock("C15f", ttl=5, limit=3) as lease:
                assert proxy.dropped.is_set(), "the acquire's answer was not dropped"
                assert lease.found, "the permit was not found by its holder name"
                info = direct.lock_info("C15f")
                assert info.holder == "other-2" and info.token == later["g"].token
                assert [(h.holder, h.token) for h in info.holders] == [
                    ("other-1", first.token), (lease.holder, lease.token),
                    ("other-2", later["g"].token)]
                assert direct.status().last_token == later["g"].token == lease.token + 1
                c.put("C15f/k", b"v", lease=lease)
            assert [h.token for h in direct.lock_info("C15f").holders] == [
                first.token, later["g"].token]
    finally:
        proxy.close()


def test_C15_aio_semaphore(server: Server) -> None:
    """fencekv.aio: acquire with a limit, the lock helper holding a permit,
    LimitMismatch, and lock_info's holders."""
    import asyncio

    import fencekv.aio

    async def main() -> None:
        async with fencekv.aio.Client(server.addr) as c:
            g = await c.acquire("C15a", ttl=10, holder="x", limit=2)
            async with c.lock("C15a", ttl=5, limit=2) as lease:
                assert lease.token > g.token
                await c.put("C15a/k", b"v", lease=lease)
                info = await c.lock_info("C15a")
                assert info.limit == 2
                assert [(h.holder, h.token) for h in info.holders] == [
                    ("x", g.token), (lease.holder, lease.token)]
                with pytest.raises(fencekv.LockHeld):
                    await c.acquire("C15a", ttl=10, limit=2)
                with pytest.raises(fencekv.LimitMismatch):
                    await c.acquire("C15a", ttl=10, limit=3)
            info = await c.lock_info("C15a")
            assert [h.token for h in info.holders] == [g.token]
            await c.release("C15a", g.token)

    asyncio.run(asyncio.wait_for(main(), 60))
