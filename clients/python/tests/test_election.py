"""Leader election (issue #32, docs/primitives.md) against real `latchkey serve` processes:
campaign, proclaim, resign, leader and observe, in the blocking and the asyncio client."""

from __future__ import annotations

import asyncio
import threading

import pytest

import latchkey
import latchkey.aio
from latchkey import _core as core
from conftest import run, wait_leader, wait_until, wait_until_async


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


def test_campaign_leads_proclaims_resigns_and_the_next_candidate_leads_higher(client):
    a, b = client.session(ttl=10), client.session(ttl=10)
    try:
        assert client.leader("svc/leader") is None
        first = a.campaign("svc/leader", "10.0.0.1:80", wait=0)
        assert isinstance(first, latchkey.Leadership) and isinstance(first, latchkey.LockGuard)
        assert first.value == b"10.0.0.1:80" and not first.is_lost()
        leader = client.leader("svc/leader")
        assert (leader.session_id, leader.token, leader.value) == (a.id, first.token,
                                                                    b"10.0.0.1:80")
        assert leader.held_for is not None and leader.held_for >= 0
        # A second candidate queues (no herd); a try finds the leader.
        with pytest.raises(latchkey.LockHeld):
            b.campaign("svc/leader", "10.0.0.2:80", wait=0)
        t, out = _in_thread(lambda: b.campaign("svc/leader", b"10.0.0.2:80", wait=20))
        wait_until("the second candidate queued", lambda: client.describe("svc/leader").waiters == 1)
        first.proclaim("10.0.0.1:8080")
        assert first.value == b"10.0.0.1:8080"
        leader = client.leader("svc/leader")
        assert (leader.token, leader.value) == (first.token, b"10.0.0.1:8080")
        first.resign()
        t.join(20)
        assert not t.is_alive() and isinstance(out[0], latchkey.Leadership), out
        second = out[0]
        assert second.token > first.token
        leader = client.leader("svc/leader")
        assert (leader.session_id, leader.token, leader.value) == (b.id, second.token,
                                                                    b"10.0.0.2:80")
        # The ended term can no longer proclaim.
        with pytest.raises(latchkey.NotElectionLeader):
            first.proclaim("stale")
        with second:
            pass
        assert client.leader("svc/leader") is None
    finally:
        a.close()
        b.close()


def test_a_proclaim_after_a_force_release_is_not_election_leader_and_changes_nothing(client):
    with client.campaign("svc/forced", "mine", ttl=10) as leadership:
        client.force_release("svc/forced", reason="test: end the term")
        with pytest.raises(latchkey.NotElectionLeader) as e:
            leadership.proclaim("still mine?")
        assert e.value.reason == "not-election-leader"
        assert isinstance(e.value, latchkey.Conflict)
        assert client.leader("svc/forced") is None
        wait_until("the leadership reports lost", leadership.is_lost)
        # Exiting resigns a grant already taken: with the exception in flight only logged.
        with pytest.raises(latchkey.NotHeld):
            leadership.resign()


def test_bad_values_are_refused_before_any_call(client):
    with client.session(ttl=10) as s:
        with pytest.raises(latchkey.InvalidArgument):
            s.campaign("svc/big", b"x" * (core.ELECTION_VALUE_BYTES_MAX + 1))
        with pytest.raises(latchkey.InvalidArgument):
            s.campaign("svc/typed", 42)
        assert not client.describe("svc/big").held
        leadership = s.campaign("svc/big", b"x" * core.ELECTION_VALUE_BYTES_MAX, wait=0)
        with pytest.raises(latchkey.InvalidArgument):
            leadership.proclaim(b"y" * (core.ELECTION_VALUE_BYTES_MAX + 1))
        assert client.leader("svc/big").value == b"x" * core.ELECTION_VALUE_BYTES_MAX
        # A plain lock of the name leads with an empty value.
        leadership.resign()
        with s.lock("svc/big", wait=0) as g:
            leader = client.leader("svc/big")
            assert (leader.session_id, leader.token, leader.value) == (s.id, g.token, b"")
        with s.lock("svc/big", wait=0, shared=True):
            assert client.leader("svc/big") is None, "a reader is not a leader"


def _next_in_thread(observe):
    return _in_thread(lambda: next(observe))


