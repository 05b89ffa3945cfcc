"""The asyncio client (grpc.aio): the same rules as the blocking one, as coroutines and tasks.

    client = latchkey.aio.Client(["127.0.0.1:7420"])
    async with client.lock("name", ttl=15, wait=30) as guard:
        ...            # `await guard.lost.wait()` completes when the lock may be lost
    await client.close()

Each session's renewal is one task, renewing every TTL/3 in KeepAlive batches shared with the
client's other sessions due at the same moment (`_KeepAlives`); cancelling a `session.lock(...)`
(e.g. with asyncio.wait_for) leaves a task that settles the request and releases a late grant.
Everything of one Client must run on one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import grpc
import grpc.aio

from . import _core as core
from . import errors
from ._proto import latchkey_pb2 as pb

log = logging.getLogger("latchkey")

_GRANTED = pb.ACQUIRE_RESULT_GRANTED
_NOT_GRANTED = pb.ACQUIRE_RESULT_NOT_GRANTED
_PENDING = pb.ACQUIRE_RESULT_PENDING
_WHY_CLOSED = "the session was closed"
_WHY_DEADLINE = "no renewal was acknowledged before the lease deadline (TTL minus safety margin)"
_JOIN_S = 10.0
# Longest sleep of LockGuard.contended between looks (see latchkey.client).
_CONTENDED_WAKE_S = 1.0


class _Signal:
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._callbacks: Dict[int, Callable[[], None]] = {}
        self._next = 0

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: Optional[float] = None) -> bool:
        if self._event.is_set():
            return True
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def set(self) -> None:
        if self._event.is_set():
            return
        self._event.set()
        callbacks = list(self._callbacks.values())
        self._callbacks.clear()
        for fn in callbacks:
            try:
                fn()
            except Exception:  # noqa: BLE001
                log.exception("latchkey: a lost callback raised")

    def add(self, fn: Callable[[], None]) -> Callable[[], None]:
        if self._event.is_set():
            fn()
            return lambda: None
        key = self._next
        self._next += 1
        self._callbacks[key] = fn
        return lambda: self._callbacks.pop(key, None)


class LostSignal:
    """Like asyncio.Event: set once the lock may be lost (see latchkey.LostSignal)."""

    def __init__(self, guard: "LockGuard") -> None:
        self._guard = guard
        self._signal = _Signal()

    def is_set(self) -> bool:
        self._guard._session._check_deadline()
        return self._signal.is_set()

    async def wait(self, timeout: Optional[float] = None) -> bool:
        """Completes with True when lost, or False after `timeout` seconds."""
        if self.is_set():
            return True
        return await self._signal.wait(timeout)

    def add_callback(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Calls `fn()` once, on the event loop, when the lock may be lost."""
        self.is_set()
        return self._signal.add(fn)

    @property
    def reason(self) -> Optional[str]:
        return self._guard.lost_reason


