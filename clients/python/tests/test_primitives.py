"""Read-write locks and counting semaphores (issue #32, docs/primitives.md) against a real
`latchkey serve`: the blocking and the asyncio client."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

import latchkey
import latchkey.aio
from latchkey import _core as core
from conftest import run, wait_until, wait_until_async


def _in_thread(fn):
    """Runs `fn` in a thread; `out` holds its result or exception once `t` has ended."""
    out: list = []

    def body():
        try:
            out.append(fn())
        except Exception as e:  # noqa: BLE001 - the test reads it
            out.append(e)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, out


def test_readers_hold_together_a_writer_alone_and_a_reader_behind_a_waiting_writer_waits(client):
    r1, r2, w, r3 = (client.session(ttl=10) for _ in range(4))
    try:
        g1 = r1.lock_shared("rw/cfg", wait=0)
        g2 = r2.lock("rw/cfg", wait=0, shared=True)
        # Granted by two entries: two tokens, in order.
        assert g2.token > g1.token
        info = client.describe("rw/cfg")
        assert info.mode == "shared" and info.permits == 0
        assert [h.session_id for h in info.holders] == [r1.id, r2.id]
        assert [h.token for h in info.holders] == [g1.token, g2.token]
        assert info.holder == info.holders[0]
        # A writer finds readers: a try-lock names the first of them.
        with pytest.raises(latchkey.LockHeld) as held:
            w.lock("rw/cfg", wait=0)
        assert held.value.holder.session_id == r1.id
        t, out = _in_thread(lambda: w.lock("rw/cfg", wait=20))
        wait_until("the writer queued", lambda: client.describe("rw/cfg").waiters == 1)
        # A reader that comes behind the waiting writer waits too, though readers hold.
        with pytest.raises(latchkey.LockHeld):
            r3.lock_shared("rw/cfg", wait=0)
        g1.release()
        assert client.describe("rw/cfg").queue == (w.id,)
        g2.release()
        t.join(20)
        assert not t.is_alive() and isinstance(out[0], latchkey.LockGuard), out
        gw = out[0]
        assert gw.token > g2.token
        info = client.describe("rw/cfg")
        assert info.mode == "exclusive" and [h.session_id for h in info.holders] == [w.id]
        # The writer holds alone: a reader waits for it, then gets a higher token.
        t, out = _in_thread(lambda: r3.lock_shared("rw/cfg", wait=20))
        wait_until("the reader queued", lambda: client.describe("rw/cfg").waiters == 1)
        gw.release()
        t.join(20)
        assert not t.is_alive() and isinstance(out[0], latchkey.LockGuard), out
        assert out[0].token > gw.token
        out[0].release()
    finally:
        for s in (r1, r2, w, r3):
            s.close()


def test_a_semaphore_of_n_holds_n_and_queues_the_next(client):
    sessions = [client.session(ttl=10) for _ in range(4)]
    try:
        guards = [s.acquire_permit("sem/jobs", 3, wait=0) for s in sessions[:3]]
        tokens = [g.token for g in guards]
        assert tokens == sorted(set(tokens)), tokens  # a token of its own each, increasing
        info = client.describe("sem/jobs")
        assert info.mode == "permits" and info.permits == 3
        assert [h.session_id for h in info.holders] == [s.id for s in sessions[:3]]
        assert [h.token for h in info.holders] == tokens
        with pytest.raises(latchkey.LockHeld):
            sessions[3].lock("sem/jobs", wait=0, permits=3)
        t, out = _in_thread(lambda: sessions[3].acquire_permit("sem/jobs", 3, wait=20))
        wait_until("the fourth queued", lambda: client.describe("sem/jobs").waiters == 1)
        guards[1].release()
        t.join(20)
        assert not t.is_alive() and isinstance(out[0], latchkey.LockGuard), out
        assert out[0].token > max(tokens)
        assert [h.session_id for h in client.describe("sem/jobs").holders] == [
            sessions[0].id, sessions[2].id, sessions[3].id]
        # A permit's guard fences like a lock's.
        assert out[0].fencing_headers()["latchkey-token"] == str(out[0].token)
    finally:
        for s in sessions:
            s.close()
    assert not client.describe("sem/jobs").held


def test_another_kind_or_count_is_a_typed_error_and_changes_nothing(client):
    with client.session(ttl=10) as a, client.session(ttl=10) as b:
        g = a.acquire_permit("sem/kind", 2, wait=0)
        with pytest.raises(latchkey.KindConflict) as kind:
            b.lock("sem/kind", wait=0)
        assert kind.value.reason == "kind-conflict" and isinstance(kind.value, latchkey.Conflict)
        assert "semaphore of 2 permits" in str(kind.value)
        with pytest.raises(latchkey.KindConflict):
            b.lock_shared("sem/kind", wait=5)
        with pytest.raises(latchkey.PermitsConflict) as count:
            b.acquire_permit("sem/kind", 5, wait=5)
        assert count.value.reason == "permits-conflict"
        assert "not 5" in str(count.value)
        info = client.describe("sem/kind")
        assert info.permits == 2 and [h.session_id for h in info.holders] == [a.id]
        assert info.waiters == 0
        # The session is still good: the right count is granted.
        assert b.acquire_permit("sem/kind", 2, wait=0).token > g.token
        # And a name held as a lock refuses a permit.
        a.lock("lock/kind", wait=0)
        with pytest.raises(latchkey.KindConflict):
            b.acquire_permit("lock/kind", 2, wait=0)


def test_bad_permits_are_refused_before_any_call(client):
    with client.session(ttl=10) as s:
        for bad in (0, core.HOLDERS_PER_LOCK_MAX + 1):
            with pytest.raises(latchkey.PermitsOutOfRange) as e:
                s.acquire_permit("sem/bad", bad, wait=0)
            assert e.value.permits == bad and e.value.max == 1024
            assert isinstance(e.value, latchkey.InvalidArgument)
        with pytest.raises(latchkey.InvalidArgument):
            s.lock("sem/bad", wait=0, shared=True, permits=2)
        with pytest.raises(latchkey.InvalidArgument):
            s.acquire_permit("sem/bad", True, wait=0)
        with pytest.raises(latchkey.PermitsOutOfRange):
            client.lock("sem/bad", permits=0)
        # The top of the range is fine.
        s.acquire_permit("sem/bad", core.HOLDERS_PER_LOCK_MAX, wait=0).release()
    assert not client.describe("sem/bad").held


def test_the_server_reasons_become_the_typed_errors():
    C = grpc.StatusCode
    f = core.classify(C.INVALID_ARGUMENT, "a semaphore has 1 to 1024 permits, not 0",
                      [("latchkey-error", "permits-out-of-range")])
    assert isinstance(f.error, latchkey.PermitsOutOfRange)
    assert f.error.reason == "permits-out-of-range" and f.error.permits is None
    f = core.classify(C.FAILED_PRECONDITION, "m", [("latchkey-error", "kind-conflict")])
    assert isinstance(f.error, latchkey.KindConflict) and f.error.reason == "kind-conflict"
    f = core.classify(C.FAILED_PRECONDITION, "m", [("latchkey-error", "permits-conflict")])
    assert isinstance(f.error, latchkey.PermitsConflict)
    f = core.classify(C.FAILED_PRECONDITION, "m", [("latchkey-error", "already-held")])
    assert type(f.error) is latchkey.Conflict


def test_client_lock_takes_a_reader_or_a_permit_in_a_session_of_its_own(client):
    with client.lock("ctx/cfg", ttl=5, wait=0, shared=True) as r1, \
            client.lock("ctx/cfg", ttl=5, wait=0, shared=True) as r2:
        info = client.describe("ctx/cfg")
        assert info.mode == "shared"
        assert {h.session_id for h in info.holders} == {r1.session_id, r2.session_id}
    with client.lock("ctx/sem", ttl=5, wait=0, permits=2), \
            client.lock("ctx/sem", ttl=5, wait=0, permits=2):
        with pytest.raises(latchkey.LockHeld):
            with client.lock("ctx/sem", ttl=5, wait=0, permits=2):
                pass
        assert len(client.describe("ctx/sem").holders) == 2
    assert not client.describe("ctx/sem").held


def test_list_shows_mode_permits_and_every_holder(client):
    with client.session(ttl=10) as a, client.session(ttl=10) as b:
        a.acquire_permit("listed/sem", 4, wait=0)
        b.acquire_permit("listed/sem", 4, wait=0)
        a.lock_shared("listed/rw", wait=0)
        by_name = {i.name: i for i in client.list("listed/")}
        assert by_name["listed/sem"].mode == "permits" and by_name["listed/sem"].permits == 4
        assert [h.session_id for h in by_name["listed/sem"].holders] == [a.id, b.id]
        assert by_name["listed/rw"].mode == "shared"


def test_a_mutex_reads_as_one_exclusive_holder(client):
    with client.lock("plain/mutex", ttl=5, wait=0) as g:
        info = client.describe("plain/mutex")
        assert info.mode == "exclusive" and info.permits == 0
        assert info.holders == (info.holder,) and info.holder.token == g.token
    info = client.describe("plain/mutex")
    assert not info.held and info.holders == () and info.mode == "exclusive"


def test_async_readers_and_permits(server):
    async def main():
        async with latchkey.aio.Client([server.addr]) as c:
            a, b, w = [await c.session(ttl=10) for _ in range(3)]
            try:
                g1 = await a.lock_shared("aio/rw", wait=0)
                g2 = await b.lock("aio/rw", wait=0, shared=True)
                info = await c.describe("aio/rw")
                assert info.mode == "shared"
                assert [h.token for h in info.holders] == [g1.token, g2.token]
                writer = asyncio.ensure_future(w.lock("aio/rw", wait=10))

                async def queued():
                    return (await c.describe("aio/rw")).waiters == 1

                await wait_until_async("the writer queued", queued)
                await g1.release()
                await g2.release()
                gw = await writer
                assert gw.token > g2.token
                await gw.release()

                p1 = await a.acquire_permit("aio/sem", 2, wait=0)
                p2 = await b.acquire_permit("aio/sem", 2, wait=0)
                assert p2.token > p1.token
                with pytest.raises(latchkey.LockHeld):
                    await w.acquire_permit("aio/sem", 2, wait=0)
                with pytest.raises(latchkey.PermitsConflict):
                    await w.acquire_permit("aio/sem", 3, wait=0)
                with pytest.raises(latchkey.KindConflict):
                    await w.lock_shared("aio/sem", wait=0)
                with pytest.raises(latchkey.PermitsOutOfRange):
                    await w.acquire_permit("aio/sem", 0, wait=0)
                async with c.lock("aio/sem2", ttl=5, wait=0, permits=1) as p:
                    info = await c.describe("aio/sem2")
                    assert info.mode == "permits" and info.holders[0].token == p.token
            finally:
                for s in (a, b, w):
                    await s.close()

    run(main())
