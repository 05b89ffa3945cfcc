// Every bound the Node client uses. Each value is a copy of crates/core/src/limits.rs (the one
// source of the numbers and their full reasons); the short reason is repeated here so that a
// reader of this package does not need the Rust tree. test/unit.test.ts checks that the copies
// still match the Rust file when it is there (a repository checkout).

/** A lock name is at most this many bytes of UTF-8 (`LOCK_NAME_BYTES_MAX`). */
export const LOCK_NAME_BYTES_MAX = 512;
/**
 * Holders of one name at once (readers, permits), and so the most permits a semaphore has
 * (`HOLDERS_PER_LOCK_MAX`): a `describe` lists every holder with its owner in one message.
 */
export const HOLDERS_PER_LOCK_MAX = 1_024;
/** A lock-delay's longest, in ms (`LOCK_DELAY_MS_MAX`): 5 minutes. */
export const LOCK_DELAY_MS_MAX = 300_000;
/** Names one keepalive lease lists as contended (`CONTENDED_PER_LEASE_MAX`). */
export const CONTENDED_PER_LEASE_MAX = 64;
/** Shortest session lease: below 1 s a renewal every third leaves no room for a blip. */
export const SESSION_TTL_MS_MIN = 1_000;
/** Longest session lease: a crashed holder blocks its locks that long. */
export const SESSION_TTL_MS_MAX = 3_600_000;
/** The lease when none is asked for: freeing locks soon after a crash vs surviving GC pauses. */
export const SESSION_TTL_MS_DEFAULT = 15_000;
/** Lock waits (Acquire long-polls) one session keeps in flight; the server remembers outcomes. */
export const SESSION_WAITS_IN_FLIGHT_MAX = 64;
/** Releases one session keeps in flight, apart from its waits (a release is what ends waits). */
export const SESSION_SHORT_REQUESTS_IN_FLIGHT_MAX = 32;
/**
 * A session starts no request whose sequence number is this far or more past its oldest
 * unanswered one, so that the server (which remembers `SESSION_OUTCOMES_MAX` = 256 outcomes,
 * at least twice this) still knows that request's outcome when it is retried.
 */
export const SESSION_SEQ_WINDOW_MAX = 128;
/** Locks returned by one `List` request (`limit` 0 or above it: this many). */
export const LIST_RESULTS_MAX = 10_000;
/** Waiters shown per lock in a `List` answer (the queue's head); `waiters` counts them all. A list of whole queues would be gigabytes. */
export const LIST_WAITERS_SHOWN_MAX = 4;
/** Records the audit log keeps, oldest dropped first; the whole log fits one `Audit` answer. */
export const AUDIT_RECORDS_MAX = 1_000;
/** Bytes of an administrative action's reason: a sentence or a ticket link. */
export const AUDIT_REASON_BYTES_MAX = 1_024;
/** Bytes of each actor string of an audit record (the identity, the operator's claimed name). */
export const AUDIT_ACTOR_BYTES_MAX = 256;
/** Sessions renewed by one KeepAlive request. */
export const KEEPALIVE_SESSIONS_MAX = 1_024;
/** A wait longer than this (a day) is cut to it by the server; the client re-sends. */
export const WAIT_TIMEOUT_MS_MAX = 86_400_000;
/** One Acquire call long-polls at most this long, then the server answers PENDING. */
export const ACQUIRE_POLL_MS_MAX = 10_000;
/** Bytes of one client gRPC message (the largest is a List answer). */
export const CLIENT_MESSAGE_BYTES_MAX = 8 * 1024 * 1024;
/** Renew every TTL / 3: two renewals can be lost in a row before the lease is in danger. */
export const CLIENT_RENEWAL_TTL_DIVISOR = 3;
/** The safety margin is TTL / 5 (20 %): the client stops believing it holds its locks that long before the lease deadline it measured. */
export const CLIENT_SAFETY_MARGIN_TTL_DIVISOR = 5;
/** The least safety margin: a late timer, scheduling on a loaded client, time to stop. */
export const CLIENT_SAFETY_MARGIN_MS_MIN = 200;
/**
 * A lead of the wall clock over the monotonic clock larger than this is taken as a suspend (or
 * a forward step of the wall clock) and added to the client's clock (`SuspendAwareClock`): above
 * the clocks' resolution and NTP's slewing between two readings, below the least safety margin,
 * so that a suspend too short to be seen still leaves the holder most of its margin.
 */
