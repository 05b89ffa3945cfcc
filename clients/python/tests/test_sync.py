"""The blocking client against a real `latchkey serve`."""

from __future__ import annotations

import threading
import time

import pytest

import latchkey
from conftest import wait_until


def test_lock_and_unlock_round_trip(client):
    with client.lock("round/trip", ttl=5, wait=5) as guard:
        assert guard.token > 0
        info = client.describe("round/trip")
        assert info.held and info.holder.token == guard.token
        assert info.holder.session_id == guard.session_id
        # Issue #33: a session says whose it is by default (this process), as the CLI's do.
        import os
        assert info.holder.owner and info.holder.owner["pid"] == os.getpid()
        assert guard.fencing_headers() == {"latchkey-lock": "round/trip",
                                           "latchkey-token": str(guard.token)}
        assert not guard.lost.is_set()
    assert not client.describe("round/trip").held


def test_fifo_order_and_increasing_tokens(client):
    sessions = [client.session(ttl=10) for _ in range(3)]
    try:
        first = sessions[0].lock("fifo", wait=5)
        granted = []  # (index, guard), in grant order
        lock = threading.Lock()
        errors_seen = []

        def wait(i):
            try:
                g = sessions[i].lock("fifo", wait=20)
                with lock:
                    granted.append((i, g))
            except Exception as e:  # noqa: BLE001 - reported below
                errors_seen.append(e)

        threads = []
        for i in (1, 2):
            t = threading.Thread(target=wait, args=(i,))
            t.start()
            threads.append(t)
            # Queue them in a known order: the next waiter starts once this one is queued.
            wait_until(f"{i} waiter(s) queued", lambda i=i: client.describe("fifo").waiters == i)
        assert client.describe("fifo").queue == (sessions[1].id, sessions[2].id)
        first.release()
        wait_until("the second session is granted", lambda: len(granted) == 1)
        assert granted[0][0] == 1 and granted[0][1].token > first.token
        granted[0][1].release()
        wait_until("the third session is granted", lambda: len(granted) == 2)
        assert granted[1][0] == 2 and granted[1][1].token > granted[0][1].token
        granted[1][1].release()
        for t in threads:
            t.join(10)
        assert not errors_seen
    finally:
        for s in sessions:
            s.close()


def test_a_wait_that_runs_out_raises_wait_timeout(client):
    with client.session(ttl=5) as holder, client.session(ttl=5) as other:
        g = holder.lock("busy", wait=0)
        start = time.monotonic()
        with pytest.raises(latchkey.WaitTimeout) as e:
            other.lock("busy", wait=0.5)
        assert not isinstance(e.value, latchkey.LockHeld)
        assert time.monotonic() - start >= 0.45
        # The timed-out waiter left the queue.
        assert client.describe("busy").waiters == 0
        # A try-lock names the holder.
        with pytest.raises(latchkey.LockHeld) as held:
            other.lock("busy", wait=0)
        assert held.value.holder.session_id == holder.id
        assert held.value.holder.token == g.token
        g.release()
        assert other.lock("busy", wait=0).token > g.token


def test_context_manager_raises_wait_timeout_and_closes_its_session(client):
    with client.lock("cm", ttl=5, wait=0):
        with pytest.raises(latchkey.WaitTimeout):
            with client.lock("cm", ttl=5, wait=0.2):
                pytest.fail("granted a held lock")


def test_lost_fires_before_the_ttl_when_the_server_is_paused(server, client):
    ttl = 2.0
    session = client.session(ttl=ttl)
    guard = session.lock("paused", wait=0)
    fired = threading.Event()
    guard.on_lost(fired.set)
    deadline = session.deadline
    server.pause()
    paused_at = latchkey.now()
    try:
        # The deadline rule: acked send + TTL - margin; the server keeps the lock till ~TTL
        # after the last renewal it received, so lost must fire within the TTL of the pause.
        assert guard.lost.wait(timeout=ttl), "lost did not fire within the TTL"
        lost_at = latchkey.now()
        # It fired at the client's deadline (the last acknowledged renewal's send time + TTL
        # - margin), not later: the server still holds the lock for the margin.
        assert session.deadline <= lost_at < session.deadline + 0.25
        assert session.deadline - deadline < ttl / 3 + 0.25  # at most one more renewal
        assert lost_at - paused_at < ttl - session.safety_margin + 0.25
        assert fired.wait(1.0), "the callback was not called"
        assert "deadline" in guard.lost_reason
        # Releasing a lost lock reports it at once, without waiting for the paused server.
        start = time.monotonic()
        with pytest.raises(latchkey.LockLost):
            guard.release()
        assert time.monotonic() - start < 0.5
        with pytest.raises(latchkey.SessionLost):
            session.lock("paused/2", wait=0)
    finally:
        server.resume()
    # The server expires the session once it runs again: the lock is free.
    wait_until("the paused session's lock is free", lambda: not client.describe("paused").held,
               timeout=15)
    session.close()


def test_same_request_twice_is_granted_once(client):
    from latchkey.testing import resend_acquire

    with client.session(ttl=5) as s:
        guard, tokens = resend_acquire(s, "exactly-once", times=3)
        assert len(set(tokens)) == 1 and tokens[0] == guard.token
        info = client.describe("exactly-once")
        assert info.holder.token == guard.token and info.waiters == 0
        guard.release()
        assert not client.describe("exactly-once").held


