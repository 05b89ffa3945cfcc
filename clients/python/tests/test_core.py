"""The pure parts: lease arithmetic (as crates/client/src/session.rs tests it), window, routing."""

from latchkey import _core as core


def test_margin_is_a_fifth_of_the_ttl_with_a_floor():
    assert core.safety_margin(15) == 3
    assert abs(core.safety_margin(2) - 0.4) < 1e-9
    assert core.safety_margin(1) == 0.2
    assert core.safety_margin(0.5) == 0.2


def test_deadline_is_acked_send_plus_ttl_minus_margin():
    lease = core.ClientLease(100.0, 15.0)
    assert lease.deadline() == 112.0
    assert lease.next_renewal() == 105.0
    lease.acknowledged(105.0, 15.0)
    assert lease.deadline() == 117.0 and lease.next_renewal() == 110.0
    # A late acknowledgement of an older renewal never moves it back.
    lease.acknowledged(101.0, 15.0)
    assert lease.deadline() == 117.0


def test_server_ttl_shorter_than_asked_is_believed():
    lease = core.ClientLease(0.0, 15.0)
    lease.acknowledged(0.0, 10.0)
    assert lease.deadline() == 8.0
    lease.acknowledged(0.0, 0.0)
    assert lease.deadline() == 8.0
    lease.acknowledged(0.0, 60.0)
    assert lease.deadline() == 8.0


def test_failed_renewal_retries_sooner_but_not_past_the_deadline():
    lease = core.ClientLease(0.0, 2.0)
    assert abs(lease.deadline() - 1.6) < 1e-9
    lease.failed(0.7)
    assert abs(lease.next_renewal() - 0.9) < 1e-9
    lease.failed(1.55)
    assert abs(lease.next_renewal() - 1.6) < 1e-9
    lease.acknowledged(1.55, 2.0)
    assert abs(lease.next_renewal() - (1.55 + 2.0 / 3)) < 1e-9


def test_first_renewal_comes_before_the_deadline_for_every_ttl():
    for ttl_ms in (core.SESSION_TTL_MS_MIN, 2_000, 15_000, core.SESSION_TTL_MS_MAX):
        lease = core.ClientLease(0.0, ttl_ms / 1000)
        assert lease.next_renewal() < lease.deadline()


def test_a_request_waits_while_the_oldest_unanswered_one_is_a_window_behind():
    w = core.SeqWindow(1)
    oldest = w.try_begin()
    for expected in range(2, core.SESSION_SEQ_WINDOW_MAX + 1):
        seq = w.try_begin()
        assert seq == expected
        w.end(seq)
    assert w.try_begin() is None
    w.end(oldest)
    assert w.try_begin() == core.SESSION_SEQ_WINDOW_MAX + 1


def test_routing_follows_hints_but_not_to_a_member_that_just_refused():
    r = core.Route(["a:1", "b:2", "c:3"])
    r.answered("a:1")
    r.unreachable("a:1", 0.0)
    assert r.pick() == "b:2"
    assert not r.reroute("b:2", "a:1", 0.1)  # b still names the dead leader
    assert r.pick() == "c:3"
    assert r.reroute("c:3", "b:2", 0.2)
    assert r.pick() == "b:2"
    # Later, a hint to a is trusted again.
    assert r.reroute("b:2", "a:1", 0.1 + core.CLIENT_REFUSED_HINT_IGNORE_MS / 1000)
    assert r.pick() == "a:1"


def test_status_classification():
    import grpc

    C = grpc.StatusCode
    f = core.classify(C.UNAVAILABLE, "m", [("latchkey-error", "not-leader"),
                                           ("latchkey-leader-addr", "h:2")])
    assert f.kind == "unavailable" and f.leader_addr == "h:2"
    assert core.classify(C.UNAVAILABLE, "refused", []).kind == "transport"
    f = core.classify(C.PERMISSION_DENIED, "no", [("latchkey-error", "permission-denied")])
    assert f.kind == "fatal" and f.error.reason == "permission-denied"
    f = core.classify(C.FAILED_PRECONDITION, "old", [("latchkey-error", "request-too-old")])
    assert f.error.__class__.__name__ == "Conflict" and f.error.reason == "request-too-old"