export const CLIENT_SUSPEND_DETECT_MS = 50;
/** One renewal attempt's deadline: TTL / 5, at least 200 ms (retried while the lease has room). */
export const CLIENT_RENEWAL_ATTEMPT_TTL_DIVISOR = 5;
export const CLIENT_RENEWAL_ATTEMPT_MS_MIN = 200;
/** Cap of the backoff between renewal attempts: TTL / 20, at least 50 ms (reach a new leader soon). */
export const CLIENT_RENEWAL_BACKOFF_TTL_DIVISOR = 20;
export const CLIENT_RENEWAL_BACKOFF_MS_MIN = 50;
/** Cap of the doubling backoff between attempts of one request (issue #11: a long cap slept past a new leader's election). */
export const CLIENT_BACKOFF_MS_MAX = 250;
/** First backoff step of a request's retries. */
export const CLIENT_BACKOFF_MS_INITIAL = 50;
/** Attempts of one request before it gives up (its 20 s time budget usually ends it first). */
export const CLIENT_ATTEMPTS_MAX = 64;
/** Time from a request's first attempt after which no new attempt starts (rides out an election and a quick restart). */
export const CLIENT_RETRY_ELAPSED_MS_MAX = 20_000;
/** Time budget of a request while none of its attempts reached a server (no name resolved, every connection refused): a dead endpoint is reported in about 2 s (issue #33). */
export const CLIENT_UNREACHABLE_MS_MAX = 2_000;
/** Heartbeat + 3 election timeouts with the default timing: the longest a group is leaderless. */
export const LEADERLESS_MS_MAX_DEFAULT = 100 + 3 * 600;
/** How long leader hints naming a member that just refused us are ignored (issue #11). */
export const CLIENT_REFUSED_HINT_IGNORE_MS = LEADERLESS_MS_MAX_DEFAULT;
/** Cap of the backoff between attempts of one Acquire. */
export const CLIENT_ACQUIRE_BACKOFF_MS_MAX = 250;
/** A request still PENDING this long after its wait timeout is given up (the server cancels first). */
export const CLIENT_PENDING_AFTER_DEADLINE_MS_MAX = 2 * ACQUIRE_POLL_MS_MAX;
/** A wait with no server answering gives up this long after the caller's wait timeout. */
export const CLIENT_UNANSWERED_AFTER_DEADLINE_MS_MAX = 1_000;
/** One attempt of a short RPC: a paused node must not hold a caller for long. */
export const CLIENT_RPC_TIMEOUT_MS_DEFAULT = 5_000;
/** Opening a TCP connection to one endpoint (a dead member is skipped early). */
export const CLIENT_CONNECT_TIMEOUT_MS_DEFAULT = 2_000;
/**
 * HTTP/2 PING of a connection with calls open after this long without a frame, and the time its
 * answer may take: a stopped member, or one cut off by a partition that drops packets, is left
 * within about 2 s rather than at the attempt's deadline (docs/protocol.md 2.1).
 */
export const CLIENT_PING_INTERVAL_MS = 1_000;
export const CLIENT_PING_TIMEOUT_MS = 1_000;
/**
 * Reconnect backoff of one gRPC channel (grpc-js defaults to 1 s doubling to 120 s, during which
 * every call to that member fails at once: a restarted leader would stay unused for minutes).
 * This client has its own retry loop and backoff, so the channel's is kept short.
 */
