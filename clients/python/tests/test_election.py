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