def test_keepalive_batches_take_at_most_the_limit_oldest_first():
    q = core.KeepAliveQueue()

    def waiting(i, attempt=1.0, backoff=0.1, deadline=10.0):
        return core.KeepAliveWaiting(core.pb.Session(id=i, secret=i), attempt, backoff,
                                     deadline, None)

    # Only the first to join an empty queue starts a sender.
    assert q.join(waiting(1))
    assert not q.join(waiting(2))
    for i in range(3, core.KEEPALIVE_SESSIONS_MAX + 3):
        assert not q.join(waiting(i))
    batch = q.take()
    assert [w.session.id for w in batch] == list(range(1, core.KEEPALIVE_SESSIONS_MAX + 1))
    assert len(q) == 2
    assert [w.session.id for w in q.take()] == [core.KEEPALIVE_SESSIONS_MAX + 1,
                                                core.KEEPALIVE_SESSIONS_MAX + 2]
    assert q.take() == [] and q.join(waiting(7))
    # Attempts of its most patient member, backoff of its tightest, until its last member's
    # deadline (as crates/client/src/keepalive.rs `send`).
    b = core.keepalive_batch([waiting(1, 0.2, 0.05, 3.0), waiting(2, 1.0, 0.25, 12.0),
                              waiting(3, 0.6, 0.15, 5.0)])
    assert [s.id for s in b.request.sessions] == [1, 2, 3]
    assert (b.attempt_timeout, b.backoff_max, b.not_after) == (1.0, 0.05, 12.0)
    response = core.pb.KeepAliveResponse(leases=[core.pb.SessionLease(id=2, alive=True)])
    leases = core.leases_by_id(response)
    assert leases[2].alive and 1 not in leases


def test_a_renewal_wakes_a_gather_window_early_but_never_after_its_deadline():
    lease = core.ClientLease(0.0, 3.0)
    assert abs(core.renewal_wake(lease) - (1.0 - core.KEEPALIVE_GATHER_S)) < 1e-9
    lease.failed(2.35)  # a retry is due at the deadline at the latest
    assert abs(core.renewal_wake(lease) - (lease.deadline() - core.KEEPALIVE_GATHER_S)) < 1e-9


def test_the_limits_match_crates_core_limits_rs():
    import re
    from pathlib import Path

    import pytest

    rust = Path(__file__).resolve().parents[3] / "crates" / "core" / "src" / "limits.rs"
    if not rust.is_file():
        pytest.skip("not in a repository checkout")
    text = rust.read_text()

    def value(name):
        m = re.search(rf"pub const {name}: \w+ =\s*([^;]+);", text)
        assert m, f"{name} in limits.rs"
        expr = re.sub(r"(\d)_(?=\d)", r"\1", m.group(1))
        expr = re.sub(r"\b([A-Z][A-Z0-9_]+)\b", lambda n: str(value(n.group(1))), expr)
        assert re.fullmatch(r"[\d\s*+/()-]+", expr), f"{name} = {m.group(1)}"
        return eval(expr)  # noqa: S307 - digits and operators only, checked above

    names = [n for n in dir(core) if n.isupper() and f"pub const {n}:" in text]
    assert len(names) >= 25, names
    for n in names:
        assert getattr(core, n) == value(n), n


def test_a_failover_is_another_node_or_a_retry():
    # As session.rs's a_failover_is_another_node_or_a_retry.
    f = core.FailoverDetector("a:1")
    assert not f.acknowledged("a:1", 0)
    assert f.acknowledged("b:2", 0), "another node answered"
    assert not f.acknowledged("b:2", 0)
    assert f.acknowledged("b:2", 2), "answered after retries"
    f.failed()
    assert f.acknowledged("b:2", 0), "a renewal failed before"
    assert not f.acknowledged("b:2", 0)


