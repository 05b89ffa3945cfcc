"""The asyncio client against a real `latchkey serve`."""

from __future__ import annotations

import asyncio
import time

import pytest

import latchkey
import latchkey.aio
from conftest import run, wait_until_async


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


def test_async_sessions_of_one_client_renew_in_shared_keepalives(metered_server):
    n, ttl, window = 200, 3.0, 4.0
    period = ttl / 3

    async def main():
        async with latchkey.aio.Client([metered_server.addr]) as c:
            # Opened at once, so that their renewals come due together, every TTL/3.
            sessions = await asyncio.gather(*(c.session(ttl=ttl) for _ in range(n)))
            try:
                start = [s.deadline for s in sessions]
                before = metered_server.requests("keep_alive")
                await asyncio.sleep(window)
                keepalives = metered_server.requests("keep_alive") - before
                assert not [s.id for s in sessions if s.is_lost()], "sessions were lost"
                # Each session renewed about every TTL/3: its deadline moved on by that each time.
                renewed = [round((s.deadline - d) / period) for s, d in zip(sessions, start)]
                assert min(renewed) >= window / period - 2, renewed
                renewals = sum(renewed)
                print(f"{renewals} renewals of {n} sessions in {keepalives} KeepAlive requests")
                # One request per session's renewal without batching; a handful per round with.
                assert 0 < keepalives and keepalives * 10 <= renewals, (keepalives, renewals)

                # Half of them closed while their renewals wait in batches with the others'
                # (the server stopped): the others' renewals are answered once it runs again.
                metered_server.pause()
                paused_at = latchkey.now()
                try:
                    await asyncio.sleep(0.7 * period)
                    closing = [asyncio.ensure_future(s.close()) for s in sessions[::2]]
                    await asyncio.sleep(0.1)
                finally:
                    metered_server.resume()
                await asyncio.wait_for(asyncio.gather(*closing), 10)
                await asyncio.sleep(period + 0.2)
                rest = sessions[1::2]
                assert not [s.id for s in rest if s.is_lost()], "open sessions were lost"
                # Each renewed since: its last acknowledged renewal was sent after the pause.
                acked = [s.deadline - (s.ttl - s.safety_margin) for s in rest]
                assert min(acked) > paused_at, (min(acked), paused_at)
            finally:
                for s in sessions:
                    await s.close()

    run(main())


def test_async_dead_endpoints_fail_fast_naming_the_cause():
    """Issue #33, the asyncio client: endpoints that refuse connections fail within the
    fail-fast budget, naming the cause."""
    from conftest import free_port

    budget = latchkey.RetryPolicy().unreachable_max

    async def main():
        async with latchkey.aio.Client([f"127.0.0.1:{free_port()}"]) as c:
            start = time.monotonic()
            with pytest.raises(latchkey.TransportError, match="connection refused"):
                await c.describe("x")
            return time.monotonic() - start

    took = run(main())
    assert budget <= took < 2 * budget, took