export const CLIENT_RECONNECT_BACKOFF_MS_INITIAL = 100;
export const CLIENT_RECONNECT_BACKOFF_MS_MAX = 1_000;

/**
 * Raft groups one cluster may run (`serve --groups`, 1 to this): a session id is
 * `index * groups + group`, and every group is a Raft instance on every member, whose idle cost
 * the count multiplies. A group count a server answers outside 1..=this is a protocol error.
 */
export const GROUPS_MAX = 64;
/**
 * How long (ms) a keepalive batch gathers in a cluster of several groups before it goes out:
 * the group sessions of one logical session are due at the same instant (one grid), but their
 * timers fire a millisecond or so apart, and one request per member needs them in one batch. A
 * renewal is due a third of a TTL (at least 333 ms) before its deadline, so 2 ms costs nothing.
 */
export const KEEPALIVE_GATHER_MS = 2;
/**
 * Operations in one `Batch` call (limits::BATCH_CALL_OPS_MAX; a server refuses more with
 * INVALID_ARGUMENT `batch-too-large`): with `batch: true` the operations waiting for the next
 * batch to one member go in calls of at most this many, the rest in the next one.
 */
export const BATCH_CALL_OPS_MAX = 256;

// The relations limits.rs asserts at compile time, checked at load time.
function assert(ok: boolean, what: string): void {
  if (!ok) throw new Error(`latchkey limits: ${what}`);
}
assert(2 * SESSION_SEQ_WINDOW_MAX <= 256, "the seq window fits the server's memory of outcomes");
assert(SESSION_WAITS_IN_FLIGHT_MAX + SESSION_SHORT_REQUESTS_IN_FLIGHT_MAX < SESSION_SEQ_WINDOW_MAX, "in-flight budgets never fill the window");
assert(4 * CLIENT_SUSPEND_DETECT_MS <= CLIENT_SAFETY_MARGIN_MS_MIN, "an unseen suspend leaves most of the margin");
assert(CLIENT_SAFETY_MARGIN_MS_MIN <= SESSION_TTL_MS_MIN / CLIENT_SAFETY_MARGIN_TTL_DIVISOR, "the margin leaves room for a renewal");
assert(2 * CLIENT_SAFETY_MARGIN_TTL_DIVISOR <= CLIENT_RENEWAL_TTL_DIVISOR * (CLIENT_SAFETY_MARGIN_TTL_DIVISOR - 1), "two renewals fall due before the margin");
assert(CLIENT_RENEWAL_ATTEMPT_TTL_DIVISOR >= CLIENT_RENEWAL_TTL_DIVISOR, "renewal attempts never pile up");
assert(CLIENT_ACQUIRE_BACKOFF_MS_MAX <= CLIENT_BACKOFF_MS_MAX, "a waiter is no slower to find a leader");
assert(CLIENT_CONNECT_TIMEOUT_MS_DEFAULT < CLIENT_RPC_TIMEOUT_MS_DEFAULT, "connect within one attempt");
/** Bytes of a session owner's host name, user name and free text. */
export const OWNER_HOST_BYTES_MAX = 255;
export const OWNER_USER_BYTES_MAX = 64;
export const OWNER_TEXT_BYTES_MAX = 256;

/** Bytes of an election's published value (limits::ELECTION_VALUE_BYTES_MAX). */
export const ELECTION_VALUE_BYTES_MAX = 1024;
/** A watch stream says how far it got this often when idle (limits::WATCH_PROGRESS_MS). */
export const WATCH_PROGRESS_MS = 2_000;
/**
 * A watch that hears nothing for this long takes its member for dead and resumes on another
 * (limits::CLIENT_WATCH_SILENCE_MS): a few progress intervals, so one late message is not a failover.
 */
export const CLIENT_WATCH_SILENCE_MS = 4 * WATCH_PROGRESS_MS;