def test_observe_sees_each_leader_and_value_once_in_order(client):
    a, b = client.session(ttl=10), client.session(ttl=10)
    try:
        first = a.campaign("svc/obs", "a1")
        with client.observe("svc/obs") as observe:
            seen = next(observe)
            assert (seen.session_id, seen.token, seen.value) == (a.id, first.token, b"a1")
            t, out = _in_thread(lambda: b.campaign("svc/obs", "b1", wait=20))
            wait_until("b queued", lambda: client.describe("svc/obs").waiters == 1)
            first.proclaim("a2")
            first.proclaim("a2")  # the same value again: a proclaim, not news
            first.proclaim("a3")
            first.resign()
            t.join(20)
            second = out[0]
            assert isinstance(second, latchkey.Leadership), out
            got = [next(observe) for _ in range(3)]
            assert [(x.session_id, x.token, x.value) for x in got] == [
                (a.id, first.token, b"a2"), (a.id, first.token, b"a3"),
                (b.id, second.token, b"b1")]
            second.resign()
            third = a.campaign("svc/obs", "a4", wait=0)
            seen = next(observe)
            assert (seen.session_id, seen.token, seen.value) == (a.id, third.token, b"a4")
            third.resign()
    finally:
        a.close()
        b.close()


def test_observe_of_a_name_nobody_leads_waits_for_the_first_leader(client):
    with client.observe("svc/empty") as observe:
        t, out = _next_in_thread(observe)
        with client.campaign("svc/empty/other", "not this one", ttl=10):
            with client.campaign("svc/empty", "first", ttl=10) as leadership:
                t.join(20)
                assert not t.is_alive(), "observe saw no leader"
                assert (out[0].token, out[0].value) == (leadership.token, b"first")


def test_observe_resumes_on_another_member_when_its_member_dies(cluster):
    client = latchkey.Client([s.addr for s in cluster])
    candidate = latchkey.Client([s.addr for s in cluster])
    try:
        with candidate.session(ttl=10) as s:
            first = s.campaign("svc/failover", "before")
            observe = client.observe("svc/failover")
            assert next(observe).value == b"before"
            watched = observe._watch._addr
            victim = next(x for x in cluster if x.addr == watched)
            victim.kill9()
            rest = [x for x in cluster if x is not victim]
            wait_leader(rest)
            first.proclaim("after")
            seen = next(observe)
            assert (seen.token, seen.value) == (first.token, b"after")
            assert observe._watch._addr != watched
            observe.close()
    finally:
        client.close()
        candidate.close()


def test_asyncio_campaign_proclaim_resign_leader_and_observe(server):
    async def body():
        client = latchkey.aio.Client([server.addr])
        try:
            a, b = await client.session(ttl=10), await client.session(ttl=10)
            assert await client.leader("svc/aio") is None
            first = await a.campaign("svc/aio", "a1", wait=0)
            assert isinstance(first, latchkey.aio.Leadership)
            observe = await client.observe("svc/aio")
            seen = await observe.next()
            assert (seen.session_id, seen.token, seen.value) == (a.id, first.token, b"a1")
            waiting = asyncio.ensure_future(b.campaign("svc/aio", "b1", wait=20))

            async def queued():
                return (await client.describe("svc/aio")).waiters == 1

            await wait_until_async("b queued", queued)
            await first.proclaim("a2")
            assert (await client.leader("svc/aio")).value == b"a2"
            assert (await observe.next()).value == b"a2"
            await first.resign()
            second = await asyncio.wait_for(waiting, 20)
            assert second.token > first.token
            with pytest.raises(latchkey.NotElectionLeader):
                await first.proclaim("stale")
            seen = await observe.next()
            assert (seen.session_id, seen.token, seen.value) == (b.id, second.token, b"b1")
            async with second:
                pass
            assert await client.leader("svc/aio") is None
            observe.close()
            assert [x async for x in observe] == []
            async with client.campaign("svc/aio", b"own session", ttl=10) as leadership:
                leader = await client.leader("svc/aio")
                assert (leader.token, leader.value) == (leadership.token, b"own session")
            await a.close()
            await b.close()
        finally:
            await client.close()

    run(body())


def test_an_observe_closed_from_another_thread_ends_its_iteration(client):
    observe = client.observe("svc/closed")
    t, out = _in_thread(lambda: list(observe))
    observe.close()
    t.join(20)
    assert not t.is_alive() and out == [[]], out


# --- The pure parts (no server). ----------------------------------------------------------
def _event(kind, session, token, value=None, index=1, ordinal=0, mode=None):
    e = latchkey._core.pb.WatchEvent(index=index, ordinal=ordinal, kind=kind, lock="svc",
                                     session=session, token=token)
    if kind == "granted":
        e.mode = core.pb.LOCK_MODE_EXCLUSIVE if mode is None else mode
    if value is not None:
        e.value = value
    return e


def _l(session, token, value):
    return core.Leader(session, token, value)


