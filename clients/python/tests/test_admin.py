"""The operator's calls (force_release, revoke, audit) and the failover counter, blocking and
asyncio, against real `latchkey serve` processes."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import threading
import time

import pytest

import latchkey
import latchkey.aio
from conftest import Server, free_port, run, wait_leader, wait_until, wait_until_async

# A TTL of 3 s renews every second: a force-release reaches its holder within about that.
TTL = 3.0
FAILOVER_TTL = 6.0


def test_force_release_takes_another_clients_lock_and_is_audited(server):
    with latchkey.Client([server.addr]) as holder_client, \
            latchkey.Client([server.addr]) as admin:
        holder = holder_client.session(ttl=TTL)
        guard = holder.lock("admin/stuck", wait=0)
        lost = threading.Event()
        guard.on_lost(lost.set)
        # Someone waits for it in the admin's client.
        waiter = admin.session(ttl=TTL)
        granted = []
        t = threading.Thread(target=lambda: granted.append(waiter.lock("admin/stuck", wait=20)))
        t.start()
        wait_until("the waiter queued", lambda: admin.describe("admin/stuck").waiters == 1)

        taken = admin.force_release("admin/stuck", reason="stuck deploy, INC-42",
                                    operator="ops@test")
        assert taken == (holder.id, guard.token)
        assert (taken.session_id, taken.token) == (holder.id, guard.token)
        # The lock went on to the waiter, with a higher token.
        t.join(10)
        assert len(granted) == 1 and granted[0].token > guard.token
        assert admin.describe("admin/stuck").holder.session_id == waiter.id
        # The holder's client learns it from its next renewal (revoked_tokens): lost, while
        # its session lives on.
        assert lost.wait(2 * TTL / 3 + 1), "the holder's guard did not report lost"
        assert guard.lost.is_set() and "force-released" in guard.lost_reason
        assert not holder.is_lost()
        with pytest.raises(latchkey.NotHeld):
            guard.release()
        # Its session can still lock.
        other = holder.lock("admin/other", wait=0)
        other.release()

        entries = admin.audit()
        assert len(entries) == 1
        e = entries[0]
        assert isinstance(e, latchkey.AuditEntry)
        assert (e.action, e.lock, e.session_id, e.token, e.next_token) == (
            "force-release", "admin/stuck", holder.id, guard.token, granted[0].token)
        assert (e.reason, e.operator, e.identity) == ("stuck deploy, INC-42", "ops@test", None)
        assert e.at_ms > 0 and e.index > 0

        # Conditional on the token: a stale one is refused, and so is a free lock.
        with pytest.raises(latchkey.Conflict) as c:
            admin.force_release("admin/stuck", token=guard.token, reason="again")
        assert c.value.reason == "token-mismatch"
        granted[0].release()
        with pytest.raises(latchkey.Conflict) as c:
            admin.force_release("admin/stuck", reason="nobody holds it")
        assert c.value.reason == "lock-not-held"
        # Grantable again.
        g = holder.lock("admin/stuck", wait=0)
        assert g.token > granted[0].token
        g.release()
        assert len(admin.audit()) == 1
        holder.close()
        waiter.close()


def test_revoke_ends_a_session_and_its_locks(server):
    with latchkey.Client([server.addr]) as victim_client, latchkey.Client([server.addr]) as admin:
        victim = victim_client.session(ttl=TTL)
        guards = [victim.lock("revoke/a", wait=0), victim.lock("revoke/b", wait=0)]
        assert admin.revoke(victim.id, reason="runaway job", operator="ops@test") == 2
        assert not admin.describe("revoke/a").held and not admin.describe("revoke/b").held
        # The victim's client learns it at its next renewal: every guard lost.
        for g in guards:
            assert g.lost.wait(2 * TTL / 3 + 1), "a revoked session's guard did not report lost"
        assert victim.is_lost()
        with pytest.raises(latchkey.SessionLost):
            victim.lock("revoke/c", wait=0)
        # Gone: a second revoke does not find it.
        with pytest.raises(latchkey.SessionNotFound):
            admin.revoke(victim.id, reason="again")
        e = admin.audit()[-1]
        assert (e.action, e.session_id, e.locks, e.reason, e.lock) == (
            "revoke", victim.id, 2, "runaway job", "")
        # The locks are grantable again.
        with admin.lock("revoke/a", ttl=TTL, wait=0) as g:
            assert g.token > guards[0].token


def test_async_force_release_revoke_and_audit(server):
    async def main():
        async with latchkey.aio.Client([server.addr]) as holder_client, \
                latchkey.aio.Client([server.addr]) as admin:
            holder = await holder_client.session(ttl=TTL)
            guard = await holder.lock("aio-admin/stuck", wait=0)
            taken = await admin.force_release("aio-admin/stuck", reason="stuck")
            assert taken == latchkey.ForceReleased(holder.id, guard.token)
            assert await guard.lost.wait(timeout=2 * TTL / 3 + 1), "guard not lost"
            assert "force-released" in guard.lost_reason and not holder.is_lost()
            with pytest.raises(latchkey.NotHeld):
                await guard.release()
            # Grantable again, to anyone.
            async with admin.lock("aio-admin/stuck", ttl=TTL, wait=0) as g:
                assert g.token > guard.token
            with pytest.raises(latchkey.Conflict):
                await admin.force_release("aio-admin/stuck", reason="free")

            g2 = await holder.lock("aio-admin/b", wait=0)
            assert await admin.revoke(holder.id, reason="runaway") == 1
            assert await g2.lost.wait(timeout=2 * TTL / 3 + 1), "revoked guard not lost"
            assert holder.is_lost()
            with pytest.raises(latchkey.SessionNotFound):
                await admin.revoke(holder.id, reason="again")

            entries = await admin.audit()
            assert [(e.action, e.session_id, e.reason) for e in entries] == [
                ("force-release", holder.id, "stuck"), ("revoke", holder.id, "runaway")]
            # The default operator is this process's user@host, as the CLI's.
            assert entries[0].operator == latchkey._core.operator_of_this_process()
            assert entries[0].lock == "aio-admin/stuck" and entries[0].next_token == 0
            await holder.close()

    run(main())


def test_bad_admin_input_is_refused_before_any_call():
    # No server on this port: any call would be a TransportError, not InvalidArgument.
    policy = latchkey.RetryPolicy(attempts_max=1)
    bad_release = [
        dict(name="", reason="r"),
        dict(name="x" * 513, reason="r"),
        dict(name="a\nb", reason="r"),
        dict(name="ok", reason=""),
        dict(name="ok", reason=" \t\u3000"),
        dict(name="ok", reason="r" * 1025),
        dict(name="ok", reason="é" * 513),  # 1,026 bytes
        dict(name="ok", reason="r", operator="o" * 257),
        dict(name="ok", reason="r", token=-1),
        dict(name="ok", reason="r", token=2**64),
        dict(name="ok", reason="r", token="7"),
        dict(name="ok", reason="r", token=True),
    ]
    bad_revoke = [(1, ""), (-1, "r"), (2**64, "r"), ("1", "r"), (1.0, "r"), (1, "r" * 1025)]
    with latchkey.Client([f"127.0.0.1:{free_port()}"], retry=policy) as c:
        for kw in bad_release:
            name = kw.pop("name")
            with pytest.raises(latchkey.InvalidArgument):
                c.force_release(name, **kw)
        for sid, reason in bad_revoke:
            with pytest.raises(latchkey.InvalidArgument):
                c.revoke(sid, reason=reason)
        with pytest.raises(TypeError):
            c.force_release("ok")  # reason is required
        # What is allowed does reach for the (absent) server.
        with pytest.raises(latchkey.TransportError):
            c.force_release("ok", token=1, reason="r" * 1024, operator="o" * 256)
        with pytest.raises(latchkey.TransportError):
            c.revoke(1, reason="x\x1c")  # U+001C is not whitespace to the server

    async def main():
        async with latchkey.aio.Client([f"127.0.0.1:{free_port()}"], retry=policy) as c:
            with pytest.raises(latchkey.InvalidArgument):
                await c.force_release("ok", reason=" ")
            with pytest.raises(latchkey.InvalidArgument):
                await c.revoke(0, reason="r", operator="o" * 257)

    run(main())


def test_the_servers_reasons_for_bad_admin_input_are_the_clients(client):
    """The same refusals from the server (bypassing the client's checks): InvalidArgument
    with the reasons the client's own checks give."""
    from latchkey._proto import latchkey_pb2 as pb

    for request, reason in [
        (pb.AdminReleaseRequest(name="x", token=1, reason=" "), "reason-empty"),
        (pb.AdminReleaseRequest(name="x", token=1, reason="r" * 1025), "field-too-long"),
        (pb.AdminReleaseRequest(name="x", token=1, reason="r", operator="o" * 257),
         "field-too-long"),
    ]:
        with pytest.raises(latchkey.InvalidArgument) as e:
            client._call("AdminRelease", request, attempt_timeout=5)
        assert e.value.reason == reason
        with pytest.raises(latchkey.InvalidArgument) as mine:
            client.force_release(request.name, token=request.token, reason=request.reason,
                                 operator=request.operator)
        assert mine.value.reason == reason


ADMIN_TOKEN = secrets.token_hex(16)
DEPLOYER_TOKEN = secrets.token_hex(16)


@pytest.fixture
def acl_server(tmp_path):
    def sha(t):
        return hashlib.sha256(t.encode()).hexdigest()

    acl = tmp_path / "acl.toml"
    acl.write_text(f"""[roles.deployer]
lock = ["app/"]
read = ["app/", "probe/"]

[roles.root]
admin = [""]
read = [""]
lock = [""]

[identities.deployer]
token_sha256 = "{sha(DEPLOYER_TOKEN)}"
roles = ["deployer"]

[identities.admin]
token_sha256 = "{sha(ADMIN_TOKEN)}"
roles = ["root"]
""")
    s = Server(tmp_path, extra=["--acl", str(acl)])
    s.start()
    try:
        wait_leader([s], auth_token=ADMIN_TOKEN)
        yield s
    finally:
        s.stop()


def test_under_acl_only_an_admin_may_force_release_revoke_or_read_the_audit(acl_server):
    addr = [acl_server.addr]
    with latchkey.Client(addr, auth_token=DEPLOYER_TOKEN) as deployer, \
            latchkey.Client(addr, auth_token=ADMIN_TOKEN) as admin, \
            latchkey.Client(addr) as anonymous:
        s = deployer.session(ttl=TTL)
        g = s.lock("app/web", wait=0)
        refusals = [
            lambda: deployer.force_release("app/web", reason="mine"),
            lambda: deployer.force_release("app/web", token=g.token, reason="mine"),
            lambda: deployer.revoke(s.id, reason="mine"),
            deployer.audit,
        ]
        for call in refusals:
            with pytest.raises(latchkey.PermissionDenied) as e:
                call()
            assert e.value.reason == "permission-denied"
        with pytest.raises(latchkey.PermissionDenied) as e:
            anonymous.force_release("app/web", token=g.token, reason="who")
        assert e.value.reason == "unauthenticated"
        # Nothing changed.
        assert admin.describe("app/web").holder.token == g.token
        assert admin.audit() == []

        # The admin may; the record names the authenticated identity.
        assert admin.force_release("app/web", reason="ops") == (s.id, g.token)
        assert admin.revoke(s.id, reason="ops") == 0
        assert [(e.action, e.identity) for e in admin.audit()] == [
            ("force-release", "admin"), ("revoke", "admin")]

        async def main():
            async with latchkey.aio.Client(addr, auth_token=DEPLOYER_TOKEN) as c:
                with pytest.raises(latchkey.PermissionDenied):
                    await c.audit()
                with pytest.raises(latchkey.PermissionDenied):
                    await c.revoke(1, reason="x")
            async with latchkey.aio.Client(addr, auth_token=ADMIN_TOKEN) as c:
                assert len(await c.audit()) == 2

        run(main())
        s.close()


def test_the_failover_counter_rises_when_the_leader_is_killed(cluster):
    """Both clients' sessions on one 3-member cluster: no failover while the leader serves,
    one (or more) once it is killed and a new leader acknowledges their renewals."""
    leader = wait_leader(cluster)
    addrs = [s.addr for s in cluster]
    rest = [m for m in cluster if m is not leader]
    # A 6 s lease (as test_sync.py's failover test): a 3 s one leaves 1.4-2.4 s after the
    # kill, about the worst election, and the lock could be lost on a loaded machine.
    with latchkey.Client(addrs) as c:
        s = c.session(ttl=FAILOVER_TTL)
        g = s.lock("failover/sync", wait=5)

        async def main():
            async with latchkey.aio.Client(addrs) as ac:
                a = await ac.session(ttl=FAILOVER_TTL)
                ag = await a.lock("failover/aio", wait=5)
                # Two renewals each by the same leader: no failover.
                await asyncio.sleep(2 * FAILOVER_TTL / 3 + 0.2)
                assert (s.failovers(), a.failovers()) == (0, 0)
                leader.kill9()

                async def counted():
                    return a.failovers() >= 1

                await wait_until_async("the asyncio session counts a failover", counted,
                                       timeout=FAILOVER_TTL + 5)
                assert not ag.lost.is_set() and not a.is_lost()
                assert (await ac.describe("failover/aio")).holder.token == ag.token
                await ag.release()
                await a.close()

        run(main())
        wait_until("the blocking session counts a failover", lambda: s.failovers() >= 1,
                   timeout=FAILOVER_TTL + 5)
        assert not g.lost.is_set() and not s.is_lost()
        n = s.failovers()
        wait_leader(rest)
        # Renewals by the new leader, one after another: no more failovers.
        time.sleep(2 * FAILOVER_TTL / 3 + 0.2)
        assert s.failovers() == n
        assert c.describe("failover/sync").holder.token == g.token
        g.release()
        s.close()