class _KeepAlives:
    """The keepalives of one Client's sessions travel together: see latchkey.client._KeepAlives
    (the same rules, with tasks). The first renewal to join an empty batch starts a task that
    lets the others join for KEEPALIVE_GATHER_S, then sends it; further full batches go out on
    tasks of their own. The task is not the first member's: that one may stop waiting (its
    deadline, a close) and the others' renewal must not be cancelled with it."""

    def __init__(self, client: "Client") -> None:
        self._client = client
        self._queue = core.KeepAliveQueue()
        self._tasks: Set[asyncio.Task] = set()

    async def renew(self, session: "Session", *, attempt_timeout: float, backoff_max: float,
                    not_after: float,
                    group: int = 0) -> Tuple[Optional["pb.SessionLease"], str, int]:
        """See latchkey.client._KeepAlives.renew: (lease or None, endpoint, failed attempts)."""
        reply = asyncio.get_running_loop().create_future()
        waiting = core.KeepAliveWaiting(session._key, attempt_timeout, backoff_max, not_after,
                                        reply, group)
        if self._queue.join(waiting):
            try:
                gatherer = self._spawn(self._gather())
            except BaseException:
                # No gatherer: fail the waiting renewals, or the queue would never be empty
                # again and no later renewal would start one.
                self._fail_waiting(errors.ServerError("the keepalive batch could not be sent"))
                raise
            gatherer.add_done_callback(self._after_gatherer)
        # One session's loss (a close, the server dropping it) ends only its own wait.
        lost = asyncio.ensure_future(session._lost.wait())
        try:
            await asyncio.wait({reply, lost}, timeout=max(not_after - core.now(), 0.0),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not reply.done():
                reply.cancel()  # the batch's answer is dropped, not left unretrieved
        if reply.cancelled():
            if session._lost.is_set():
                raise session._lost_error()
            raise errors.TransportError(
                "the keepalive batch was not answered before the session's deadline")
        outcome, lease, addr, failed_attempts = reply.result()
        if isinstance(outcome, errors.LatchkeyError):
            raise outcome
        return lease, addr, failed_attempts

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)
        return task

    def _after_gatherer(self, task: asyncio.Task) -> None:
        """A gatherer cancelled (a task-cancelling shutdown while the client stays in use, also
        before it ever ran) or broken before the queue was empty: fail what waits, or the queue
        would stay non-empty, no renewal would start a gatherer again, and every later renewal
        would wait out its deadline."""
        if task.cancelled() or task.exception() is not None:
            self._fail_waiting(errors.ServerError("the keepalive batch was cancelled"))

    def _fail_waiting(self, error: errors.LatchkeyError) -> None:
        """Fails every renewal waiting for a batch; the queue is left empty, so the next
        renewal starts a gatherer again."""
        while True:
            batch = self._queue.take()
            if not batch:
                return
            self._answer(batch, error, None, "", 0)

    async def _gather(self) -> None:
        await asyncio.sleep(core.KEEPALIVE_GATHER_S)
        while True:
            batch = self._queue.take()
            if not batch:
                return
            last = len(self._queue) == 0
            # In a cluster of several Raft groups, one request per member that leads any of
            # the batch's groups (protocol.md, 2.4).
            parts = core.by_leader(batch, self._client._pick)
            for i, part in enumerate(parts):
                if last and i == len(parts) - 1:
                    # Whoever joins from now on finds the queue empty and starts its own
                    # gatherer.
                    await self._send(part)
                    return
                self._spawn(self._send(part))

    async def _send(self, batch: List[core.KeepAliveWaiting], follow: bool = True) -> None:
        b = core.keepalive_batch(batch)
        outcome: object
        addr, failed_attempts = "", 0
        leases = None
        refused: Dict[int, "pb.GroupRefusal"] = {}
        try:
            outcome, addr, failed_attempts = await self._client._call(
                "KeepAlive", b.request, attempt_timeout=b.attempt_timeout,
                backoff_max=b.backoff_max, not_after=b.not_after, group=batch[0].group)
            leases = core.leases_by_id(outcome)
            refused = core.refusals(outcome, batch)
        except errors.LatchkeyError as e:
            outcome = e  # each member's failure
        except asyncio.CancelledError:
            self._answer(batch, errors.ServerError("the keepalive batch was cancelled"), None,
                         "", 0)
            raise
        except Exception as e:  # noqa: BLE001 - a bug must not leave the members waiting
            log.exception("latchkey: a keepalive batch failed")
            outcome = errors.ServerError(f"the keepalive batch failed: {e!r}")
        if not refused:
            self._answer(batch, outcome, leases, addr, failed_attempts)
            return
        self._answer([w for w in batch if w.group not in refused], outcome, leases, addr,
                     failed_attempts)
        again = [w for w in batch if w.group in refused]
        for part in self._follow(again, refused, addr, follow):
            await self._send(part, follow=False)

    def _follow(self, again: List[core.KeepAliveWaiting], refused: Dict[int, "pb.GroupRefusal"],
                addr: str, follow: bool) -> List[List[core.KeepAliveWaiting]]:
        """See latchkey.client._KeepAlives._follow: the refused groups' routes move to their
        hints, and their sessions go there at once, once (the batches returned)."""
        for g, r in refused.items():
            self._client._reroute(g, addr, r.leader_addr or None)
        retry: List[core.KeepAliveWaiting] = []
        for w in again:
            if follow and self._client._pick(w.group) != addr:
                retry.append(w)
            else:
                r = refused[w.group]
                self._answer([w], errors.Unavailable(
                    f"{addr} did not renew group {r.group}: {r.message} ({r.reason})"),
                    None, "", 0)
        return core.by_leader(retry, self._client._pick)

    @staticmethod
    def _answer(batch: List[core.KeepAliveWaiting], outcome: object,
                leases: Optional[Dict[int, "pb.SessionLease"]], addr: str,
                failed_attempts: int) -> None:
        # An answer, or the error, as a result: an exception nobody retrieves would be logged.
        for w in batch:
            if not w.reply.done():
                lease = None if leases is None else leases.get(w.session.id)
                w.reply.set_result((outcome, lease, addr, failed_attempts))

    async def close(self) -> None:
        """Ends the batches in flight (their members are closed by now)."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_JOIN_S)


class _Coalescer:
    """See latchkey.client._Coalescer (`batch=True`): the operation that finds no batch in
    flight to this member starts a task that sends batches while operations wait and ends when
    none do, so a caller that gives up does not take the others' answers with it."""

    def __init__(self, client: "Client", addr: str) -> None:
        self._client = client
        self._addr = addr
        self._queue = core.BatchQueue()

    def send(self, waiting: core.BatchWaiting) -> None:
        """Queues `waiting`; its `reply` (a Future) is done once `answer` is set."""
        if self._queue.join(waiting):
            task = asyncio.ensure_future(self._drive())
            self._client._batch_tasks.add(task)
            task.add_done_callback(self._client._batch_tasks.discard)

    @staticmethod
    def _answer(batch: List[core.BatchWaiting], answers: List[object]) -> None:
        for w, a in zip(batch, answers):
            w.answer = a
            if not w.reply.done():
                w.reply.set_result(None)

    async def _drive(self) -> None:
        client = self._client
        batch: List[core.BatchWaiting] = []
        try:
            while True:
                batch = self._queue.take()
                if not batch:
                    return
                try:
                    mc = client._callable(self._addr, "Batch")
                    response = await mc(core.batch_request(batch), timeout=client._rpc_timeout,
                                        metadata=client._metadata)
                    answers = core.batch_answers(batch, response)
                except grpc.aio.AioRpcError as e:
                    answers = [core.batch_call_failure(e.code(), e.details(),
                                                       e.trailing_metadata(), self._addr)
                               for _ in batch]
                except errors.LatchkeyError as e:  # the client was closed
                    answers = [core.Failure("fatal", str(e), error=e)] * len(batch)
                self._answer(batch, answers)
                batch = []
        except BaseException:
            # Cancelled (the client closes): what this task carried fails as a cancelled call.
            rest = batch
            while True:
                more = self._queue.take()
                if not more:
                    break
                rest = rest + more
            self._answer(rest, [core.Failure("transport", f"the call to {self._addr} was cancelled")
                                for _ in rest])
            raise