def test_observed_each_leader_and_value_is_news_once_and_never_an_older_leader():
    """election.rs each_leader_and_value_is_news_once_and_never_an_older_leader, in Python."""
    o = core.Observed()
    o.read(_l(1, 10, b"a"))
    assert o.news() == _l(1, 10, b"a")
    assert o.news() is None, "the same leader twice"
    # Events from before the read (the watch opened first) change nothing.
    o.apply(_event("granted", 1, 10, b"a"))
    o.apply(_event("granted", 9, 7, b"old"))
    assert o.news() is None
    o.apply(_event("proclaimed", 1, 10, b"a2"))
    assert o.news() == _l(1, 10, b"a2")
    o.apply(_event("proclaimed", 9, 7, b"stale"))
    assert o.news() is None
    # A handover: released then granted in one entry; only the new leader is news.
    o.apply(_event("released", 1, 10))
    assert o.news() is None, "no leader is not an item"
    o.apply(_event("granted", 2, 12, b"b"))
    assert o.news() == _l(2, 12, b"b")
    # A read older than the events (it raced them) is ignored.
    o.read(_l(1, 10, b"a2"))
    assert o.news() is None
    # Readers and permits are not leaders.
    o.apply(_event("expired", 2, 12))
    o.apply(_event("granted", 3, 14, mode=core.pb.LOCK_MODE_SHARED))
    assert o.news() is None


def test_observed_a_proclaim_replayed_after_a_read_that_reflects_a_later_one_is_not_news():
    """election.rs a_proclaim_replayed_after_a_read_that_reflects_a_later_one_is_not_news: a
    watch on a member that lags behind the one read replays proclaims the read reflects."""
    o = core.Observed()
    o.read(_l(1, 10, b"v2"), 30)
    assert o.news() == _l(1, 10, b"v2")
    for e in (_event("granted", 1, 10, b"v0", index=10),
              _event("proclaimed", 1, 10, b"v1", index=20),
              _event("proclaimed", 1, 10, b"v2", index=30)):
        o.apply(e)
        assert o.news() is None, "an older value after a newer one"
    o.apply(_event("proclaimed", 1, 10, b"v3", index=31))
    assert o.news() == _l(1, 10, b"v3")


def _progress(index):
    return core.pb.WatchMessage(progress=core.pb.WatchProgress(index=index))


def _ev(index, ordinal):
    return core.pb.WatchMessage(event=_event("granted", 1, index, index=index, ordinal=ordinal))


def test_a_resumed_watch_repeats_nothing_already_delivered():
    """watch.rs a_resumed_stream_repeats_nothing_already_delivered, in Python."""
    c = core.WatchCursor()
    assert c.resume_index() is None
    assert c.accept(_progress(4)) is None
    assert c.resume_index() == 4
    assert c.accept(_ev(5, 0)).index == 5
    assert c.resume_index() == 4, "entry 5 may have more events"
    # A stream resumed after 4 replays entry 5: its first event is old news.
    assert c.accept(_progress(4)) is None
    assert c.accept(_ev(5, 0)) is None
    assert c.accept(_ev(5, 1)).ordinal == 1
    assert c.accept(_progress(9)) is None and c.resume_index() == 9
    missed = c.accept(core.pb.WatchMessage(
        missed=core.pb.WatchMissed(after_index=9, through_index=20)))
    assert missed == core.WatchMissed(9, 20) and c.resume_index() == 20


def test_elections_in_every_group_of_a_cluster_of_several_groups(grouped_cluster):
    """Each election's name lives in one Raft group: a fresh client (group count not yet
    known) observes and reads a leader of each group's name."""
    from conftest import GROUPS, names_by_group

    names = names_by_group(GROUPS, "svc/grouped/")
    endpoints = [s.addr for s in grouped_cluster]
    candidate = latchkey.Client(endpoints)
    try:
        with candidate.session(ttl=10) as s:
            for g, name in enumerate(names):
                observer = latchkey.Client(endpoints)
                try:
                    with observer.observe(name) as observe:
                        leadership = s.campaign(name, f"group {g}", wait=10)
                        seen = next(observe)
                        assert (seen.session_id, seen.token, seen.value) == (
                            s.session_id_for(name), leadership.token, f"group {g}".encode())
                        assert observer.leader(name).value == f"group {g}".encode()
                        leadership.resign()
                finally:
                    observer.close()
    finally:
        candidate.close()


def test_asyncio_observe_resumes_on_another_member_when_its_member_dies(cluster):
    async def body():
        client = latchkey.aio.Client([s.addr for s in cluster])
        candidate = latchkey.aio.Client([s.addr for s in cluster])
        try:
            s = await candidate.session(ttl=10)
            first = await s.campaign("svc/aio-failover", "before")
            observe = await client.observe("svc/aio-failover")
            assert (await observe.next()).value == b"before"
            watched = observe._watch._addr
            victim = next(x for x in cluster if x.addr == watched)
            victim.kill9()
            await asyncio.get_running_loop().run_in_executor(
                None, wait_leader, [x for x in cluster if x is not victim])
            await first.proclaim("after")
            seen = await observe.next()
            assert (seen.token, seen.value) == (first.token, b"after")
            assert observe._watch._addr != watched
            observe.close()
            await s.close()
        finally:
            await client.close()
            await candidate.close()

    run(body())