def test_admin_input_is_checked_as_the_server_checks_it():
    import pytest

    from latchkey import errors

    core.validate_reason("r" * core.AUDIT_REASON_BYTES_MAX)
    core.validate_reason("x\x1c")  # not whitespace to Rust's trim
    for bad, reason in [("", "reason-empty"), (" \n\u3000\u2028", "reason-empty"),
                        ("r" * (core.AUDIT_REASON_BYTES_MAX + 1), "field-too-long")]:
        with pytest.raises(errors.InvalidArgument) as e:
            core.validate_reason(bad)
        assert e.value.reason == reason
    core.validate_operator("")
    core.validate_operator("o" * core.AUDIT_ACTOR_BYTES_MAX)
    with pytest.raises(errors.InvalidArgument):
        core.validate_operator("é" * (core.AUDIT_ACTOR_BYTES_MAX // 2 + 1))
    assert core.u64_of("t", core.U64_MAX) == 2**64 - 1
    for bad in (-1, 2**64, 1.0, "1", True, None):
        with pytest.raises(errors.InvalidArgument):
            core.u64_of("t", bad)
    assert len(core.operator_of_this_process().encode()) <= core.AUDIT_ACTOR_BYTES_MAX
    with pytest.raises(errors.Conflict) as e:
        core.holder_token(core.LockInfo("x", None, 0, ()))
    assert e.value.reason == "lock-not-held"
    # A name in a lock-delay has no holder to take; ending the delay names the lost grant's
    # token (end_delay), which a name in no delay has not.
    delayed = core.lock_info(core.pb.LockInfo(name="x", delay_remaining_ms=500, delay_token=7))
    assert (delayed.delay_remaining, delayed.delay_token) == (0.5, 7)
    with pytest.raises(errors.Conflict, match="end_delay=True") as e:
        core.holder_token(delayed)
    assert e.value.reason == "lock-not-held"
    assert core.holder_token(delayed, end_delay=True) == 7
    with pytest.raises(errors.Conflict) as e:
        core.holder_token(core.LockInfo("x", None, 0, ()), end_delay=True)
    assert e.value.reason == "no-lock-delay"
    r = core.pb.AuditRecord(index=3, at_ms=9, action="revoke", session=4, locks=2,
                            operator="o", reason="r")
    assert core.audit_entry(r) == core.AuditEntry(3, 9, "revoke", "", 4, 0, 0, 2, None, "o", "r")


def test_lock_info_reads_every_holder_and_the_mode():
    pb = core.pb
    lock = pb.LockInfo(name="jobs", held=True, session=3, token=10, mode=pb.LOCK_MODE_PERMITS,
                       permits=3, holders=[pb.Holder(session=3, token=10),
                                           pb.Holder(session=5, token=11)])
    info = core.lock_info(lock)
    assert info.mode == "permits" and info.permits == 3
    assert [(h.session_id, h.token) for h in info.holders] == [(3, 10), (5, 11)]
    assert info.holder == info.holders[0]
    assert core.own_holder(info, 5).token == 11 and core.own_holder(info, 7) is None
    # A server from before read-write locks names its one holder only.
    old = core.lock_info(pb.LockInfo(name="m", held=True, session=4, token=9))
    assert old.mode == "exclusive" and [h.token for h in old.holders] == [9]
    assert core.lock_info(pb.LockInfo(name="free")).holders == ()


def test_acquire_mode_checks_its_input():
    pb = core.pb
    # (mode, permits, a campaign's value: None for a lock, the lock-delay in ms).
    assert core.acquire_mode() == (pb.LOCK_MODE_EXCLUSIVE, 0, None, 0)
    assert core.acquire_mode(shared=True) == (pb.LOCK_MODE_SHARED, 0, None, 0)
    assert core.acquire_mode(permits=1024) == (pb.LOCK_MODE_PERMITS, 1024, None, 0)
    assert core.campaign_mode("v") == (pb.LOCK_MODE_EXCLUSIVE, 0, b"v", 0)
    # A lock-delay: rounded up to whole ms, at most LOCK_DELAY_MS_MAX, a mutex's only.
    assert core.acquire_mode(lock_delay=0.0005) == (pb.LOCK_MODE_EXCLUSIVE, 0, None, 1)
    assert core.acquire_mode(lock_delay=1.1).lock_delay_ms == 1100
    assert core.acquire_mode(lock_delay=300).lock_delay_ms == core.LOCK_DELAY_MS_MAX
    assert core.acquire_request(core.pb.Session(id=1), 1, "x", 0,
                                core.acquire_mode(lock_delay=2)).lock_delay_ms == 2000
    import pytest
    from latchkey import errors
    for bad in (0, 1025, -1):
        with pytest.raises(errors.PermitsOutOfRange):
            core.acquire_mode(permits=bad)
    for bad in (2.0, "3", True):
        with pytest.raises(errors.InvalidArgument):
            core.acquire_mode(permits=bad)
    with pytest.raises(errors.InvalidArgument):
        core.acquire_mode(shared=True, permits=2)
    for bad in (300.0005, float("inf"), -0.001, float("nan"), "1", True):
        with pytest.raises(errors.InvalidArgument):
            core.acquire_mode(lock_delay=bad)
    for kind in ({"shared": True}, {"permits": 3}):
        with pytest.raises(errors.InvalidArgument, match="a mutex"):
            core.acquire_mode(lock_delay=1, **kind)
