"""Client-side coalescing (`batch=True`, issue #35 item 2) against a real server, blocking and
asyncio: many sessions of one client taking and releasing their own locks at once go in `Batch`
calls (fewer calls than operations, counted by the server's metrics), each getting its own
answer; an acquire that must wait answers PENDING in its batch and then long-polls alone until
granted; one operation's error fails only its own call, as the error its own call raises."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import latchkey
from latchkey import aio, errors

from conftest import run, wait_until

SESSIONS = 32
ROUNDS = 3
T = 20.0  # bound for anything that should take a moment


def rpcs(server) -> int:
    """Calls that carried an acquire, release or close: each alone, or a Batch of them."""
    return sum(server.requests(m) for m in ("acquire", "release", "close_session", "batch"))


def held(c, prefix: str) -> dict:
    """name -> (session, token) of the held locks under `prefix`."""
    return {i.name: (i.holder.session_id, i.holder.token) for i in c.list(prefix) if i.held}


def test_concurrent_operations_of_one_client_ride_batches_each_with_its_own_answer(
        metered_server):
    # The default batches (issue #35: clients coalesce automatically).
    with latchkey.Client([metered_server.addr]) as c:
        sessions = [c.session(ttl=15) for _ in range(SESSIONS)]
        before, batches = rpcs(metered_server), metered_server.requests("batch")
        for _ in range(ROUNDS):
            barrier = threading.Barrier(SESSIONS)

            def take(i):
                barrier.wait(T)
                return sessions[i].lock(f"own/{i}", wait=T)

            with ThreadPoolExecutor(SESSIONS) as pool:
                guards = list(pool.map(take, range(SESSIONS)))
            # Each call got its own answer: its lock, held by its session under its token.
            assert held(c, "own/") == {
                f"own/{i}": (s.id, g.token) for i, (s, g) in enumerate(zip(sessions, guards))}
            barrier = threading.Barrier(SESSIONS)

            def release(g):
                barrier.wait(T)
                g.release()

            with ThreadPoolExecutor(SESSIONS) as pool:
                list(pool.map(release, guards))
            assert held(c, "own/") == {}
        calls = rpcs(metered_server) - before
        ops = 2 * SESSIONS * ROUNDS
        print(f"{ops} acquires and releases in {calls} calls")
        assert metered_server.requests("batch") > batches
        assert calls < ops, (calls, ops)
        for s in sessions:
            s.close()


def test_one_call_at_a_time_goes_alone_at_once(metered_server):
    """With nothing in flight a call is sent at once, alone: one call each, none waiting for
    a batch to fill (no linger), so a program that makes one call at a time is unchanged. One
    attempt per call: a call held back until its attempt's time is up fails instead of passing
    on a retry."""
    once = latchkey.RetryPolicy(attempts_max=1)
    with latchkey.Client([metered_server.addr], batch=True, retry=once) as c:
        s = c.session(ttl=15)
        before, batches = rpcs(metered_server), metered_server.requests("batch")
        for i in range(10):
            s.lock(f"alone/{i}", wait=T).release()
        assert rpcs(metered_server) - before == 20
        assert metered_server.requests("batch") - batches == 20
        s.close()


def test_a_pending_acquire_in_a_batch_is_granted_after_the_holder_releases(metered_server):
    with latchkey.Client([metered_server.addr], batch=True) as c:
        a, b = c.session(ttl=15), c.session(ttl=15)
        first = a.lock("contended", wait=T)
        acquires = metered_server.requests("acquire")
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(b.lock, "contended", T)
            wait_until("b waits in the queue", lambda: c.describe("contended").waiters == 1, T)
            # Answered PENDING in its batch, it long-polls in an Acquire of its own.
            wait_until("b long-polls alone",
                       lambda: metered_server.requests("acquire") > acquires, T)
            assert not waiting.done()
            first.release()
            second = waiting.result(T)
        assert second.token > first.token
        assert held(c, "contended") == {"contended": (b.id, second.token)}
        second.release()
        a.close()
        b.close()


def _conflict_error(addr: str, batch: bool):
    """The error of an acquire that conflicts with its lock's kind (a semaphore of 2 permits
    taken as one of 5) made at once with others' acquires of their own locks."""
    with latchkey.Client([addr], batch=batch) as c:
        sessions = [c.session(ttl=15) for _ in range(8)]
        permit = sessions[0].acquire_permit("err/sem", 2, wait=T)
        barrier = threading.Barrier(len(sessions))

        def take(i):
            barrier.wait(T)
            if i == 3:
                return sessions[i].acquire_permit("err/sem", 5, wait=T)
            return sessions[i].lock(f"err/{i}", wait=T)

        with ThreadPoolExecutor(len(sessions)) as pool:
            futures = [pool.submit(take, i) for i in range(len(sessions))]
            outcomes = []
            for f in futures:
                try:
                    outcomes.append(f.result(T))
                except errors.LatchkeyError as e:
                    outcomes.append(e)
        # Only the conflicting acquire failed; each other got its own lock.
        failed = [isinstance(o, errors.LatchkeyError) for o in outcomes]
        assert failed == [i == 3 for i in range(8)], outcomes
        assert held(c, "err/") == {
            **{f"err/{i}": (s.id, outcomes[i].token) for i, s in enumerate(sessions) if i != 3},
            "err/sem": (sessions[0].id, permit.token)}
        for i, o in enumerate(outcomes):
            if i != 3:
                o.release()
        permit.release()
        for s in sessions:
            s.close()
        return outcomes[3]


