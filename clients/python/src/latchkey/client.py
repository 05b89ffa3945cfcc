"""The blocking client: Client, Session, LockGuard (threads; grpcio's synchronous channels).

Layout: `Client` routes every call (leader hints, retries with backoff, one request re-sent
unchanged, so a sequence number survives retries); `Session` owns a lease renewed by one
background thread every TTL/3 and its client-side deadline (`_core.ClientLease`), whose
KeepAlive travels with those of the client's other sessions due at the same moment
(`_KeepAlives`); with `batch=True` the acquires, releases and closes of the client's sessions
ride `Batch` calls, one sender per member (`_Coalescer`); a `LockGuard` is one grant and its lost signal, a `Leadership` a campaign's
grant with its published value; `Observe` follows an election's leaders on a `_Watch` of the
name that resumes on another member (crates/client/src/election.rs). The asyncio twin is
`latchkey.aio`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import grpc

from . import _core as core
from . import errors
from ._proto import latchkey_pb2 as pb

log = logging.getLogger("latchkey")

_GRANTED = pb.ACQUIRE_RESULT_GRANTED
_NOT_GRANTED = pb.ACQUIRE_RESULT_NOT_GRANTED
_PENDING = pb.ACQUIRE_RESULT_PENDING
_WHY_CLOSED = "the session was closed"
_WHY_DEADLINE = "no renewal was acknowledged before the lease deadline (TTL minus safety margin)"
# Joining a stopped thread: it wakes on the lost signal at once; this only bounds a bug.
_JOIN_S = 10.0
# Longest sleep of LockGuard.contended between looks (it is woken by each keepalive answer and
# the lost signal; this only bounds a wake missed by a bug).
_CONTENDED_WAKE_S = 1.0


class _Signal:
    """A one-shot event with callbacks, set at most once."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: Dict[int, Callable[[], None]] = {}
        self._next = 0

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._event.wait(timeout)

    def set(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
        for fn in callbacks:
            try:
                fn()
            except Exception:  # noqa: BLE001 - a user's callback must not stop the others
                log.exception("latchkey: a lost callback raised")

    def add(self, fn: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            if not self._event.is_set():
                key = self._next
                self._next += 1
                self._callbacks[key] = fn

                def remove() -> None:
                    with self._lock:
                        self._callbacks.pop(key, None)

                return remove
        fn()
        return lambda: None


class LostSignal:
    """A guard's lost signal, like a threading.Event: set once the lock may be lost (the
    session's deadline on this client's clock passed without an acknowledged renewal, the
    server dropped the session, it was closed, or an operator force-released this grant).
    Stop working under the lock at once: the server keeps it for the safety margin at most."""

    def __init__(self, guard: "LockGuard") -> None:
        self._guard = guard
        self._signal = _Signal()

    def is_set(self) -> bool:
        """Reads the clock itself (not only the renewal thread's timer), so that a holder
        resuming from a pause and asking before writing gets the true answer."""
        self._guard._session._check_deadline()
        return self._signal.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until lost (True) or `timeout` seconds pass (False)."""
        if self.is_set():
            return True
        return self._signal.wait(timeout)

    def add_callback(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Calls `fn()` once when the lock may be lost (at once if it already may be), on a
        library thread: keep it short. Returns a function that unregisters it."""
        self.is_set()
        return self._signal.add(fn)

    @property
    def reason(self) -> Optional[str]:
        return self._guard.lost_reason


class _Reply:
    """Where a batch puts one member's answer: the KeepAliveResponse or the call's error, and
    who answered it after how many failed attempts (the failover signal's input)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.outcome: object = None
        self.lease: Optional["pb.SessionLease"] = None
        self.answered: Tuple[str, int] = ("", 0)


class _KeepAlives:
    """The keepalives of one Client's sessions travel together (crates/client/src/keepalive.rs).

    Each session's renewal thread decides *when* to renew (its own lease), but the RPC is
    shared: a renewal joins the batch being gathered, and one KeepAlive carries every session
    waiting at that moment (up to KEEPALIVE_SESSIONS_MAX). Like group commit: the first renewal
    to join an empty batch starts a short-lived thread that lets the others join for
    KEEPALIVE_GATHER_S (each renewal woke that much early: none goes out later than alone),
    takes the batch and sends it; each further full batch goes out on a thread of its own, so
    that no batch waits behind another's retries. The sending thread is not the first member's
    own: that member may reach its deadline or be closed and stop waiting, and the others'
    renewal must go on. A batch's call ends at its last member's deadline at the latest (see
    _core.keepalive_batch)."""

    def __init__(self, client: "Client") -> None:
        self._client = client
        self._lock = threading.Lock()
        self._queue = core.KeepAliveQueue()

    def renew(self, session: "Session", *, attempt_timeout: float, backoff_max: float,
              not_after: float, group: int = 0) -> Tuple[Optional["pb.SessionLease"], str, int]:
        """Renews `session` (of Raft group `group`) with the next batch: its lease in the
        answer (None: left out), the endpoint that answered and the batch call's failed
        attempts. Raises the batch call's error, SessionLost if the session is lost while it
        waits, or TransportError if no answer came before `not_after` (its deadline)."""
        waiting = core.KeepAliveWaiting(session._key, attempt_timeout, backoff_max, not_after,
                                        _Reply(), group)
        reply: _Reply = waiting.reply
        with self._lock:
            first = self._queue.join(waiting)
        if first and not self._spawn(self._gather):
            # No thread to spare. Sending on this session's own thread would leave its loss
            # unreported until the batch's call ended (up to another member's deadline), so
            # every waiting renewal fails this attempt instead and retries on its schedule.
            self._fail_waiting(errors.ServerError(
                "no thread could be started to send the keepalive batch"))
        # One session's loss (a close, the server dropping it) ends only its own wait.
        remove = session._lost.add(reply.done.set)
        try:
            reply.done.wait(max(not_after - core.now(), 0.0))
        finally:
            remove()
        outcome = reply.outcome
        if outcome is None:
            if session._lost.is_set():
                raise session._lost_error()
            raise errors.TransportError(
                "the keepalive batch was not answered before the session's deadline")
        if isinstance(outcome, errors.LatchkeyError):
            raise outcome
        addr, failed_attempts = reply.answered
        return reply.lease, addr, failed_attempts

    def _spawn(self, target, *args) -> bool:
        """Runs `target` on a thread of its own; False if no thread could be started."""
        try:
            threading.Thread(target=target, args=args, name="latchkey-keepalive",
                             daemon=True).start()
            return True
        except RuntimeError:
            return False

    def _fail_waiting(self, error: errors.LatchkeyError) -> None:
        """Fails every renewal waiting for a batch (the queue is left empty, so the next
        renewal starts a gatherer again)."""
        while True:
            with self._lock:
                batch = self._queue.take()
            if not batch:
                return
            self._answer(batch, error, None, ("", 0))

    def _gather(self) -> None:
        time.sleep(core.KEEPALIVE_GATHER_S)
        while True:
            with self._lock:
                batch = self._queue.take()
                last = len(self._queue) == 0
            if not batch:
                return
            # In a cluster of several Raft groups, one request per member that leads any of
            # the batch's groups (protocol.md, 2.4).
            parts = core.by_leader(batch, self._client._pick)
            for i, part in enumerate(parts):
                if last and i == len(parts) - 1:
                    # Whoever joins from now on finds the queue empty and starts its own
                    # gatherer.
                    self._send(part)
                    return
                if not self._spawn(self._send, part):
                    self._send(part)  # on this gatherer thread, no member's own

    def _send(self, batch: List[core.KeepAliveWaiting], follow: bool = True) -> None:
        b = core.keepalive_batch(batch)
        outcome: object
        answered = ("", 0)
        leases = None
        refused: Dict[int, "pb.GroupRefusal"] = {}
        try:
            outcome, addr, failed_attempts = self._client._call(
                "KeepAlive", b.request, attempt_timeout=b.attempt_timeout,
                backoff_max=b.backoff_max, not_after=b.not_after, group=batch[0].group)
            answered = (addr, failed_attempts)
            leases = core.leases_by_id(outcome)
            refused = core.refusals(outcome, batch)
        except errors.LatchkeyError as e:
            outcome = e  # each member's failure
        except Exception as e:  # noqa: BLE001 - a bug must not leave the members waiting
            log.exception("latchkey: a keepalive batch failed")
            outcome = errors.ServerError(f"the keepalive batch failed: {e!r}")
        if not refused:
            self._answer(batch, outcome, leases, answered)
            return
        self._answer([w for w in batch if w.group not in refused], outcome, leases, answered)
        again = [w for w in batch if w.group in refused]
        for part in self._follow(again, refused, answered[0], follow):
            self._send(part, follow=False)

    def _follow(self, again: List[core.KeepAliveWaiting], refused: Dict[int, "pb.GroupRefusal"],
                addr: str, follow: bool) -> List[List[core.KeepAliveWaiting]]:
        """The members of the groups a member refused (it does not lead them now): each group's
        route moves to the refusal's leader hint, as an error of that group would, and its
        sessions are sent there at once, once (the batches returned). Refused again, or with
        no other member to go to, they fail this renewal and retry on their schedule."""
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
                    None, ("", 0))
        return core.by_leader(retry, self._client._pick)

    @staticmethod
    def _answer(batch: List[core.KeepAliveWaiting], outcome: object,
                leases: Optional[Dict[int, "pb.SessionLease"]], answered: Tuple[str, int]) -> None:
        for w in batch:
            w.reply.answered = answered
            w.reply.lease = None if leases is None else leases.get(w.session.id)
            w.reply.outcome = outcome
            w.reply.done.set()


class _Coalescer:
    """The operations waiting for the next Batch call to one member (`batch=True`; the Rust
    client's batch.rs). The call that finds no batch in flight sends its operation at once;
    the operations that come while a batch is in flight wait for its answer and then go
    together (at most BATCH_CALL_OPS_MAX per call). The next batch is sent from the done
    callback of the previous one, so no thread waits for it: a caller that gives up does not
    take the others' answers with it. Each call is bounded by the client's rpc_timeout."""

    def __init__(self, client: "Client", addr: str) -> None:
        self._client = client
        self._addr = addr
        self._lock = threading.Lock()
        self._queue = core.BatchQueue()

    def send(self, waiting: core.BatchWaiting) -> None:
        """Queues `waiting`; its `reply` (an Event) is set once `answer` is."""
        with self._lock:
            start = self._queue.join(waiting)
        if start:
            self._next()

    def _next(self) -> None:
        with self._lock:
            batch = self._queue.take()
        if not batch:
            return
        client = self._client
        try:
            mc = client._callable(self._addr, "Batch")
            future = mc.future(core.batch_request(batch), timeout=client._rpc_timeout,
                               metadata=client._metadata)
        except errors.LatchkeyError as e:  # the client was closed
            self._answer(batch, [core.Failure("fatal", str(e), error=e)] * len(batch))
            return
        except Exception as e:  # a channel closed meanwhile: as a call that failed to start
            self._answer(batch, [core.Failure("transport", f"the call to {self._addr} could "
                                              f"not start: {e}") for _ in batch])
            return
        future.add_done_callback(lambda f: self._done(batch, f))

    def _done(self, batch: List[core.BatchWaiting], future) -> None:
        try:
            answers = core.batch_answers(batch, future.result())
        except grpc.FutureCancelledError:
            answers = [core.Failure("transport", f"the call to {self._addr} was cancelled")
                       for _ in batch]
        except grpc.RpcError as e:
            answers = [core.batch_call_failure(e.code(), e.details(), e.trailing_metadata(),
                                               self._addr) for _ in batch]
        except Exception as e:  # never leave the queue without a sender
            answers = [core.Failure("transport", f"the call to {self._addr} failed: {e}")
                       for _ in batch]
        self._answer(batch, answers)

    def _answer(self, batch: List[core.BatchWaiting], answers: List[object]) -> None:
        for w, a in zip(batch, answers):
            w.answer = a
            w.reply.set()
        # The operations that came meanwhile go now (or the sender stops).
        self._next()


class Client:
    """A handle on a latchkey cluster: `Client(["127.0.0.1:7420"])`. Thread-safe. Connections
    open lazily, so this does not fail when no server is up; the first call does, after its
    retries (up to 64 attempts or 20 s; 2 s while no endpoint accepts a connection or resolves).
    Endpoints are HOST:PORT (or https://HOST:PORT); a
    node's leader hint is followed. TLS: `ca=` (PEM file of the CA that signed the servers),
    optionally `cert=`/`key=` for servers that require client certificates. `auth_token=` is
    sent as `authorization: Bearer TOKEN` to servers with access control.

    `batch=True` (the default, as the Rust client's `ClientConfig::batch`): the acquires,
    releases and closes this client's sessions send to one member while an earlier batch to it
    is in flight wait for its answer and then go together, as one `Batch` call (at most 256
    operations); a call made alone goes at once. Each keeps its own retries and errors.
    `batch=False` sends every operation in a call of its own."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        ca: Optional[str] = None,
        cert: Optional[str] = None,
        key: Optional[str] = None,
        auth_token: Optional[str] = None,
        rpc_timeout: float = core.CLIENT_RPC_TIMEOUT_MS_DEFAULT / 1000,
        retry: Optional[core.RetryPolicy] = None,
        batch: bool = True,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        split = [core.split_endpoint(e) for e in endpoints]
        if not split:
            raise errors.InvalidArgument("no endpoints")
        self._tls = core.read_tls(ca, cert, key)
        if self._tls is None and any(s == "https" for s, _ in split):
            raise errors.InvalidArgument(
                "an https:// endpoint needs the CA that signed the servers' certificates (ca=...)"
            )
        self._metadata = core.auth_metadata(auth_token)
        self._rpc_timeout = float(rpc_timeout)
        self._retry = retry or core.RetryPolicy()
        self._rng = random.Random()
        self._lock = threading.Lock()
        self._route = core.Route([addr for _, addr in split])
        self._channels: Dict[str, grpc.Channel] = {}
        self._callables: Dict[Tuple[str, str], object] = {}
        self._sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()
        self._keepalives = _KeepAlives(self)
        # With `batch`, the operations waiting for a Batch call, per member (made on first use).
        self._batch = bool(batch)
        self._coalescers: Dict[str, _Coalescer] = {}
        # The cluster's Raft group count once an answer said it (None: not yet; protocol.md,
        # 2.4). With one group no request names a group, as before groups existed.
        self._groups: Optional[int] = None
        self._closed = False

    # --- public API --------------------------------------------------------------------
    def session(self, ttl: float = core.SESSION_TTL_MS_DEFAULT / 1000, *,
                owner: Optional[str] = None) -> "Session":
        """Opens a session (a lease of `ttl` seconds, 1..3600) renewed in the background every
        TTL/3. `owner`: a text shown next to its locks by `latchkey status` (with this
        process's host, pid and user). Close it (or use `with`).

        In a cluster of several Raft groups (`serve --groups`) this is one logical session:
        a session in group 0 now, and one in each other group at the first lock of that
        group, all renewed together; it is lost (every guard reports lost) when any of them
        is."""
        ttl_ms = core.ttl_ms_of(ttl)
        # This process by default (issue #33), as the CLI's sessions say it.
        owner_pb = core.owner_of_this_process(owner or "")
        session = self._open(ttl_ms, owner_pb, 0, None)
        with self._lock:
            self._sessions.add(session)
        session._start()
        return session

    def lock(self, name: str, ttl: float = core.SESSION_TTL_MS_DEFAULT / 1000,
             wait: Optional[float] = None, *, owner: Optional[str] = None, shared: bool = False,
             permits: Optional[int] = None,
             lock_delay: Optional[float] = None) -> "_SessionLock":
        """`with client.lock("name", ttl=15, wait=30) as guard:` opens a session of its own,
        takes the lock (waiting up to `wait` seconds; None: until granted; 0: try once), and on
        exit releases it and closes the session. Raises WaitTimeout (LockHeld for a try-lock
        that found it held) when not granted. `shared=True`: as a reader; `permits=N`: one of
        a semaphore's N permits; `lock_delay=S`: a lock-delay (see Session.lock)."""
        # Bad input fails here, before any call.
        return _SessionLock(self, name, ttl, wait, owner,
                            core.acquire_mode(shared, permits, lock_delay))

    def campaign(self, name: str, value, ttl: float = core.SESSION_TTL_MS_DEFAULT / 1000,
                 wait: Optional[float] = None, *, owner: Optional[str] = None) -> "_SessionLock":
        """`with client.campaign("svc/leader", "10.0.0.1:80") as leadership:` opens a session
        of its own, leads the election (see Session.campaign), and on exit resigns and closes
        the session."""
        return _SessionLock(self, name, ttl, wait, owner, core.campaign_mode(value))

    def leader(self, name: str) -> Optional[core.Leader]:
        """The current leader of the election `name` (its exclusive holder; a linearizable
        read on the leader), or None when nobody leads. Needs `read` on the name."""
        return core.leader_of(self.describe(name))

    def observe(self, name: str) -> "Observe":
        """Every change of leader or value of the election `name`, from its current leader
        on: `for leader in client.observe(name):` (see Observe; close it, or use `with`).
        Needs `read` on the name."""
        core.validate_name(name)
        observe = Observe(self, name)
        observe._start()
        return observe

    def describe(self, name: str) -> core.LockInfo:
        """One lock's holder, token and queue, read on the leader (of the lock's group)."""
        return self._describe_read(name)[0]

    def _describe_read(self, name: str) -> Tuple[core.LockInfo, int]:
        """describe, with the index of the last log entry applied when it was read
        (DescribeResponse.read_index): every watch event at or below it is reflected."""
        core.validate_name(name)
        response, _, _ = self._call("Describe", pb.DescribeRequest(name=name),
                                    attempt_timeout=self._rpc_timeout,
                                    group=self._group_of_lock(name))
        if not response.HasField("lock"):
            raise errors.ProtocolError("Describe answered without a lock")
        return core.lock_info(response.lock), response.read_index

    def list(self, prefix: str = "") -> List[core.LockInfo]:
        """Held locks whose names start with `prefix`, in name order, up to the server's
        maximum. In a cluster of several Raft groups each group is listed at its leader and
        the answers merged (at most LIST_RESULTS_MAX in all)."""
        groups = self._groups
        if groups is None or groups == 1:
            try:
                response, _, _ = self._call("List", pb.ListRequest(prefix=prefix),
                                            attempt_timeout=self._rpc_timeout)
                return [core.lock_info(lock) for lock in response.locks]
            except errors.Conflict as e:
                # A cluster of several groups wants `group`: learn how many, list each.
                if groups is not None or e.reason != "not-with-groups":
                    raise
            groups = self._ask_groups()
        answers = [
            self._call("List", pb.ListRequest(prefix=prefix, group=g),
                       attempt_timeout=self._rpc_timeout, group=g)[0]
            for g in range(groups)
        ]
        return core.merge_lists(answers)[0]

    def node_status(self, endpoint: str) -> core.NodeStatus:
        """What the node at `endpoint` says about itself; asks that node once, no retry."""
        _, addr = core.split_endpoint(endpoint)
        outcome = self._attempt(addr, "NodeStatus", pb.NodeStatusRequest(), self._rpc_timeout, None)
        if isinstance(outcome, core.Failure):
            raise core.give_up(outcome, 1, 0.0)
        return core.node_status(outcome)

    # --- administration (an operator's tools; recorded in the audit log) ---------------
    def force_release(self, name: str, *, token: Optional[int] = None, reason: str,
                      operator: Optional[str] = None,
                      end_delay: bool = False) -> core.ForceReleased:
        """Force-releases lock `name` (needs `admin` on it under access control): the next
        waiter gets it with a higher token, and the holder's client learns from its next
        renewal that it lost the lock (its guard's `lost` is set). Answers the grant taken,
        `ForceReleased(session_id, token)`. `reason` is required (at most 1,024 bytes) and
        recorded in the audit log with `operator` (default `user@host` of this process; the
        server adds the authenticated identity).

        Without `token`, the holder's token (of several holders, the first granted's) is read
        first (Describe) and the release made conditional on it, so that a retry after a lost
        answer can never take the *next* holder's grant: it fails with Conflict
        `token-mismatch` or `lock-not-held` instead (also raised when nobody holds the lock).

        A release of a holder that asked for a lock-delay starts the delay; a retry of it
        answers the first attempt's grant and ends nothing. `end_delay=True` ends the lock's
        running lock-delay instead (only the one under `token`; without it, the delay's token
        is read first): its first waiter gets the lock now; Conflict `no-lock-delay` if none
        runs. Answers the grant whose loss started the delay."""
        token, operator = core.check_admin_release(name, token, reason, operator)
        if token is None:
            token = core.holder_token(self.describe(name), end_delay)
        response, _, _ = self._call(
            "AdminRelease", core.admin_release_request(name, token, reason, operator, end_delay),
            attempt_timeout=self._rpc_timeout, group=self._group_of_lock(name))
        return core.ForceReleased(response.session, response.token)

    def revoke(self, session_id: int, *, reason: str, operator: Optional[str] = None) -> int:
        """Ends session `session_id` as an expiry would (needs `admin` on every lock under
        access control): its locks go to their next waiters, its client's guards report lost.
        Answers how many locks it held. Recorded in the audit log (`reason` required, as for
        force_release). SessionNotFound: no such session (any more); a retry after a lost
        answer gets it too, so it may be this very call that ended it (see `audit()`)."""
        request = core.check_admin_revoke(session_id, reason, operator)
        response, _, _ = self._call("AdminRevoke", request, attempt_timeout=self._rpc_timeout,
                                    group=self._group_of_session(request.session))
        return response.locks

    def audit(self) -> List[core.AuditEntry]:
        """The audit log (force-releases and revocations), oldest first, read on the leader:
        the newest AUDIT_RECORDS_MAX (1,000) records. Needs `read` on every lock (prefix "")
        under access control. In a cluster of several Raft groups, every group's log (each
        at its leader), merged by time; each entry names its `group`."""
        groups = self._groups
        if groups is None or groups == 1:
            try:
                response, _, _ = self._call("Audit", pb.AuditRequest(),
                                            attempt_timeout=self._rpc_timeout)
                return [core.audit_entry(r) for r in response.records]
            except errors.Conflict as e:
                if groups is not None or e.reason != "not-with-groups":
                    raise
            groups = self._ask_groups()
        records = []
        for g in range(groups):
            response, _, _ = self._call("Audit", pb.AuditRequest(group=g),
                                        attempt_timeout=self._rpc_timeout, group=g)
            records.extend(core.audit_entry(r) for r in response.records)
        records.sort(key=lambda r: r.at_ms)  # stable: one group's records stay in log order
        return records

    def close(self) -> None:
        """Closes every open session of this client, then its connections."""
        with self._lock:
            sessions = list(self._sessions)
        for s in sessions:
            try:
                s.close()
            except errors.LatchkeyError as e:
                log.debug("latchkey: closing session %s: %s", s.id, e)
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._callables.clear()
        for c in channels:
            c.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- Raft groups ---------------------------------------------------------------------
    def _learn_groups(self, answered: int, what: str) -> int:
        """The group count an answer said (0 from a server before groups: one), remembered;
        a cluster that changes it is a protocol error."""
        groups = core.checked_groups(answered, what)
        with self._lock:
            if self._groups is None:
                self._groups = groups
            known = self._groups
        if known != groups:
            raise errors.ProtocolError(
                f"{what} answered {groups} Raft groups, and the cluster {known} before")
        return groups

    def _ask_groups(self) -> int:
        """The group count, asked of any member (NodeStatus) if no answer said it yet."""
        if self._groups is not None:
            return self._groups
        response, _, _ = self._call("NodeStatus", pb.NodeStatusRequest(),
                                    attempt_timeout=self._rpc_timeout, group=core.ANY_MEMBER)
        return self._learn_groups(response.groups, "NodeStatus")

    def _group_of_lock(self, name: str) -> Optional[int]:
        """The group of lock `name`; None while the count is unknown (then the call learns
        its group from a `latchkey-group` error)."""
        groups = self._groups
        return None if groups is None else core.group_of(name, groups)

    def _group_of_session(self, session_id: int) -> Optional[int]:
        groups = self._groups
        return None if groups is None else core.group_of_session(session_id, groups)

    def _pick(self, group: int) -> str:
        with self._lock:
            return self._route.pick(group)

    def _reroute(self, group: int, addr: str, hint: Optional[str]) -> None:
        with self._lock:
            self._route.reroute(addr, hint, core.now(), group)

    def _open(self, ttl_ms: int, owner: Optional["pb.Owner"], group: int,
              root: Optional["Session"]) -> "Session":
        """A session of `ttl_ms` in `group` (not started): group 0's of a logical session
        (`root` None), or another group's of `root`. With one group the request names none,
        as before groups; a cluster of several refuses that (`not-with-groups`), which is
        how this client's first session learns of the groups."""
        request = pb.CreateSessionRequest(ttl_ms=ttl_ms)
        if owner is not None:
            request.owner.CopyFrom(owner)
        if group != 0 or (self._groups or 1) > 1:
            request.group = group
        # Before the first attempt: the lease starts no earlier than this on the server.
        sent = core.now()
        try:
            response, addr, _ = self._call("CreateSession", request,
                                           attempt_timeout=self._rpc_timeout, group=group)
        except errors.Conflict as e:
            if e.reason != "not-with-groups" or request.HasField("group"):
                raise
            request.group = group
            sent = core.now()
            response, addr, _ = self._call("CreateSession", request,
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

    # --- calls -------------------------------------------------------------------------
    def _callable(self, addr: str, method: str):
        channel = self._channel(addr)
        with self._lock:
            mc = self._callables.get((addr, method))
            if mc is None:
                req, resp = core.METHODS[method]
                mc = channel.unary_unary(core.method_path(method),
                                         request_serializer=req.SerializeToString,
                                         response_deserializer=resp.FromString)
                self._callables[(addr, method)] = mc
            return mc

    def _channel(self, addr: str) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise errors.InvalidArgument("the client is closed")
            channel = self._channels.get(addr)
            if channel is None:
                if self._tls is not None:
                    creds = grpc.ssl_channel_credentials(self._tls.ca, self._tls.key,
                                                         self._tls.cert)
                    channel = grpc.secure_channel(addr, creds, core.CHANNEL_OPTIONS)
                else:
                    channel = grpc.insecure_channel(addr, core.CHANNEL_OPTIONS)
                self._channels[addr] = channel
            return channel

    def _stream_callable(self, addr: str, method: str):
        """A server-streaming method (Watch) on `addr`'s channel."""
        req, resp = core.STREAM_METHODS[method]
        return self._channel(addr).unary_stream(core.method_path(method),
                                                request_serializer=req.SerializeToString,
                                                response_deserializer=resp.FromString)

    def _coalescer(self, addr: str) -> "_Coalescer":
        with self._lock:
            c = self._coalescers.get(addr)
            if c is None:
                c = self._coalescers[addr] = _Coalescer(self, addr)
            return c

    def _attempt_batched(self, addr: str, method: str, request, timeout: float,
                         session: Optional["Session"]):
        """One attempt in the next Batch call to `addr`: the answer its own call would have
        had, or a Failure. Raises SessionLost if `session` is lost meanwhile (the operation
        still goes in its batch; its answer is then dropped)."""
        waiting = core.BatchWaiting(core.BATCH_OPS[method], request, threading.Event())
        wake = waiting.reply
        remove = session._lost.add(wake.set) if session is not None else None
        try:
            self._coalescer(addr).send(waiting)
            # The batch in flight, then this one: each bounded by rpc_timeout; the extra
            # second only bounds a lost callback.
            wake.wait(timeout + self._rpc_timeout + 1.0)
        finally:
            if remove is not None:
                remove()
        answer = waiting.answer
        if answer is None:
            if session is not None and session._lost.is_set():
                raise session._lost_error()
            return core.Failure("transport", f"{addr} did not answer within {timeout:.1f}s")
        return answer

    def _attempt(self, addr: str, method: str, request, timeout: float,
                 session: Optional["Session"], batch: bool = False):
        """One attempt: the response, or a Failure. Raises SessionLost if `session` is lost
        meanwhile (the attempt is cancelled). `batch`: in a Batch call, with `batch=True`."""
        if batch and self._batch:
            return self._attempt_batched(addr, method, request, timeout, session)
        mc = self._callable(addr, method)
        future = mc.future(request, timeout=timeout, metadata=self._metadata)
        wake = threading.Event()
        future.add_done_callback(lambda _f: wake.set())
        remove = session._lost.add(wake.set) if session is not None else None
        try:
            # grpc enforces `timeout`; the extra second only bounds a lost callback.
            wake.wait(timeout + 1.0)
        finally:
            if remove is not None:
                remove()
        if not future.done():
            future.cancel()
            if session is not None and session._lost.is_set():
                raise session._lost_error()
            return core.Failure("transport", f"{addr} did not answer within {timeout:.1f}s")
        try:
            return future.result()
        except grpc.FutureCancelledError:
            if session is not None and session._lost.is_set():
                raise session._lost_error() from None
            return core.Failure("transport", f"the call to {addr} was cancelled")
        except grpc.RpcError as e:
            failure = core.classify(e.code(), e.details(), e.trailing_metadata())
            if failure.kind == "transport":
                failure.message = f"cannot reach {addr}: {failure.message}"
            return failure

    def _call(self, method: str, request, *, attempt_timeout: float,
              backoff_max: Optional[float] = None, session: Optional["Session"] = None,
              not_after: Optional[float] = None, group: Optional[int] = 0,
              batch: bool = False):
        """One logical request: the same `request` (same seq, if it has one) on every attempt
        until an answer, a fatal error, the retry budget's end, or `not_after` (a clock
        instant), sent to the leader of Raft group `group` (None: not known yet, group 0's
        route until an error names the group). `batch`: each attempt rides the next Batch
        call to its member when the client batches. Returns (response, endpoint that
        answered, failed attempts)."""
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
            with self._lock:
                addr = self._route.pick(route_group)
                untried.discard(addr)
            outcome = self._attempt(addr, method, request, timeout, session, batch)
            if not isinstance(outcome, core.Failure):
                with self._lock:
                    self._route.answered(addr, route_group)
                return outcome, addr, attempts - 1
            failure = outcome
            if failure.kind == "fatal":
                assert failure.error is not None
                raise failure.error
            if failure.group is not None:
                # An error of a cluster of several groups names its group: the hint is that
                # group's leader (a keepalive may carry several groups' sessions).
                if group is None:
                    group = route_group = failure.group
                elif self._groups is not None and failure.group < self._groups:
                    route_group = failure.group
            with self._lock:
                if failure.kind == "unavailable":
                    hinted = self._route.reroute(addr, failure.leader_addr, core.now(),
                                                 route_group)
                else:
                    self._route.unreachable(addr, core.now())
                    hinted = False
            reached = reached or failure.kind != "transport" or failure.connected
            budget = policy.budget(reached, bool(untried))
            elapsed = core.now() - start
            if attempts >= policy.attempts_max or elapsed >= budget:
                raise core.give_up(failure, attempts, elapsed)
            log.debug("latchkey: %s attempt %d failed: %s", method, attempts, failure.message)
            # A fresh leader hint is worth trying at once, but only the first time in a row.
            if not (hinted and attempts == 1):
                delay = min(backoff.next_delay(), budget - elapsed)
                if not_after is not None:
                    delay = min(delay, not_after - core.now())
                if session is not None:
                    if session._lost.wait(max(delay, 0.0)):
                        raise session._lost_error()
                else:
                    threading.Event().wait(max(delay, 0.0))


class Session:
    """A lease on the server that keeps this client's locks alive; made by Client.session.

    One background thread renews it every TTL/3 (in one KeepAlive with the client's other
    sessions due then) and decides when it may be lost: the send instant of the last
    acknowledged renewal + TTL - safety margin (max(TTL/5, 200 ms)), on CLOCK_BOOTTIME. Close
    it when done (`with` does): closing releases its locks on the server. A session that is
    never closed stops being renewed only when the process exits; the server then expires it
    after its TTL.

    In a cluster of several Raft groups this object is group 0's session and the logical
    session: its sessions in the other groups (made at the first lock of each, renewed on
    the same schedule, in the same KeepAlives per member) share its lost signal."""

    def __init__(self, client: Client, key: "pb.Session", lease: core.ClientLease,
                 endpoint: str, *, group: int = 0, groups: int = 1,
                 root: Optional["Session"] = None, owner: Optional["pb.Owner"] = None) -> None:
        self._client = client
        self._key = pb.Session(id=key.id, secret=key.secret)
        self.id: int = key.id
        self.ttl: float = lease.ttl
        self._lease = lease
        self._cond = threading.Condition()
        self._window = core.SeqWindow(1)
        self._deadline = lease.deadline()
        self._lost = _Signal()
        self._lost_why: Optional[str] = None
        self._guards: "set[LockGuard]" = set()
        self._taken: Tuple[frozenset, int] = (frozenset(), 0)
        # Conflict events: the held names the last keepalive answer said someone waits for.
        self._contended: frozenset = frozenset()
        # Only the renewal thread moves the detector; the count is read under _cond.
        self._failover_detector = core.FailoverDetector(endpoint)
        self._failovers = 0
        self._waits = threading.BoundedSemaphore(core.SESSION_WAITS_IN_FLIGHT_MAX)
        self._short = threading.BoundedSemaphore(core.SESSION_SHORT_REQUESTS_IN_FLIGHT_MAX)
        self._background: "set[threading.Thread]" = set()
        self._closed = False
        self._renewal = threading.Thread(target=self._renew, name=f"latchkey-renew-{self.id}",
                                         daemon=True)
        # Raft groups (protocol.md, 2.4): this session's group, the cluster's count, and the
        # logical session it belongs to (itself for group 0's). Only the root keeps the
        # others, by group (at most GROUPS_MAX), and a lock per group held while that
        # group's session is made, so that two locks of one group make one session and a
        # group whose leader is away delays only its own locks.
        self._group = group
        self._groups = groups
        self._root: Session = self if root is None else root
        self._owner = owner
        self._others: Dict[int, Session] = {}
        self._making: Dict[int, threading.Lock] = {}

    def _start(self) -> None:
        self._renewal.start()

    # --- public API --------------------------------------------------------------------
    @property
    def safety_margin(self) -> float:
        return core.safety_margin(self.ttl)

    @property
    def deadline(self) -> float:
        """The client-side deadline, on latchkey's clock (`latchkey.now()`): if no renewal is
        acknowledged before it, the session is lost. With several Raft groups, the earliest
        of its group sessions' deadlines."""
        return min(s._own_deadline() for s in self._group_sessions())

    def is_lost(self) -> bool:
        self._check_deadline()
        return self._lost.is_set()

    def failovers(self) -> int:
        """How many failovers the session has lived through: renewals acknowledged by another
        node than the previous one (the first: the node that created it), or only after failed
        attempts (an election, a node down); with several Raft groups, summed over its group
        sessions. Starts at 0, never decreases. Nothing is lost by a failover while `lost` is
        not set; a holder may want to re-check its resource or log."""
        n = 0
        for s in self._group_sessions():
            with s._cond:
                n += s._failovers
        return n

    def session_id_for(self, name: str) -> int:
        """The id of the session that takes lock `name` (its holder, as `describe` shows it):
        this session's own id in a cluster of one group; with several, its session in the
        lock's group, made (a CreateSession at that group's leader) if it is the group's
        first use, as its first lock would."""
        core.validate_name(name)
        if self.is_lost():
            raise self._lost_error()
        return self._for_lock(name).id

    def lock(self, name: str, wait: Optional[float] = None, *, shared: bool = False,
             permits: Optional[int] = None, lock_delay: Optional[float] = None,
             positions: Optional[Callable[[int], None]] = None) -> "LockGuard":
        """Takes lock `name`, waiting in its FIFO queue up to `wait` seconds (None: until
        granted; 0: try once, never queue). Raises WaitTimeout (LockHeld for a try-lock that
        found it held), SessionLost if the session is lost meanwhile.

        Exclusive by default (a mutex, or a read-write lock's writer). `shared=True` takes it
        as a reader: any number of readers hold together, never beside a writer, and a reader
        behind a waiting writer waits. `permits=N` takes one of the N permits of a counting
        semaphore (each grant has its own token). A name in use as the other kind raises
        KindConflict, a semaphore with another N PermitsConflict, N outside 1..1024
        PermitsOutOfRange (docs/primitives.md).

        `lock_delay=S` (seconds, rounded up to whole ms, at most 300; a mutex's only, so
        InvalidArgument with `shared` or `permits`): if this grant is lost (the session expires
        or is revoked, or an operator force-releases it; not a release or close), the server
        grants the name to nobody for S seconds, for a resource that cannot check fencing
        tokens (docs/primitives.md, Lock-delay). `positions=fn`: while queued, `fn(position)`
        is called (on this thread) with the 1-based place in the queue each long-poll answers
        (about every 10 s, and at each re-send); never when granted at once.

        The request keeps one
        sequence number across its long-polls and retries, so it keeps its place in the
        queue through reconnects and leader changes. A wait abandoned before its outcome is
        known (a client-side give-up, an exception such as KeyboardInterrupt) is settled by a
        background thread: a late grant is released."""
        core.validate_name(name)
        return self._take(name, core.wait_of(wait),
                          core.acquire_mode(shared, permits, lock_delay), positions)

    def _take(self, name: str, wait: Optional[float], mode: core.AcquireMode,
              positions: Optional[Callable[[int], None]] = None) -> "LockGuard":
        if self.is_lost():
            raise self._lost_error()
        session = self._for_lock(name)
        with session._waits:
            deadline = None if wait is None else core.now() + wait
            while True:
                guard = session._lock_once(name, mode, deadline, positions)
                if guard is not None:
                    return guard

    def lock_shared(self, name: str, wait: Optional[float] = None) -> "LockGuard":
        """Takes `name` as a reader of a read-write lock: `lock(name, wait, shared=True)`."""
        return self.lock(name, wait, shared=True)

    def acquire_permit(self, name: str, permits: int, wait: Optional[float] = None) -> "LockGuard":
        """Takes one of the `permits` permits of the semaphore `name`:
        `lock(name, wait, permits=permits)`."""
        return self.lock(name, wait, permits=permits)

    def campaign(self, name: str, value, wait: Optional[float] = None) -> "Leadership":
        """Campaigns in the election `name`: waits in its FIFO queue (no herd) up to `wait`
        seconds (None: until this session leads; 0: only if nobody leads) and returns the
        Leadership, whose token is the term's fencing token and whose `value` (bytes, or a str
        sent as UTF-8, at most 1,024 bytes) `Client.leader` and `Client.observe` show. An
        election is an exclusive lock whose grant publishes a value: it fails as `lock` does
        (WaitTimeout, LockHeld, SessionLost, KindConflict) and ends as a grant does."""
        core.validate_name(name)
        mode = core.campaign_mode(value)
        guard = self._take(name, core.wait_of(wait), mode)
        assert isinstance(guard, Leadership)
        return guard

    def close(self) -> None:
        """Ends the session: stops the renewal and asks the server to release its locks and
        drop its waits (in every Raft group it has a session in). Every guard reports lost
        from here on."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
        self._mark_lost(_WHY_CLOSED)
        sessions = self._group_sessions()
        for s in sessions:
            s._stop()
        failed: Optional[errors.LatchkeyError] = None
        for s in sessions:
            try:
                s._close_on_server()
            except errors.LatchkeyError as e:
                failed = failed or e
        if failed is not None:
            raise failed

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- Raft groups -----------------------------------------------------------------------
    def _group_sessions(self) -> "List[Session]":
        """Every group session of the logical session made so far, group 0's first."""
        root = self._root
        with root._cond:
            return [root, *(root._others[g] for g in sorted(root._others))]

    def _for_lock(self, name: str) -> "Session":
        """The group session that takes lock `name`: made on the first use of its group."""
        root = self._root
        if root._groups <= 1:
            return root
        group = core.group_of(name, root._groups)
        if group == root._group:
            return root
        with root._cond:
            made = root._others.get(group)
            if made is not None:
                return made
            making = root._making.setdefault(group, threading.Lock())
        with making:
            with root._cond:
                made = root._others.get(group)
            if made is not None:
                return made
            if root._lost_why is not None:
                raise root._lost_error()
            ttl_ms = int(round(root.ttl * 1000))
            made = root._client._open(ttl_ms, root._owner, group, root)
            with root._cond:
                lost = root._lost_why
                if lost is None:
                    root._others[group] = made
            if lost is not None:
                # Lost (or closed) while this one was made: it is given up at once.
                made._mark_lost_here(lost)
                try:
                    made._close_on_server()
                except errors.LatchkeyError as e:
                    log.debug("latchkey: closing session %d: %s", made.id, e)
                raise root._lost_error()
            made._start()
            return made

    def _stop(self) -> None:
        """Stops this group session's renewal and background work (it is lost by now)."""
        with self._cond:
            self._closed = True
        self._renewal.join(_JOIN_S)
        with self._cond:
            background = list(self._background)
        for t in background:
            t.join(_JOIN_S)

    def _close_on_server(self) -> None:
        try:
            self._client._call("CloseSession", pb.CloseSessionRequest(session=self._key),
                               attempt_timeout=self._client._rpc_timeout, group=self._group,
                               batch=True)
        except errors.SessionNotFound:
            pass  # already gone (expired, or a retried close that went through)

    # --- lost ----------------------------------------------------------------------------
    def _mark_lost(self, why: str) -> None:
        """Lost in any group, the logical session is lost in every group."""
        root = self._root
        if not root._mark_lost_here(why):
            return
        with root._cond:
            others = list(root._others.values())
        for s in others:
            s._mark_lost_here(why)

    def _mark_lost_here(self, why: str) -> bool:
        with self._cond:
            if self._lost_why is not None:
                return False
            self._lost_why = why
            guards = list(self._guards)
            self._cond.notify_all()
        if why != _WHY_CLOSED and self._root is self:
            log.warning("latchkey: session %d lost: %s", self.id, why)
        self._lost.set()
        for g in guards:
            g._lost_signal._signal.set()
        return True

    def _own_deadline(self) -> float:
        with self._cond:
            return self._deadline

    def _check_deadline(self) -> None:
        """Past the deadline the session is lost, whether or not the renewal thread's timer has
        fired yet (after a process pause it may not have): no renewal acknowledged after it
        counts, so marking it here is what the renewal thread would do. Any group session
        past its deadline loses the logical session."""
        if self._root._lost_why is not None:
            return
        at = core.now()
        for s in self._group_sessions():
            if at >= s._own_deadline():
                s._mark_lost(_WHY_DEADLINE)
                return

    def _lost_error(self) -> errors.SessionLost:
        return errors.SessionLost(self.id, self._lost_why or _WHY_DEADLINE)

    def _checked(self, e: errors.LatchkeyError) -> errors.LatchkeyError:
        if isinstance(e, errors.SessionNotFound):
            self._mark_lost(f"the server does not know the session: {e.message}")
            return self._lost_error()
        return e

    # --- the renewal thread ---------------------------------------------------------------
    def _renew(self) -> None:
        try:
            self._renew_until_lost()
        finally:
            if self._root._groups > 1 and self._lost_why != _WHY_CLOSED:
                # Lost (here or in another group): this group's locks are given up as well,
                # so that they go to their waiters now rather than when its lease runs out.
                try:
                    self._close_on_server()
                except errors.LatchkeyError as e:
                    log.debug("latchkey: closing session %d: %s", self.id, e)

    def _renew_until_lost(self) -> None:
        lease = self._lease
        client = self._client
        while True:
            # A gather window early: see _core.KEEPALIVE_GATHER_S.
            wake_at = core.renewal_wake(lease)
            if self._lost.wait(max(wake_at - core.now(), 0.0)):
                return
            sent = core.now()
            if sent >= lease.deadline():
                break
            if sent < wake_at:
                continue
            try:
                # With every other session of this client due now, in one KeepAlive per
                # member that leads any of their groups.
                answer, addr, failed_attempts = client._keepalives.renew(
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
                break  # acknowledged too late: the deadline passed while it travelled
            if answer is None:
                log.warning("latchkey: KeepAlive answer without session %d", self.id)
                lease.failed(core.now())
                continue
            if not answer.alive:
                self._mark_lost("the server says the session has expired")
                return
            self._taken_now(frozenset(answer.revoked_tokens), answer.revoked_through)
            self._contended_now(answer.contended, answer.contended_truncated)
            lease.acknowledged(sent, answer.ttl_ms / 1000)
            failover = self._failover_detector.acknowledged(addr, failed_attempts)
            with self._cond:
                self._deadline = lease.deadline()
                if failover:
                    self._failovers += 1
            if failover:
                log.info("latchkey: session %d renewed after a failover (by %s)", self.id, addr)
        self._mark_lost(_WHY_DEADLINE)

    def _taken_now(self, tokens: frozenset, through: int) -> None:
        with self._cond:
            if (tokens, through) == self._taken:
                return
            self._taken = (tokens, through)
            hit = [g for g in self._guards if g._taken()]
        for g in hit:
            log.warning("latchkey: an operator force-released lock %r (token %d)", g.name, g.token)
            g._lost_signal._signal.set()

    def _contended_now(self, names: Sequence[str], truncated: bool) -> None:
        """A keepalive's list of held names that someone waits for: all of them, or,
        `truncated`, the first of them in name order (what was known of the names after its
        last one is kept until an answer that lists all: the Rust client's contended_now)."""
        with self._cond:
            new = core.merge_contended(self._contended, names, truncated)
            if new == self._contended:
                return
            self._contended = new
            self._cond.notify_all()

    def _forget_contended(self, name: str) -> None:
        """A guard of `name` ended: what the keepalives said of its waiters is not a later
        grant's (the Rust client's forget_contended). Called with `_cond` held."""
        if name in self._contended:
            self._contended = self._contended - {name}

    # --- sequence numbers ---------------------------------------------------------------------
    def _begin(self) -> int:
        with self._cond:
            while True:
                if self._lost_why is not None:
                    raise self._lost_error()
                seq = self._window.try_begin()
                if seq is not None:
                    return seq
                self._cond.wait()

    def _end(self, seq: int) -> None:
        with self._cond:
            self._window.end(seq)
            self._cond.notify_all()

    # --- acquire ---------------------------------------------------------------------------
    def _acquire_once(self, name: str, mode: core.AcquireMode, seq: int,
                      deadline: Optional[float], not_after: Optional[float],
                      first: bool = False):
        if deadline is None:
            wait_ms = core.WAIT_TIMEOUT_MS_MAX
        else:
            wait_ms = min(max(int((deadline - core.now()) * 1000), 0), core.WAIT_TIMEOUT_MS_MAX)
        request = core.acquire_request(self._key, seq, name, wait_ms, mode)
        if first and self._client._batch:
            # In a batch, a request that must wait answers PENDING at once (the server does
            # not long-poll it there): the next send of it is a call of its own.
            try:
                response, _, _ = self._client._call(
                    "Acquire", request, attempt_timeout=self._client._rpc_timeout,
                    backoff_max=core.CLIENT_ACQUIRE_BACKOFF_MS_MAX / 1000,
                    session=self, not_after=not_after, group=self._group, batch=True)
            except errors.LatchkeyError as e:
                raise self._checked(e) from None
            return response
        try:
            response, _, _ = self._client._call(
                "Acquire", request,
                # The server long-polls at most ACQUIRE_POLL_MS_MAX whatever we ask.
                attempt_timeout=core.ACQUIRE_POLL_MS_MAX / 1000 + self._client._rpc_timeout,
                backoff_max=core.CLIENT_ACQUIRE_BACKOFF_MS_MAX / 1000,
                session=self, not_after=not_after, group=self._group)
        except errors.LatchkeyError as e:
            raise self._checked(e) from None
        return response

    def _lock_once(self, name: str, mode: core.AcquireMode, deadline: Optional[float],
                   positions: Optional[Callable[[int], None]] = None) -> Optional["LockGuard"]:
        """One logical Acquire (one seq, re-sent until decided). None: start again with a new
        seq (only after the server's own day-long cap on a wait forever)."""
        seq = self._begin()
        armed = True  # while armed, leaving settles the request in the background
        try:
            give_up_at = None if deadline is None else (
                deadline + core.CLIENT_UNANSWERED_AFTER_DEADLINE_MS_MAX / 1000)
            first = True
            while True:
                polled_at = core.now()
                try:
                    response = self._acquire_once(name, mode, seq, deadline, give_up_at, first)
                    first = False
                except (errors.Unavailable, errors.TransportError):
                    # The retry budget of one call ran out (a long election, a partition):
                    # keep trying under the same seq while the session and the wait last.
                    if give_up_at is None or core.now() < give_up_at:
                        continue
                    raise errors.WaitTimeout(name) from None
                except errors.SessionLost:
                    armed = False
                    raise
                except errors.Conflict as e:
                    if e.reason == "request-too-old":
                        # Granted or not, the outcome is forgotten: look and release.
                        armed = False
                        self._spawn(self._release_orphan, name)
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
                self._spawn(self._settle, name, mode, seq, deadline)
            else:
                self._end(seq)

    def _spawn(self, target, *args) -> None:
        with self._cond:
            if self._closed:
                return
            self._background = {t for t in self._background if t.is_alive()}

            def run() -> None:
                try:
                    target(*args)
                except errors.LatchkeyError as e:
                    log.debug("latchkey: background clean-up of session %d: %s", self.id, e)
                finally:
                    with self._cond:
                        self._background.discard(threading.current_thread())

            t = threading.Thread(target=run, name=f"latchkey-settle-{self.id}", daemon=True)
            self._background.add(t)
        t.start()

    def _settle(self, name: str, mode: core.AcquireMode, seq: int,
                deadline: Optional[float]) -> None:
        """Re-sends an abandoned Acquire until it is decided and releases a late grant, so that
        a lock nobody holds a guard for does not stay held until the session ends. Ends with
        the session at the latest (closing it aborts the call)."""
        try:
            while self._lost_why is None:
                try:
                    response = self._acquire_once(name, mode, seq, deadline, None)
                except (errors.Unavailable, errors.TransportError):
                    continue
                except errors.Conflict as e:
                    if e.reason == "request-too-old":
                        self._release_orphan(name)
                    return
                if response.result == _PENDING:
                    continue
                if response.result == _GRANTED:
                    log.debug("latchkey: releasing %r, granted after its wait was abandoned", name)
                    self._release_on_server(name, response.token)
                return
        finally:
            self._end(seq)

    def _release_orphan(self, name: str) -> None:
        # Of a name with several holders (readers, permits), this session's grant.
        mine = core.own_holder(self._client.describe(name), self.id)
        if mine is None:
            return
        with self._cond:
            if any(g.name == name for g in self._guards):
                return
        self._release_on_server(name, mine.token)

    def _release_on_server(self, name: str, token: int) -> None:
        with self._short:
            seq = self._begin()
            try:
                request = pb.ReleaseRequest(session=self._key, seq=seq, name=name, token=token)
                response, _, _ = self._client._call(
                    "Release", request, attempt_timeout=self._client._rpc_timeout, session=self,
                    group=self._group, batch=True)
            except errors.LatchkeyError as e:
                raise self._checked(e) from None
            finally:
                self._end(seq)
        if not response.released:
            raise errors.NotHeld(name, token)

    def _proclaim_on_server(self, name: str, token: int, value: bytes) -> None:
        with self._short:
            seq = self._begin()
            try:
                request = pb.ProclaimRequest(session=self._key, seq=seq, name=name, token=token,
                                             value=value)
                self._client._call("Proclaim", request, attempt_timeout=self._client._rpc_timeout,
                                   session=self, group=self._group)
            except errors.LatchkeyError as e:
                raise self._checked(e) from None
            finally:
                self._end(seq)


class LockGuard:
    """A held lock. Send its fencing token with every write to the protected resource
    (`fencing_headers()`), and stop when `lost` is set. `with guard:` releases on exit."""

    def __init__(self, session: Session, name: str, token: int) -> None:
        self._session = session
        self.name = name
        self.token = token
        self.session_id = session.id
        self._lost_signal = LostSignal(self)
        self._released = False
        with session._cond:
            session._guards.add(self)
            lost_already = session._lost_why is not None
        if lost_already:
            self._lost_signal._signal.set()

    @property
    def lost(self) -> LostSignal:
        return self._lost_signal

    def on_lost(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Same as `guard.lost.add_callback(fn)`."""
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
        """Whether the last keepalive answer said someone waits for this lock."""
        with self._session._cond:
            return self.name in self._session._contended

    def contended(self, timeout: Optional[float] = None) -> bool:
        """Blocks until someone is seen waiting for this lock (Chubby's "conflicting lock
        request"), so that a long holder can finish up and release it, and returns True; at
        once if one waits already. The session's keepalive answers list its held names that
        have waiters, so this returns within about a renewal interval (a third of the TTL) of
        the first waiter queueing. Also True when the lock may be lost (`lost`): nobody needs it
        released then. False once `timeout` seconds pass (None: no limit)."""
        session = self._session
        end = None if timeout is None else core.now() + max(float(timeout), 0.0)

        def wake() -> None:
            with session._cond:
                session._cond.notify_all()

        remove = self.on_lost(wake)
        try:
            with session._cond:
                while True:
                    if self.name in session._contended or self._lost_signal.is_set():
                        return True
                    now = core.now()
                    if end is not None and now >= end:
                        return False
                    # Woken by a keepalive answer or the lost signal; the deadline is also
                    # read from the clock (lost.is_set) at least when it passes.
                    until = session._deadline if end is None else min(end, session._deadline)
                    session._cond.wait(min(max(until - now, 0.001), _CONTENDED_WAKE_S))
        finally:
            remove()

    def fencing_headers(self) -> Dict[str, str]:
        """{"latchkey-lock": name, "latchkey-token": "<token>"} for a fenced resource."""
        return {core.LOCK_HEADER: self.name, core.TOKEN_HEADER: str(self.token)}

    def release(self) -> None:
        """Releases the lock. Raises LockLost (SessionLost, NotHeld) if it may have been lost
        before: then no call is made when this client already knows (the server frees a lost
        session's locks by expiry, and a force-released grant is someone else's). A second
        release does nothing."""
        if self._released:
            return
        self._released = True
        session = self._session
        with session._cond:
            session._guards.discard(self)
            session._forget_contended(self.name)
        if self._taken():
            raise errors.NotHeld(self.name, self.token)
        if session.is_lost():
            raise session._lost_error()
        session._release_on_server(self.name, self.token)

    def __enter__(self) -> "LockGuard":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Releases. With no exception in flight, raises LockLost if the lock may have been
        lost while held: the work done under it may not have been exclusive."""
        try:
            self.release()
        except errors.LatchkeyError:
            if exc_type is None:
                raise
            log.warning("latchkey: releasing %r after an exception failed", self.name,
                        exc_info=True)

    def __repr__(self) -> str:
        return f"LockGuard(name={self.name!r}, token={self.token}, session={self.session_id})"


class Leadership(LockGuard):
    """This session leads an election (`Session.campaign`): the grant of its campaign, a
    LockGuard (`token` is the term's fencing token; `lost`, `fencing_headers()`) that also
    publishes a `value`. `with leadership:` resigns on exit."""

    def __init__(self, session: Session, name: str, token: int, value: bytes) -> None:
        super().__init__(session, name, token)
        self.value = value

    def proclaim(self, value) -> None:
        """Replaces the published value without giving up leadership. Raises
        NotElectionLeader if this term has ended (resigned, force-released), SessionLost if
        the session is."""
        value = core.value_of(value)
        if self._released:
            raise errors.NotElectionLeader(
                f"the leadership of {self.name!r} (token {self.token}) was resigned")
        self._session._proclaim_on_server(self.name, self.token, value)
        self.value = value

    def resign(self) -> None:
        """Gives up leadership: the next candidate in the queue leads with a higher token.
        Raises as `LockGuard.release` does."""
        self.release()

    def __enter__(self) -> "Leadership":
        return self

    def __repr__(self) -> str:
        return (f"Leadership(name={self.name!r}, token={self.token}, value={self.value!r}, "
                f"session={self.session_id})")


class _Watch:
    """A watch of one election's name in its Raft group (watch.rs `GroupWatch`), moved to
    another member when its stream breaks or says nothing for CLIENT_WATCH_SILENCE_MS, from
    where it got to, without repeating or skipping an event (`core.WatchCursor`)."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self._name = name
        self._cursor = core.WatchCursor()
        self._call = None
        self._addr = ""
        # The silence watchdog: one thread for the watch's life (started with its first stream,
        # ended by close), which cancels a stream that has said nothing since `_heard` for
        # CLIENT_WATCH_SILENCE_MS. (A timer per message would start a thread per event.)
        self._heard = time.monotonic()
        self._watchdog: Optional[threading.Thread] = None
        self._broken = 0
        self._backoff = client._retry.backoff(None, client._rng)
        self._closed = threading.Event()

    def _open(self) -> None:
        client = self._client
        groups = client._ask_groups()
        group = core.group_of(self._name, groups)
        with client._lock:
            addr = client._route.pick(group)
        channel_call = client._stream_callable(addr, "Watch")
        request = core.watch_request(self._name, self._cursor.resume_index(),
                                     group if groups > 1 else None)
        # Heard "now" before the watchdog can see the new stream: it must not judge it by the
        # silence of the one it replaces.
        self._heard = time.monotonic()
        self._call = channel_call(request, metadata=client._metadata)
        self._addr = addr

    def _arm(self) -> None:
        """Restarts the silence clock (a stream silent past it is cancelled and resumed), and
        starts the watchdog with the first stream."""
        self._heard = time.monotonic()
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch_silence, daemon=True,
                                              name="latchkey-watch-silence")
            self._watchdog.start()

    def _watch_silence(self) -> None:
        silence = core.CLIENT_WATCH_SILENCE_MS / 1000
        while not self._closed.wait(silence / 4):
            call = self._call
            if call is not None and time.monotonic() - self._heard > silence:
                call.cancel()

    def _lost_stream(self, call) -> None:
        call.cancel()
        self._call = None
        if not self._closed.is_set():
            with self._client._lock:
                self._client._route.unreachable(self._addr, core.now())

    def next_step(self):
        """The next event or WatchMissed, or None once the position moved without one."""
        while True:
            if self._closed.is_set():
                raise core.WatchClosed()
            if self._call is None:
                self._broken += 1
                if self._broken > self._client._retry.attempts_max:
                    raise errors.Unavailable(
                        f"watch: {self._broken - 1} streams in a row broke before delivering "
                        "anything")
                if self._broken > 1 and self._closed.wait(self._backoff.next_delay()):
                    continue
                self._open()
            # Read from a local: close() from another thread drops self._call.
            call = self._call
            if call is None:
                continue
            self._arm()
            try:
                message = next(call)
            except StopIteration:
                self._lost_stream(call)
                continue
            except grpc.RpcError as e:
                fatal = core.watch_fatal(e.code(), e.details(), e.trailing_metadata())
                if fatal is not None:
                    self.close()
                    raise fatal from None
                log.debug("latchkey: watch stream at %s broke; resuming: %s", self._addr,
                          e.details())
                self._lost_stream(call)
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
        self._closed.set()
        call = self._call
        if call is not None:
            call.cancel()


class Observe:
    """The leaders of an election (`Client.observe`), as etcd's Observe: an iterator of
    `Leader`s, the current leader first (if one leads), then each new leader and each new
    value of a leader; never the same twice in a row, never an older leader after a newer one
    (tokens increase). A time with no leader is not an item (`Client.leader` says whether
    anyone leads now). It resumes across member failures; if a member can no longer replay
    what was missed, it re-reads the leader. `close()` (or `with`) ends it."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self._name = name
        self._watch = _Watch(client, name)
        self._state = core.Observed()

    def _start(self) -> None:
        # The watch first, then the read: whatever changes in between comes as events, which
        # the tokens put in their place. The first message (a progress) says the stream is on.
        try:
            while self._watch._cursor.last is None:
                item = self._watch.next_step()
                if item is not None:
                    self._apply(item)
            self._resync()
        except BaseException:
            self.close()
            raise

    def _resync(self) -> None:
        info, index = self._client._describe_read(self._name)
        self._state.read(core.leader_of(info), index)

    def _apply(self, item) -> None:
        if isinstance(item, core.WatchMissed):
            self._resync()
        elif item.lock == self._name:
            self._state.apply(item)

    def __iter__(self) -> "Observe":
        return self

    def __next__(self) -> core.Leader:
        """The next leader, or the leader's next value (StopIteration once closed, also
        from another thread)."""
        try:
            while True:
                news = self._state.news()
                if news is not None:
                    return news
                item = self._watch.next_step()
                if item is not None:
                    self._apply(item)
        except core.WatchClosed:
            raise StopIteration from None

    def close(self) -> None:
        self._watch.close()

    def __enter__(self) -> "Observe":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _SessionLock:
    """The context manager of Client.lock and Client.campaign: a session of its own, one
    grant."""

    def __init__(self, client: Client, name: str, ttl: float, wait: Optional[float],
                 owner: Optional[str], mode: core.AcquireMode) -> None:
        self._client = client
        self._args = (name, ttl, wait, owner)
        self._mode = mode
        self._session: Optional[Session] = None
        self._guard: Optional[LockGuard] = None

    def __enter__(self) -> LockGuard:
        name, ttl, wait, owner = self._args
        core.validate_name(name)
        session = self._client.session(ttl, owner=owner)
        try:
            self._guard = session._take(name, core.wait_of(wait), self._mode)
        except BaseException:
            session.close()
            raise
        self._session = session
        return self._guard

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self._session is not None and self._guard is not None
        try:
            self._guard.__exit__(exc_type, exc, tb)
        finally:
            self._session.close()
