"""What the blocking and the asyncio clients share: limits, the clock, the lease arithmetic,
the sequence window, routing, backoff and the one place where a gRPC status becomes an error.

Nothing here does I/O or starts a thread; the Rust client (crates/client) is the reference and
each piece names its counterpart there.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import grpc

from . import errors
from ._proto import latchkey_pb2 as pb

# --- Limits, mirrored from crates/core/src/limits.rs (the reasons are there). -----------------
LOCK_NAME_BYTES_MAX = 512
SESSION_TTL_MS_MIN = 1_000
SESSION_TTL_MS_MAX = 3_600_000
SESSION_TTL_MS_DEFAULT = 15_000
SESSION_SEQ_WINDOW_MAX = 128
SESSION_WAITS_IN_FLIGHT_MAX = 64
SESSION_SHORT_REQUESTS_IN_FLIGHT_MAX = 32
WAIT_TIMEOUT_MS_MAX = 86_400_000
ACQUIRE_POLL_MS_MAX = 10_000
CLIENT_MESSAGE_BYTES_MAX = 8 * 1024 * 1024
CLIENT_RENEWAL_TTL_DIVISOR = 3
CLIENT_SAFETY_MARGIN_TTL_DIVISOR = 5
CLIENT_SAFETY_MARGIN_MS_MIN = 200
CLIENT_RENEWAL_ATTEMPT_TTL_DIVISOR = 5
CLIENT_RENEWAL_ATTEMPT_MS_MIN = 200
CLIENT_RENEWAL_BACKOFF_TTL_DIVISOR = 20
CLIENT_RENEWAL_BACKOFF_MS_MIN = 50
CLIENT_BACKOFF_MS_MAX = 250
CLIENT_BACKOFF_MS_INITIAL = 50
CLIENT_ATTEMPTS_MAX = 64
CLIENT_ELAPSED_MS_MAX = 20_000
# While no attempt of a call has reached a server (names that do not resolve, connections
# refused): a dead or misspelled endpoint is reported in about 2 s, not after the whole budget
# (limits::CLIENT_UNREACHABLE_MS_MAX).
CLIENT_UNREACHABLE_MS_MAX = 2_000
LEADERLESS_MS_MAX_DEFAULT = 100 + 3 * 600
CLIENT_REFUSED_HINT_IGNORE_MS = LEADERLESS_MS_MAX_DEFAULT
CLIENT_ACQUIRE_BACKOFF_MS_MAX = 250
CLIENT_PENDING_AFTER_DEADLINE_MS_MAX = 2 * ACQUIRE_POLL_MS_MAX
CLIENT_UNANSWERED_AFTER_DEADLINE_MS_MAX = 1_000
CLIENT_RPC_TIMEOUT_MS_DEFAULT = 5_000
# HTTP/2 PING of a connection with calls open, and the time its answer may take (docs/protocol.md 2.1).
CLIENT_PING_INTERVAL_MS = 1_000
CLIENT_PING_TIMEOUT_MS = 1_000
KEEPALIVE_SESSIONS_MAX = 1_024  # sessions renewed by one KeepAlive request
# Operations in one Batch call (limits::BATCH_CALL_OPS_MAX; a server refuses more with
# INVALID_ARGUMENT `batch-too-large`): with `batch=True` the operations waiting for the next
# batch to one member go in calls of at most this many, the rest in the next one.
BATCH_CALL_OPS_MAX = 256
# Locks returned by one List request; a list merged from several Raft groups is cut to it too,
# so that it is no longer than one group's could be.
LIST_RESULTS_MAX = 10_000
# Raft groups one cluster may run (`serve --groups`): a count a server answers outside
# 1..GROUPS_MAX is a protocol error, and it bounds the per-group state this client keeps (one
# leader route and one session per group).
GROUPS_MAX = 64
# Records the audit log keeps, oldest dropped first (one Audit answer holds them all).
AUDIT_RECORDS_MAX = 1_000
# Bytes of an administrative action's reason: a sentence or a ticket link.
AUDIT_REASON_BYTES_MAX = 1_024
# Bytes of each actor string of an audit record (the identity, the operator's claimed name).
AUDIT_ACTOR_BYTES_MAX = 256
# Holders of one name at once, and so a semaphore's most permits (limits::HOLDERS_PER_LOCK_MAX).
HOLDERS_PER_LOCK_MAX = 1_024
# Bytes of an election's published value (limits::ELECTION_VALUE_BYTES_MAX).
ELECTION_VALUE_BYTES_MAX = 1_024
# A lock-delay's longest, in ms (limits::LOCK_DELAY_MS_MAX): 5 minutes.
LOCK_DELAY_MS_MAX = 300_000
# Names one keepalive lease lists as contended (limits::CONTENDED_PER_LEASE_MAX).
CONTENDED_PER_LEASE_MAX = 64
# A watch stream says how far it got this often when idle (limits::WATCH_PROGRESS_MS); one that
# says nothing for CLIENT_WATCH_SILENCE_MS is taken for dead and resumed on another member.
WATCH_PROGRESS_MS = 2_000
CLIENT_WATCH_SILENCE_MS = 4 * WATCH_PROGRESS_MS
# Session ids and fencing tokens are protobuf uint64.
U64_MAX = 2**64 - 1
# Same relations as the Rust const assertions, checked at import.
assert 2 * SESSION_SEQ_WINDOW_MAX <= 256  # SESSION_OUTCOMES_MAX
assert SESSION_WAITS_IN_FLIGHT_MAX + SESSION_SHORT_REQUESTS_IN_FLIGHT_MAX < SESSION_SEQ_WINDOW_MAX
assert CLIENT_WATCH_SILENCE_MS >= 2 * WATCH_PROGRESS_MS
assert 2 * CLIENT_SAFETY_MARGIN_TTL_DIVISOR <= CLIENT_RENEWAL_TTL_DIVISOR * (
    CLIENT_SAFETY_MARGIN_TTL_DIVISOR - 1
)

ERROR_REASON_KEY = "latchkey-error"
LEADER_ADDR_KEY = "latchkey-leader-addr"
# The Raft group an error of a cluster of several groups came from (decimal): its leader hint
# is that group's leader (protocol.md, 2.4).
GROUP_KEY = "latchkey-group"
TOKEN_HEADER = "latchkey-token"
LOCK_HEADER = "latchkey-lock"
TLS_REQUIRED_MESSAGE = "latchkey: this server speaks TLS"

# --- The clock. ----------------------------------------------------------------------------
if hasattr(time, "CLOCK_BOOTTIME"):

    def now() -> float:
        """Seconds on CLOCK_BOOTTIME: monotonic, and counts time the machine was suspended, so
        that a holder resuming from suspend sees its lease deadline passed at once (as the
        server does). Timers (Event.wait, asyncio.sleep) still run on CLOCK_MONOTONIC: a
        renewal wakes on that schedule, which is why every "lost?" question reads this clock
        itself rather than trusting a timer."""
        return time.clock_gettime(time.CLOCK_BOOTTIME)

else:  # pragma: no cover - not Linux

    def now() -> float:
        """time.monotonic: whether it counts suspended time depends on the platform (macOS's
        does not), so a holder there learns of a loss after a suspend from its next renewal."""
        return time.monotonic()


# --- Validation. ---------------------------------------------------------------------------
def validate_name(name: str) -> None:
    if not isinstance(name, str):
        raise errors.InvalidArgument(f"a lock name is a str, not {type(name).__name__}")
    n = len(name.encode("utf-8"))
    if n == 0:
        raise errors.InvalidArgument("the lock name is empty")
    if n > LOCK_NAME_BYTES_MAX:
        raise errors.InvalidArgument(
            f"the lock name has {n} bytes, more than {LOCK_NAME_BYTES_MAX}"
        )
    for i, c in enumerate(name):
        if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0:  # Unicode Cc, as Rust's char::is_control
            raise errors.InvalidArgument(f"the lock name has a control character at {i}")


def ttl_ms_of(ttl: float) -> int:
    """A TTL in seconds as the protocol's milliseconds, checked against the server's range."""
    try:
        ms = int(round(float(ttl) * 1000))
    except (TypeError, ValueError):
        raise errors.InvalidArgument(f"ttl must be a number of seconds, not {ttl!r}") from None
    if not SESSION_TTL_MS_MIN <= ms <= SESSION_TTL_MS_MAX:
        raise errors.InvalidArgument(
            f"ttl {ttl} s is outside {SESSION_TTL_MS_MIN / 1000:g}..{SESSION_TTL_MS_MAX / 1000:g} s"
        )
    return ms


def wait_of(wait: Optional[float]) -> Optional[float]:
    if wait is None:
        return None
    try:
        w = float(wait)
    except (TypeError, ValueError):
        raise errors.InvalidArgument(f"wait must be seconds or None, not {wait!r}") from None
    if w < 0 or w != w:
        raise errors.InvalidArgument(f"wait must be >= 0 seconds, not {wait!r}")
    return w


# Rust's char::is_whitespace (Unicode White_Space), which the server's `reason.trim()` strips:
# Python's str.isspace also counts U+001C..U+001F, which the server keeps.
_RUST_WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def validate_reason(reason: str) -> None:
    """An administrative action's reason, as the server checks it (core's validate_reason):
    required (not only whitespace), at most AUDIT_REASON_BYTES_MAX bytes of UTF-8."""
    if not isinstance(reason, str):
        raise errors.InvalidArgument(f"a reason is a str, not {type(reason).__name__}")
    if all(c in _RUST_WHITESPACE for c in reason):
        raise errors.InvalidArgument("a reason is required (it is recorded in the audit log)",
                                     reason="reason-empty")
    n = len(reason.encode("utf-8"))
    if n > AUDIT_REASON_BYTES_MAX:
        raise errors.InvalidArgument(
            f"the reason has {n} bytes, more than {AUDIT_REASON_BYTES_MAX}",
            reason="field-too-long")


def validate_operator(operator: str) -> None:
    """Who the operator says they are (audit record's `operator`): at most
    AUDIT_ACTOR_BYTES_MAX bytes of UTF-8, may be empty."""
    if not isinstance(operator, str):
        raise errors.InvalidArgument(f"an operator is a str, not {type(operator).__name__}")
    n = len(operator.encode("utf-8"))
    if n > AUDIT_ACTOR_BYTES_MAX:
        raise errors.InvalidArgument(
            f"the operator has {n} bytes, more than {AUDIT_ACTOR_BYTES_MAX}",
            reason="field-too-long")


# How an acquire takes a name (docs/primitives.md): the LockInfo.mode strings, the HTTP API's.
EXCLUSIVE = "exclusive"
SHARED = "shared"
PERMITS = "permits"
_MODE_NAMES = {pb.LOCK_MODE_EXCLUSIVE: EXCLUSIVE, pb.LOCK_MODE_SHARED: SHARED,
               pb.LOCK_MODE_PERMITS: PERMITS}


class AcquireMode(NamedTuple):
    """An Acquire's `mode` and `permits` fields (0 but with LOCK_MODE_PERMITS), a
    campaign's election `value` (None: not a campaign; exclusive mode only), and its
    `lock_delay_ms` (0: none; exclusive mode only, never with a value)."""

    mode: int
    permits: int
    value: Optional[bytes] = None
    lock_delay_ms: int = 0


def acquire_request(session: "pb.Session", seq: int, name: str, wait_ms: int,
                    mode: AcquireMode) -> "pb.AcquireRequest":
    request = pb.AcquireRequest(session=session, seq=seq, name=name, wait_timeout_ms=wait_ms,
                                mode=mode.mode, permits=mode.permits,
                                lock_delay_ms=mode.lock_delay_ms)
    if mode.value is not None:
        request.value = mode.value
    return request


def lock_delay_ms_of(lock_delay: object) -> int:
    """A lock-delay in seconds (None or 0: none) as the Acquire's `lock_delay_ms`, rounded UP
    to whole milliseconds (a delay asked for is never shortened, and 0.5 ms is not none), as
    the Rust client's LockRequest::lock_delay: InvalidArgument if negative, not a number, or
    above LOCK_DELAY_MS_MAX (the server's words: "a lock-delay is at most 300000 ms, not N")."""
    if lock_delay is None:
        return 0
    if isinstance(lock_delay, bool) or not isinstance(lock_delay, (int, float)):
        raise errors.InvalidArgument(
            f"a lock-delay is seconds (an int or a float), not {type(lock_delay).__name__}")
    if lock_delay != lock_delay or lock_delay < 0:
        raise errors.InvalidArgument(f"a lock-delay is 0 or more seconds, not {lock_delay!r}")
    if lock_delay == float("inf"):
        raise errors.InvalidArgument(
            f"a lock-delay is at most {LOCK_DELAY_MS_MAX} ms, not inf",
            reason="lock-delay-out-of-range")
    else:
        # Of a float, the decimal its repr shows (1.1 s is 1100 ms, not 1101 by binary error).
        exact = Decimal(lock_delay) if isinstance(lock_delay, int) else Decimal(repr(lock_delay))
        ms = math.ceil(exact * 1000)
    if ms > LOCK_DELAY_MS_MAX:
        raise errors.InvalidArgument(
            f"a lock-delay is at most {LOCK_DELAY_MS_MAX} ms, not {ms}",
            reason="lock-delay-out-of-range")
    return ms


def value_of(value: object) -> bytes:
    """An election value as sent: bytes as they are, a str as UTF-8; InvalidArgument over
    ELECTION_VALUE_BYTES_MAX bytes or of another type (core's validate_value)."""
    if isinstance(value, str):
        value = value.encode()
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise errors.InvalidArgument(
            f"an election value is bytes or str, not {type(value).__name__}")
    value = bytes(value)
    if len(value) > ELECTION_VALUE_BYTES_MAX:
        raise errors.InvalidArgument(
            f"an election value is at most {ELECTION_VALUE_BYTES_MAX} bytes, not {len(value)}")
    return value


def campaign_mode(value: object) -> AcquireMode:
    """The mode of `campaign(name, value)`: an exclusive acquire publishing `value`."""
    return AcquireMode(pb.LOCK_MODE_EXCLUSIVE, 0, value_of(value))


def acquire_mode(shared: bool = False, permits: Optional[int] = None,
                 lock_delay: Optional[float] = None) -> AcquireMode:
    """The mode of `lock(name, shared=..., permits=..., lock_delay=...)`, checked before any
    call as the Rust client's LockRequest::wait does: PermitsOutOfRange for 0 or more than
    HOLDERS_PER_LOCK_MAX permits, InvalidArgument for both a reader and permits, and for a
    lock-delay out of range (lock_delay_ms_of) or with a reader or permits (a mutex's only)."""
    delay_ms = lock_delay_ms_of(lock_delay)
    if delay_ms > 0 and (shared or permits is not None):
        raise errors.InvalidArgument("a lock-delay is for an exclusive lock (a mutex) only")
    if permits is None:
        return AcquireMode(pb.LOCK_MODE_SHARED if shared else pb.LOCK_MODE_EXCLUSIVE, 0,
                           lock_delay_ms=delay_ms)
    if shared:
        raise errors.InvalidArgument(
            "a lock is taken shared (a reader) or as one of a semaphore's permits, not both")
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise errors.InvalidArgument(f"permits is an int, not {type(permits).__name__}")
    if not 1 <= permits <= HOLDERS_PER_LOCK_MAX:
        raise errors.PermitsOutOfRange(permits, HOLDERS_PER_LOCK_MAX)
    return AcquireMode(pb.LOCK_MODE_PERMITS, permits)


def u64_of(what: str, value: object) -> int:
    """A session id or token as the protocol's uint64 (not a bool, not a float)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidArgument(f"{what} is an int, not {type(value).__name__}")
    if not 0 <= value <= U64_MAX:
        raise errors.InvalidArgument(f"{what} {value} is outside 0..2**64-1")
    return value


def operator_of_this_process() -> str:
    """`user@host`, as `latchkey admin` records it beside the authenticated identity
    (crates/cli/src/admin.rs, operator()): each part cut as a session owner's is."""
    me = owner_of_this_process()
    user, host = me.user.strip(), me.host.strip()
    if user and host:
        out = f"{user}@{host}"
    elif user or host:
        out = user if user else f"@{host}"
    else:
        out = ""
    return out.encode()[:AUDIT_ACTOR_BYTES_MAX].decode("utf-8", "ignore")


# --- Raft groups (crates/core/src/groups.rs; protocol.md, 2.4). ----------------------------
_U64 = U64_MAX
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


def _fnv1a64(data: bytes) -> int:
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _U64
    return h


def _fmix64(k: int) -> int:
    """MurmurHash3's 64-bit finalizer."""
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _U64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _U64
    k ^= k >> 33
    return k


def _jump(key: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash, its step in IEEE-754 doubles as published
    (Python's float is one; `key >> 33` and `b + 1` convert exactly)."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & _U64
        j = int(float(b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def group_of(name: str, groups: int) -> int:
    """The Raft group of the lock `name` in a cluster of `groups` groups: FNV-1a 64 of its
    UTF-8 bytes, MurmurHash3's finalizer, then jump consistent hash onto 0..groups."""
    if groups < 1:
        raise ValueError("a cluster has at least one group")
    return _jump(_fmix64(_fnv1a64(name.encode("utf-8"))), groups)


def group_of_session(session_id: int, groups: int) -> int:
    """The group that knows session `session_id`: its id is `index * groups + group`."""
    if groups < 1:
        raise ValueError("a cluster has at least one group")
    return session_id % groups


def checked_groups(answered: int, what: str) -> int:
    """A group count a server answered (0 from a server before groups: one), checked."""
    groups = max(int(answered), 1)
    if groups > GROUPS_MAX:
        raise errors.ProtocolError(
            f"{what} answered {groups} Raft groups, more than {GROUPS_MAX}")
    return groups


# --- The lease (crates/client/src/session.rs, ClientLease). ---------------------------------
def safety_margin(ttl: float) -> float:
    """max(TTL / 5, 200 ms)."""
    return max(ttl / CLIENT_SAFETY_MARGIN_TTL_DIVISOR, CLIENT_SAFETY_MARGIN_MS_MIN / 1000)


def renewal_attempt_timeout(ttl: float) -> float:
    return max(ttl / CLIENT_RENEWAL_ATTEMPT_TTL_DIVISOR, CLIENT_RENEWAL_ATTEMPT_MS_MIN / 1000)


def renewal_backoff_max(ttl: float) -> float:
    return max(ttl / CLIENT_RENEWAL_BACKOFF_TTL_DIVISOR, CLIENT_RENEWAL_BACKOFF_MS_MIN / 1000)


class ClientLease:
    """A session's lease as the client sees it. The server expires a session TTL after it last
    received a renewal; the client cannot see that clock, so it keeps a conservative one: the
    send instant of the last renewal the server acknowledged, plus the TTL, minus the safety
    margin. The server received that renewal after it was sent, so its deadline is later than
    ours by at least the margin: the time a holder has to stop working."""

    def __init__(self, sent: float, ttl: float, grid: Optional[float] = None) -> None:
        self.ttl = ttl
        self.margin = safety_margin(ttl)
        self.acked_sent = sent
        self.retry_at: Optional[float] = None
        # The group sessions of one logical session renew on one schedule (protocol.md, 2.4):
        # each renewal falls on `grid + k * interval`, the first such instant after the last
        # acknowledged send, so that all of them are due together and travel in the same
        # KeepAlive requests however far apart they were made. None: the regular schedule.
        self.grid = grid

    def deadline(self) -> float:
        return self.acked_sent + max(self.ttl - self.margin, 0.0)

    def next_renewal(self) -> float:
        if self.retry_at is not None:
            return self.retry_at
        interval = self.ttl / CLIENT_RENEWAL_TTL_DIVISOR
        regular = self.acked_sent + interval
        if self.grid is not None and regular > self.grid and interval > 0:
            # The last grid instant at or before the regular time, and after the last send.
            # A renewal wakes (and is sent) up to KEEPALIVE_GATHER_S before its instant
            # (`renewal_wake`), so both sides are shifted by that much: the instant a renewal
            # sent early was for is not due again, and the wake (this minus the gather
            # window) is never later than the regular schedule.
            shifted = regular + KEEPALIVE_GATHER_S
            aligned = shifted - (shifted - self.grid) % interval
            if aligned > self.acked_sent + KEEPALIVE_GATHER_S:
                return aligned
        return regular

    def acknowledged(self, sent: float, server_ttl: float) -> None:
        """An older acknowledgement never moves the deadline back; a shorter server TTL is
        believed (0 means "not said")."""
        if sent >= self.acked_sent:
            self.acked_sent = sent
        if 0 < server_ttl < self.ttl:
            self.ttl = server_ttl
            self.margin = safety_margin(server_ttl)
        self.retry_at = None

    def failed(self, at: float) -> None:
        """A renewal failed at `at`: try again after a tenth of the TTL (at least 100 ms), never
        later than the deadline."""
        step = max(self.ttl / 10, 0.1)
        self.retry_at = min(at + step, self.deadline())


# --- The failover signal (session.rs, FailoverDetector). ----------------------------------
class FailoverDetector:
    """Whether an acknowledged renewal marks a failover: another node answered it than the
    previous one (the first: the node that answered CreateSession), or it was answered only
    after failed attempts, or a renewal failed since the last acknowledgement. A session's
    `failovers()` counts them."""

    def __init__(self, endpoint: str) -> None:
        self.last_endpoint = endpoint
        self.disrupted = False

    def failed(self) -> None:
        """A renewal failed after its retries."""
        self.disrupted = True

    def acknowledged(self, endpoint: str, failed_attempts: int) -> bool:
        failover = self.disrupted or failed_attempts > 0 or endpoint != self.last_endpoint
        self.disrupted = False
        self.last_endpoint = endpoint
        return failover


# --- Keepalive batches (crates/client/src/keepalive.rs). -----------------------------------
# How long the first renewal to join an empty batch lets the others join before the batch is
# sent (the Rust client yields one scheduler turn; tokio's timers tick in whole milliseconds, so
# renewals due in the same millisecond meet there). Python's timers do not tick: renewals due
# together wake one thread or task after another under the GIL, spread over milliseconds, and
# a window of one turn catches fewer of them (200 sessions opened at once, 800 renewals: 68
# KeepAlives from threads and 39 from tasks with no window, 23 and 27 with this one). So every
# renewal wakes this much before it is due (`renewal_wake`) and its batch leaves at most this
# much after its first member joined: no member's KeepAlive is sent later than it would be
# alone, and none more than this much early (its deadline, counted from the instant it
# joined, is that much conservative). 2 ms is under half a percent of the shortest slack a
# renewal has (TTL 1 s: due at 333 ms, deadline at 800 ms).
KEEPALIVE_GATHER_S = 0.002


def renewal_wake(lease: ClientLease) -> float:
    """When a session's renewal wakes to join the next keepalive batch: KEEPALIVE_GATHER_S
    before its renewal is due, and never after its deadline."""
    return min(lease.next_renewal() - KEEPALIVE_GATHER_S, lease.deadline())


@dataclass
class KeepAliveWaiting:
    """One session's renewal waiting in a batch. `attempt_timeout`/`backoff_max` are what it
    would use alone; `not_after` is its deadline (it stops waiting then); `reply` is where the
    blocking or asyncio client puts its answer; `group` is its session's Raft group."""

    session: "pb.Session"
    attempt_timeout: float
    backoff_max: float
    not_after: float
    reply: Any
    # The Raft group of the session (0 in a cluster of one): a batch goes out as one request
    # per member that leads any of its members' groups.
    group: int = 0


class KeepAliveQueue:
    """The renewals waiting for the next batch (keepalive.rs, Batcher). Not locked: the
    blocking client guards it with a lock, the asyncio one runs it on one event loop."""

    def __init__(self) -> None:
        self._waiting: List[KeepAliveWaiting] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def join(self, waiting: KeepAliveWaiting) -> bool:
        """Adds a renewal; True if it is the first of an empty batch: then the caller starts
        the sender (which gathers, then `take`s until empty)."""
        self._waiting.append(waiting)
        return len(self._waiting) == 1

    def take(self) -> List[KeepAliveWaiting]:
        """The oldest waiting renewals, up to KEEPALIVE_SESSIONS_MAX: one request's worth."""
        batch = self._waiting[:KEEPALIVE_SESSIONS_MAX]
        del self._waiting[:KEEPALIVE_SESSIONS_MAX]
        return batch


# --- Coalescing (`batch=True`, issue #35; the Rust client's batch.rs, Coalescer). ----------
# The calls that may ride a Batch call, and the BatchOp/BatchResult field each one is.
BATCH_OPS = {"Acquire": "acquire", "Release": "release", "CloseSession": "close_session"}

_STATUS_OF_CODE = {c.value[0]: c for c in grpc.StatusCode}


class BatchWaiting:
    """One operation waiting for its batch: `op` is its BatchOp field, `request` the request
    its own call would send; `answer` becomes its own call's response or a Failure (that
    call's error, rebuilt from the operation's BatchError)."""

    __slots__ = ("op", "request", "answer", "reply")

    def __init__(self, op: str, request: Any, reply: Any = None) -> None:
        self.op = op
        self.request = request
        self.answer: Any = None
        # Where the blocking or asyncio client wakes the caller (an Event, a Future).
        self.reply = reply


class BatchQueue:
    """The operations waiting for the next Batch call to one member. Not locked: the blocking
    client guards it with a lock, the asyncio one runs it on one event loop. A caller that
    finds no batch in flight starts the sender (its operation goes at once, alone); the others
    wait for the batch in flight to be answered and then go together."""

    def __init__(self) -> None:
        self._waiting: List[BatchWaiting] = []
        self.sending = False

    def __len__(self) -> int:
        return len(self._waiting)

    def join(self, waiting: BatchWaiting) -> bool:
        """Adds an operation; True if no batch was in flight: the caller starts the sender."""
        self._waiting.append(waiting)
        start = not self.sending
        self.sending = True
        return start

    def take(self) -> List[BatchWaiting]:
        """The oldest waiting operations, up to BATCH_CALL_OPS_MAX (one call's worth); none:
        the sender stops (the next operation starts a new one)."""
        batch = self._waiting[:BATCH_CALL_OPS_MAX]
        del self._waiting[:BATCH_CALL_OPS_MAX]
        if not batch:
            self.sending = False
        return batch


def batch_request(batch: Sequence[BatchWaiting]) -> "pb.BatchRequest":
    return pb.BatchRequest(ops=[pb.BatchOp(**{w.op: w.request}) for w in batch])


def batch_error_failure(e: "pb.BatchError") -> Failure:
    """What the operation's own call would have failed with: its status (code, message) and
    metadata (reason, leader hint, group) classified as that call's would be."""
    code = _STATUS_OF_CODE.get(e.code, grpc.StatusCode.UNKNOWN)
    metadata = []
    if e.reason:
        metadata.append((ERROR_REASON_KEY, e.reason))
    # The leader's id (`latchkey-leader-id`) is not read by this client: its address is.
    if e.leader_addr:
        metadata.append((LEADER_ADDR_KEY, e.leader_addr))
    if e.HasField("group"):
        metadata.append((GROUP_KEY, str(e.group)))
    return classify(code, e.message, metadata)


def batch_answers(batch: Sequence[BatchWaiting], response: "pb.BatchResponse") -> List[Any]:
    """Each operation's answer out of a Batch call's: its own response, or a Failure."""
    if len(response.results) != len(batch):
        failure = Failure("fatal", "", error=errors.ProtocolError(
            f"a Batch call of {len(batch)} operations was answered with "
            f"{len(response.results)} results"))
        return [failure] * len(batch)
    out: List[Any] = []
    for w, r in zip(batch, response.results):
        kind = r.WhichOneof("result")
        if kind == "error":
            out.append(batch_error_failure(r.error))
        elif kind == w.op:
            out.append(getattr(r, kind))
        else:
            out.append(Failure("fatal", "", error=errors.ProtocolError(
                f"a Batch call answered a {w.op} operation with {kind or 'no result'}")))
    return out


def batch_call_failure(code: grpc.StatusCode, details: Optional[str], metadata,
                       addr: str) -> Failure:
    """A Batch call that failed as a whole: each of its operations fails with its status."""
    failure = classify(code, details, metadata)
    if failure.kind == "transport":
        failure.message = f"cannot reach {addr}: {failure.message}"
    return failure


@dataclass(frozen=True)
class KeepAliveBatch:
    request: "pb.KeepAliveRequest"
    attempt_timeout: float
    backoff_max: float
    not_after: float


def keepalive_batch(batch: Sequence[KeepAliveWaiting]) -> KeepAliveBatch:
    """One request for `batch`, as the Rust client's `send` builds it: attempts as long as its
    most patient member's (a member with a short TTL must not cut every attempt of a thousand
    other sessions below one read-index round or logged renewal), backoff as short as its
    tightest member's (re-sending a keepalive costs nothing), retried until its last member's
    deadline. Each member stops waiting at its own deadline, so none is held past it; a member
    near its deadline must not cut the call short for the others either (they would all fail
    that renewal, and count a failover, for nothing). The price, as in the Rust client: a retry
    may still renew on the server a member its client has given up meanwhile; the server then
    expires it one TTL later."""
    return KeepAliveBatch(
        request=pb.KeepAliveRequest(sessions=[w.session for w in batch]),
        attempt_timeout=max(w.attempt_timeout for w in batch),
        backoff_max=min(w.backoff_max for w in batch),
        not_after=max(w.not_after for w in batch),
    )


def leases_by_id(response: "pb.KeepAliveResponse") -> Dict[int, "pb.SessionLease"]:
    """A batch's answer by session id, built once per batch (a lookup per member would be
    quadratic in a batch of 1,024); a session the server left out is missing."""
    return {lease.id: lease for lease in response.leases}


def by_leader(batch: Sequence[KeepAliveWaiting],
              pick: Callable[[int], str]) -> List[List[KeepAliveWaiting]]:
    """A batch split by the member each member's group is routed to (`pick(group)`): one
    KeepAlive each, carrying the sessions of every group that member leads (keepalive.rs,
    by_leader). A batch of one group (every batch in a cluster of one) stays whole."""
    if all(w.group == batch[0].group for w in batch):
        return [list(batch)] if batch else []
    by: Dict[str, List[KeepAliveWaiting]] = {}
    for w in batch:
        by.setdefault(pick(w.group), []).append(w)
    return list(by.values())


def refusals(response: "pb.KeepAliveResponse",
             batch: Sequence[KeepAliveWaiting]) -> Dict[int, "pb.GroupRefusal"]:
    """The groups a KeepAlive of several groups' sessions was refused for (the member cannot
    renew them now: it does not lead them, it has no quorum), by group. Only groups the batch
    carries count: what the client keeps per group stays within the groups it uses, whatever
    a server sends."""
    carried = {w.group for w in batch}
    return {r.group: r for r in response.refused if r.group in carried}


# --- The sequence window (session.rs, SeqWindow). --------------------------------------------
class SeqWindow:
    """The sequence numbers of a session's unanswered requests. A new request waits while its
    number would be SESSION_SEQ_WINDOW_MAX or more past the oldest unanswered one, so that the
    server's memory of outcomes still holds the oldest one's when it is retried. Not locked:
    the sync and asyncio sessions guard it with their own condition."""

    def __init__(self, first: int = 1) -> None:
        self.next = first
        self.unanswered: set = set()

    def try_begin(self) -> Optional[int]:
        oldest = min(self.unanswered) if self.unanswered else self.next
        if self.next - oldest >= SESSION_SEQ_WINDOW_MAX:
            return None
        seq = self.next
        self.next += 1
        self.unanswered.add(seq)
        return seq

    def end(self, seq: int) -> None:
        self.unanswered.discard(seq)


# --- Backoff (retry.rs). -------------------------------------------------------------------
class Backoff:
    """Doubling delays with equal jitter: uniformly in [ceiling/2, ceiling]."""

    def __init__(self, initial: float, cap: float, rng: random.Random) -> None:
        self.next = min(initial, cap)
        self.cap = max(cap, self.next)
        self.rng = rng

    def next_delay(self) -> float:
        ceiling = self.next
        self.next = min(self.next * 2, self.cap)
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)


@dataclass
class RetryPolicy:
    attempts_max: int = CLIENT_ATTEMPTS_MAX
    elapsed_max: float = CLIENT_ELAPSED_MS_MAX / 1000
    # The budget while no attempt has reached a server (see CLIENT_UNREACHABLE_MS_MAX).
    unreachable_max: float = CLIENT_UNREACHABLE_MS_MAX / 1000
    backoff_initial: float = CLIENT_BACKOFF_MS_INITIAL / 1000
    backoff_max: float = CLIENT_BACKOFF_MS_MAX / 1000

    def budget(self, reached: bool, untried: bool = False) -> float:
        """The time budget of a call, given whether any of its attempts reached a server and
        whether an endpoint is left that it has not tried: the fail-fast budget ends a call only
        once every endpoint was tried (one dead member whose connection times out took the
        whole budget in one attempt, issue #34's nemesis)."""
        if reached or untried:
            return self.elapsed_max
        return min(self.elapsed_max, self.unreachable_max)

    def backoff(self, cap: Optional[float], rng: random.Random) -> Backoff:
        if cap is None:
            return Backoff(self.backoff_initial, self.backoff_max, rng)
        return Backoff(min(self.backoff_initial, cap), min(self.backoff_max, cap), rng)


# --- Endpoints and routing (client.rs, Route). ---------------------------------------------
def split_endpoint(endpoint: str) -> Tuple[str, str]:
    """("http"|"https", "host:port") of an endpoint given as host:port or with a scheme."""
    e = str(endpoint).strip()
    if not e:
        raise errors.InvalidArgument("empty endpoint")
    scheme = "http"
    if "://" in e:
        scheme, e = e.split("://", 1)
        if scheme not in ("http", "https"):
            raise errors.InvalidArgument(f"endpoint {endpoint!r}: unknown scheme {scheme!r}")
    e = e.rstrip("/")
    host, sep, port = e.rpartition(":")
    if not sep or not host or not port.isdigit() or " " in host:
        raise errors.InvalidArgument(f"endpoint {endpoint!r}: want HOST:PORT")
    return scheme, e


# The route of calls any member answers (NodeStatus, asking the group count): kept apart from
# every group's, so that the member that answered is not taken for a group's leader.
ANY_MEMBER = -1


@dataclass
class Route:
    """Where the next attempt goes: the believed leader of the call's Raft group (group 0's
    in a cluster of one), else the seeds round-robin. Hints naming a member that just refused
    us are ignored for a while (issue #16; issue #11). At most GROUPS_MAX + 1 leaders are kept
    (the callers check a group before they name it)."""

    seeds: Sequence[str]
    leaders: Dict[int, str] = field(default_factory=dict)
    next_seed: int = 0
    refused: Optional[Tuple[str, float]] = None

    @property
    def leader(self) -> Optional[str]:
        """Group 0's leader (the leader, in a cluster of one group)."""
        return self.leaders.get(0)

    def recently_refused(self, addr: str, at: float) -> bool:
        return (
            self.refused is not None
            and self.refused[0] == addr
            and at - self.refused[1] < CLIENT_REFUSED_HINT_IGNORE_MS / 1000
        )

    def pick(self, group: int = 0) -> str:
        leader = self.leaders.get(group)
        if leader is not None:
            return leader
        return self.seeds[self.next_seed % len(self.seeds)]

    def answered(self, addr: str, group: int = 0) -> None:
        if self.refused is not None and self.refused[0] == addr:
            self.refused = None
        self.leaders[group] = addr

    def reroute(self, addr: str, hint: Optional[str], at: float, group: int = 0) -> bool:
        """`addr` does not lead `group`: follow `hint` unless it refused us lately; True if
        followed."""
        if hint:
            if hint == addr:
                # It leads but cannot answer yet: stay, after the backoff.
                self.leaders[group] = hint
                return False
            if not self.recently_refused(hint, at):
                self.leaders[group] = hint
                return True
        self.leaders.pop(group, None)
        self._next_seed(addr, at)
        return False

    def unreachable(self, addr: str, at: float) -> None:
        """`addr` failed in transport: forgotten as every group's leader."""
        self.refused = (addr, at)
        for g in [g for g, a in self.leaders.items() if a == addr]:
            del self.leaders[g]
        self._next_seed(addr, at)

    def _next_seed(self, addr: str, at: float) -> None:
        n = len(self.seeds)
        if self.seeds[self.next_seed % n] == addr:
            self.next_seed += 1
        if n > 1 and self.recently_refused(self.seeds[self.next_seed % n], at):
            self.next_seed += 1


# --- Status classification (error.rs, classify). --------------------------------------------
@dataclass
class Failure:
    """One failed attempt: "unavailable" (a node answered but cannot serve: retry, maybe at
    the leader hint), "transport" (no answer: retry elsewhere) or "fatal" (raise `error`)."""

    kind: str
    message: str
    leader_addr: Optional[str] = None
    error: Optional[errors.LatchkeyError] = field(default=None)
    # The Raft group the error came from (`latchkey-group`, a cluster of several groups):
    # its leader hint is that group's leader. None: not said.
    group: Optional[int] = None
    # A "transport" failure that never reached a server: the name did not resolve or the
    # connection was refused (the call gives up after RetryPolicy.unreachable_max then).
    connected: bool = True


def _meta(metadata: Optional[Iterable]) -> dict:
    out = {}
    for item in metadata or ():
        try:
            k, v = item
        except (TypeError, ValueError):
            k, v = item.key, item.value
        if isinstance(v, bytes):
            continue
        out[str(k).lower()] = v
    return out


def classify(code: grpc.StatusCode, details: Optional[str], metadata: Optional[Iterable]) -> Failure:
    """A failed attempt's status -> what to do. The server sets `latchkey-error` on every
    status it returns, so an UNAVAILABLE without it came from the transport, not a node."""
    meta = _meta(metadata)
    failure = _classify(code, details, meta)
    group = meta.get(GROUP_KEY)
    if group is not None and group.isascii() and group.isdigit() and int(group) < GROUPS_MAX:
        failure.group = int(group)
    return failure


def _classify(code: grpc.StatusCode, details: Optional[str], meta: dict) -> Failure:
    reason = meta.get(ERROR_REASON_KEY)
    message = details or ""
    C = grpc.StatusCode
    if reason is None and TLS_REQUIRED_MESSAGE in message:
        return Failure("fatal", message, error=errors.TlsError(
            "this server speaks TLS: use https:// endpoints and give ca=..."))
    if code == C.UNAVAILABLE and reason is not None:
        hint = meta.get(LEADER_ADDR_KEY) or None
        return Failure("unavailable", f"{message} ({reason})", leader_addr=hint)
    if code in (C.UNAVAILABLE, C.CANCELLED, C.DEADLINE_EXCEEDED) or (
        code == C.UNKNOWN and reason is None
    ):
        connected = not never_connected(message)
        return Failure("transport", transport_cause(code, message), connected=connected)
    if code == C.INVALID_ARGUMENT and reason == "permits-out-of-range":
        err: errors.LatchkeyError = errors.PermitsOutOfRange.from_server(message)
    elif code == C.INVALID_ARGUMENT:
        err = errors.InvalidArgument(message, reason=reason)
    elif code == C.NOT_FOUND:
        err = errors.SessionNotFound(message, reason=reason)
    elif code == C.RESOURCE_EXHAUSTED:
        err = errors.LimitReached(message, reason=reason or "resource-exhausted")
    elif code in (C.PERMISSION_DENIED, C.UNAUTHENTICATED):
        err = errors.PermissionDenied(message, reason=reason or code.name.lower())
    elif code == C.FAILED_PRECONDITION and reason == "kind-conflict":
        err = errors.KindConflict(message)
    elif code == C.FAILED_PRECONDITION and reason == "permits-conflict":
        err = errors.PermitsConflict(message)
    elif code == C.FAILED_PRECONDITION and reason == "not-election-leader":
        err = errors.NotElectionLeader(message)
    elif code == C.FAILED_PRECONDITION:
        err = errors.Conflict(message, reason=reason or "failed-precondition")
    else:
        err = errors.ServerError(f"{code.name}: {message}", reason=reason)
    return Failure("fatal", message, error=err)


def _no_such_host(details: str) -> bool:
    return "errors resolving" in details or "DNS resolution failed" in details


def never_connected(details: str) -> bool:
    """Whether grpc's status details say the attempt reached no server: every address refused
    the connection (or timed out), or the name did not resolve."""
    return "failed to connect to all addresses" in details or _no_such_host(details)


def transport_cause(code: grpc.StatusCode, details: str) -> str:
    """A transport failure's cause in a few words, as the Rust client says it."""
    if _no_such_host(details):
        return f"no such host ({details})"
    if "Connection refused" in details:
        return "connection refused"
    if "Timeout occurred" in details or "timed out" in details.lower():
        return "timed out"
    return f"{code.name}: {details}"


def give_up(failure: Failure, attempts: int, elapsed: float) -> errors.LatchkeyError:
    if failure.kind == "fatal":
        assert failure.error is not None
        return failure.error
    cls = errors.Unavailable if failure.kind == "unavailable" else errors.TransportError
    return cls(f"{failure.message} ({attempts} attempts in {elapsed:.1f}s)")


# --- Answers. ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Holder:
    session_id: int
    token: int
    held_for: float
    owner: Optional[dict]
    # What a campaign's grant published (None: taken as a plain lock, without a value).
    value: Optional[bytes] = None


@dataclass(frozen=True)
class LockInfo:
    """One lock as the leader sees it (Describe). `holder` is the first granted of `holders`
    (every holder: one for a mutex or a writer, several readers or permits); `mode` is how it
    is held: "exclusive" (a mutex or a writer; also a free lock), "shared" (readers) or
    "permits" (a semaphore of `permits` permits; 0 with the other modes). `lock_delay` is the
    holder's lock-delay in seconds (0: none); `delay_remaining` the seconds left of a running
    one (None: none runs; the lock then has no holder) and `delay_token` the lost grant's token
    that started it (`force_release(..., end_delay=True)` naming it ends the delay)."""

    name: str
    holder: Optional[Holder]
    waiters: int
    queue: Tuple[int, ...]
    mode: str = EXCLUSIVE
    permits: int = 0
    holders: Tuple[Holder, ...] = ()
    lock_delay: float = 0.0
    delay_remaining: Optional[float] = None
    delay_token: Optional[int] = None

    @property
    def held(self) -> bool:
        return self.holder is not None


def _owner(o: "pb.Owner") -> Optional[dict]:
    if not (o.host or o.pid or o.user or o.text):
        return None
    return {"host": o.host, "pid": o.pid, "user": o.user, "text": o.text}


def _holder(h: "pb.Holder") -> Holder:
    return Holder(h.session, h.token, h.held_for_ms / 1000,
                  _owner(h.owner) if h.HasField("owner") else None,
                  h.value if h.HasField("value") else None)


def lock_info(lock: "pb.LockInfo") -> LockInfo:
    holders = tuple(_holder(h) for h in lock.holders)
    holder = None
    if lock.held:
        holder = Holder(lock.session, lock.token, lock.held_for_ms / 1000,
                        _owner(lock.owner) if lock.HasField("owner") else None,
                        lock.value if lock.HasField("value") else None)
        if not holders:
            # A server from before issue #32 names its one holder only.
            holders = (holder,)
    mode = _MODE_NAMES.get(lock.mode)
    if mode is None:
        raise errors.ProtocolError(f"lock {lock.name!r} is held in an unknown mode {lock.mode}")
    delay_remaining = (lock.delay_remaining_ms / 1000
                       if lock.HasField("delay_remaining_ms") else None)
    delay_token = lock.delay_token if lock.HasField("delay_token") else None
    return LockInfo(lock.name, holder, lock.waiters, tuple(w.session for w in lock.queue),
                    mode, lock.permits, holders, lock.lock_delay_ms / 1000, delay_remaining,
                    delay_token)


@dataclass(frozen=True)
class GroupStatus:
    """What a member sees of one Raft group (NodeStatus's `group_status`)."""

    group: int
    role: str
    term: int
    leader_id: Optional[int]


@dataclass(frozen=True)
class NodeStatus:
    """A member about itself; `role`, `term` and `leader_id` are of group 0 (of the only
    group, in a cluster of one). `groups`: the cluster's Raft groups; `group_status`: this
    member's view of each (empty from a server before groups)."""

    id: int
    role: str
    term: int
    leader_id: Optional[int]
    members: Tuple[Tuple[int, str], ...]
    cluster_id: str
    groups: int = 1
    group_status: Tuple[GroupStatus, ...] = ()


def node_status(s: "pb.NodeStatusResponse") -> NodeStatus:
    return NodeStatus(s.id, s.role, s.term, s.leader_id or None,
                      tuple((m.id, m.addr) for m in s.members), s.cluster_id,
                      max(s.groups, 1),
                      tuple(GroupStatus(g.group, g.role, g.term, g.leader_id or None)
                            for g in s.group_status))


def merge_lists(answers: Sequence["pb.ListResponse"]) -> Tuple[List[LockInfo], bool]:
    """The List answers of every Raft group as one (client.rs, list): in name order, at most
    LIST_RESULTS_MAX, and whether more matched. A truncated group's answer ends at its last
    name: the merged list stops there too, or it would skip that group's names after it and
    still look like a sorted prefix."""
    locks: List["pb.LockInfo"] = []
    truncated = False
    cut: Optional[str] = None
    for answer in answers:
        if answer.truncated:
            truncated = True
            if answer.locks:
                last = max(lock.name for lock in answer.locks)
                if cut is None or last < cut:
                    cut = last
        locks.extend(answer.locks)
    if cut is not None:
        locks = [lock for lock in locks if lock.name <= cut]
    # Rust compares names as UTF-8 bytes; so does Python's str order (by code point).
    locks.sort(key=lambda lock: lock.name)
    if len(locks) > LIST_RESULTS_MAX:
        del locks[LIST_RESULTS_MAX:]
        truncated = True
    return [lock_info(lock) for lock in locks], truncated


class ForceReleased(NamedTuple):
    """The grant a force-release took (AdminReleaseResponse): its session and token."""

    session_id: int
    token: int


@dataclass(frozen=True)
class AuditEntry:
    """One administrative action of the audit log (crates/client/src/types.rs, AuditEntry)."""

    index: int
    at_ms: int  # the leader's wall clock, Unix ms
    action: str  # "force-release" or "revoke"
    lock: str  # force-release: the lock; revoke: ""
    session_id: int
    token: int  # force-release: the grant taken
    next_token: int  # force-release: the next waiter's grant (0: none)
    locks: int  # revoke: how many locks the session held
    identity: Optional[str]  # the authenticated identity; None without access control
    operator: str  # what the operator's tool said about them (e.g. user@host)
    reason: str
    group: int = 0  # the Raft group whose log holds it: `index` is of that group's log


def audit_entry(r: "pb.AuditRecord") -> AuditEntry:
    return AuditEntry(r.index, r.at_ms, r.action, r.lock, r.session, r.token, r.next_token,
                      r.locks, r.identity or None, r.operator, r.reason, r.group)


def admin_release_request(name: str, token: int, reason: str, operator: str,
                          end_delay: bool = False) -> "pb.AdminReleaseRequest":
    """The request of a force-release (or, with `end_delay`, of the end of a lock-delay),
    always conditional on `token` (protocol.md, 10: AdminRelease is not sequenced; a retry
    without a token could take the next holder's, or end a later delay)."""
    return pb.AdminReleaseRequest(name=name, token=token, reason=reason, operator=operator,
                                  end_delay=end_delay)


def check_admin_release(name: str, token: Optional[int], reason: str,
                        operator: Optional[str]) -> Tuple[Optional[int], str]:
    """Validates a force-release's input before any call: (token or None, operator)."""
    validate_name(name)
    if token is not None:
        token = u64_of("the token", token)
    validate_reason(reason)
    operator = operator_of_this_process() if operator is None else operator
    validate_operator(operator)
    return token, operator


def check_admin_revoke(session_id: int, reason: str,
                       operator: Optional[str]) -> "pb.AdminRevokeRequest":
    """Validates a revoke's input before any call; its request."""
    session_id = u64_of("the session id", session_id)
    validate_reason(reason)
    operator = operator_of_this_process() if operator is None else operator
    validate_operator(operator)
    return pb.AdminRevokeRequest(session=session_id, reason=reason, operator=operator)


def holder_token(info: LockInfo, end_delay: bool = False) -> int:
    """The token a force-release without one names, read first (client.rs, admin_release):
    the current holder's; with `end_delay`, the running lock-delay's (Conflict
    `no-lock-delay` when none runs). Conflict `lock-not-held` when nobody holds it, also when
    a delay runs (a release never ends one: that is `end_delay=True`)."""
    if end_delay:
        if info.delay_token is None:
            raise errors.Conflict(f"no lock-delay of {info.name!r} is running",
                                  reason="no-lock-delay")
        return info.delay_token
    if info.holder is None and info.delay_token is not None:
        raise errors.Conflict(
            f"lock {info.name!r} is not held: it is in the lock-delay that began when its grant "
            f"{info.delay_token} was lost (ending the delay is its own request: "
            "force_release(..., end_delay=True))", reason="lock-not-held")
    if info.holder is None:
        raise errors.Conflict(f"lock {info.name!r} is not held", reason="lock-not-held")
    return info.holder.token


# --- Leader election (crates/client/src/election.rs). --------------------------------------
@dataclass(frozen=True)
class Leader:
    """An election's leader: its session, its term's fencing token, the value it published
    (b"" when it took the name as a plain lock) and how long it has led by the Raft leader's
    clock (None when a watch event told it: events carry no time)."""

    session_id: int
    token: int
    value: bytes
    held_for: Optional[float] = None


def leader_of(info: LockInfo) -> Optional[Leader]:
    """The leader a Describe shows: the exclusive holder, if any (Client::leader)."""
    h = info.holder
    if h is None or info.mode != EXCLUSIVE:
        return None
    return Leader(h.session_id, h.token, h.value or b"", h.held_for)


class Observed:
    """What an observe knows (election.rs `Observed`): pure, fed the leader reads and the
    name's watch events. Fencing tokens strictly increase per name, so a grant at or below the
    last token seen is old news (a resumed or lagging stream, a read that raced the events):
    no leader is delivered twice in a row, none after a newer one."""

    def __init__(self) -> None:
        self.current: Optional[Leader] = None  # the leader now (None: nobody leads)
        self.delivered: Optional[Leader] = None  # the leader last delivered
        self.last_token = 0
        # The log index the last read reflects: an event at or below it is in the read already
        # (a lagging member may replay it after the read; a proclaim replayed then would bring
        # an older value back under the same token).
        self.read_index = 0

    def read(self, leader: Optional[Leader], index: int = 0) -> None:
        """A read of the leader reflecting the log up to `index` (DescribeResponse.read_index)."""
        if leader is not None:
            if leader.token < self.last_token:
                return
            self.last_token = leader.token
        self.read_index = max(self.read_index, index)
        self.current = leader

    def apply(self, e: "pb.WatchEvent") -> None:
        if e.index <= self.read_index:
            return
        token = e.token
        value = e.value if e.HasField("value") else b""
        cur = self.current
        if e.kind == "granted":
            exclusive = e.HasField("mode") and e.mode == pb.LOCK_MODE_EXCLUSIVE
            if exclusive and token > self.last_token:
                self.last_token = token
                self.current = Leader(e.session, token, value)
        elif e.kind == "proclaimed":
            if cur is not None and cur.token == token:
                self.current = Leader(cur.session_id, token, value, cur.held_for)
        elif e.kind in ("released", "expired", "revoked", "force_released"):
            if cur is not None and cur.token == token:
                self.current = None

    def news(self) -> Optional[Leader]:
        """The leader to deliver, if it is news: another leader or value than the last one."""
        now = self.current
        if now is None:
            return None
        d = self.delivered
        if d is not None and (d.session_id, d.token, d.value) == (now.session_id, now.token,
                                                                  now.value):
            return None
        self.delivered = now
        return now


# A watch's position "every event of this index delivered": after any ordinal of it.
WHOLE_ENTRY = 2**32 - 1


class WatchMissed(NamedTuple):
    """Events after `after_index` up to `through_index` the member could not send."""

    after_index: int
    through_index: int


class WatchCursor:
    """Where a watch stream got to (watch.rs `GroupWatch::accept`): every member applies the
    same log, so an event's (index, ordinal) is the same everywhere; a stream resumed on
    another member from `resume_index()` replays the last entry, and what was delivered
    already is dropped here."""

    def __init__(self) -> None:
        self.last: Optional[Tuple[int, int]] = None

    def resume_index(self) -> Optional[int]:
        if self.last is None:
            return None
        i, o = self.last
        return i if o == WHOLE_ENTRY else i - 1

    def accept(self, message: "pb.WatchMessage"):
        """The event (pb.WatchEvent) or WatchMissed to deliver, or None (a progress, or old)."""
        which = message.WhichOneof("item")
        if which == "progress":
            position, out = (message.progress.index, WHOLE_ENTRY), None
        elif which == "missed":
            m = message.missed
            position, out = (m.through_index, WHOLE_ENTRY), WatchMissed(m.after_index,
                                                                        m.through_index)
        elif which == "event":
            position, out = (message.event.index, message.event.ordinal), message.event
        else:
            raise errors.ProtocolError("Watch sent an empty message")
        if self.last is not None and position <= self.last:
            return None
        self.last = position
        return out


class WatchClosed(Exception):
    """An observe's watch was closed (`Observe.close()`): its iteration ends."""


def watch_request(name: str, after_index: Optional[int], group: Optional[int]) -> "pb.WatchRequest":
    request = pb.WatchRequest(prefix=name)
    if after_index is not None:
        request.after_index = after_index
    if group is not None:
        request.group = group
    return request


def watch_fatal(code: grpc.StatusCode, details: Optional[str], metadata) -> Optional[errors.LatchkeyError]:
    """The statuses that end a watch rather than move it to another member (watch.rs `fatal`):
    access refused or bad input is not cured by another member."""
    C = grpc.StatusCode
    if code not in (C.PERMISSION_DENIED, C.UNAUTHENTICATED, C.INVALID_ARGUMENT):
        return None
    failure = classify(code, details, metadata)
    return failure.error if failure.kind == "fatal" else None


def own_holder(info: LockInfo, session_id: int) -> Optional[Holder]:
    """Of a name's holders (several for readers and permits), the grant of this session."""
    return next((h for h in info.holders if h.session_id == session_id), None)


def owner_of_this_process(text: str = "") -> "pb.Owner":
    import getpass
    import os
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name is not an error
        # No $USER and no passwd entry for this uid (a container): the uid says who it is.
        user = str(os.getuid()) if hasattr(os, "getuid") else ""
    host = socket.gethostname()
    return pb.Owner(host=host.encode()[:255].decode("utf-8", "ignore"), pid=os.getpid(),
                    user=user.encode()[:64].decode("utf-8", "ignore"),
                    text=text.encode()[:256].decode("utf-8", "ignore"))


# Method paths of the Locks service (no generated *_pb2_grpc: see docs/client-python.md).
_SERVICE = "/latchkey.v1.Locks/"
METHODS = {
    "CreateSession": (pb.CreateSessionRequest, pb.CreateSessionResponse),
    "KeepAlive": (pb.KeepAliveRequest, pb.KeepAliveResponse),
    "CloseSession": (pb.CloseSessionRequest, pb.CloseSessionResponse),
    "Acquire": (pb.AcquireRequest, pb.AcquireResponse),
    "Release": (pb.ReleaseRequest, pb.ReleaseResponse),
    "Describe": (pb.DescribeRequest, pb.DescribeResponse),
    "List": (pb.ListRequest, pb.ListResponse),
    "NodeStatus": (pb.NodeStatusRequest, pb.NodeStatusResponse),
    "AdminRelease": (pb.AdminReleaseRequest, pb.AdminReleaseResponse),
    "AdminRevoke": (pb.AdminRevokeRequest, pb.AdminRevokeResponse),
    "Audit": (pb.AuditRequest, pb.AuditResponse),
    "Proclaim": (pb.ProclaimRequest, pb.ProclaimResponse),
    "Batch": (pb.BatchRequest, pb.BatchResponse),
}
# Server-streaming methods.
STREAM_METHODS = {
    "Watch": (pb.WatchRequest, pb.WatchMessage),
}


def method_path(name: str) -> str:
    return _SERVICE + name


CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", CLIENT_MESSAGE_BYTES_MAX),
    ("grpc.max_send_message_length", CLIENT_MESSAGE_BYTES_MAX),
    # The client retries itself, with the same request (same seq): no hidden retries.
    ("grpc.enable_retries", 0),
    # A member that came back must be reachable again soon, not after grpc's default
    # reconnect backoff (up to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # A member that is stopped, or cut off by a partition that drops packets, is left within
    # about 2 s rather than at the attempt's deadline (docs/protocol.md 2.1): a ping after a
    # second without a frame while calls are open, the connection dropped if it is not
    # answered in a second. C-core stops pinging a connection with no data (a long-poll)
    # after max_pings_without_data pings unless it is 0.
    ("grpc.keepalive_time_ms", CLIENT_PING_INTERVAL_MS),
    ("grpc.keepalive_timeout_ms", CLIENT_PING_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
]


@dataclass
class TlsFiles:
    ca: Optional[bytes]
    cert: Optional[bytes]
    key: Optional[bytes]


def read_tls(ca, cert, key) -> Optional[TlsFiles]:
    if ca is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        raise errors.InvalidArgument("give both cert and key (or neither)")
    if ca is None:
        raise errors.InvalidArgument("TLS needs the CA that signed the servers' certificates (ca=...)")

    def read(what: str, path) -> bytes:
        try:
            with open(path, "rb") as f:
                data = f.read(1024 * 1024 + 1)
        except OSError as e:
            raise errors.InvalidArgument(f"cannot read the {what} file {path}: {e}") from None
        if len(data) > 1024 * 1024:
            raise errors.InvalidArgument(f"the {what} file {path} is too large for PEM")
        return data

    return TlsFiles(read("CA", ca), read("certificate", cert) if cert else None,
                    read("key", key) if key else None)


def auth_metadata(token: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    if token is None:
        return ()
    if not token or not all(0x21 <= ord(c) <= 0x7E for c in token):
        raise errors.InvalidArgument("the auth token must be printable ASCII without spaces")
    return (("authorization", f"Bearer {token}"),)


def merge_contended(old: frozenset, listed: Sequence[str], truncated: bool) -> frozenset:
    """The contended names after a keepalive's list: all of them, or, `truncated`, the first of
    them in name order, which says nothing of the names after its last one: what was known of
    those is kept; names up to it that it does not list are not contended (docs/protocol.md
    6.8; the Rust client's merge_contended). Python compares str by code point, the order of
    the server's UTF-8 bytes."""
    new = frozenset(listed)
    if truncated:
        cut = max(listed) if listed else None
        new = new | frozenset(n for n in old if cut is None or n > cut)
    return new