def test_bad_input_is_a_clear_error(client):
    with pytest.raises(latchkey.InvalidArgument):
        client.session(ttl=0.5)
    with client.session(ttl=5) as s:
        with pytest.raises(latchkey.InvalidArgument):
            s.lock("", wait=0)
        with pytest.raises(latchkey.InvalidArgument):
            s.lock("x" * 513, wait=0)
        with pytest.raises(latchkey.InvalidArgument):
            s.lock("ok", wait=-1)
    with pytest.raises(latchkey.InvalidArgument):
        latchkey.Client(["no-port"])


def test_no_server_is_a_bounded_transport_error():
    from conftest import free_port

    policy = latchkey.RetryPolicy(attempts_max=3, elapsed_max=5, backoff_initial=0.001,
                                  backoff_max=0.002)
    with latchkey.Client([f"127.0.0.1:{free_port()}"], retry=policy) as c:
        with pytest.raises(latchkey.TransportError, match="3 attempts"):
            c.describe("x")


def test_dead_endpoints_fail_fast_naming_the_cause():
    """Issue #33: with no server, a lock with wait=2 raised TransportError after 11.2 s (64
    attempts). Endpoints that refuse connections now fail within the fail-fast budget (2 s),
    and the error names the endpoint and the cause."""
    from conftest import free_port

    budget = latchkey.RetryPolicy().unreachable_max
    endpoints = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    with latchkey.Client(endpoints) as c:
        start = time.monotonic()
        with pytest.raises(latchkey.TransportError, match="connection refused") as e:
            with c.lock("x", wait=30):
                pass
        took = time.monotonic() - start
    assert "cannot reach 127.0.0.1:" in str(e.value)
    assert budget <= took < 2 * budget, (took, str(e.value))


def test_an_endpoint_that_does_not_resolve_says_no_such_host():
    with latchkey.Client(["nosuchhost.invalid:7420"]) as c:
        start = time.monotonic()
        with pytest.raises(latchkey.TransportError, match="no such host"):
            c.describe("x")
        assert time.monotonic() - start < 2 * latchkey.RetryPolicy().unreachable_max


def test_a_follower_sends_the_client_to_the_leader(cluster):
    from conftest import wait_leader

    leader = wait_leader(cluster)
    follower = next(s for s in cluster if s is not leader)
    with latchkey.Client([follower.addr]) as c:
        with c.lock("hinted", ttl=5, wait=5) as g:
            assert c.describe("hinted").holder.token == g.token
            assert c._route.leader == leader.addr


def test_a_held_lock_survives_the_leader_being_killed(cluster):
    from conftest import wait_leader

    leader = wait_leader(cluster)
    with latchkey.Client([s.addr for s in cluster]) as c:
        with c.session(ttl=6) as s:
            g = s.lock("survivor", wait=5)
            leader.kill9()
            killed_deadline = s.deadline
            rest = [m for m in cluster if m is not leader]
            wait_leader(rest)
            # The session is renewed at the new leader before its deadline: not lost.
            wait_until("a renewal acknowledged after the kill",
                       lambda: s.deadline > killed_deadline, timeout=6)
            assert not g.lost.is_set()
            assert c.describe("survivor").holder.token == g.token
            other = c.session(ttl=5)
            g2 = other.lock("after-failover", wait=5)
            assert g2.token > g.token
            g2.release()
            other.close()
            g.release()


def test_the_sessions_of_one_client_renew_in_shared_keepalives(metered_server):
    from concurrent.futures import ThreadPoolExecutor

    n, ttl, window = 200, 3.0, 4.0
    period = ttl / 3
    with latchkey.Client([metered_server.addr]) as c:
        # Opened at once (a thread each, released together), so that their renewals come due
        # together, every TTL/3.
        barrier = threading.Barrier(n)

        def open_one(_):
            barrier.wait(10)
            return c.session(ttl=ttl)

        with ThreadPoolExecutor(n) as pool:
            sessions = list(pool.map(open_one, range(n)))
        try:
            start = [s.deadline for s in sessions]
            before = metered_server.requests("keep_alive")
            time.sleep(window)
            keepalives = metered_server.requests("keep_alive") - before
            assert not [s.id for s in sessions if s.is_lost()], "sessions were lost"
            # Each session renewed about every TTL/3: its deadline moved on by that each time.
            renewed = [round((s.deadline - d) / period) for s, d in zip(sessions, start)]
            assert min(renewed) >= window / period - 2, renewed
            renewals = sum(renewed)
            print(f"{renewals} renewals of {n} sessions in {keepalives} KeepAlive requests")
            # One request per session's renewal without batching; with it, a handful per round.
            assert 0 < keepalives and keepalives * 10 <= renewals, (keepalives, renewals)

            # Half of them closed while their renewals wait in batches with the others' (the
            # server stopped): the others' renewals are answered once it runs again.
            metered_server.pause()
            paused_at = latchkey.now()
            try:
                time.sleep(0.7 * period)
                with ThreadPoolExecutor(n // 2) as pool:
                    closing = [pool.submit(s.close) for s in sessions[::2]]
                    time.sleep(0.1)
                    metered_server.resume()
                    for f in closing:
                        f.result(10)
            finally:
                metered_server.resume()
            time.sleep(period + 0.2)
            rest = sessions[1::2]
            assert not [s.id for s in rest if s.is_lost()], "open sessions were lost"
            # Each renewed since: its last acknowledged renewal was sent after the pause began.
            acked = [s.deadline - (s.ttl - s.safety_margin) for s in rest]
            assert min(acked) > paused_at, (min(acked), paused_at)
        finally:
            for s in sessions:
                s.close()
