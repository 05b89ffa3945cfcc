"""The asyncio client against a real `latchkey serve`."""

from __future__ import annotations

import asyncio
import time

import pytest

import latchkey
import latchkey.aio


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def wait_until_async(what, cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.02) + 1):
        if await cond():
            return
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting until {what}")


def test_async_round_trip_fifo_and_timeout(server):
    async def main():
        async with latchkey.aio.Client([server.addr]) as c:
            async with c.lock("aio/x", ttl=5, wait=5) as g:
                info = await c.describe("aio/x")
                assert info.holder.token == g.token
                assert g.fencing_headers()["latchkey-token"] == str(g.token)
                with pytest.raises(latchkey.LockHeld):
                    async with c.lock("aio/x", ttl=5, wait=0):
                        pass
                with pytest.raises(latchkey.WaitTimeout):
                    async with c.lock("aio/x", ttl=5, wait=0.3):
                        pass
                # A waiter queues, and gets it with a higher token once released.
                s2 = await c.session(ttl=5)
                waiter = asyncio.ensure_future(s2.lock("aio/x", wait=10))

                async def queued():
                    return (await c.describe("aio/x")).waiters == 1

                await wait_until_async("the waiter queued", queued)
            g2 = await waiter
            assert g2.token > g.token
            await g2.release()
            await s2.close()
            assert not (await c.describe("aio/x")).held

    run(main())


def test_a_cancelled_wait_releases_the_grant_that_came_too_late(server):
    async def main():
        async with latchkey.aio.Client([server.addr]) as c:
            holder = await c.session(ttl=5)
            waiter = await c.session(ttl=5)
            g = await holder.lock("aio/late", wait=0)
            # The wait is abandoned client-side while the server still queues it...
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(waiter.lock("aio/late", wait=30), 0.5)
            assert (await c.describe("aio/late")).waiters == 1
            # ...so the grant that follows the release is one nobody wants: released.
            await g.release()

            async def free():
                info = await c.describe("aio/late")
                return not info.held and info.waiters == 0

            await wait_until_async("the unwanted grant is released", free)
            await holder.close()
            await waiter.close()

    run(main())


def test_async_lost_when_the_server_is_paused(server):
    async def main():
        async with latchkey.aio.Client([server.addr]) as c:
            s = await c.session(ttl=2)
            g = await s.lock("aio/paused", wait=0)
            called = asyncio.Event()
            g.on_lost(called.set)
            server.pause()
            try:
                paused_at = latchkey.now()
                assert await g.lost.wait(timeout=2.0)
                lost_at = latchkey.now()
                assert s.deadline <= lost_at < s.deadline + 0.25
                assert lost_at - paused_at < 2.0 - s.safety_margin + 0.25
                assert called.is_set()
                with pytest.raises(latchkey.LockLost):
                    await asyncio.wait_for(g.release(), 0.5)
            finally:
                server.resume()
            await s.close()

    run(main())
