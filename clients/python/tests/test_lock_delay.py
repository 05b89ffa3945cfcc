"""Lock-delay, conflict events and queue positions (issue #32 items 4 and 5,
docs/primitives.md) against a real `latchkey serve`: the blocking and the asyncio client."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import latchkey
import latchkey.aio
from latchkey import _core as core
from conftest import run, wait_until, wait_until_async

# A holder's session TTL, and a lock-delay well above it: a waiter granted at the expiry
# without the delay would be granted within about a TTL of the holder's death.
TTL = 2.0
DELAY = 6.0

# A holder in a process of its own, so that it can die without a word (SIGKILL): it takes
# the lock with a lock-delay, prints its token, and holds until killed.
_HOLDER = """
import sys
import latchkey
client = latchkey.Client(sys.argv[1])
session = client.session(ttl=float(sys.argv[3]))
guard = session.lock(sys.argv[2], wait=0, lock_delay=float(sys.argv[4]))
print(guard.token, flush=True)
sys.stdin.read()
"""


def _in_thread(fn):
    """Runs `fn` in a thread; `out` holds its result or exception, and the time.monotonic()
    it ended at, once `t` has ended."""
    out: list = []

    def body():
        try:
            r = fn()
        except Exception as e:  # noqa: BLE001 - the test reads it
            r = e
        out.append((r, time.monotonic()))

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, out


def test_a_lock_delay_is_checked_before_any_call(client):
    with client.session(ttl=10) as s:
        for bad, words in [(300.0001, "at most 300000 ms, not 300001"),
                           (float("inf"), "at most 300000 ms"),
                           (-1, "0 or more seconds"), (float("nan"), "0 or more seconds"),
                           ("5", "not str"), (True, "not bool")]:
            with pytest.raises(latchkey.InvalidArgument, match=words):
                s.lock("delay/bad", wait=0, lock_delay=bad)
        with pytest.raises(latchkey.InvalidArgument, match="exclusive lock .a mutex. only"):
            s.lock("delay/bad", wait=0, shared=True, lock_delay=1)
        with pytest.raises(latchkey.InvalidArgument, match="exclusive lock .a mutex. only"):
            s.lock("delay/bad", wait=0, permits=3, lock_delay=1)
        with pytest.raises(latchkey.InvalidArgument):
            client.lock("delay/bad", lock_delay=301)
        # Nothing was asked: the name is free, the session good.
        assert not client.describe("delay/bad").held
        # Rounded up to whole ms, the most allowed included; the holder's delay is shown.
        assert core.acquire_mode(lock_delay=0.0005).lock_delay_ms == 1
        assert core.acquire_mode(lock_delay=1.1).lock_delay_ms == 1100
        with s.lock("delay/bad", wait=0, lock_delay=300) as g:
            info = client.describe("delay/bad")
            assert info.holder.token == g.token and info.lock_delay == 300.0
            assert info.delay_remaining is None


def test_a_dead_holders_lock_delay_keeps_the_lock_from_a_waiter(server, client):
    env = dict(os.environ, PYTHONPATH=str(Path(latchkey.__file__).resolve().parents[1]))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, server.addr, "delay/dead", str(TTL), str(DELAY)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        line = holder.stdout.readline()
        assert line.strip().isdigit(), f"the holder process said {line!r}"
        token = int(line)
        info = client.describe("delay/dead")
        assert info.holder.token == token and info.lock_delay == DELAY
        with client.session(ttl=10) as w:
            t, out = _in_thread(lambda: w.lock("delay/dead", wait=60))
            wait_until("the waiter queued", lambda: client.describe("delay/dead").waiters == 1)
            killed_at = time.monotonic()
            holder.kill()
            holder.wait(10)
            # The holder's session expires about a TTL later; then the delay runs: no holder,
            # the waiter keeps its place.
            wait_until("the delay runs", lambda: client.describe("delay/dead").delay_remaining
                       is not None, timeout=3 * TTL + 5)
            during = client.describe("delay/dead")
            assert not during.held and during.queue == (w.id,), during
            assert 0 < during.delay_remaining <= DELAY
            # The lost grant's token: a force-release without one names it to end the delay.
            assert during.delay_token == token, during
            t.join(TTL + DELAY + 20)
            assert not t.is_alive() and out, "the waiter was never granted"
            granted, granted_at = out[0]
            assert isinstance(granted, latchkey.LockGuard), granted
            assert granted_at - killed_at >= DELAY, (
                f"granted {granted_at - killed_at:.1f}s after the holder died, within its "
                f"{DELAY}s lock-delay")
            assert granted.token > token
            granted.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        holder.stdout.close()
        holder.stdin.close()


def test_a_retried_force_release_keeps_the_delay_and_end_delay_ends_it(client):
    # The holder asked for a 300-s delay: a force-release starts it; the same call again (a
    # retry after a lost answer) answers the same and ends nothing; one naming no token finds
    # nobody holding; only end_delay=True ends it, once.
    with client.session(ttl=10) as a, client.session(ttl=10) as b:
        g = a.lock("delay/forced", wait=0, lock_delay=300)
        t, out = _in_thread(lambda: b.lock("delay/forced", wait=60))
        wait_until("the waiter queued", lambda: client.describe("delay/forced").waiters == 1)
        first = client.force_release("delay/forced", token=g.token, reason="wedged")
        assert first == (a.id, g.token)
        assert client.force_release("delay/forced", token=g.token, reason="wedged") == first

        def still_delayed():
            info = client.describe("delay/forced")
            assert not info.held and info.delay_token == g.token and info.queue == (b.id,), info

        still_delayed()
        with pytest.raises(latchkey.Conflict, match="end_delay=True") as e:
            client.force_release("delay/forced", reason="wedged")
        assert e.value.reason == "lock-not-held"
        still_delayed()
        assert not out, "granted during the delay"
        ended = client.force_release("delay/forced", reason="the job is gone", end_delay=True)
        assert ended == first
        t.join(30)
        assert not t.is_alive() and out, "ending the delay did not hand the lock over"
        granted = out[0][0]
        assert isinstance(granted, latchkey.LockGuard), granted
        assert granted.token > g.token
        with pytest.raises(latchkey.Conflict) as e:
            client.force_release("delay/forced", reason="again", end_delay=True)
        assert e.value.reason == "no-lock-delay"
        with pytest.raises(latchkey.Conflict) as e:
            client.force_release("delay/forced", token=g.token, reason="again", end_delay=True)
        assert e.value.reason == "no-lock-delay"
        assert client.describe("delay/forced").holder.token == granted.token
        granted.release()


def test_a_clean_release_hands_over_at_once_despite_a_lock_delay(client):
    with client.session(ttl=10) as a, client.session(ttl=10) as b:
        g = a.lock("delay/clean", wait=0, lock_delay=300)
        t, out = _in_thread(lambda: b.lock("delay/clean", wait=60))
        wait_until("the waiter queued", lambda: client.describe("delay/clean").waiters == 1)
        released_at = time.monotonic()
        g.release()
        # Not after the 300 s delay: a release starts none (bounded far below it).
        t.join(30)
        assert not t.is_alive() and out, "a clean release did not hand the lock over"
        granted, granted_at = out[0]
        assert isinstance(granted, latchkey.LockGuard), granted
        assert granted_at - released_at < 30
        assert client.describe("delay/clean").delay_remaining is None
        granted.release()


def test_a_holder_learns_it_is_contended_and_a_waiter_its_position(client):
    # TTL 3 s: renewed each second, so a holder hears of a waiter within about a second.
    a, b, c = (client.session(ttl=3) for _ in range(3))
    try:
        held = a.lock("contended/q", wait=0)
        assert not held.is_contended()
        assert not held.contended(timeout=1.5), "contended with nobody waiting"
        b_positions: list = []
        c_positions: list = []
        tb, out_b = _in_thread(lambda: b.lock("contended/q", wait=60,
                                              positions=b_positions.append))
        wait_until("b queued", lambda: client.describe("contended/q").waiters == 1)
        assert held.contended(timeout=10), "the holder was not told that b waits"
        assert held.is_contended()
        tc, out_c = _in_thread(lambda: c.lock("contended/q", wait=60,
                                              positions=c_positions.append))
        # The first long-poll answers PENDING after at most ACQUIRE_POLL_MS_MAX (10 s).
        wait_until("c at position 2", lambda: 2 in c_positions, timeout=25)
        assert b_positions and set(b_positions) == {1}, b_positions
        held.release()
        tb.join(20)
        assert not tb.is_alive() and isinstance(out_b[0][0], latchkey.LockGuard), out_b
        g_b = out_b[0][0]
        # The queue ahead of c drained by one: 2 -> 1 at its next long-poll answer.
        wait_until("c at position 1", lambda: c_positions[-1:] == [1], timeout=25)
        assert c_positions == sorted(c_positions, reverse=True), c_positions
        assert g_b.contended(timeout=10) and g_b.is_contended()
        g_b.release()
        tc.join(20)
        assert not tc.is_alive() and isinstance(out_c[0][0], latchkey.LockGuard), out_c
        g_c = out_c[0][0]
        # Nobody waits for c's lock: the next answer says so.
        assert not g_c.contended(timeout=2.5)
        assert not g_c.is_contended()
        g_c.release()
    finally:
        for s in (a, b, c):
            s.close()


def test_a_cut_contended_list_keeps_what_was_known_of_the_names_after_it(client):
    with client.session(ttl=10) as s:
        s._contended_now(["x", "y"], False)
        assert s._contended == {"x", "y"}
        # Cut after "m": it says nothing of "x" and "y", which stay.
        s._contended_now(["m"], True)
        assert s._contended == {"m", "x", "y"}
        # Cut after "x": "m", before it and not listed, is not contended; "y" stays.
        s._contended_now(["x"], True)
        assert s._contended == {"x", "y"}
        # Cut with nothing listed: nothing is known anew.
        s._contended_now([], True)
        assert s._contended == {"x", "y"}
        # All of them: only what is listed.
        s._contended_now(["z"], False)
        assert s._contended == {"z"}
        s._contended_now([], False)
        assert s._contended == frozenset()


def test_a_released_guard_forgets_its_contention_so_a_later_guard_is_not_told_of_it(client):
    # Regression: the session kept a released guard's name among the contended ones, so the
    # next guard of that name was "contended" from the old grant's waiters until a keepalive
    # answer said otherwise. TTL 60: no renewal (every 20 s) comes between the steps.
    with client.session(ttl=60) as s:
        first = s.lock("contended/forget", wait=0)
        s._contended_now(["contended/forget"], False)  # what a keepalive answer would say
        assert first.is_contended()
        first.release()
        second = s.lock("contended/forget", wait=0)
        assert not second.is_contended(), "a later guard was told of the old grant's waiters"
        assert "contended/forget" not in s._contended
        assert not second.contended(timeout=0.2)
        second.release()


def test_a_lost_lock_ends_a_wait_for_contention(client):
    s = client.session(ttl=10)
    g = s.lock("contended/lost", wait=0)
    t, out = _in_thread(lambda: g.contended(timeout=30))
    s.close()
    t.join(10)
    assert not t.is_alive() and out[0][0] is True, out


def test_async_lock_delay_contended_and_positions(server):
    async def main():
        async with latchkey.aio.Client([server.addr]) as c:
            a = await c.session(ttl=3)
            b = await c.session(ttl=3)
            admin = c
            with pytest.raises(latchkey.InvalidArgument, match="exclusive lock"):
                await a.lock("aio/delay", wait=0, shared=True, lock_delay=1)
            with pytest.raises(latchkey.InvalidArgument, match="at most 300000 ms"):
                await a.lock("aio/delay", wait=0, lock_delay=301)
            held = await a.lock("aio/delay", wait=0, lock_delay=DELAY)
            assert not held.is_contended()
            assert not await held.contended(timeout=1.5)
            positions: list = []
            waiter = asyncio.ensure_future(b.lock("aio/delay", wait=50,
                                                  positions=positions.append))

            async def queued():
                return (await c.describe("aio/delay")).waiters == 1

            await wait_until_async("b queued", queued)
            assert await held.contended(timeout=10), "the holder was not told that b waits"
            assert held.is_contended()
            # An operator's revoke ends the grant: the delay runs.
            revoked_at = time.monotonic()
            assert await admin.revoke(a.id, reason="test: lock-delay") == 1
            info = await c.describe("aio/delay")
            assert not info.held and info.delay_remaining is not None, info
            granted = await asyncio.wait_for(waiter, DELAY + 20)
            assert time.monotonic() - revoked_at >= DELAY, "granted within the lock-delay"
            assert granted.token > held.token
            # Granted within its first long-poll (10 s) or after: only position 1 was sent.
            assert set(positions) <= {1}, positions
            await granted.release()
            await b.close()
            await a.close()

    run(main())


def test_async_a_released_guard_forgets_its_contention(server):
    # As test_a_released_guard_forgets_its_contention_so_a_later_guard_is_not_told_of_it.
    async def main():
        async with latchkey.aio.Client([server.addr]) as c:
            s = await c.session(ttl=60)
            first = await s.lock("aio/forget", wait=0)
            s._contended_now(["aio/forget"], False)
            assert first.is_contended()
            await first.release()
            second = await s.lock("aio/forget", wait=0)
            assert not second.is_contended(), "a later guard was told of the old grant's waiters"
            assert "aio/forget" not in s._contended
            assert not await second.contended(timeout=0.2)
            await second.release()
            await s.close()

    run(main())


def test_async_positions_are_reported_while_queued(server):
    async def main():
        async with latchkey.aio.Client([server.addr]) as c:
            a = await c.session(ttl=10)
            b = await c.session(ttl=10)
            held = await a.lock("aio/positions", wait=0)
            positions: list = []
            waiter = asyncio.ensure_future(b.lock("aio/positions", wait=40,
                                                  positions=positions.append))

            async def told():
                return 1 in positions

            # The first long-poll answers PENDING after at most ACQUIRE_POLL_MS_MAX (10 s).
            await wait_until_async("b told its position", told, timeout=25)
            await held.release()
            granted = await asyncio.wait_for(waiter, 20)
            assert set(positions) == {1}, positions
            await granted.release()
            await b.close()
            await a.close()

    run(main())
