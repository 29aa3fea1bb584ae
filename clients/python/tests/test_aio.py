"""fencekv.aio against a real server: the same scenarios, awaited."""

from __future__ import annotations

import asyncio
import time
from typing import Any, List

import pytest

import fencekv
import fencekv.aio
from conftest import Server
from helpers import CutProxy


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


async def until(cond: Any, timeout: float = 10.0, what: str = "condition") -> Any:
    end = time.monotonic() + timeout
    while True:
        v = await cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def test_aio_methods_and_refusals(server: Server) -> None:
    async def main() -> None:
        async with fencekv.aio.Client(server.addr) as c:
            assert await c.ping() == "0.1.0"
            # Pipelined: many calls in flight on one connection.
            rs = await asyncio.gather(*(c.put(f"a/{i:03d}", str(i)) for i in range(200)))
            assert len({r.revision for r in rs}) == 200
            es = await asyncio.gather(*(c.get(f"a/{i:03d}") for i in range(200)))
            assert [e.value for e in es] == [str(i).encode() for i in range(200)]
            assert c.connects == 1
            keys = [e.key async for e in c.scan("a/", page_size=30)]
            assert keys == [f"a/{i:03d}".encode() for i in range(200)]
            await c.put("a/k", b"x", token=9)
            with pytest.raises(fencekv.StaleToken) as ei:
                await c.put("a/k", b"y", token=8)
            assert ei.value.fence == 9
            g = await c.acquire("L", ttl=5, holder="h")
            with pytest.raises(fencekv.LockHeld) as lh:
                await c.acquire("L", ttl=5)
            assert lh.value.token == g.token and lh.value.retry_after > 0
            with pytest.raises(fencekv.BadRequest):
                await c.put("", b"v")
            with pytest.raises(fencekv.UnknownMethod):
                await c.call("nope")
            assert (await c.incr("n", 3)).value == 3
            t = await c.txn([("put", "t", b"1"), ("incr", "n", 1)])
            assert t.results[1].value == 4
            assert [i.lock async for i in c.locks()] == ["L"]
            assert (await c.status()).last_token == g.token
    run(main())


def test_aio_lock_renews_and_releases(server: Server) -> None:
    async def main() -> None:
        async with fencekv.aio.Client(server.addr) as c:
            async with c.lock("L", ttl=0.5) as lease:
                t0 = time.monotonic()
                while time.monotonic() - t0 < 1.2:  # well past the TTL: renewed
                    lease.check()
                    await c.put("k", b"v", lease=lease)
                    await asyncio.sleep(0.1)
                info = await c.lock_info("L")
                assert info.held and info.token == lease.token and info.holder == lease.holder
            assert not (await c.lock_info("L")).held
    run(main())


def test_aio_C07_loss_before_expiry(server: Server) -> None:
    async def main() -> None:
        ttl = 1.5
        async with fencekv.aio.Client(server.addr, timeout=2) as c:
            lease = c.lock("L", ttl=ttl)
            sent_before = time.monotonic()
            with pytest.raises(fencekv.LeaseLost):
                async with lease:
                    server.sigstop()
                    try:
                        await asyncio.wait_for(lease.lost.wait(), ttl + 1)
                        assert time.monotonic() < sent_before + ttl
                        with pytest.raises(fencekv.LeaseLost):
                            lease.check()
                    finally:
                        server.sigcont()
            await until(lambda: _not_held(c, "L"), what="release")
    run(main())


async def _not_held(c: fencekv.aio.Client, name: str) -> bool:
    return not (await c.lock_info(name)).held


def test_aio_C13_reconnect_after_restart(server: Server) -> None:
    async def main() -> None:
        async with fencekv.aio.Client(server.addr, timeout=5) as c:
            await c.put("k", b"1")
            server.kill9()
            server.start()
            assert (await c.get("k")).value == b"1"
            await c.put("k", b"2")  # never sent on the dead connection
            assert c.connects == 2
    run(main())


def test_aio_C05_lost_grant_found(server: Server) -> None:
    proxy = CutProxy(server.addr)

    async def main() -> None:
        async with fencekv.aio.Client(proxy.addr, timeout=5) as c:
            proxy.drop_answer_after(b"acquire")
            async with c.lock("L", ttl=5) as lease:
                assert lease.found
                info = await c.lock_info("L")
                assert info.token == lease.token and info.holder == lease.holder
                assert (await c.status()).last_token == lease.token

    try:
        run(main())
    finally:
        proxy.close()


def test_aio_C09_watch_resumes(server: Server) -> None:
    async def main() -> None:
        async with fencekv.aio.Client(server.addr) as c:
            r = await c.put("w/0", b"0")
            got: List[fencekv.Event] = []
            async with c.watch("w/", start_revision=r.revision, locks=True) as w:
                async def consume() -> None:
                    async for ev in w:
                        got.append(ev)
                task = asyncio.ensure_future(consume())
                await until(lambda: _len_at_least(got, 1), what="the replay")
                server.kill9()
                server.start()
                for i in range(1, 4):
                    await c.put(f"w/{i}", str(i))
                g = await c.acquire("w/lock", ttl=1)
                await until(lambda: _len_at_least(got, 5), what="events after the restart")
                task.cancel()
            assert [e.key for e in got[:4]] == [f"w/{i}".encode() for i in range(4)]
            assert got[4].type == "acquired" and got[4].token == g.token
            # The history is durable: the restarted server replays from
            # the first revision on.
            async with c.watch("w/", start_revision=1) as w2:
                async for ev in w2:
                    assert ev.revision == 1 and ev.key == b"w/0"
                    break
    run(main())


async def _len_at_least(xs: List[Any], n: int) -> bool:
    return len(xs) >= n