def test_an_operations_error_fails_only_its_call_as_its_own_call_would(metered_server):
    alone = _conflict_error(metered_server.addr, batch=False)
    before = metered_server.requests("batch")
    batched = _conflict_error(metered_server.addr, batch=True)
    assert metered_server.requests("batch") > before
    assert isinstance(alone, errors.PermitsConflict), alone
    assert type(batched) is type(alone), (batched, alone)
    assert batched.reason == alone.reason


def test_asyncio_operations_ride_batches_with_their_own_answers_and_errors(metered_server):
    async def main():
        # The default batches, as the blocking client's.
        async with aio.Client([metered_server.addr]) as c:
            sessions = [await c.session(ttl=15) for _ in range(SESSIONS)]
            before, batches = rpcs(metered_server), metered_server.requests("batch")
            for _ in range(ROUNDS):
                guards = await asyncio.gather(
                    *(s.lock(f"aown/{i}", wait=T) for i, s in enumerate(sessions)))
                got = {i.name: (i.holder.session_id, i.holder.token) for i in await c.list("aown/") if i.held}
                assert got == {f"aown/{i}": (s.id, g.token)
                               for i, (s, g) in enumerate(zip(sessions, guards))}
                await asyncio.gather(*(g.release() for g in guards))
                assert not [i for i in await c.list("aown/") if i.held]
            calls = rpcs(metered_server) - before
            ops = 2 * SESSIONS * ROUNDS
            print(f"asyncio: {ops} acquires and releases in {calls} calls")
            assert metered_server.requests("batch") > batches
            assert calls < ops, (calls, ops)

            # A PENDING acquire long-polls alone and is granted after the holder releases.
            first = await sessions[0].lock("acontended", wait=T)
            acquires = metered_server.requests("acquire")
            waiting = asyncio.ensure_future(sessions[1].lock("acontended", wait=T))
            for _ in range(int(T / 0.02)):
                if metered_server.requests("acquire") > acquires:
                    break
                await asyncio.sleep(0.02)
            assert metered_server.requests("acquire") > acquires
            assert not waiting.done()
            await first.release()
            second = await asyncio.wait_for(waiting, T)
            assert second.token > first.token
            await second.release()

            # One conflicting acquire among others': only it fails, as its own call would.
            permit = await sessions[0].acquire_permit("aerr/sem", 2, wait=T)

            async def take(i):
                if i == 3:
                    return await sessions[i].acquire_permit("aerr/sem", 5, wait=T)
                return await sessions[i].lock(f"aerr/{i}", wait=T)

            outcomes = await asyncio.gather(*(take(i) for i in range(8)),
                                            return_exceptions=True)
            failed = [isinstance(o, BaseException) for o in outcomes]
            assert failed == [i == 3 for i in range(8)], outcomes
            assert isinstance(outcomes[3], errors.PermitsConflict), outcomes[3]
            left = {i.name: i.holder.token for i in await c.list("aerr/") if i.held}
            assert left == {**{f"aerr/{i}": o.token for i, o in enumerate(outcomes) if i != 3},
                            "aerr/sem": permit.token}
            for i, o in enumerate(outcomes):
                if i != 3:
                    await o.release()
            await permit.release()
            for s in sessions:
                await s.close()

    run(main())


def test_asyncio_one_call_at_a_time_goes_alone_at_once(metered_server):
    """As test_one_call_at_a_time_goes_alone_at_once, through latchkey.aio's sender task."""
    async def main():
        once = latchkey.RetryPolicy(attempts_max=1)
        async with aio.Client([metered_server.addr], batch=True, retry=once) as c:
            s = await c.session(ttl=15)
            before, batches = rpcs(metered_server), metered_server.requests("batch")
            for i in range(10):
                await (await s.lock(f"aalone/{i}", wait=T)).release()
            assert rpcs(metered_server) - before == 20
            assert metered_server.requests("batch") - batches == 20
            await s.close()

    run(main())


def test_a_batch_that_fails_as_a_whole_fails_each_operation_which_retries(metered_server):
    """The server stopped (SIGSTOP) while a batch is in flight and more operations wait: the
    Batch call's deadline fails each of its operations as a transport error, each retries under
    its own seq, and once the server runs again every acquire is granted exactly once."""
    n = 8
    with latchkey.Client([metered_server.addr], batch=True, rpc_timeout=1.0) as c:
        sessions = [c.session(ttl=30) for _ in range(n)]
        metered_server.pause()
        try:
            with ThreadPoolExecutor(n) as pool:
                futures = [pool.submit(s.lock, f"paused/{i}", T) for i, s in enumerate(sessions)]
                # Past one batch's deadline (rpc_timeout) with the server stopped.
                threading.Event().wait(2.5)
                assert not [f for f in futures if f.done()]
                metered_server.resume()
                guards = [f.result(T) for f in futures]
        finally:
            metered_server.resume()
        assert held(c, "paused/") == {
            f"paused/{i}": (s.id, g.token) for i, (s, g) in enumerate(zip(sessions, guards))}
        for g in guards:
            g.release()
        for s in sessions:
            s.close()