class Client:
    """The asyncio twin of latchkey.Client; same arguments (`batch=True`, the default, included)."""

    def __init__(self, endpoints: Sequence[str], *, ca: Optional[str] = None,
                 cert: Optional[str] = None, key: Optional[str] = None,
                 auth_token: Optional[str] = None,
                 rpc_timeout: float = core.CLIENT_RPC_TIMEOUT_MS_DEFAULT / 1000,
                 retry: Optional[core.RetryPolicy] = None, batch: bool = True) -> None:
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        split = [core.split_endpoint(e) for e in endpoints]
        if not split:
            raise errors.InvalidArgument("no endpoints")
        self._tls = core.read_tls(ca, cert, key)
        if self._tls is None and any(s == "https" for s, _ in split):
            raise errors.InvalidArgument(
                "an https:// endpoint needs the CA that signed the servers' certificates (ca=...)")
        self._metadata = core.auth_metadata(auth_token)
        self._rpc_timeout = float(rpc_timeout)
        self._retry = retry or core.RetryPolicy()
        self._rng = random.Random()
        self._route = core.Route([addr for _, addr in split])
        self._channels: Dict[str, grpc.aio.Channel] = {}
        self._callables: Dict[Tuple[str, str], object] = {}
        self._sessions: Set["Session"] = set()
        self._keepalives = _KeepAlives(self)
        # With `batch`, the operations waiting for a Batch call, per member, and the tasks
        # sending them.
        self._batch = bool(batch)
        self._coalescers: Dict[str, _Coalescer] = {}
        self._batch_tasks: Set["asyncio.Future"] = set()
        # The cluster's Raft group count once an answer said it (see latchkey.Client).
        self._groups: Optional[int] = None
        self._closed = False

    async def session(self, ttl: float = core.SESSION_TTL_MS_DEFAULT / 1000, *,
                      owner: Optional[str] = None) -> "Session":
        """See latchkey.Client.session (one logical session over the Raft groups)."""
        ttl_ms = core.ttl_ms_of(ttl)
        # This process by default (issue #33), as the CLI's sessions say it.
        owner_pb = core.owner_of_this_process(owner or "")
        session = await self._open(ttl_ms, owner_pb, 0, None)
        self._sessions.add(session)
        session._start()
        return session

    def lock(self, name: str, ttl: float = core.SESSION_TTL_MS_DEFAULT / 1000,
             wait: Optional[float] = None, *, owner: Optional[str] = None, shared: bool = False,
             permits: Optional[int] = None,
             lock_delay: Optional[float] = None) -> "_SessionLock":
        """`async with client.lock("name", ttl=15, wait=30) as guard:`; see latchkey.Client.lock."""
        # Bad input fails here, before any call.
        return _SessionLock(self, name, ttl, wait, owner,
                            core.acquire_mode(shared, permits, lock_delay))

    def campaign(self, name: str, value, ttl: float = core.SESSION_TTL_MS_DEFAULT / 1000,
                 wait: Optional[float] = None, *, owner: Optional[str] = None) -> "_SessionLock":
        """`async with client.campaign("svc/leader", "10.0.0.1:80") as leadership:`; see
        latchkey.Client.campaign."""
        return _SessionLock(self, name, ttl, wait, owner, core.campaign_mode(value))

    async def leader(self, name: str) -> Optional[core.Leader]:
        """See latchkey.Client.leader."""
        return core.leader_of(await self.describe(name))

    async def observe(self, name: str) -> "Observe":
        """`async for leader in await client.observe(name):`; see latchkey.Client.observe."""
        core.validate_name(name)
        observe = Observe(self, name)
        await observe._start()
        return observe

    async def describe(self, name: str) -> core.LockInfo:
        return (await self._describe_read(name))[0]

    async def _describe_read(self, name: str) -> Tuple[core.LockInfo, int]:
        """See latchkey.Client._describe_read."""
        core.validate_name(name)
        response, _, _ = await self._call("Describe", pb.DescribeRequest(name=name),
                                          attempt_timeout=self._rpc_timeout,
                                          group=self._group_of_lock(name))
        if not response.HasField("lock"):
            raise errors.ProtocolError("Describe answered without a lock")
        return core.lock_info(response.lock), response.read_index

    async def list(self, prefix: str = "") -> List[core.LockInfo]:
        """See latchkey.Client.list: with several Raft groups, each group's at its leader
        (at once), merged."""
        groups = self._groups
        if groups is None or groups == 1:
            try:
                response, _, _ = await self._call("List", pb.ListRequest(prefix=prefix),
                                                  attempt_timeout=self._rpc_timeout)
                return [core.lock_info(lock) for lock in response.locks]
            except errors.Conflict as e:
                if groups is not None or e.reason != "not-with-groups":
                    raise
            groups = await self._ask_groups()
        answers = await asyncio.gather(*(
            self._call("List", pb.ListRequest(prefix=prefix, group=g),
                       attempt_timeout=self._rpc_timeout, group=g)
            for g in range(groups)))
        return core.merge_lists([response for response, _, _ in answers])[0]

    async def force_release(self, name: str, *, token: Optional[int] = None, reason: str,
                            operator: Optional[str] = None,
                            end_delay: bool = False) -> core.ForceReleased:
        """See latchkey.Client.force_release."""
        token, operator = core.check_admin_release(name, token, reason, operator)
        if token is None:
            token = core.holder_token(await self.describe(name), end_delay)
        response, _, _ = await self._call(
            "AdminRelease", core.admin_release_request(name, token, reason, operator, end_delay),
            attempt_timeout=self._rpc_timeout, group=self._group_of_lock(name))
        return core.ForceReleased(response.session, response.token)

    async def revoke(self, session_id: int, *, reason: str,
                     operator: Optional[str] = None) -> int:
        """See latchkey.Client.revoke: how many locks the session held."""
        request = core.check_admin_revoke(session_id, reason, operator)
        response, _, _ = await self._call("AdminRevoke", request,
                                          attempt_timeout=self._rpc_timeout,
                                          group=self._group_of_session(request.session))
        return response.locks

    async def audit(self) -> List[core.AuditEntry]:
        """See latchkey.Client.audit: the audit log, oldest first (every group's, merged)."""
        groups = self._groups
        if groups is None or groups == 1:
            try:
                response, _, _ = await self._call("Audit", pb.AuditRequest(),
                                                  attempt_timeout=self._rpc_timeout)
                return [core.audit_entry(r) for r in response.records]
            except errors.Conflict as e:
                if groups is not None or e.reason != "not-with-groups":
                    raise
            groups = await self._ask_groups()
        answers = await asyncio.gather(*(
            self._call("Audit", pb.AuditRequest(group=g), attempt_timeout=self._rpc_timeout,
                       group=g)
            for g in range(groups)))
        records = [core.audit_entry(r) for response, _, _ in answers for r in response.records]
        records.sort(key=lambda r: r.at_ms)  # stable: one group's records stay in log order
        return records

    async def close(self) -> None:
        for s in list(self._sessions):
            try:
                await s.close()
            except errors.LatchkeyError as e:
                log.debug("latchkey: closing session %s: %s", s.id, e)
        await self._keepalives.close()
        batch_tasks = list(self._batch_tasks)
        for t in batch_tasks:
            t.cancel()
        if batch_tasks:
            await asyncio.wait(batch_tasks, timeout=_JOIN_S)
        self._closed = True
        channels = list(self._channels.values())
        self._channels.clear()
        self._callables.clear()
        for c in channels:
            await c.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # --- Raft groups (see latchkey.Client) --------------------------------------------------
    def _learn_groups(self, answered: int, what: str) -> int:
        groups = core.checked_groups(answered, what)
        if self._groups is None:
            self._groups = groups
        if self._groups != groups:
            raise errors.ProtocolError(
                f"{what} answered {groups} Raft groups, and the cluster {self._groups} before")
        return groups

    async def _ask_groups(self) -> int:
        if self._groups is not None:
            return self._groups
        response, _, _ = await self._call("NodeStatus", pb.NodeStatusRequest(),
                                          attempt_timeout=self._rpc_timeout,
                                          group=core.ANY_MEMBER)
        return self._learn_groups(response.groups, "NodeStatus")

    def _group_of_lock(self, name: str) -> Optional[int]:
        groups = self._groups
        return None if groups is None else core.group_of(name, groups)

    def _group_of_session(self, session_id: int) -> Optional[int]:
        groups = self._groups
        return None if groups is None else core.group_of_session(session_id, groups)

    def _pick(self, group: int) -> str:
        return self._route.pick(group)

    def _reroute(self, group: int, addr: str, hint: Optional[str]) -> None:
        self._route.reroute(addr, hint, core.now(), group)

    async def _open(self, ttl_ms: int, owner: Optional["pb.Owner"], group: int,
                    root: Optional["Session"]) -> "Session":
        """See latchkey.Client._open: a session in `group`, not started."""
        request = pb.CreateSessionRequest(ttl_ms=ttl_ms)
        if owner is not None:
            request.owner.CopyFrom(owner)
        if group != 0 or (self._groups or 1) > 1:
            request.group = group
        sent = core.now()
        try:
            response, addr, _ = await self._call("CreateSession", request,
                                                 attempt_timeout=self._rpc_timeout, group=group)
        except errors.Conflict as e:
            if e.reason != "not-with-groups" or request.HasField("group"):
                raise
            request.group = group
            sent = core.now()
            response, addr, _ = await self._call("CreateSession", request,
                                                 attempt_timeout=self._rpc_timeout, group=group)
        if not response.HasField("session"):
            raise errors.ProtocolError("CreateSession answered without a session")
        groups = self._learn_groups(response.groups, "CreateSession")
        if core.group_of_session(response.session.id, groups) != group:
            raise errors.ProtocolError(f"CreateSession in group {group} answered session "
                                       f"{response.session.id}, of another group")
        if groups > 1:
            grid: Optional[float] = sent if root is None else root._lease.grid
        else:
            grid = None
        lease = core.ClientLease(sent, ttl_ms / 1000, grid)
        lease.acknowledged(sent, response.ttl_ms / 1000)
        return Session(self, response.session, lease, addr, group=group, groups=groups,
                       root=root, owner=owner)

    def _channel(self, addr: str) -> grpc.aio.Channel:
        if self._closed:
            raise errors.InvalidArgument("the client is closed")
        channel = self._channels.get(addr)
        if channel is None:
            if self._tls is not None:
                creds = grpc.ssl_channel_credentials(self._tls.ca, self._tls.key, self._tls.cert)
                channel = grpc.aio.secure_channel(addr, creds, core.CHANNEL_OPTIONS)
            else:
                channel = grpc.aio.insecure_channel(addr, core.CHANNEL_OPTIONS)
            self._channels[addr] = channel
        return channel

    def _stream_callable(self, addr: str, method: str):
        """A server-streaming method (Watch) on `addr`'s channel."""
        req, resp = core.STREAM_METHODS[method]
        return self._channel(addr).unary_stream(core.method_path(method),
                                                request_serializer=req.SerializeToString,
                                                response_deserializer=resp.FromString)

    def _callable(self, addr: str, method: str):
        mc = self._callables.get((addr, method))
        if mc is None:
            channel = self._channel(addr)
            req, resp = core.METHODS[method]
            mc = channel.unary_unary(core.method_path(method),
                                     request_serializer=req.SerializeToString,
                                     response_deserializer=resp.FromString)
            self._callables[(addr, method)] = mc
        return mc

    async def _attempt_batched(self, addr: str, method: str, request, timeout: float,
                               session: Optional["Session"]):
        """See latchkey.Client._attempt_batched."""
        waiting = core.BatchWaiting(core.BATCH_OPS[method], request,
                                    asyncio.get_running_loop().create_future())
        c = self._coalescers.get(addr)
        if c is None:
            c = self._coalescers[addr] = _Coalescer(self, addr)
        c.send(waiting)
        waiter = asyncio.ensure_future(session._lost.wait()) if session is not None else None
        try:
            waits = {waiting.reply} if waiter is None else {waiting.reply, waiter}
            # The batch in flight, then this one: each bounded by rpc_timeout.
            await asyncio.wait(waits, timeout=timeout + self._rpc_timeout + 1.0,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            if waiter is not None:
                waiter.cancel()
        answer = waiting.answer
        if answer is None:
            if session is not None and session._lost.is_set():
                raise session._lost_error()
            return core.Failure("transport", f"{addr} did not answer within {timeout:.1f}s")
        return answer

    async def _attempt(self, addr: str, method: str, request, timeout: float,
                       session: Optional["Session"], batch: bool = False):
        if batch and self._batch:
            return await self._attempt_batched(addr, method, request, timeout, session)
        call = self._callable(addr, method)(request, timeout=timeout, metadata=self._metadata)
        task = asyncio.ensure_future(call)
        waiter = asyncio.ensure_future(session._lost.wait()) if session is not None else None
        try:
            waits = {task} if waiter is None else {task, waiter}
            done, _ = await asyncio.wait(waits, timeout=timeout + 1.0,
                                         return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            call.cancel()
            task.cancel()
            raise
        finally:
            if waiter is not None:
                waiter.cancel()
        if task not in done:
            call.cancel()
            task.cancel()
            if session is not None and session._lost.is_set():
                raise session._lost_error()
            return core.Failure("transport", f"{addr} did not answer within {timeout:.1f}s")
        try:
            return task.result()
        except asyncio.CancelledError:
            return core.Failure("transport", f"the call to {addr} was cancelled")
        except grpc.aio.AioRpcError as e:
            failure = core.classify(e.code(), e.details(), e.trailing_metadata())
            if failure.kind == "transport":
                failure.message = f"cannot reach {addr}: {failure.message}"
            return failure

    async def _call(self, method: str, request, *, attempt_timeout: float,
                    backoff_max: Optional[float] = None, session: Optional["Session"] = None,
                    not_after: Optional[float] = None, group: Optional[int] = 0,
                    batch: bool = False):
        """See latchkey.Client._call (to the leader of Raft group `group`). Returns (response,
        endpoint that answered, failed attempts)."""
        policy = self._retry
        start = core.now()
        backoff = policy.backoff(backoff_max, self._rng)
        attempts = 0
        failure = core.Failure("transport", "no attempt was made before the deadline")
        # Whether an attempt reached a server: until one has, the shorter budget applies.
        reached = False
        # The seeds not tried yet by this call (see RetryPolicy.budget).
        untried = set(self._route.seeds)
        while True:
            if session is not None and session._lost.is_set():
                raise session._lost_error()
            timeout = attempt_timeout
            if not_after is not None:
                timeout = min(timeout, not_after - core.now())
                if timeout <= 0:
                    raise core.give_up(failure, attempts, core.now() - start)
            attempts += 1
            route_group = 0 if group is None else group
            addr = self._route.pick(route_group)
            untried.discard(addr)
            outcome = await self._attempt(addr, method, request, timeout, session, batch)
            if not isinstance(outcome, core.Failure):
                self._route.answered(addr, route_group)
                return outcome, addr, attempts - 1
            failure = outcome
            if failure.kind == "fatal":
                assert failure.error is not None
                raise failure.error
            if failure.group is not None:
                # The error's group: its leader hint is that group's leader.
                if group is None:
                    group = route_group = failure.group
                elif self._groups is not None and failure.group < self._groups:
                    route_group = failure.group
            if failure.kind == "unavailable":
                hinted = self._route.reroute(addr, failure.leader_addr, core.now(), route_group)
            else:
                self._route.unreachable(addr, core.now())
                hinted = False
            reached = reached or failure.kind != "transport" or failure.connected
            budget = policy.budget(reached, bool(untried))
            elapsed = core.now() - start
            if attempts >= policy.attempts_max or elapsed >= budget:
                raise core.give_up(failure, attempts, elapsed)
            if not (hinted and attempts == 1):
                delay = min(backoff.next_delay(), budget - elapsed)
                if not_after is not None:
                    delay = min(delay, not_after - core.now())
                if session is not None:
                    if await session._lost.wait(max(delay, 0.0)):
                        raise session._lost_error()
                else:
                    await asyncio.sleep(max(delay, 0.0))


class Session:
    """See latchkey.Session; `await session.lock(name, wait)`, `await session.close()`. In a
    cluster of several Raft groups, group 0's session and the logical session (its sessions
    in the other groups made at the first lock of each)."""

    def __init__(self, client: Client, key: "pb.Session", lease: core.ClientLease,
                 endpoint: str, *, group: int = 0, groups: int = 1,
                 root: Optional["Session"] = None, owner: Optional["pb.Owner"] = None) -> None:
        self._client = client
        self._key = pb.Session(id=key.id, secret=key.secret)
        self.id: int = key.id
        self.ttl: float = lease.ttl
        self._lease = lease
        self._window = core.SeqWindow(1)
        self._window_waiters: List[asyncio.Future] = []
        self._deadline = lease.deadline()
        self._lost = _Signal()
        self._lost_why: Optional[str] = None
        self._guards: Set["LockGuard"] = set()
        self._taken: Tuple[frozenset, int] = (frozenset(), 0)
        # Conflict events: the held names the last keepalive answer said someone waits for,
        # and an event set (then replaced) at each change.
        self._contended: frozenset = frozenset()
        self._contended_changed = asyncio.Event()
        self._failover_detector = core.FailoverDetector(endpoint)
        self._failovers = 0
        self._waits = asyncio.BoundedSemaphore(core.SESSION_WAITS_IN_FLIGHT_MAX)
        self._short = asyncio.BoundedSemaphore(core.SESSION_SHORT_REQUESTS_IN_FLIGHT_MAX)
        self._background: Set[asyncio.Task] = set()
        self._closed = False
        self._renewal: Optional[asyncio.Task] = None
        # Raft groups: see latchkey.Session (the others by group, at most GROUPS_MAX, and a
        # lock per group held while its session is made).
        self._group = group
        self._groups = groups
        self._root: Session = self if root is None else root
        self._owner = owner
        self._others: Dict[int, Session] = {}
        self._making: Dict[int, asyncio.Lock] = {}

    def _start(self) -> None:
        self._renewal = asyncio.ensure_future(self._renew())

    @property
    def safety_margin(self) -> float:
        return core.safety_margin(self.ttl)

    @property
    def deadline(self) -> float:
        """See latchkey.Session.deadline: the earliest of its group sessions'."""
        return min(s._deadline for s in self._group_sessions())

    def is_lost(self) -> bool:
        self._check_deadline()
        return self._lost.is_set()

    def failovers(self) -> int:
        """See latchkey.Session.failovers: renewals acknowledged by another node than the
        previous one, or only after failed attempts (summed over its group sessions)."""
        return sum(s._failovers for s in self._group_sessions())

    async def session_id_for(self, name: str) -> int:
        """See latchkey.Session.session_id_for: the id of the session that takes `name`."""
        core.validate_name(name)
        if self.is_lost():
            raise self._lost_error()
        return (await self._for_lock(name)).id

    async def lock(self, name: str, wait: Optional[float] = None, *, shared: bool = False,
                   permits: Optional[int] = None, lock_delay: Optional[float] = None,
                   positions: Optional[Callable[[int], None]] = None) -> "LockGuard":
        """See latchkey.Session.lock (`positions` is called on the event loop). Cancelling it
        settles the request in the background."""
        core.validate_name(name)
        return await self._take(name, core.wait_of(wait),
                                core.acquire_mode(shared, permits, lock_delay), positions)

    async def campaign(self, name: str, value, wait: Optional[float] = None) -> "Leadership":
        """See latchkey.Session.campaign. Cancelling it settles the request in the background
        (a late grant is resigned)."""
        core.validate_name(name)
        guard = await self._take(name, core.wait_of(wait), core.campaign_mode(value))
        assert isinstance(guard, Leadership)
        return guard

    async def _take(self, name: str, wait: Optional[float], mode: core.AcquireMode,
                    positions: Optional[Callable[[int], None]] = None) -> "LockGuard":
        if self.is_lost():
            raise self._lost_error()
        session = await self._for_lock(name)
        async with session._waits:
            deadline = None if wait is None else core.now() + wait
            while True:
                guard = await session._lock_once(name, mode, deadline, positions)
                if guard is not None:
                    return guard

    async def lock_shared(self, name: str, wait: Optional[float] = None) -> "LockGuard":
        """See latchkey.Session.lock_shared: `name` as a reader of a read-write lock."""
        return await self.lock(name, wait, shared=True)

    async def acquire_permit(self, name: str, permits: int,
                             wait: Optional[float] = None) -> "LockGuard":
        """See latchkey.Session.acquire_permit: one of the semaphore `name`'s `permits`."""
        return await self.lock(name, wait, permits=permits)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._mark_lost(_WHY_CLOSED)
        sessions = self._group_sessions()
        for s in sessions:
            s._closed = True
        tasks = [t for s in sessions for t in [s._renewal, *s._background] if t is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=_JOIN_S)
        self._client._sessions.discard(self)
        # Every group's session, each at its group's leader, at once; the first error wins.
        results = await asyncio.gather(*(s._close_on_server() for s in sessions),
                                       return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # --- Raft groups -----------------------------------------------------------------------
    def _group_sessions(self) -> "List[Session]":
        root = self._root
        return [root, *(root._others[g] for g in sorted(root._others))]

    async def _for_lock(self, name: str) -> "Session":
        """See latchkey.Session._for_lock: made on the first use of its group."""
        root = self._root
        if root._groups <= 1:
            return root
        group = core.group_of(name, root._groups)
        if group == root._group:
            return root
        made = root._others.get(group)
        if made is not None:
            return made
        making = root._making.setdefault(group, asyncio.Lock())
        async with making:
            made = root._others.get(group)
            if made is not None:
                return made
            if root._lost_why is not None:
                raise root._lost_error()
            made = await root._client._open(int(round(root.ttl * 1000)), root._owner, group,
                                            root)
            if root._lost_why is not None:
                # Lost (or closed) while this one was made: it is given up at once.
                made._mark_lost_here(root._lost_why)
                try:
                    await made._close_on_server()
                except errors.LatchkeyError as e:
                    log.debug("latchkey: closing session %d: %s", made.id, e)
                raise root._lost_error()
            root._others[group] = made
            made._start()
            return made

    async def _close_on_server(self) -> None:
        try:
            await self._client._call("CloseSession", pb.CloseSessionRequest(session=self._key),
                                     attempt_timeout=self._client._rpc_timeout,
                                     group=self._group, batch=True)
        except errors.SessionNotFound:
            pass

    def _mark_lost(self, why: str) -> None:
        """Lost in any group, the logical session is lost in every group."""
        root = self._root
        if not root._mark_lost_here(why):
            return
        for s in list(root._others.values()):
            s._mark_lost_here(why)

    def _mark_lost_here(self, why: str) -> bool:
        if self._lost_why is not None:
            return False
        self._lost_why = why
        if why != _WHY_CLOSED and self._root is self:
            log.warning("latchkey: session %d lost: %s", self.id, why)
        self._lost.set()
        self._wake_window_waiters()
        for g in list(self._guards):
            g._lost_signal._signal.set()
        return True

    def _check_deadline(self) -> None:
        if self._root._lost_why is not None:
            return
        at = core.now()
        for s in self._group_sessions():
            if at >= s._deadline:
                s._mark_lost(_WHY_DEADLINE)
                return

    def _lost_error(self) -> errors.SessionLost:
        return errors.SessionLost(self.id, self._lost_why or _WHY_DEADLINE)

    def _checked(self, e: errors.LatchkeyError) -> errors.LatchkeyError:
        if isinstance(e, errors.SessionNotFound):
            self._mark_lost(f"the server does not know the session: {e.message}")
            return self._lost_error()
        return e

    async def _renew(self) -> None:
        await self._renew_until_lost()
        if self._root._groups > 1 and self._lost_why != _WHY_CLOSED:
            # Lost (here or in another group): this group's locks are given up as well.
            try:
                await self._close_on_server()
            except errors.LatchkeyError as e:
                log.debug("latchkey: closing session %d: %s", self.id, e)

    async def _renew_until_lost(self) -> None:
        lease = self._lease
        client = self._client
        while True:
            # A gather window early: see _core.KEEPALIVE_GATHER_S.
            wake_at = core.renewal_wake(lease)
            if await self._lost.wait(max(wake_at - core.now(), 0.0)):
                return
            sent = core.now()
            if sent >= lease.deadline():
                break
            if sent < wake_at:
                continue
            try:
                # With every other session of this client due now, in one KeepAlive per
                # member that leads any of their groups.
                answer, addr, failed_attempts = await client._keepalives.renew(
                    self,
                    attempt_timeout=min(client._rpc_timeout, core.renewal_attempt_timeout(lease.ttl)),
                    backoff_max=core.renewal_backoff_max(lease.ttl),
                    not_after=lease.deadline(), group=self._group)
            except errors.SessionLost:
                return
            except errors.SessionNotFound as e:
                self._mark_lost(f"the server does not know the session: {e.message}")
                return
            except errors.LatchkeyError as e:
                log.warning("latchkey: renewal of session %d failed; retrying: %s", self.id, e)
                self._failover_detector.failed()
                lease.failed(core.now())
                continue
            if core.now() >= lease.deadline():
                break
            if answer is None:
                lease.failed(core.now())
                continue
            if not answer.alive:
                self._mark_lost("the server says the session has expired")
                return
            self._taken_now(frozenset(answer.revoked_tokens), answer.revoked_through)
            self._contended_now(answer.contended, answer.contended_truncated)
            lease.acknowledged(sent, answer.ttl_ms / 1000)
            self._deadline = lease.deadline()
            if self._failover_detector.acknowledged(addr, failed_attempts):
                self._failovers += 1
                log.info("latchkey: session %d renewed after a failover (by %s)", self.id, addr)
        self._mark_lost(_WHY_DEADLINE)

    def _contended_now(self, names: Sequence[str], truncated: bool) -> None:
        """See latchkey.Session._contended_now."""
        new = core.merge_contended(self._contended, names, truncated)
        if new == self._contended:
            return
        self._contended = new
        changed, self._contended_changed = self._contended_changed, asyncio.Event()
        changed.set()

    def _forget_contended(self, name: str) -> None:
        """See latchkey.Session._forget_contended."""
        if name in self._contended:
            self._contended = self._contended - {name}

    def _taken_now(self, tokens: frozenset, through: int) -> None:
        if (tokens, through) == self._taken:
            return
        self._taken = (tokens, through)
        for g in [g for g in self._guards if g._taken()]:
            log.warning("latchkey: an operator force-released lock %r (token %d)", g.name, g.token)
            g._lost_signal._signal.set()

    async def _begin(self) -> int:
        while True:
            if self._lost_why is not None:
                raise self._lost_error()
            seq = self._window.try_begin()
            if seq is not None:
                return seq
            moved = asyncio.get_running_loop().create_future()
            self._window_waiters.append(moved)
            await moved

    def _end(self, seq: int) -> None:
        self._window.end(seq)
        self._wake_window_waiters()

    def _wake_window_waiters(self) -> None:
        waiters, self._window_waiters = self._window_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def _acquire_once(self, name: str, mode: core.AcquireMode, seq: int,
                            deadline: Optional[float], not_after: Optional[float],
                            first: bool = False):
        if deadline is None:
            wait_ms = core.WAIT_TIMEOUT_MS_MAX
        else:
            wait_ms = min(max(int((deadline - core.now()) * 1000), 0), core.WAIT_TIMEOUT_MS_MAX)
        request = core.acquire_request(self._key, seq, name, wait_ms, mode)
        if first and self._client._batch:
            # In a batch a request that must wait answers PENDING at once: the next send of
            # it is a call of its own, which long-polls.
            try:
                response, _, _ = await self._client._call(
                    "Acquire", request, attempt_timeout=self._client._rpc_timeout,
                    backoff_max=core.CLIENT_ACQUIRE_BACKOFF_MS_MAX / 1000,
                    session=self, not_after=not_after, group=self._group, batch=True)
            except errors.LatchkeyError as e:
                raise self._checked(e) from None
            return response
        try:
            response, _, _ = await self._client._call(
                "Acquire", request,
                attempt_timeout=core.ACQUIRE_POLL_MS_MAX / 1000 + self._client._rpc_timeout,
                backoff_max=core.CLIENT_ACQUIRE_BACKOFF_MS_MAX / 1000,
                session=self, not_after=not_after, group=self._group)
        except errors.LatchkeyError as e:
            raise self._checked(e) from None
        return response

    async def _lock_once(self, name: str, mode: core.AcquireMode, deadline: Optional[float],
                         positions: Optional[Callable[[int], None]] = None
                         ) -> Optional["LockGuard"]:
        seq = await self._begin()
        armed = True
        try:
            give_up_at = None if deadline is None else (
                deadline + core.CLIENT_UNANSWERED_AFTER_DEADLINE_MS_MAX / 1000)
            first = True
            while True:
                polled_at = core.now()
                try:
                    response = await self._acquire_once(name, mode, seq, deadline, give_up_at,
                                                        first)
                    first = False
                except (errors.Unavailable, errors.TransportError):
                    if give_up_at is None or core.now() < give_up_at:
                        continue
                    raise errors.WaitTimeout(name) from None
                except errors.SessionLost:
                    armed = False
                    raise
                except errors.Conflict as e:
                    if e.reason == "request-too-old":
                        armed = False
                        self._spawn(self._release_orphan(name))
                    raise
                if response.result == _GRANTED:
                    armed = False
                    if mode.value is not None:
                        return Leadership(self, name, response.token, mode.value)
                    return LockGuard(self, name, response.token)
                if response.result == _NOT_GRANTED:
                    armed = False
                    if deadline is None:
                        return None
                    if response.HasField("held_by") and response.held_by.held:
                        raise errors.LockHeld(name, core.lock_info(response.held_by).holder)
                    raise errors.WaitTimeout(name)
                if response.result == _PENDING:
                    if positions is not None:
                        positions(response.position)
                    if deadline is not None and polled_at > (
                            deadline + core.CLIENT_PENDING_AFTER_DEADLINE_MS_MAX / 1000):
                        raise errors.WaitTimeout(name)
                    continue
                armed = False
                raise errors.ProtocolError(f"Acquire answered an unknown result {response.result}")
        finally:
            if armed and self._lost_why is None:
                self._spawn(self._settle(name, mode, seq, deadline))
            else:
                self._end(seq)

    def _spawn(self, coro) -> None:
        if self._closed:
            coro.close()
            return

        async def run() -> None:
            try:
                await coro
            except errors.LatchkeyError as e:
                log.debug("latchkey: background clean-up of session %d: %s", self.id, e)

        task = asyncio.ensure_future(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _settle(self, name: str, mode: core.AcquireMode, seq: int,
                      deadline: Optional[float]) -> None:
        try:
            while self._lost_why is None:
                try:
                    response = await self._acquire_once(name, mode, seq, deadline, None)
                except (errors.Unavailable, errors.TransportError):
                    continue
                except errors.Conflict as e:
                    if e.reason == "request-too-old":
                        await self._release_orphan(name)
                    return
                if response.result == _PENDING:
                    continue
                if response.result == _GRANTED:
                    log.debug("latchkey: releasing %r, granted after its wait was abandoned", name)
                    await self._release_on_server(name, response.token)
                return
        finally:
            self._end(seq)

    async def _release_orphan(self, name: str) -> None:
        # Of a name with several holders (readers, permits), this session's grant.
        mine = core.own_holder(await self._client.describe(name), self.id)
        if mine is None:
            return
        if any(g.name == name for g in self._guards):
            return
        await self._release_on_server(name, mine.token)

    async def _release_on_server(self, name: str, token: int) -> None:
        async with self._short:
            seq = await self._begin()
            try:
                request = pb.ReleaseRequest(session=self._key, seq=seq, name=name, token=token)
                response, _, _ = await self._client._call(
                    "Release", request, attempt_timeout=self._client._rpc_timeout, session=self,
                    group=self._group, batch=True)
            except errors.LatchkeyError as e:
                raise self._checked(e) from None
            finally:
                self._end(seq)
        if not response.released:
            raise errors.NotHeld(name, token)

    async def _proclaim_on_server(self, name: str, token: int, value: bytes) -> None:
        async with self._short:
            seq = await self._begin()
            try:
                request = pb.ProclaimRequest(session=self._key, seq=seq, name=name, token=token,
                                             value=value)
                await self._client._call("Proclaim", request,
                                         attempt_timeout=self._client._rpc_timeout, session=self,
                                         group=self._group)
            except errors.LatchkeyError as e:
                raise self._checked(e) from None
            finally:
                self._end(seq)


class LockGuard:
    """See latchkey.LockGuard; `await guard.release()`, `async with guard:`."""

    def __init__(self, session: Session, name: str, token: int) -> None:
        self._session = session
        self.name = name
        self.token = token
        self.session_id = session.id
        self._lost_signal = LostSignal(self)
        self._released = False
        session._guards.add(self)
        if session._lost_why is not None:
            self._lost_signal._signal.set()

    @property
    def lost(self) -> LostSignal:
        return self._lost_signal

    def on_lost(self, fn: Callable[[], None]) -> Callable[[], None]:
        return self._lost_signal.add_callback(fn)

    def is_lost(self) -> bool:
        return self._lost_signal.is_set()

    def _taken(self) -> bool:
        tokens, through = self._session._taken
        return self.token <= through or self.token in tokens

    @property
    def lost_reason(self) -> Optional[str]:
        if self._taken():
            return f"an operator force-released it (token {self.token}); see `latchkey audit`"
        return self._session._lost_why

    def is_contended(self) -> bool:
        """See latchkey.LockGuard.is_contended."""
        return self.name in self._session._contended

    async def contended(self, timeout: Optional[float] = None) -> bool:
        """See latchkey.LockGuard.contended: True once someone is seen waiting for this lock
        (or it may be lost), False after `timeout` seconds (None: no limit)."""
        session = self._session
        end = None if timeout is None else core.now() + max(float(timeout), 0.0)
        while True:
            if self.name in session._contended or self._lost_signal.is_set():
                return True
            now = core.now()
            if end is not None and now >= end:
                return False
            until = session._deadline if end is None else min(end, session._deadline)
            waits = [asyncio.ensure_future(session._contended_changed.wait()),
                     asyncio.ensure_future(self._lost_signal._signal._event.wait())]
            try:
                await asyncio.wait(waits, timeout=min(max(until - now, 0.001), _CONTENDED_WAKE_S),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    def fencing_headers(self) -> Dict[str, str]:
        return {core.LOCK_HEADER: self.name, core.TOKEN_HEADER: str(self.token)}

    async def release(self) -> None:
        """See latchkey.LockGuard.release."""
        if self._released:
            return
        self._released = True
        session = self._session
        session._guards.discard(self)
        session._forget_contended(self.name)
        if self._taken():
            raise errors.NotHeld(self.name, self.token)
        if session.is_lost():
            raise session._lost_error()
        await session._release_on_server(self.name, self.token)

    async def __aenter__(self) -> "LockGuard":
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            await self.release()
        except errors.LatchkeyError:
            if exc_type is None:
                raise
            log.warning("latchkey: releasing %r after an exception failed", self.name,
                        exc_info=True)

    def __repr__(self) -> str:
        return f"aio.LockGuard(name={self.name!r}, token={self.token}, session={self.session_id})"


class Leadership(LockGuard):
    """See latchkey.Leadership; `await leadership.proclaim(value)`, `await
    leadership.resign()`, `async with leadership:` resigns on exit."""

    def __init__(self, session: Session, name: str, token: int, value: bytes) -> None:
        super().__init__(session, name, token)
        self.value = value

    async def proclaim(self, value) -> None:
        """See latchkey.Leadership.proclaim."""
        value = core.value_of(value)
        if self._released:
            raise errors.NotElectionLeader(
                f"the leadership of {self.name!r} (token {self.token}) was resigned")
        await self._session._proclaim_on_server(self.name, self.token, value)
        self.value = value

    async def resign(self) -> None:
        """See latchkey.Leadership.resign."""
        await self.release()

    async def __aenter__(self) -> "Leadership":
        return self

    def __repr__(self) -> str:
        return (f"aio.Leadership(name={self.name!r}, token={self.token}, value={self.value!r}, "
                f"session={self.session_id})")


class _Watch:
    """See latchkey.client._Watch: one election name's watch, resumed on another member when
    its stream breaks or stays silent for CLIENT_WATCH_SILENCE_MS."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self._name = name
        self._cursor = core.WatchCursor()
        self._call = None
        self._addr = ""
        self._broken = 0
        self._backoff = client._retry.backoff(None, client._rng)
        self._closed = False

    async def _open(self) -> None:
        client = self._client
        groups = await client._ask_groups()
        group = core.group_of(self._name, groups)
        addr = client._pick(group)
        request = core.watch_request(self._name, self._cursor.resume_index(),
                                     group if groups > 1 else None)
        self._call = client._stream_callable(addr, "Watch")(request, metadata=client._metadata)
        self._addr = addr

    def _lost_stream(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None
            self._client._route.unreachable(self._addr, core.now())

    async def next_step(self):
        """The next event or WatchMissed, or None once the position moved without one."""
        while True:
            if self._closed:
                raise core.WatchClosed()
            if self._call is None:
                self._broken += 1
                if self._broken > self._client._retry.attempts_max:
                    raise errors.Unavailable(
                        f"watch: {self._broken - 1} streams in a row broke before delivering "
                        "anything")
                if self._broken > 1:
                    await asyncio.sleep(self._backoff.next_delay())
                await self._open()
            try:
                message = await asyncio.wait_for(self._call.read(),
                                                 core.CLIENT_WATCH_SILENCE_MS / 1000)
            except asyncio.TimeoutError:
                log.debug("latchkey: watch stream at %s went silent; resuming", self._addr)
                self._lost_stream()
                continue
            except grpc.aio.AioRpcError as e:
                fatal = core.watch_fatal(e.code(), e.details(), e.trailing_metadata())
                if fatal is not None:
                    self.close()
                    raise fatal from None
                log.debug("latchkey: watch stream at %s broke; resuming: %s", self._addr,
                          e.details())
                self._lost_stream()
                continue
            if message is grpc.aio.EOF:
                self._lost_stream()
                continue
            self._broken = 0
            self._backoff = self._client._retry.backoff(None, self._client._rng)
            before = self._cursor.last
            item = self._cursor.accept(message)
            if item is not None:
                return item
            if self._cursor.last != before:
                return None

    def close(self) -> None:
        self._closed = True
        if self._call is not None:
            self._call.cancel()
            self._call = None


class Observe:
    """See latchkey.Observe: `async for leader in observe:`, `await observe.next()`;
    `close()` (or `async with`) ends it."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self._name = name
        self._watch = _Watch(client, name)
        self._state = core.Observed()

    async def _start(self) -> None:
        # The watch first, then the read (see latchkey.Observe).
        try:
            while self._watch._cursor.last is None:
                item = await self._watch.next_step()
                if item is not None:
                    await self._apply(item)
            await self._resync()
        except BaseException:
            self.close()
            raise

    async def _resync(self) -> None:
        info, index = await self._client._describe_read(self._name)
        self._state.read(core.leader_of(info), index)

    async def _apply(self, item) -> None:
        if isinstance(item, core.WatchMissed):
            await self._resync()
        elif item.lock == self._name:
            self._state.apply(item)

    async def next(self) -> core.Leader:
        """The next leader, or the leader's next value."""
        while True:
            news = self._state.news()
            if news is not None:
                return news
            item = await self._watch.next_step()
            if item is not None:
                await self._apply(item)

    def __aiter__(self) -> "Observe":
        return self

    async def __anext__(self) -> core.Leader:
        try:
            return await self.next()
        except core.WatchClosed:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._watch.close()

    async def __aenter__(self) -> "Observe":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


class _SessionLock:
    def __init__(self, client: Client, name: str, ttl: float, wait: Optional[float],
                 owner: Optional[str], mode: core.AcquireMode) -> None:
        self._client = client
        self._args = (name, ttl, wait, owner)
        self._mode = mode
        self._session: Optional[Session] = None
        self._guard: Optional[LockGuard] = None

    async def __aenter__(self) -> LockGuard:
        name, ttl, wait, owner = self._args
        core.validate_name(name)
        session = await self._client.session(ttl, owner=owner)
        try:
            self._guard = await session._take(name, core.wait_of(wait), self._mode)
        except BaseException:
            await session.close()
            raise
        self._session = session
        return self._guard

    async def __aexit__(self, exc_type, exc, tb) -> None:
        assert self._session is not None and self._guard is not None
        try:
            await self._guard.__aexit__(exc_type, exc, tb)
        finally:
            await self._session.close()
