"""A cluster of several Raft groups (`serve --groups`, protocol.md 2.4): a lock's group, one
logical session with a session per group, routing to each group's leader, renewals batched per
member, the logical session lost with any of its group sessions; blocking and asyncio clients,
against real servers (conftest: `grouped_server`, one member leading every group,
`grouped_cluster`, three members with the leaders spread, and `replica_cluster`, four members
with each group on three of them)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from pathlib import Path

import pytest
from conftest import (GROUPS, PLACEMENT, REPLICA_GROUPS, group_leaders, names_by_group, run,
                      wait_until, wait_until_async)

import latchkey
import latchkey.aio
from latchkey import _core as core

TTL = 3.0
ROUND = TTL / core.CLIENT_RENEWAL_TTL_DIVISOR

# protocol.md 2.4 and crates/core/src/groups.rs (tests::VECTORS).
VECTORS = [("", 4, 1), ("a", 4, 3), ("jobs/nightly", 8, 4), ("orders/42", 3, 2),
           ("Ünïcödé", 16, 14), ("x", 64, 36)]


# --- Without a server. ----------------------------------------------------------------------
def test_group_of_matches_the_protocol_vectors():
    for name, groups, group in VECTORS:
        assert core.group_of(name, groups) == group, (name, groups)
    # The published FNV-1a 64 of "a"; one group holds every name; session ids name theirs.
    assert core._fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert all(core.group_of(n, 1) == 0 for n in ["", "a", "x/y/z"])
    assert [core.group_of_session(i * 5 + 3, 5) for i in range(1, 4)] == [3, 3, 3]
    # Growing the count moves a name only to the new group (jump hash).
    moved = [n for n in (f"n{i}" for i in range(2000))
             if core.group_of(n, 4) != core.group_of(n, 5)]
    assert moved and all(core.group_of(n, 5) == 4 for n in moved)


def test_the_vectors_are_the_documents_and_the_rust_cores():
    repo = Path(__file__).resolve().parents[3]
    doc, rust = repo / "docs" / "protocol.md", repo / "crates" / "core" / "src" / "groups.rs"
    if not (doc.is_file() and rust.is_file()):
        pytest.skip("not in a repository checkout")
    pattern = r'\("([^"]*)",\s*(\d+),\s*(\d+)\)'
    for text in (doc.read_text(), rust.read_text()):
        found = [(n, int(g), int(e)) for n, g, e in re.findall(pattern, text)]
        assert found == VECTORS


def test_group_sessions_renew_on_one_grid():
    """As session.rs's group_sessions_renew_on_one_grid; a renewal sent a gather window early
    (renewal_wake) is not due again at the instant it was for."""
    ttl, t0 = 15.0, 100.0
    home = core.ClientLease(t0, ttl, grid=t0)
    assert abs(home.next_renewal() - (t0 + 5)) < 1e-9
    late = core.ClientLease(t0 + 2.3, ttl, grid=t0)  # made 2.3 s later: renewed at t0 + 5
    assert abs(late.next_renewal() - (t0 + 5)) < 1e-9
    late.acknowledged(t0 + 5 - core.KEEPALIVE_GATHER_S, ttl)  # sent as it woke, early
    assert abs(late.next_renewal() - (t0 + 10)) < 1e-9
    late.acknowledged(t0 + 10.003, ttl)  # sent a little late
    assert abs(late.next_renewal() - (t0 + 15)) < 1e-9
    for offset in [0.0, 0.001, 0.999, 2.5, 4.999, 5.0, 5.001, 12.345]:
        lease = core.ClientLease(t0 + offset, ttl, grid=t0)
        wake = core.renewal_wake(lease)
        assert t0 + offset < wake <= t0 + offset + 5, offset
    assert core.ClientLease(t0 + 2.3, ttl).next_renewal() == t0 + 2.3 + 5  # no grid


def test_each_group_routes_to_its_own_leader():
    r = core.Route(["a:1", "b:2"])
    r.answered("a:1", 0)
    assert r.reroute("a:1", "b:2", 0.0, group=1)
    assert (r.pick(0), r.pick(1), r.leader) == ("a:1", "b:2", "a:1")
    r.unreachable("b:2", 1.0)  # forgotten as every group's leader
    assert r.pick(0) == "a:1" and 1 not in r.leaders
    f = core.classify(__import__("grpc").StatusCode.UNAVAILABLE, "m", [
        ("latchkey-error", "not-leader"), ("latchkey-leader-addr", "b:2"),
        ("latchkey-group", "2")])
    assert (f.kind, f.leader_addr, f.group) == ("unavailable", "b:2", 2)
    f = core.classify(__import__("grpc").StatusCode.UNAVAILABLE, "m", [
        ("latchkey-error", "not-leader"), ("latchkey-group", str(core.GROUPS_MAX))])
    assert f.group is None  # beyond any cluster: ignored


def test_lists_of_several_groups_merge_in_name_order_and_stop_at_a_truncated_ones_end():
    pb = core.pb

    def answer(names, truncated=False):
        return pb.ListResponse(locks=[pb.LockInfo(name=n, held=True) for n in names],
                               truncated=truncated)

    locks, truncated = core.merge_lists([answer(["b", "d"]), answer(["a", "c", "e"])])
    assert [lock.name for lock in locks] == ["a", "b", "c", "d", "e"] and not truncated
    # Group 1 stopped at "c": names after it may be missing from it, so the merge ends there.
    locks, truncated = core.merge_lists([answer(["b", "d"]), answer(["a", "c"], True)])
    assert [lock.name for lock in locks] == ["a", "b", "c"] and truncated


# --- Against servers. -------------------------------------------------------------------------
def _spy_keepalives(client, log: list, groups: int = GROUPS) -> None:
    """Records each KeepAlive the client sends that a member answers: (member, groups of its
    sessions, refused), in a cluster of `groups` groups."""
    real = client._call
    lock = threading.Lock()

    def call(method, request, **kw):
        out = real(method, request, **kw)
        if method == "KeepAlive":
            with lock:
                log.append((out[1], sorted({s.id % groups for s in request.sessions}),
                            sorted(r.group for r in out[0].refused)))
        return out

    client._call = call


def _just_after_a_keepalive(log: list) -> int:
    """Waits (at most two rounds) until the spy records the next KeepAlive answered, and
    returns the log's length then: the next round's call is about a round away."""
    n = len(log)
    deadline = time.monotonic() + 2 * ROUND
    while len(log) == n:
        assert time.monotonic() < deadline, "no KeepAlive answered within two rounds"
        time.sleep(0.005)
    return len(log)


def _locks_in_every_group(c, s, prefix: str):
    """Locks one name per group three times over; checks each grant's group session, the
    holder the leader reports, strictly increasing tokens per lock, and the merged list."""
    names = names_by_group(GROUPS, prefix)
    tokens = {n: [] for n in names}
    for _ in range(3):
        guards = [s.lock(n, wait=5) for n in names]
        for g, guard in enumerate(guards):
            assert guard.session_id % GROUPS == g, guard
            assert s.session_id_for(guard.name) == guard.session_id
            assert c.describe(guard.name).holder.session_id == guard.session_id
            tokens[guard.name].append(guard.token)
        listed = c.list(prefix)
        assert [(i.name, i.holder.session_id) for i in listed] == sorted(
            (g.name, g.session_id) for g in guards)
        for guard in guards:
            guard.release()
    for n, ts in tokens.items():
        assert ts == sorted(set(ts)), (n, ts)
    assert c.list(prefix) == []
    assert c._groups == GROUPS
    return names


@pytest.mark.parametrize("members", [1, 3])
def test_a_session_takes_locks_in_every_group(request, members):
    servers = request.getfixturevalue("grouped_server" if members == 1 else "grouped_cluster")
    with latchkey.Client([servers[0].addr]) as c:
        with c.session(ttl=TTL, owner="groups") as s:
            _locks_in_every_group(c, s, f"take{members}/")
            assert len(s._group_sessions()) == GROUPS
            assert not s.is_lost()
    # A client that never made a session lists every group too (it asks the count).
    with latchkey.Client([s.addr for s in servers]) as fresh:
        assert fresh.list(f"take{members}/") == [] and fresh._groups == GROUPS


def test_renewals_carry_every_group_in_one_request_per_member(grouped_server):
    """One member leads all three groups: each round is one KeepAlive with the sessions of
    every group, of both logical sessions (the server's counter agrees with the client's)."""
    server = grouped_server[0]
    with latchkey.Client([server.addr]) as c:
        sent: list = []
        _spy_keepalives(c, sent)
        s = c.session(ttl=TTL)
        guards = [s.lock(n, wait=5) for n in names_by_group(GROUPS, "batch/")]
        assert [g.session_id % GROUPS for g in guards] == list(range(GROUPS))
        time.sleep(ROUND)  # the group sessions made after group 0's are on its schedule
        # The window opens and closes just after a KeepAlive was answered, when none is in
        # flight: one sent across either edge would be counted on one side only (a CI run
        # counted 3 on the server against 4 answered).
        start = _just_after_a_keepalive(sent)
        before = server.requests("keep_alive")
        time.sleep(3 * ROUND)
        end = _just_after_a_keepalive(sent)
        counted = server.requests("keep_alive") - before
        window = sent[start:end]
        assert not [g for g in guards if g.is_lost()] and s.failovers() == 0
        # One a round (3 or 4 rounds in the window), not one per group session.
        assert 3 <= len(window) <= 4, window
        assert all(groups == list(range(GROUPS)) and not refused
                   for _, groups, refused in window), window
        assert counted == len(window), (counted, window)
        s.close()


def test_renewals_go_one_request_per_leading_member_and_follow_a_refusal(grouped_cluster):
    leaders = group_leaders(grouped_cluster, GROUPS)
    assert len(leaders) == GROUPS, leaders
    with latchkey.Client([m.addr for m in grouped_cluster]) as c:
        sent: list = []
        _spy_keepalives(c, sent)
        s = c.session(ttl=TTL)
        guards = [s.lock(n, wait=5) for n in names_by_group(GROUPS, "member/")]
        time.sleep(ROUND)
        sent.clear()
        time.sleep(2 * ROUND + 0.2)
        by_member: dict = {}
        for addr, groups, refused in sent:
            assert not refused and groups == sorted(g for g in leaders if leaders[g] == addr)
            by_member[addr] = by_member.get(addr, 0) + 1
        assert set(by_member) == set(leaders.values()), sent
        assert all(2 <= n <= 3 for n in by_member.values()), by_member

        # The client believes group 0's leader leads every group: its one KeepAlive there is
        # refused for the others, whose sessions are then renewed at the hinted leaders.
        deadlines = {gs.id: gs._own_deadline() for gs in s._group_sessions()}
        with c._lock:
            for g in range(GROUPS):
                c._route.leaders[g] = leaders[0]
        sent.clear()
        wait_until("every group session renewed after the misroute",
                   lambda: all(gs._own_deadline() > deadlines[gs.id]
                               for gs in s._group_sessions()), timeout=2 * ROUND)
        first = sent[0]
        others = sorted(g for g in range(GROUPS) if leaders[g] != leaders[0])
        assert first == (leaders[0], list(range(GROUPS)), others), sent
        assert {(a, tuple(gs)) for a, gs, _ in sent[1:len(others) + 1]} >= {
            (leaders[g], (g,)) for g in others if leaders[g] != leaders[0]}, sent
        assert not [g for g in guards if g.is_lost()]
        assert {g: c._pick(g) for g in range(GROUPS)} == leaders
        s.close()


def test_a_revoked_group_session_loses_every_groups_guards(grouped_cluster):
    addrs = [m.addr for m in grouped_cluster]
    names = names_by_group(GROUPS, "revoked/")
    with latchkey.Client(addrs) as c, latchkey.Client(addrs) as admin:
        ttl = 10.0  # long: a lock freed soon after the loss was closed, not expired
        s = c.session(ttl=ttl)
        guards = [s.lock(n, wait=5) for n in names]
        victim = guards[1]
        revoked_at = time.monotonic()
        assert admin.revoke(victim.session_id, reason="test a group session's end") == 1
        # Its client learns it from its next renewal, at most TTL/3 later.
        wait_until("every guard reports lost", lambda: all(g.lost.is_set() for g in guards),
                   timeout=ttl / 3 + 2)
        assert s.is_lost()
        assert all(g.lost.reason for g in guards)
        # The other groups' sessions were closed: their locks are free long before their TTL.
        wait_until("the other groups' locks are free",
                   lambda: not any(admin.describe(n).held for n in names), timeout=3)
        assert time.monotonic() - revoked_at < ttl - 2
        with pytest.raises(latchkey.SessionLost):
            s.lock(names[2], wait=0)
        # The audit log of every group, merged: the revocation, in group 1's log.
        audit = admin.audit()
        assert [(e.action, e.session_id, e.group) for e in audit
                if e.session_id == victim.session_id] == [("revoke", victim.session_id, 1)]
        for g in guards:
            with pytest.raises(latchkey.LockLost):
                g.release()
        s.close()


def test_a_client_of_one_member_reaches_every_group_of_replica_subsets(replica_cluster):
    """`serve --groups 4 --replicas 3` (protocol.md 2.4, "Replica subsets"): member 1 is outside
    group 1 and answers for it with a hint to one of its replicas, which sends the client on to
    the leader. A client given member 1 only holds a lock in every group in one session, reads
    each back, and keeps them all over two renewals, after a renewal of every group's sessions
    sent to member 1 (protocol.md 2.4, "Renewals")."""
    first = replica_cluster[0]
    with latchkey.Client([first.addr], rpc_timeout=1.0) as c:

        def voters() -> dict:
            """{member: {group: voters}} from each member's NodeStatus (read raw: the client's
            NodeStatus has no voters)."""
            out = {}
            for m in replica_cluster:
                answer = c._attempt(m.addr, "NodeStatus", core.pb.NodeStatusRequest(), 1.0, None)
                assert not isinstance(answer, core.Failure), answer
                out[m.id] = {g.group: [v.id for v in g.voters] for g in answer.group_status}
            return out

        # A member knows the voters of its groups and none of the others'. A replica learns
        # them from its group's founder, which may not have reached the last one yet.
        placed = {m.id: {g: v if m.id in v else [] for g, v in PLACEMENT.items()}
                  for m in replica_cluster}
        wait_until("every member knows the placement", lambda: voters() == placed)

        leaders = group_leaders(replica_cluster, REPLICA_GROUPS)
        s = c.session(ttl=TTL)
        names = names_by_group(REPLICA_GROUPS, "replicas/")
        guards = [s.lock(n, wait=5) for n in names]
        assert [g.session_id % REPLICA_GROUPS for g in guards] == list(range(REPLICA_GROUPS))
        for guard in guards:
            holder = c.describe(guard.name).holder
            assert (holder.session_id, holder.token) == (guard.session_id, guard.token), guard
        assert [(i.name, i.holder.session_id, i.holder.token) for i in c.list("replicas/")] == \
            sorted((g.name, g.session_id, g.token) for g in guards)
        # Each group's requests go to its leader, group 1's too, learned through the hints.
        assert {g: c._pick(g) for g in range(REPLICA_GROUPS)} == leaders

        def deadlines() -> dict:
            return {gs.id: gs._own_deadline() for gs in s._group_sessions()}

        def renewed_since(before: dict) -> bool:
            return all(d > before[i] for i, d in deadlines().items())

        # Misrouted just after a renewal round, so that the next one carries every group's
        # sessions at once: the client believes member 1 leads every group, group 1 too. Member
        # 1 renews the sessions of the groups it leads and refuses the others', group 1's with
        # a hint to one of its replicas, rather than failing the request as a whole (which
        # would leave every group unrenewed); the client renews them where the hints lead.
        before = deadlines()
        wait_until("a renewal round", lambda: renewed_since(before), timeout=2 * ROUND)
        sent: list = []
        _spy_keepalives(c, sent, REPLICA_GROUPS)
        before = deadlines()
        with c._lock:
            for g in range(REPLICA_GROUPS):
                c._route.leaders[g] = first.addr
        wait_until("every group session renewed after the misroute",
                   lambda: renewed_since(before), timeout=3 * ROUND)
        misrouted = [(gs, refused) for a, gs, refused in sent if a == first.addr and 1 in gs]
        assert misrouted, sent
        carried, refused = misrouted[0]
        assert len(carried) > 1 and 1 in refused, sent
        assert refused == [g for g in carried if leaders[g] != first.addr], (leaders, sent)
        # Group 1's route followed the hint to its leader (one of its replicas, not member 1).
        assert {g: c._pick(g) for g in range(REPLICA_GROUPS)} == leaders

        before = deadlines()
        time.sleep(2 * ROUND + 0.2)
        assert not [g for g in guards if g.is_lost()] and not s.is_lost()
        assert renewed_since(before)
        for guard in guards:
            assert c.describe(guard.name).holder.token == guard.token, guard
            guard.release()
        assert c.list("replicas/") == []
        s.close()


def test_one_group_names_no_group_in_any_request(server):
    """With one group everything is as before groups: no request names a group."""
    with latchkey.Client([server.addr]) as c:
        requests: list = []
        real = c._call

        def call(method, request, **kw):
            requests.append((method, request))
            return real(method, request, **kw)

        c._call = call
        with c.session(ttl=TTL) as s:
            with s.lock("single/a", wait=5):
                assert [i.name for i in c.list("single/")] == ["single/a"]
                c.audit()
        assert c._groups == 1
        named = [(m, r) for m, r in requests
                 if "group" in r.DESCRIPTOR.fields_by_name and r.HasField("group")]
        assert not named and {m for m, _ in requests} >= {"CreateSession", "List", "Audit"}
        assert "NodeStatus" not in {m for m, _ in requests}


def test_async_session_over_groups(grouped_cluster):
    """The asyncio client: locks in every group with increasing tokens, the merged list, one
    KeepAlive per leading member, and a group session closed behind its back loses them all."""
    addrs = [m.addr for m in grouped_cluster]
    leaders = group_leaders(grouped_cluster, GROUPS)
    names = names_by_group(GROUPS, "aio/")

    async def main():
        async with latchkey.aio.Client(addrs) as c:
            sent: list = []
            real = c._call

            async def call(method, request, **kw):
                out = await real(method, request, **kw)
                if method == "KeepAlive":
                    sent.append((out[1], sorted({x.id % GROUPS for x in request.sessions})))
                return out

            c._call = call
            s = await c.session(ttl=TTL)
            tokens: dict = {n: [] for n in names}
            for round_ in range(3):
                held = [await s.lock(n, wait=5) for n in names]
                assert [g.session_id % GROUPS for g in held] == list(range(GROUPS))
                for g in held:
                    tokens[g.name].append(g.token)
                assert [(i.name, i.holder.token) for i in await c.list("aio/")] == sorted(
                    (g.name, g.token) for g in held)
                if round_ < 2:
                    for g in held:
                        await g.release()
            assert all(ts == sorted(set(ts)) for ts in tokens.values()), tokens
            await asyncio.sleep(ROUND)
            sent.clear()
            await asyncio.sleep(2 * ROUND + 0.2)
            assert sent and all(gs == sorted(g for g in leaders if leaders[g] == addr)
                                for addr, gs in sent), sent
            assert len(sent) <= 3 * len(set(leaders.values())), sent
            assert not s.is_lost()

            # Group 2's session closed behind the client's back: every guard reports lost.
            victim = held[2]
            await c._call("CloseSession", core.pb.CloseSessionRequest(
                session=victim._session._key), attempt_timeout=5.0, group=2)

            async def all_lost():
                return all(g.lost.is_set() for g in held)

            await wait_until_async("every guard reports lost", all_lost, timeout=TTL)
            assert s.is_lost()

            async def all_free():
                return not any([(await c.describe(n)).held for n in names])

            await wait_until_async("every group's lock is free", all_free, timeout=TTL)
            with pytest.raises(latchkey.SessionLost):
                await s.lock(names[0], wait=0)
            await s.close()

    run(main())
