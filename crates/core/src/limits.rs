//! Every bound in latchkey, with the reason for its value.
//!
//! The state machine enforces the ones that concern replicated state; the server enforces the
//! ones that concern messages and connections. Relations between them are checked at compile time.
//!
//! Here: the bounds of the core, log-store, raft, server and client crates (queues, batches,
//! timeouts, the lease tick, snapshot defaults, the client's renewal interval, safety margin,
//! give-up delays and backoff caps, related to the server's failover time). Not here: the
//! fence crate's own `limits.rs` (it depends on nothing of latchkey;
//! `client/tests/shared_constants.rs` fails if its copies drift), and the `fenced_kv` example's
//! HTTP bounds (in the example). The Python and TypeScript clients copy the client's bounds,
//! held to this file by their own tests.

/// A lock name is at most this many bytes of UTF-8. Long enough for a path-like name with a
/// tenant and an id (`payments/tenant-42/invoice-...`), short enough that a full queue of names
/// stays small in a snapshot.
pub const LOCK_NAME_BYTES_MAX: usize = 512;

/// Shortest session lease. Below one second a renewal every third of the lease (333 ms) leaves
/// no room for a network blip or a leader election; holders would lose locks spuriously.
pub const SESSION_TTL_MS_MIN: u64 = 1_000;
/// Longest session lease. A crashed holder blocks its locks for up to this long (and up to twice
/// this across leader changes); an hour is already longer than anyone should wait.
pub const SESSION_TTL_MS_MAX: u64 = 3_600_000;
/// The lease a client gets when it does not ask for one: 15 s, the usual compromise between
/// freeing locks soon after a crash and surviving GC pauses.
pub const SESSION_TTL_MS_DEFAULT: u64 = 15_000;

/// Live sessions in one group. Each costs a few hundred bytes of state and a deadline on the
/// leader; 100k sessions keeps a snapshot in the tens of megabytes.
pub const SESSIONS_MAX: usize = 100_000;
/// Locks one session may hold or wait for at once. A session that needs more is a design smell
/// (see "when not to use a lock"), and the bound keeps a session close/expiry entry cheap.
pub const LOCKS_PER_SESSION_MAX: usize = 1_024;
/// Waiters in one lock's queue. Thousands of workers fighting over one lock means the lock is
/// the wrong tool; a full queue answers `QueueFull` instead of growing without bound.
pub const WAITERS_PER_LOCK_MAX: usize = 1_024;
/// Holders of one name at once (issue #32): the readers of a read-write lock, and the most
/// permits a semaphore may have. A reader beyond it waits in the queue like any acquire that
/// does not fit (no error), so the bound never refuses a correct program. Hundreds of
/// concurrent holders is already a rate limiter rather than mutual exclusion; the bound keeps
/// a `describe` answer, which lists every holder with its owner, within a message (below) and
/// a handover's scan of the holders short.
pub const HOLDERS_PER_LOCK_MAX: usize = 1_024;
/// Locks (held or with waiters) in one group.
pub const LOCKS_MAX: usize = 1_000_000;
/// Outcomes of finished requests remembered per session, so that a retry gets the original
/// answer. Must exceed the requests a client keeps in flight at once (see the client library).
pub const SESSION_OUTCOMES_MAX: usize = 256;
/// Lock waits (Acquire long-polls) one client session keeps in flight at once; the client
/// library enforces it. A wait lasts up to its timeout, so waits have a budget of their own.
pub const SESSION_WAITS_IN_FLIGHT_MAX: usize = 64;
/// Short sequenced requests (releases) one client session keeps in flight at once, apart from
/// its waits: a session full of waits must still release, since a release is what ends waits.
pub const SESSION_SHORT_REQUESTS_IN_FLIGHT_MAX: usize = 32;
/// Sequenced requests one client session keeps in flight at once: both budgets.
pub const SESSION_REQUESTS_IN_FLIGHT_MAX: usize =
    SESSION_WAITS_IN_FLIGHT_MAX + SESSION_SHORT_REQUESTS_IN_FLIGHT_MAX;
const _: () = assert!(SESSION_REQUESTS_IN_FLIGHT_MAX * 2 <= SESSION_OUTCOMES_MAX);
/// A client session starts no request whose sequence number is this far or more past its
/// oldest unanswered request (which may still be retried, by its wait or by the background
/// task that settles an abandoned one). Every request that can complete on the server between
/// the oldest one's outcome and its retry was then unanswered at some moment with it, so its
/// sequence number lies within this distance on either side: fewer than twice this many
/// outcomes, which the server's memory holds, so a retry never finds its outcome forgotten.
pub const SESSION_SEQ_WINDOW_MAX: usize = 128;
const _: () = assert!(2 * SESSION_SEQ_WINDOW_MAX <= SESSION_OUTCOMES_MAX);
// The in-flight budgets alone never fill the window: only a request left unanswered while
// many newer ones finish does.
const _: () = assert!(SESSION_REQUESTS_IN_FLIGHT_MAX < SESSION_SEQ_WINDOW_MAX);
const _: () = assert!(SESSION_TTL_MS_MIN <= SESSION_TTL_MS_DEFAULT);
const _: () = assert!(SESSION_TTL_MS_DEFAULT <= SESSION_TTL_MS_MAX);

/// Sessions expired by one replicated command; the leader splits larger batches.
pub const EXPIRE_BATCH_MAX: usize = 1_024;
/// The clock rate error latchkey assumes of any member or client, in parts per million (1 %).
/// Ordinary quartz clocks drift by tens of ppm; NTP slews at most 500 ppm. Durations measured
/// on one machine and used on another are stretched by twice this.
pub const CLOCK_DRIFT_PPM_MAX: u64 = 10_000;

/// Sessions marked by one lease-checkpoint entry; the leader splits larger batches.
pub const LEASE_MARK_BATCH_MAX: usize = 4_096;
/// Sessions renewed by one `RenewLeases` entry. After a failover every session needs a logged
/// renewal at its next keepalive; the leader gathers every keepalive waiting for one into a
/// single entry up to this many sessions (about 40 KiB of ids), so thousands of sessions renew
/// in a few commits instead of one commit each.
pub const LEASE_RENEW_BATCH_MAX: usize = 8_192;
/// Sessions renewed by one keepalive request.
pub const KEEPALIVE_SESSIONS_MAX: usize = 1_024;
/// Log lines `latchkey lock` queues for its stderr writer thread. Beyond it lines are dropped:
/// an unread stderr must never block the task that logs (see `cli/src/logwriter.rs`); a few
/// hundred lines cover any burst of warnings a session produces between two writes.
pub const CLI_LOG_LINES_QUEUED_MAX: usize = 256;
// ---- the table's byte budget (issue #13 item 5) ----

/// What the table is charged for each thing it keeps, in bytes: about its heap cost (the
/// allocator's count, `tests/memory.rs`), and at least what the thing takes in a snapshot, so
/// that a snapshot is never larger than the table's accounted bytes plus its header
/// (`tests/table_bytes.rs` checks both). These decide what `apply` answers near the budget, so
/// changing one changes the replicated state machine: every member must run the same values.
///
/// A held lock: the map entry, the holder, the name's one shared copy (its bytes on top), and the
/// holder session's reference to it (measured 137 B + name, `tests/memory.rs`).
pub const TABLE_LOCK_BYTES: usize = 144;
/// A queued wait: its queue slot, its entry in the index of wait ends, and its session's record
/// of the request with its own copy of the lock's name (the name's bytes on top).
pub const TABLE_WAITER_BYTES: usize = 128;
/// One remembered outcome: its map entry and its place in the session's order of outcomes.
pub const TABLE_OUTCOME_BYTES: usize = 48;
/// A session without its outcomes: the map entry and its fields (its owner's bytes on top).
pub const TABLE_SESSION_BYTES: usize = 192;
/// A session is charged when it is created for every outcome it may come to remember and every
/// force-released grant it may be told of (a token each), so that a release, a cancel, an
/// expiry or a force-release, which record those, never needs room: they must succeed on a full
/// table, since they are what makes room.
pub const TABLE_SESSION_WITH_OUTCOMES_BYTES: usize = TABLE_SESSION_BYTES
    + SESSION_OUTCOMES_MAX * TABLE_OUTCOME_BYTES
    + REVOKED_GRANTS_PER_SESSION_MAX * 8;
/// A holder of a name used with several holders (issue #32: a reader, a permit, and the
/// exclusive holder of such a name) beyond the lock's own charge: its grant (session, token,
/// time, mode) and its session's reference to the name. A handover turns a waiter into one,
/// so it must not cost more than a waiter.
pub const TABLE_GRANT_BYTES: usize = 64;
const _: () = assert!(TABLE_GRANT_BYTES <= TABLE_WAITER_BYTES);
// A hand-over removes a waiter and records two outcomes; a release that frees a lock removes the
// lock: both shrink the table even when outcomes are counted one by one.
const _: () = assert!(TABLE_WAITER_BYTES >= 2 * TABLE_OUTCOME_BYTES);
const _: () = assert!(TABLE_LOCK_BYTES >= TABLE_OUTCOME_BYTES);
/// An election's published value (issue #32), held by the leader's grant or by a campaign's
/// wait until it is granted: the map entry, its key, the token and the value's heap header
/// (the value's bytes and the election's name's, which a snapshot writes again beside a
/// published value, on top). The same charge either way, so a handover from the queue moves
/// it and needs no room.
pub const TABLE_VALUE_BYTES: usize = 64;

/// The byte budget of the whole lock table (`--table-bytes-max` lowers it): sessions with their
/// outcomes, held locks with their names, queued waits with theirs, owners' names. A command
/// that would take the table past it is rejected (`Rejection::TableFull`). 1 GiB: a node holds
/// the table, a snapshot of it being written or sent (never larger than the budget, above), and
/// a snapshot being received while the old table is still serving, about three budgets, which
/// a node with 4 GiB of memory holds with room for the process itself. A snapshot of a full
/// table streams in `SNAPSHOT_CHUNK_BYTES` chunks.
///
/// The count limits above, multiplied out, exceed it (a million locks with 512-byte names are
/// 656 MB; 100,000 sessions that each remember their 256 outcomes are 1.25 GB): each fits on
/// its own for typical sizes, but not all at once, so the budget is the binding limit on
/// memory, and each count limit bounds one thing's share of it.
pub const TABLE_BYTES_MAX: usize = 1024 * 1024 * 1024;
/// The smallest budget `--table-bytes-max` accepts: room for a few sessions and their locks, so
/// that a typo does not make a cluster that cannot open a session.
pub const TABLE_BYTES_MIN: usize = 64 * 1024;
const _: () = assert!(TABLE_BYTES_MIN >= 4 * TABLE_SESSION_WITH_OUTCOMES_BYTES);
const _: () = assert!(TABLE_BYTES_MIN < TABLE_BYTES_MAX);
// Each count limit fits in the budget on its own at a typical size: a million held locks with
// 64-byte names, or as many sessions as there are waiting acquires on a node, fully used.
const _: () = assert!(LOCKS_MAX * (TABLE_LOCK_BYTES + 64) <= TABLE_BYTES_MAX);
const _: () = assert!((SESSIONS_MAX / 2) * TABLE_SESSION_WITH_OUTCOMES_BYTES <= TABLE_BYTES_MAX);
// ... but not all at once: the budget binds.
const _: () = assert!(
    LOCKS_MAX * (TABLE_LOCK_BYTES + LOCK_NAME_BYTES_MAX)
        + SESSIONS_MAX * TABLE_SESSION_WITH_OUTCOMES_BYTES
        > TABLE_BYTES_MAX
);

/// Locks returned by one `List` request.
pub const LIST_RESULTS_MAX: usize = 10_000;

/// A wait that asks for longer than this is cut to it. A day is "forever" for any caller that
/// should be using a lock; the client library re-sends to wait longer.
pub const WAIT_TIMEOUT_MS_MAX: u64 = 86_400_000;
/// A single Acquire call long-polls at most this long before the server answers `Pending` and the
/// client re-attaches with the same sequence number. Keeps connections and server tasks short.
pub const ACQUIRE_POLL_MS_MAX: u64 = 10_000;
const _: () = assert!(ACQUIRE_POLL_MS_MAX < WAIT_TIMEOUT_MS_MAX);
/// Waits ended by one `ExpireWaits` entry; the leader proposes another for the rest. Keeps an
/// entry's apply time and its answer small when many waits end at once.
pub const WAITS_EXPIRED_PER_ENTRY_MAX: usize = 4_096;
/// `ExpireWaits` entries the lease task proposes in one pass before its other duties
/// (expiring sessions, ending lock-delays): waits that come due as fast as entries commit
/// cannot starve those; more are due on the next pass, a lease tick later at most.
pub const WAIT_EXPIRY_ROUNDS_PER_PASS: usize = 8;
/// The longest lock-delay an acquire may ask for (issue #32 item 4): 5 minutes. A delay keeps
/// a name from every waiter after its holder died, so it is a window for a resource that
/// cannot check tokens to finish what a dead holder started, not a way to park a name; Consul
/// caps its `lock-delay` at 60 s, Chubby's is a minute. A longer one is refused, not cut, so
/// that the holder learns it does not get the protection it asked for.
pub const LOCK_DELAY_MS_MAX: u64 = 300_000;
/// Lock-delays ended by one `EndDelays` entry; the leader proposes another for the rest, as
/// for `WAITS_EXPIRED_PER_ENTRY_MAX`.
pub const DELAYS_ENDED_PER_ENTRY_MAX: usize = 4_096;
/// Lock-delays one group keeps, asked for by queued acquires, held with grants, and running
/// after a grant was lost: an acquire asking for another is refused (`TooManyDelays`). A
/// running delay outlives its session, so without a bound a tenant could let sessions die
/// and park names for `LOCK_DELAY_MS_MAX` each; with it, delays keep at most 1.6% of
/// `LOCKS_MAX` names, and the leader's scan of the running ones on each lease tick (to time
/// them on its monotonic clock) looks at no more than this. Each identity is bounded lower
/// by its quota (`IDENTITY_DELAYS_DEFAULT`).
pub const DELAYS_MAX: usize = 16_384;
/// Lock-delays one identity may have in a group whatever its quota (`max_delays`, checked
/// before proposing, so calls in flight can pass it together): a quarter of `DELAYS_MAX`,
/// enforced by the table itself (`TooManyDelays`), so that no identity alone, however many
/// calls it sends at once, takes the group's every delay.
pub const DELAYS_PER_IDENTITY_MAX: usize = DELAYS_MAX / 4;
const _: () = assert!(IDENTITY_DELAYS_DEFAULT <= DELAYS_PER_IDENTITY_MAX);
const _: () = assert!(DELAYS_ENDED_PER_ENTRY_MAX <= DELAYS_MAX);
/// Held names with waiters one keepalive answer lists for a session (conflict events, issue
/// #32 item 5), in name order: a holder learns someone waits for each of its first 64 locks;
/// a session holding more contended locks than that learns it for those first. Bounds the
/// answer (a session may hold `LOCKS_PER_SESSION_MAX` locks).
pub const CONTENDED_PER_LEASE_MAX: usize = 64;
/// Held names one keepalive answer looks at for conflict events, over all its sessions
/// (a session may hold `LOCKS_PER_SESSION_MAX`, a keepalive carry `KEEPALIVE_SESSIONS_MAX`
/// sessions): bounds the time the answer reads the table for them (a map lookup each, a few
/// milliseconds in all). Sessions past it are answered with `contended_truncated`.
pub const CONTENDED_CHECKS_PER_ANSWER_MAX: usize = 65_536;
/// Contended names one keepalive answer lists, over all its sessions: 4,096 names of at most
/// `LOCK_NAME_BYTES_MAX` bytes are 2 MiB, inside `CLIENT_MESSAGE_BYTES_MAX` beside the rest of the
/// answer. Sessions past it are answered with `contended_truncated`.
pub const CONTENDED_NAMES_PER_ANSWER_MAX: usize = 4_096;
/// What the table is charged for a lock-delay asked by a held or queued acquire, beyond the
/// lock or waiter: its map entry, key and value (a held lock's name is its lock's).
pub const TABLE_LOCK_DELAY_BYTES: usize = 64;

/// Operations in one `Op::Batch` entry (issue #35). The leader gathers into one entry what
/// arrives while its writes in flight (`GATHER_WRITES_IN_FLIGHT`) are busy: with one connection per user that is at most
/// the users in flight (64 in the benchmark's workload), with batching clients a few of their
/// batches. Applying an entry holds the table's write lock, so this also bounds how long one
/// entry keeps reads waiting (a few hundred small operations: well under a millisecond).
pub const BATCH_OPS_MAX: usize = 256;
/// The leader's writes of gathered operations in flight at once (issue #35): an operation that
/// finds fewer in flight is proposed at once, the rest gather for the next one to end. One was
/// measured to cost the contended workload 15-25% of its handoffs (docs/PERFORMANCE.md,
/// "Batching"): a handoff is a chain of commits, and each release waited behind an unrelated
/// write in flight (a waiter's acquire, a keepalive) and then its own. Two let one write pass
/// another, while gathering still fills entries under load; four (tried on `h-pipeline`)
/// halved the entries and cost more CPU per pair.
pub const GATHER_WRITES_IN_FLIGHT: usize = 2;
const _: () = assert!(GATHER_WRITES_IN_FLIGHT >= 1);
/// Bytes of one `Op::Batch` entry's operations, as `Op::bytes_max` bounds them. Room for the
/// largest plain acquires and releases at `BATCH_OPS_MAX`; campaigns with long values fill it
/// sooner (and the leader then starts the next entry). An append message of many such entries
/// still fits a peer message.
pub const BATCH_BYTES_MAX: usize = 256 * 1024;
const _: () = assert!(BATCH_OPS_MAX * (LOCK_NAME_BYTES_MAX + 64) <= BATCH_BYTES_MAX);
/// Operations in one `Batch` call (issue #35 item 1). Each runs as its own call would, all at
/// once: a call of this many is as many concurrent calls on one connection, the most a batching
/// client gathers between two answers. As many as one batch entry holds, so that a full call's
/// operations can go into one entry.
pub const BATCH_CALL_OPS_MAX: usize = BATCH_OPS_MAX;
/// `Batch` calls a batching client has in flight to one member at once, at most
/// (`ClientConfig::batch_calls_in_flight`, issue #35): each is bounded by
/// `BATCH_CALL_OPS_MAX` operations, and a member runs `BATCH_OPS_IN_FLIGHT_MAX` operations of
/// batches at once over all its connections.
pub const CLIENT_BATCH_CALLS_IN_FLIGHT_MAX: usize = 16;
/// The default of `ClientConfig::batch_calls_in_flight`. One: measured in one sitting (64
/// users over 4 connections, the leader coalescing; docs/PERFORMANCE.md, "Batching"), two in
/// flight made smaller batches (0.42 calls per operation against 0.25) and no more pairs/s in
/// any of three rounds (2,146 / 5,152 / 2,697 against 3,954 / 5,287 / 3,469).
pub const CLIENT_BATCH_CALLS_IN_FLIGHT_DEFAULT: usize = 1;
/// Batches in flight in the simulation's batching clients (`RunConfig::client_batch`): more
/// than the default, so that the seeds run the coalescer with several in flight, of which one
/// is the case; four sessions per client host fill them (`BATCH_WORKERS`).
pub const SIM_CLIENT_BATCH_CALLS_IN_FLIGHT: usize = 2;
const _: () = assert!(
    CLIENT_BATCH_CALLS_IN_FLIGHT_DEFAULT >= 1
        && CLIENT_BATCH_CALLS_IN_FLIGHT_DEFAULT <= CLIENT_BATCH_CALLS_IN_FLIGHT_MAX
);
/// Operations of `Batch` calls a member runs at once, over all its connections: a call waits
/// for room for its operations before it runs them. Without it one connection could have
/// `CLIENT_CONCURRENT_REQUESTS_MAX` calls of `BATCH_CALL_OPS_MAX` operations each in flight
/// (a million), where unary calls are bounded by the per-connection limit alone.
pub const BATCH_OPS_IN_FLIGHT_MAX: usize = CLIENT_CONCURRENT_REQUESTS_MAX;
const _: () = assert!(BATCH_OPS_IN_FLIGHT_MAX >= BATCH_CALL_OPS_MAX);
/// The most an answer of one operation of a `Batch` call takes, but a keepalive's and an
/// acquire's `held_by` (which a too-large answer leaves out): a grant, a position, an error
/// whose message quotes a name, a leader hint.
pub const BATCH_RESULT_BYTES_SMALL_MAX: usize = LOCK_NAME_BYTES_MAX + 1_024;
/// A `Batch` call carries at most one keepalive (one renews any number of sessions), whose
/// answer takes at most half a message (its contended names, asserted where
/// `CONTENDED_NAMES_PER_ANSWER_MAX` is): with every other operation's answer at most
/// `BATCH_RESULT_BYTES_SMALL_MAX`, a batch's answer fits a message. (Four keepalives of 64
/// contended sessions each made an answer over 8 MiB, refused after its operations applied.)
const _: () = assert!(
    CLIENT_MESSAGE_BYTES_MAX / 2 + BATCH_CALL_OPS_MAX * BATCH_RESULT_BYTES_SMALL_MAX
        <= CLIENT_MESSAGE_BYTES_MAX
);
const _: () = assert!(64 * BATCH_BYTES_MAX <= PEER_MESSAGE_BYTES_MAX);

/// Bytes of one client gRPC message (request or response). The largest is a `List` answer:
/// `LIST_RESULTS_MAX` names of at most 512 bytes plus fields.
pub const CLIENT_MESSAGE_BYTES_MAX: usize = 8 * 1024 * 1024;
const _: () = assert!(LIST_RESULTS_MAX * (LOCK_NAME_BYTES_MAX + 64) <= CLIENT_MESSAGE_BYTES_MAX);
const _: () = assert!(
    CONTENDED_NAMES_PER_ANSWER_MAX * (LOCK_NAME_BYTES_MAX + 8) <= CLIENT_MESSAGE_BYTES_MAX / 2
);
/// Bytes of one peer (Raft) gRPC message: a batch of log entries or a snapshot chunk (a snapshot
/// itself is streamed in chunks of `SNAPSHOT_CHUNK_BYTES`, so it may be far larger).
pub const PEER_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Bytes of a snapshot beyond its table's accounted bytes: the file header, the last log id,
/// the membership (members' addresses) and the table's own header. A receiver refuses a
/// snapshot stream announcing more than its table budget plus this.
pub const SNAPSHOT_OVERHEAD_BYTES_MAX: usize = 1024 * 1024;
/// Member ids a Raft group remembers as removed (`latchkey_raft::RemovedMembers`), so that a
/// removed member, which keeps its credentials, is refused even when its message claims
/// leadership. An operator removes a member a handful of times in a cluster's life; a thousand
/// covers any history that is not a loop, and keeps the record (two integers each) a few KiB
/// of every snapshot. Past it, the oldest removal is forgotten (and logged): that id is then
/// told only by the other checks, as before the record existed.
pub const REMOVED_MEMBERS_MAX: usize = 1_024;
// The record, at most 20 bytes an id in postcard (two varint u64s), is a small part of the
// snapshot's allowance beyond its table.
const _: () = assert!(REMOVED_MEMBERS_MAX * 20 <= SNAPSHOT_OVERHEAD_BYTES_MAX / 16);
/// Bytes of data in one snapshot chunk message. Small enough that a chunk is a small part of
/// a peer message and of the time a chunk may take; large enough that a full table's snapshot
/// is a few hundred chunks, each costing a MAC and a message header.
pub const SNAPSHOT_CHUNK_BYTES: usize = 4 * 1024 * 1024;
// A chunk and its framing fit in one peer message.
const _: () = assert!(SNAPSHOT_CHUNK_BYTES + 4096 <= PEER_MESSAGE_BYTES_MAX);
/// Time one snapshot chunk may take to be sent and accepted (openraft's
/// `install_snapshot_timeout`, which it gives `full_snapshot` as its RPC timeout). A member
/// that takes no chunk for this long is treated as unreachable, so a stalled transfer holds
/// a leader's replication to it, and the receiver's slot, no longer. 4 MiB in 10 s is 0.4 MB/s,
/// far slower than any network between members.
pub const SNAPSHOT_CHUNK_TIMEOUT_MS: u64 = 10_000;
/// Time a member may take, after the last chunk, to decode and check the snapshot and install
/// it (write it durably, swap the table). A 69 MiB snapshot took 7.5 s after its last chunk in
/// a debug build on a loaded 2-core machine (`cli/tests/snapshot_stream.rs`); a full 1 GiB
/// table at that rate takes about 110 s, a release build far less.
pub const SNAPSHOT_INSTALL_TIMEOUT_MS: u64 = 120_000;
/// Snapshots a member receives at once. openraft's leader sends one snapshot to a member at a
/// time; a second stream (a new leader's, while an old one's times out) is refused and retried,
/// so a member never buffers more than one snapshot of its budget.
pub const SNAPSHOTS_RECEIVING_MAX: usize = 1;
/// Client requests served at once by one node; beyond it requests wait in tonic's queue.
pub const CLIENT_CONCURRENT_REQUESTS_MAX: usize = 4_096;
/// Streams a client may reset before the server accepted them, per connection, before the
/// server closes the connection (HTTP/2 GOAWAY ENHANCE_YOUR_CALM). h2's default, 20, guards
/// against the "rapid reset" flood, but one process with thousands of sessions on a slow or busy
/// node legitimately cancels more than 20 keepalives whose attempt deadline passed: the whole
/// connection then failed, every session's renewal with it (found by 5,000 sessions across a
/// leader kill). The concurrency limit per connection still bounds the work a flood can cause.
pub const CLIENT_PENDING_RESET_STREAMS_MAX: usize = 1_024;
/// Reset streams a client connection remembers, so that an answer arriving after its request
/// was cancelled is ignored rather than counted as a protocol error of the server (h2 keeps 10;
/// a process with thousands of sessions cancels more than that at once when a node is slow).
pub const CLIENT_RESET_STREAMS_REMEMBERED: usize = 4_096;
/// Acquire calls long-polling at once on one node (each holds a task and a registry slot).
pub const WAITING_ACQUIRES_MAX: usize = 100_000;

/// Default Raft heartbeat interval. A follower that misses heartbeats for a leader lease plus an
/// election timeout (below) campaigns, so at 100 ms it has missed at least nine in a row: a
/// leader busy with an fsync or a burst of client work is not mistaken for a dead one.
pub const HEARTBEAT_MS_DEFAULT: u64 = 100;
/// Default election timeout range. openraft lets a follower campaign (pre-vote) only once
/// `leader lease + election timeout` has passed since it last heard from the leader, and its
/// leader lease is the *maximum* election timeout (`EngineConfig::new`: `leader_lease =
/// election_timeout_max`; `RaftCore::handle_tick_election`; openraft 0.10.0-alpha.37). A dead
/// leader is therefore replaced `max + [min, max)` after its last heartbeat: with 1000..2000 that
/// was 3-4 s, which with the client's backoff on top made failover 3.6-5.9 s (issue #11). At
/// 300..600 it is 0.9-1.2 s, a first grant within about 1.5 s.
pub const ELECTION_TIMEOUT_MS_MIN_DEFAULT: u64 = 300;
pub const ELECTION_TIMEOUT_MS_MAX_DEFAULT: u64 = 600;
// openraft and `ServerConfig::validate` want at least three heartbeats per election timeout.
const _: () = assert!(3 * HEARTBEAT_MS_DEFAULT <= ELECTION_TIMEOUT_MS_MIN_DEFAULT);
const _: () = assert!(ELECTION_TIMEOUT_MS_MIN_DEFAULT < ELECTION_TIMEOUT_MS_MAX_DEFAULT);
/// The longest a group is without a leader after its leader dies, with the default timing:
/// the last heartbeat, the follower's leader lease, its election timeout, and one more timeout
/// for a split vote.
pub const LEADERLESS_MS_MAX_DEFAULT: u64 =
    HEARTBEAT_MS_DEFAULT + 3 * ELECTION_TIMEOUT_MS_MAX_DEFAULT;

/// A client renews its session every TTL / this (the usual third: two renewals can be lost in
/// a row before the lease is in danger).
pub const CLIENT_RENEWAL_TTL_DIVISOR: u32 = 3;
/// A client's safety margin is at least TTL / this: 20 % of the lease. It stops believing it
/// holds its locks this long before the lease deadline it measured. Monotonic clocks drift by
/// parts per million, so the rest is room for the holder to stop before the server can grant
/// again.
pub const CLIENT_SAFETY_MARGIN_TTL_DIVISOR: u32 = 5;
/// The least safety margin. Covers a late timer and scheduling on a loaded client, and leaves a
/// holder time to stop (the CLI's kill grace is half the margin).
pub const CLIENT_SAFETY_MARGIN_MS_MIN: u64 = 200;
// The margin must leave room for a renewal even at the shortest TTL.
const _: () = assert!(
    CLIENT_SAFETY_MARGIN_MS_MIN <= SESSION_TTL_MS_MIN / CLIENT_SAFETY_MARGIN_TTL_DIVISOR as u64
);
// Two renewals fall due before the margin begins (2·TTL/R <= TTL - TTL/S), so one lost
// renewal never costs a holder its lock.
const _: () = assert!(
    2 * CLIENT_SAFETY_MARGIN_TTL_DIVISOR
        <= CLIENT_RENEWAL_TTL_DIVISOR * (CLIENT_SAFETY_MARGIN_TTL_DIVISOR - 1)
);
/// Deadline of one renewal attempt: TTL / this (a fifth), at least the minimum below. A
/// healthy leader answers in milliseconds, a logged renewal in one fsync; a renewal that takes
/// longer is retried while the lease still has room.
pub const CLIENT_RENEWAL_ATTEMPT_TTL_DIVISOR: u32 = 5;
pub const CLIENT_RENEWAL_ATTEMPT_MS_MIN: u64 = 200;
// An attempt ends before the next renewal is due, so attempts never pile up.
const _: () = assert!(CLIENT_RENEWAL_ATTEMPT_TTL_DIVISOR >= CLIENT_RENEWAL_TTL_DIVISOR);
const _: () = assert!(
    CLIENT_RENEWAL_ATTEMPT_MS_MIN <= SESSION_TTL_MS_MIN / CLIENT_RENEWAL_TTL_DIVISOR as u64
);
/// After a renewal failed (its attempts ran out, or the answer left the session out), the next
/// one is sent TTL / this (a tenth) later, at least the minimum below, and never later than the
/// client's deadline: sooner than the regular TTL/3 schedule, since the lease is now running
/// down, but not a tight loop against a cluster that is electing a leader.
pub const CLIENT_RENEWAL_RETRY_TTL_DIVISOR: u32 = 10;
pub const CLIENT_RENEWAL_RETRY_MS_MIN: u64 = 100;
// A failed renewal is retried sooner than the regular schedule would send the next one.
const _: () = assert!(CLIENT_RENEWAL_RETRY_TTL_DIVISOR >= CLIENT_RENEWAL_TTL_DIVISOR);
const _: () =
    assert!(CLIENT_RENEWAL_RETRY_MS_MIN <= SESSION_TTL_MS_MIN / CLIENT_RENEWAL_TTL_DIVISOR as u64);
/// Cap of the backoff between renewal attempts: TTL / this (a twentieth), at least the minimum
/// below, so that a renewal reaches a new leader within a few hundred ms of its election.
pub const CLIENT_RENEWAL_BACKOFF_TTL_DIVISOR: u32 = 20;
pub const CLIENT_RENEWAL_BACKOFF_MS_MIN: u64 = 50;
// A backoff never outlasts an attempt's deadline: a retry waits less than the attempt it repeats.
const _: () = assert!(CLIENT_RENEWAL_BACKOFF_MS_MIN <= CLIENT_RENEWAL_ATTEMPT_MS_MIN);
const _: () = assert!(CLIENT_RENEWAL_BACKOFF_TTL_DIVISOR >= CLIENT_RENEWAL_ATTEMPT_TTL_DIVISOR);
// A holder's client must reach the new leader before its own lease deadline: its last
// acknowledged renewal is up to TTL/3 old, and it gives up TTL/5 before the TTL, which leaves
// 7/15 of the TTL. A failover must fit in that, with room to spare, at the default TTL.
const _: () = assert!(
    2 * LEADERLESS_MS_MAX_DEFAULT
        <= SESSION_TTL_MS_DEFAULT
            - SESSION_TTL_MS_DEFAULT / CLIENT_RENEWAL_TTL_DIVISOR as u64
            - SESSION_TTL_MS_DEFAULT / CLIENT_SAFETY_MARGIN_TTL_DIVISOR as u64
);

/// Cap of the doubling backoff between a client's attempts of one request. During a failover
/// the client polls followers that answer "not the leader" at once; a cap of seconds meant it
/// could sleep a whole backoff past the new leader's election (up to 2 s of the 3.6-5.9 s of
/// issue #11). A cheap "not the leader" answer or a refused connection every 250 ms per client
/// is no load for a member.
pub const CLIENT_BACKOFF_MS_MAX: u64 = 250;
/// The first backoff of a client's retry sequence (`RetryPolicy::backoff_initial`); it doubles
/// after each failed attempt up to `CLIENT_BACKOFF_MS_MAX`. Short, because the usual failure is
/// a follower's "not the leader" answer, which costs the member nothing.
pub const CLIENT_BACKOFF_MS_INITIAL: u64 = 50;
const _: () = assert!(CLIENT_BACKOFF_MS_INITIAL <= CLIENT_BACKOFF_MS_MAX);
/// The time budget of one logical request (`RetryPolicy::elapsed_max`): no new attempt starts
/// after it. Long enough to ride out several failovers (`LEADERLESS_MS_MAX_DEFAULT`) and the
/// quick restart of a single node; short enough that a cluster that is really down is reported
/// within a human's patience. A wait (`Acquire`) re-sends past it under the same sequence number.
pub const CLIENT_RETRY_ELAPSED_MS_MAX: u64 = 20_000;
const _: () = assert!(3 * LEADERLESS_MS_MAX_DEFAULT <= CLIENT_RETRY_ELAPSED_MS_MAX);
/// The time budget of one logical request while none of its attempts has reached a server
/// (`RetryPolicy::unreachable_max`): every endpoint's name failed to resolve, or its
/// connection was refused or timed out. A member in an election answers "no leader yet" and
/// gets the whole `CLIENT_RETRY_ELAPSED_MS_MAX`; a dead or misspelled endpoint is reported in
/// about the time etcdctl takes (2 s), after several rounds over the endpoints (issue #33).
pub const CLIENT_UNREACHABLE_MS_MAX: u64 = 2_000;
const _: () = assert!(CLIENT_UNREACHABLE_MS_MAX >= 4 * CLIENT_BACKOFF_MS_MAX);
const _: () = assert!(CLIENT_UNREACHABLE_MS_MAX <= CLIENT_RETRY_ELAPSED_MS_MAX);
/// A client's attempts of one request before it gives up (its time budget,
/// `CLIENT_RETRY_ELAPSED_MS_MAX`, usually ends it first). With the backoff capped low, many attempts are needed to ride out an election and
/// the quick restart of a single-node cluster.
pub const CLIENT_ATTEMPTS_MAX: u32 = 64;
// The attempts' least total backoff (each delay is at least half its ceiling, the ceilings
// reaching the cap after a few doublings) must outlast a failover several times over.
const _: () = assert!(
    (CLIENT_ATTEMPTS_MAX as u64 - 8) * CLIENT_BACKOFF_MS_MAX / 2 >= 3 * LEADERLESS_MS_MAX_DEFAULT
);
/// How long a client ignores leader hints naming a member that just refused it (or did not
/// answer). Followers go on naming a dead leader until they vote in a new term, a leader lease
/// plus an election timeout after its last heartbeat; following those hints cost every other
/// attempt and doubled the backoff each time (issue #11). After this, a hint to that member is
/// trusted again: it may have restarted and been re-elected.
pub const CLIENT_REFUSED_HINT_IGNORE_MS: u64 = LEADERLESS_MS_MAX_DEFAULT;
/// Cap of the backoff between a client's attempts of one Acquire: a waiter should reach a new
/// leader soon after an election (when the call's attempts run out first, the wait sends it
/// again with the same sequence number).
pub const CLIENT_ACQUIRE_BACKOFF_MS_MAX: u64 = 250;
// A waiter is no slower to find a new leader than any other call.
const _: () = assert!(CLIENT_ACQUIRE_BACKOFF_MS_MAX <= CLIENT_BACKOFF_MS_MAX);
/// After its wait timeout, a client gives up a request the server still answers PENDING after
/// this much more. The server cancels the wait at its own deadline, so this only fires if the
/// server does not; two long-polls is plenty for the replicated cancel to land.
pub const CLIENT_PENDING_AFTER_DEADLINE_MS_MAX: u64 = 2 * ACQUIRE_POLL_MS_MAX;
/// How long after the caller's wait timeout a client's wait gives up on its own when no server
/// answers (an election, a partition). A reachable leader answers at the deadline itself (its
/// cancel goes through the log first); this is the room for that answer to arrive.
pub const CLIENT_UNANSWERED_AFTER_DEADLINE_MS_MAX: u64 = 1_000;
/// The shortest sleep of a client waiting for its clock to reach an instant: tokio's timer
/// resolution. A remainder that rounds down to zero must not spin the loop without letting
/// time pass.
pub const CLIENT_TIMER_TICK_MS: u64 = 1;

/// Clients `latchkey bench` runs at once, each with its own connection and session. Beyond a
/// few thousand the bench's own CPU, not the server, is what a small machine measures; a full
/// wait queue (the contended and herd workloads) and the herd's default fit.
pub const BENCH_CLIENTS_MAX: usize = 4_096;
/// Waiters of `latchkey bench --workload herd` when `--clients` is not given: enough that a
/// cost per waiter (a wake-up, a request, an entry) shows in the figures per handoff.
pub const BENCH_HERD_CLIENTS_DEFAULT: usize = 500;
const _: () = assert!(BENCH_HERD_CLIENTS_DEFAULT <= WAITERS_PER_LOCK_MAX);
const _: () = assert!(WAITERS_PER_LOCK_MAX <= BENCH_CLIENTS_MAX);
const _: () = assert!(BENCH_CLIENTS_MAX <= SESSIONS_MAX);
/// Locks held by `latchkey bench --workload hold`: as many as one group holds.
pub const BENCH_HOLD_LOCKS_MAX: usize = LOCKS_MAX;
/// Failover rounds of one bench run. Each kills the leader, restarts it and waits for the
/// cluster to be whole again (seconds each): a hundred is already a long run.
pub const BENCH_FAILOVER_ROUNDS_MAX: u32 = 100;
/// Candidates of `latchkey bench --workload election`: each is a real `latchkey elect` process
/// with its own connection and session (and, leading, a COMMAND shell); a few suffice to have a
/// queue behind the leader, and a few dozen processes are already a load of their own.
pub const BENCH_ELECTION_CANDIDATES_MAX: usize = 64;
/// Leader kills of one `bench --workload election` run: each waits out a session lease (about
/// `--ttl`), so a hundred is already a long run.
pub const BENCH_ELECTION_ROUNDS_MAX: u32 = 100;
const _: () = assert!(BENCH_ELECTION_CANDIDATES_MAX <= WAITERS_PER_LOCK_MAX);
/// Acquires the hold workload keeps in flight while it fills the table: enough to keep a
/// leader's group commit busy, far below the requests a node serves at once.
pub const BENCH_HOLD_FILL_IN_FLIGHT_MAX: usize = 256;
const _: () = assert!(BENCH_HOLD_FILL_IN_FLIGHT_MAX <= CLIENT_CONCURRENT_REQUESTS_MAX);

/// Deadline of one proposal on the leader (`Node::propose`): a leader cut off from its majority
/// must answer "unavailable" (`NoQuorum`), not hold the call until the client gives up.
pub const PROPOSE_TIMEOUT_MS: u64 = 5_000;
/// A client's deadline for one attempt of a short RPC (`ClientConfig::rpc_timeout`). A healthy
/// node answers in milliseconds; 5 s covers an fsync under load without letting a paused node
/// hold a caller for long.
pub const CLIENT_RPC_TIMEOUT_MS_DEFAULT: u64 = 5_000;
// A proposal that cannot commit ends on the server no later than the client's attempt, so the
// client hears "no quorum" (and retries elsewhere) rather than only its own timeout.
const _: () = assert!(PROPOSE_TIMEOUT_MS <= CLIENT_RPC_TIMEOUT_MS_DEFAULT);
/// A client's time to open a TCP connection to one endpoint (`ClientConfig::connect_timeout`):
/// a member that is down is skipped within a fraction of one attempt's deadline.
pub const CLIENT_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 2_000;
const _: () = assert!(CLIENT_CONNECT_TIMEOUT_MS_DEFAULT < CLIENT_RPC_TIMEOUT_MS_DEFAULT);
/// A client pings a connection (HTTP/2 PING) when nothing arrived on it for this long while
/// requests are open on it, and closes it when the ping is not answered within
/// `CLIENT_PING_TIMEOUT_MS`: a member that is stopped (SIGSTOP, a hung host) or cut off by a
/// partition that drops packets silently is left within about 2 s, and the request retried on
/// another member, instead of after the attempt's whole deadline (5 s; a wait's long-poll,
/// longer). The nemesis measured it (issue #34): with the leader isolated, the clients went
/// 10.7 s without a grant, 5.4 s with it paused. A PING is answered by the peer's HTTP/2 layer,
/// not by a handler, so a busy member answers it; the timeout leaves room for a loaded
/// machine's scheduling. Idle connections are not pinged.
pub const CLIENT_PING_INTERVAL_MS: u64 = 1_000;
/// See `CLIENT_PING_INTERVAL_MS`.
pub const CLIENT_PING_TIMEOUT_MS: u64 = 1_000;
const _: () =
    assert!(CLIENT_PING_INTERVAL_MS + CLIENT_PING_TIMEOUT_MS < CLIENT_RPC_TIMEOUT_MS_DEFAULT);
/// A member's time to open a TCP connection to a peer. openraft retries replication on its own,
/// so a dead peer needs to cost a replication stream only about a heartbeat's worth of waits.
pub const PEER_CONNECT_TIMEOUT_MS: u64 = 1_000;
/// Appends a leader sends down one `AppendStream` before their answers come back. The member
/// takes about 64 at a time into its Raft core (openraft's `PIPELINE_BUFFER_SIZE` in
/// `raft/stream_append.rs`, plus the one it is handing over), so more would only wait in
/// buffers; this bounds the leader's record of send times and the entries in flight to one
/// member (each append at most `max_payload_entries`, openraft's default 300).
pub const PEER_APPENDS_UNANSWERED_MAX: usize = 64;
/// Streams of appends a member keeps open at once, from all senders. A leader keeps one open
/// to each follower and opens a short one per heartbeat; a leader's streams end when it stops
/// leading, and those of a leader that died with its connection half open end when the
/// connection's keepalive fails (`PEER_KEEPALIVE_INTERVAL_MS`). Each open stream holds a task
/// of openraft's and its buffers; beyond this a new stream is refused `UNAVAILABLE` and the
/// leader retries after its backoff.
pub const PEER_APPEND_STREAMS_MAX: usize = 32;
/// HTTP/2 keepalive on every server connection and on the members' connections to each other:
/// a ping after this long without traffic, and the connection is closed when no answer comes
/// within `PEER_KEEPALIVE_TIMEOUT_MS`. It is how a member learns that a peer's host died with
/// the connection half open (power loss, a freeze, a partition that healed after a reboot),
/// so that the streams that peer had open stop holding their slots. Long against the
/// heartbeat (100 ms): a live connection carries traffic far more often.
pub const PEER_KEEPALIVE_INTERVAL_MS: u64 = 10_000;
/// See `PEER_KEEPALIVE_INTERVAL_MS`.
pub const PEER_KEEPALIVE_TIMEOUT_MS: u64 = 20_000;
/// Time from opening a stream of appends to its first append. The leader takes its first
/// append before it opens the call, so the first comes at once; a stream that stays empty
/// this long is not a leader's and is closed (it would hold one of `PEER_APPEND_STREAMS_MAX`).
pub const PEER_APPEND_STREAM_FIRST_TIMEOUT_MS: u64 = 5_000;

/// Keepalive batches of marked sessions queued for the leader's lease task, which writes their
/// renewal; beyond it keepalives wait (and, past their deadline, the client retries).
pub const RENEW_QUEUE_CAPACITY: usize = 256;
/// How often the leader's lease task re-checks leases even when no deadline is near. Deadlines
/// wake it on their own; the tick bounds how long it sleeps past a deadline it has not seen yet.
pub const LEASE_TICK_MS: u64 = 100;
// Many ticks fit in the shortest lease, so a missed deadline costs a small part of a TTL.
const _: () = assert!(10 * LEASE_TICK_MS <= SESSION_TTL_MS_MIN);
/// Pause before the lease task retries a mark or expiry that failed to commit (typically "not
/// the leader" in the moment around an election): not a tight loop, and within a tick.
pub const LEASE_WRITE_RETRY_MS: u64 = 50;
const _: () = assert!(LEASE_WRITE_RETRY_MS <= LEASE_TICK_MS);

/// Default entries between snapshots (`ServerConfig::snapshot_every_entries`); the log before a
/// snapshot is purged. Enough that snapshots are rare under load, few enough that a restart
/// replays seconds of entries, not minutes.
pub const SNAPSHOT_EVERY_ENTRIES_DEFAULT: u64 = 10_000;
/// Default entries kept behind a snapshot (`ServerConfig::log_kept_after_snapshot`, openraft's
/// `max_in_snapshot_log_to_keep`), so that a follower a little behind catches up by entries
/// rather than by a snapshot install.
pub const LOG_KEPT_AFTER_SNAPSHOT_DEFAULT: u64 = 1_000;
const _: () = assert!(LOG_KEPT_AFTER_SNAPSHOT_DEFAULT < SNAPSHOT_EVERY_ENTRIES_DEFAULT);

/// Requests waiting for the log store's writer, which serves every Raft group of a member (its
/// groups share one log). Each group's openraft keeps few log IOs in flight (each append
/// carries up to `max_payload_entries` entries, and a vote save waits for its answer), so the
/// queue is rarely full even with `GROUPS_MAX` groups; when it is, submitters wait for room,
/// which pushes back on the Raft cores instead of growing memory.
pub const LOG_WRITE_QUEUE_CAPACITY: usize = 1_024;
/// Requests written by one log-store transaction. Bounds the time one commit takes (and so the
/// latency of the first request in it) while still sharing an fsync among everything that
/// queued up.
pub const LOG_WRITE_BATCH_REQUESTS_MAX: usize = 1_024;
const _: () = assert!(LOG_WRITE_BATCH_REQUESTS_MAX >= 1);
const _: () = assert!(LOG_WRITE_BATCH_REQUESTS_MAX <= LOG_WRITE_QUEUE_CAPACITY);
/// Bytes of already-synced log entries the log store keeps in memory (the newest ones); older
/// entries are read back from their segment file with a positioned read. Entries are read back
/// to replicate the recent tail and when a follower catches up; the live log is normally at most
/// `SNAPSHOT_EVERY_ENTRIES_DEFAULT + LOG_KEPT_AFTER_SNAPSHOT_DEFAULT` entries of a few hundred
/// bytes (a few MiB), so 16 MiB serves those reads from memory, while a log that grew far beyond
/// the snapshot policy (a slow state machine, a raised `--snapshot-every-entries`) does not grow
/// the node's memory with it. Entries not yet synced are always in memory besides this
/// (bounded by the write queue).
pub const LOG_TAIL_CACHE_BYTES: usize = 16 * 1024 * 1024;
const _: () = assert!(
    (SNAPSHOT_EVERY_ENTRIES_DEFAULT + LOG_KEPT_AFTER_SNAPSHOT_DEFAULT) as usize * 512
        <= LOG_TAIL_CACHE_BYTES
);
/// A log-store segment file is closed, and a new one started with a checkpoint, once it holds
/// this many bytes. Segments are the unit of deletion after a purge, so the disk holds the live
/// log plus at most about one segment of purged entries (with several groups sharing the log,
/// see `LOG_SEGMENTS_HELD_BACK_MAX`); a rotation costs a checkpoint and two
/// extra fsyncs, so at a few hundred bytes per entry 32 MiB makes it rare (every ~100,000
/// entries) and keeps a restart's replay of the segments short.
pub const LOG_SEGMENT_BYTES: u64 = 32 * 1024 * 1024;
const _: () = assert!(LOG_SEGMENT_BYTES >= 1024 * 1024 && LOG_SEGMENT_BYTES <= 64 * 1024 * 1024);
/// Zeros the log store writes ahead of its appends in the active segment (issue #35, item 4;
/// etcd's WAL preallocates its segments too). An append that overwrites blocks the file already
/// has changes no metadata the disk must hold (`fdatasync` skips the modification time), so
/// its `fdatasync` needs no journal commit; an append that extends the file does. Measured on
/// this machine class (docs/PERFORMANCE.md): a 512-byte write and `fdatasync` into zeros
/// written ahead took 102 µs against 142 µs appended. Real zeros, not `fallocate`: blocks
/// fallocated are "unwritten", and the first write to each is again a metadata change. 4 MiB
/// is a thousand or more group commits of a few KiB per extension, each extension written in
/// the same `fdatasync` as the append that needed it (a few ms once per 4 MiB); it is small
/// beside the segment, so a new or idle member holds little more than it wrote; never past
/// the segment's `LOG_SEGMENT_BYTES`, where it rotates.
pub const LOG_PREALLOCATE_BYTES: u64 = 4 * 1024 * 1024;
const _: () =
    assert!(LOG_PREALLOCATE_BYTES >= 64 * 1024 && LOG_PREALLOCATE_BYTES <= LOG_SEGMENT_BYTES);
/// A member's Raft groups share one log, whose segments are deleted from the front only, each
/// once every group purged its entries in it. A quiet group (its few entries never reach the
/// snapshot policy) would keep the oldest segment, and so every later one, forever. Once the
/// log has more segments than this and a group's entries hold the oldest one back, the server
/// has that group snapshot and purge up to them (`node.rs` `compact_log`). Four segments (128
/// MiB) hold the live logs of many busy groups (about 3 MB each at the snapshot policy's
/// 11,000 entries), so a busy group is rarely asked.
pub const LOG_SEGMENTS_HELD_BACK_MAX: usize = 4;
const _: () = assert!(LOG_SEGMENTS_HELD_BACK_MAX >= 2);
/// How often each group checks whether it holds the shared log's oldest segment back: a
/// quiet group is found within this after the log outgrew `LOG_SEGMENTS_HELD_BACK_MAX`.
pub const LOG_COMPACTION_CHECK_MS: u64 = 10_000;

// ---- peer authentication (issue #13) ----

/// Bytes of the cluster id that names a cluster in every peer request (the SHA-256 of the
/// founding member list, fixed at bootstrap and kept across membership changes). 16 bytes (128
/// bits) make an accidental match between two clusters' ids impossible in practice; the id is
/// not a secret and not what keeps a forger out (the secret is).
pub const PEER_FINGERPRINT_BYTES: usize = 16;
/// Bytes of an HMAC-SHA256 tag; a longer hex value in a request is refused before decoding.
pub const PEER_MAC_BYTES: usize = 32;
/// The shortest cluster secret accepted: 16 bytes of random data (128 bits) put guessing out of
/// reach; a shorter one is more likely a placeholder than a secret.
pub const CLUSTER_SECRET_BYTES_MIN: usize = 16;
/// The longest cluster secret read: HMAC hashes a longer key down to 32 bytes anyway, and a file
/// this big is not a secret someone meant to give.
pub const CLUSTER_SECRET_BYTES_MAX: usize = 4_096;
const _: () = assert!(PEER_FINGERPRINT_BYTES <= 32 && PEER_MAC_BYTES == 32);

/// How long an added member may take to catch up as a learner before it is promoted to voter
/// (`latchkey cluster add`). A new member with an empty data dir receives the latest snapshot
/// (at most `SNAPSHOT_EVERY_ENTRIES_DEFAULT` entries' worth of table) and the log after it;
/// a minute covers a large table over a slow link, and a member that is not even running
/// fails the call rather than hold it: it stays a learner, which does not count towards any
/// quorum, and `cluster add` may be run again.
pub const MEMBER_CATCH_UP_TIMEOUT_MS: u64 = 60_000;
/// How long one membership change (joint configuration, then the final one, each committed)
/// may take on the leader before the call answers "no quorum".
pub const MEMBERSHIP_CHANGE_TIMEOUT_MS: u64 = 20_000;
/// A client's deadline for one attempt of a membership call: the server gives up first, so
/// the caller hears why rather than only its own timeout.
pub const CLIENT_MEMBERSHIP_RPC_TIMEOUT_MS: u64 =
    MEMBER_CATCH_UP_TIMEOUT_MS + MEMBERSHIP_CHANGE_TIMEOUT_MS + 5_000;
const _: () = assert!(PROPOSE_TIMEOUT_MS <= MEMBERSHIP_CHANGE_TIMEOUT_MS);
/// Non-member senders a member remembers having reported (one warning each, then debug lines):
/// a removed member left running asks for votes every election timeout. Claimed ids are free
/// to invent, so the set is bounded; past it every refusal is a warning again.
pub const PEER_NON_MEMBERS_REPORTED_MAX: usize = 64;
/// Bytes of a `HOST:PORT`: a host name (at most 253) and a port.
pub const HOST_PORT_BYTES_MAX: usize = 260;
/// Bytes of a member's address in a membership change: a client `HOST:PORT` and, with
/// `--peer-listen`, `/` and a peer one.
pub const MEMBER_ADDR_BYTES_MAX: usize = 2 * HOST_PORT_BYTES_MAX + 1;
/// Characters of a cluster id (`--join`): the hex of `PEER_FINGERPRINT_BYTES` bytes.
pub const CLUSTER_ID_CHARS: usize = 2 * PEER_FINGERPRINT_BYTES;
const _: () = assert!(CLUSTER_SECRET_BYTES_MIN < CLUSTER_SECRET_BYTES_MAX);

/// Bytes of one HTTP API request body (`--http-listen`, issue #15). The largest is a keepalive
/// of `KEEPALIVE_SESSIONS_MAX` sessions, each `{"id":N,"secret":"N"}` in at most 64 bytes; an
/// acquire with an owner is under 2 KiB. A larger body is refused (413) before it is parsed.
pub const HTTP_BODY_BYTES_MAX: usize = 256 * 1024;
const _: () = assert!(KEEPALIVE_SESSIONS_MAX * 64 + 1024 <= HTTP_BODY_BYTES_MAX);
/// A `POST /v1/batch` (issue #35) of `BATCH_CALL_OPS_MAX` acquires of names of
/// `LOCK_NAME_BYTES_MAX` bytes fits one body: each is the name and at most 256 bytes of JSON
/// beside it (a session, seq, wait, mode). Batches of campaigns with long values are split.
const _: () = assert!(BATCH_CALL_OPS_MAX * (LOCK_NAME_BYTES_MAX + 256) <= HTTP_BODY_BYTES_MAX);
/// HTTP API connections served at once by one node; further accepted connections wait (in the
/// handshake channel, then the kernel's backlog) until one closes. An HTTP/1.1 connection
/// carries one request at a time, so this also bounds the HTTP requests in flight, long-polls
/// (at most `ACQUIRE_POLL_MS_MAX` each) included: each costs a task and its buffers.
pub const HTTP_CONNECTIONS_MAX: usize = 1_024;
const _: () = assert!(HTTP_CONNECTIONS_MAX <= CLIENT_CONCURRENT_REQUESTS_MAX);
/// An HTTP API connection on which nothing was read or written for this long is closed, so that
/// idle keep-alive connections (or a client that stops mid-request) do not hold the
/// `HTTP_CONNECTIONS_MAX` slots forever. Longer than a long-poll, which reads and writes nothing
/// while it waits.
pub const HTTP_IDLE_TIMEOUT_MS: u64 = ACQUIRE_POLL_MS_MAX + 20_000;
const _: () = assert!(HTTP_IDLE_TIMEOUT_MS > ACQUIRE_POLL_MS_MAX + 5_000);
/// How long a follower waits for its leader to answer an HTTP request it forwarded (issue #33,
/// `api/http/forward.rs`): connecting, sending, and the whole answer. The longest answer is a
/// long-poll's (`ACQUIRE_POLL_MS_MAX`); a few seconds more for the round trips. Within the
/// caller's own connection's idle bound, so the caller gets the follower's answer (the
/// follower's own `not-leader` when the leader does not answer in time).
pub const HTTP_FORWARD_TIMEOUT_MS: u64 = ACQUIRE_POLL_MS_MAX + 5_000;
const _: () = assert!(HTTP_FORWARD_TIMEOUT_MS < HTTP_IDLE_TIMEOUT_MS);
/// Bytes of a leader's answer to a forwarded HTTP request, head and body: the largest is a
/// list of up to `LIST_RESULTS_MAX` locks with their first waiters; one larger than this
/// is not relayed (the caller gets the follower's own `not-leader`: ask the leader).
pub const HTTP_FORWARD_RESPONSE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// A `POST /v1/batch` answer (issue #35) a follower relays fits: its one keepalive (the names
/// of `CONTENDED_NAMES_PER_ANSWER_MAX` contended locks, each at most twice its bytes once
/// escaped, and `KEEPALIVE_SESSIONS_MAX` leases of `REVOKED_GRANTS_PER_SESSION_MAX` tokens of
/// at most 21 characters) and `BATCH_CALL_OPS_MAX` other results, each at most a refused
/// acquire's holder (its owner, election value and name, at most six bytes per byte escaped)
/// or an error quoting a name, with a kilobyte of fields. Else an answer of operations that
/// applied would not be relayed.
const _: () = assert!(
    CONTENDED_NAMES_PER_ANSWER_MAX * (2 * LOCK_NAME_BYTES_MAX + 4)
        + KEEPALIVE_SESSIONS_MAX * (256 + REVOKED_GRANTS_PER_SESSION_MAX * 21)
        + BATCH_CALL_OPS_MAX
            * (6 * (OWNER_BYTES_MAX + ELECTION_VALUE_BYTES_MAX + LOCK_NAME_BYTES_MAX) + 1024)
        <= HTTP_FORWARD_RESPONSE_BYTES_MAX
);
/// Members whose HTTP address one member remembers for its cluster status (issue #33): more
/// than any cluster runs; beyond, a new member's is not shown until a restart.
pub const HTTP_ADDRS_KNOWN_MAX: usize = 1_024;
/// Origins an operator may list with `--http-allow-origin` (issue #31 item 3): web pages of
/// other origins allowed to write to the HTTP API and read its answers (CORS). Each request
/// with an `Origin` header is compared with every one. A page or two of the operator's own
/// (a dashboard, a reverse proxy's name) is the use; a list longer than this looks like an
/// attempt to allow everyone, which the flag does not offer (no wildcard).
pub const HTTP_ALLOW_ORIGINS_MAX: usize = 16;
/// Bytes of an origin (`scheme://host:port`) as `--http-allow-origin` takes it: the longest
/// `https://`, host name (253) and port.
pub const HTTP_ORIGIN_BYTES_MAX: usize = "https://".len() + HOST_PORT_BYTES_MAX;
/// Seconds a browser may keep the node's answer to a listed origin's CORS preflight (its
/// `Access-Control-Max-Age`): a page then asks once per this long, not before every write;
/// an origin removed from the list (a restart) is still answered from that cache this long.
pub const HTTP_CORS_MAX_AGE_S: u64 = 600;
/// Bytes of a refused request's header (its `Origin`, its `Content-Type`) that the error
/// message quotes: enough to recognise it; the header itself may be far longer.
pub const HTTP_QUOTED_HEADER_BYTES_MAX: usize = 128;
/// Accepted connections whose first bytes or TLS handshake are being read at once (issue #13).
/// Each costs a task and a few KiB of handshake buffers; a flood of connections that never speak
/// waits in the kernel's accept backlog instead of growing the server's memory.
pub const CONN_HANDSHAKES_IN_FLIGHT_MAX: usize = 1_024;
/// Time a new connection gets to send its first bytes and finish its TLS handshake before it is
/// dropped: well above a client's connect timeout, so that a slow but live client still gets in,
/// while a connection that never speaks holds its handshake slot only this long.
pub const CONN_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
const _: () = assert!(CONN_HANDSHAKE_TIMEOUT_MS > CLIENT_CONNECT_TIMEOUT_MS_DEFAULT);
/// Time the server keeps reading from a connection it has told "wrong protocol" (plaintext to a
/// TLS port, TLS to a plaintext one) before closing it: closing with unread bytes sends a TCP
/// reset, which can destroy the explanation before the client reads it.
pub const CONN_MISMATCH_LINGER_MS: u64 = 1_000;
/// How often a server looks at the modification times of the files it reloads without a restart
/// (SIGHUP reloads at once): the TLS certificate, key and CA, and the access-control list (its
/// file, or the `serve --config` file holding it). A few `stat` calls every few seconds cost
/// nothing; a renewed certificate, a new CA or a changed list is in force within this time of
/// its file changing.
pub const RELOAD_POLL_MS: u64 = 5_000;
/// Bytes a certificate, key or CA file may have. A chain of a few certificates is a few KiB; the
/// bound keeps a wrong path (a log file, a device) from being read into memory whole.
pub const TLS_PEM_FILE_BYTES_MAX: u64 = 1024 * 1024;

// ---- health (issue #14) ----

/// `/readyz` says not ready while this member has applied more than this many entries fewer
/// than it knows committed: a member catching up (after a restart, a snapshot install, a long
/// pause) would serve reads from a table that far behind and answer writes late. A few
/// thousand entries are applied in well under a second, so a healthy member never trips it.
pub const READY_APPLY_LAG_MAX: u64 = 1_000;
/// How often the gRPC health service re-reads this member's readiness. A probe sees a change
/// at most this late; each check is one read of the Raft metrics and the table's sizes.
pub const HEALTH_REPORT_INTERVAL_MS: u64 = 500;
/// Sessions one identity may hold at once when the access-control list gives it no
/// `max_sessions` (issue #13 item 4). A process needs one session (the client library batches
/// keepalives and shares a session between locks); a few hundred covers a fleet of workers
/// behind one identity, while a tenth of one percent of `SESSIONS_MAX` leaves the rest of the
/// cluster room when one client runs away.
pub const IDENTITY_SESSIONS_DEFAULT: usize = 100;
/// Acquire requests one identity may have queued at once when the access-control list gives it
/// no `max_waiting`. Enough for every one of its default sessions to wait for several locks,
/// small enough that one identity cannot fill the queues (`WAITERS_PER_LOCK_MAX` per lock) or
/// the node's long-poll slots (`WAITING_ACQUIRES_MAX`) on its own.
pub const IDENTITY_WAITING_DEFAULT: usize = 1_000;
/// Lock-delays (asked for, held or running: `IdentityUsage::delays`) one identity may have
/// when the access-control list gives it no `max_delays`: a sixteenth of `DELAYS_MAX`, so
/// that one tenant's delays (which outlive its sessions) cannot take every other tenant's.
pub const IDENTITY_DELAYS_DEFAULT: usize = 1_024;
const _: () = assert!(IDENTITY_DELAYS_DEFAULT <= DELAYS_MAX);
const _: () = assert!(IDENTITY_SESSIONS_DEFAULT <= SESSIONS_MAX);
const _: () = assert!(IDENTITY_WAITING_DEFAULT <= WAITING_ACQUIRES_MAX);
/// Bytes an access-control file (`--acl`) may have: a hundred thousand identities' hashes and
/// roles fit; the bound keeps a wrong path from being read into memory whole.
pub const ACL_FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;
/// Bytes a `serve --config` file may have: its keys are the serve flags, a few dozen lines even
/// with every comment of the sample; the bound keeps a wrong path (a log, a device) from being
/// read into memory whole.
pub const CONFIG_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// Bytes of a bearer token in a request's `authorization` header. Tokens are random strings of a
/// few dozen bytes; the bound caps the hashing work a hostile header can ask for (tonic already
/// caps the whole header block).
pub const AUTH_TOKEN_BYTES_MAX: usize = 4_096;
/// Log lines about refused clients (a TLS handshake without an acceptable certificate, an
/// unknown token or identity, a denied permission, a quota) a member may write in a burst. Every
/// refusal is counted (`latchkey_auth_refused_total{reason}`); the log is for the operator to
/// see who and from where, and the first few lines of a misconfigured client say that. Beyond
/// the burst, lines are refilled at `REFUSAL_LOG_REFILL_MS`, and the next line written says
/// how many were left out, by reason: a flood of refusals costs the log at most one line per
/// refill and the member a fixed few bytes of state (one bucket, one count per reason), never a
/// map that grows with the addresses an attacker can use.
pub const REFUSAL_LOG_BURST: u32 = 10;
/// One refusal log line comes back to the bucket every this many milliseconds (at most 3,600
/// lines an hour, about half a MiB, under a sustained flood).
pub const REFUSAL_LOG_REFILL_MS: u64 = 1_000;
/// Bytes of a refusal's explanation a log line carries: enough for the identity, permission
/// and lock of a denial; a lock name in a request may be far longer (up to the message bound),
/// and a flood must not write megabytes per line.
pub const REFUSAL_LOG_DETAIL_BYTES_MAX: usize = 256;
const _: () = assert!(REFUSAL_LOG_BURST >= 1 && REFUSAL_LOG_REFILL_MS >= 1);

/// Locks whose queue lengths `/metrics` shows (`latchkey_queue_length{lock=...}`): the longest
/// few are what an operator looks for (a stuck holder, a herd); one series per lock would make
/// the scrape as large as the table.
pub const METRICS_LONGEST_QUEUES: usize = 5;

// ---- owner descriptions and the audit log (issue #14 items 6 and 7) ----

/// Bytes of a session owner's host name: a DNS name is at most 253 bytes.
pub const OWNER_HOST_BYTES_MAX: usize = 255;
/// Bytes of a session owner's user name: login names are short (32 on Linux by default).
pub const OWNER_USER_BYTES_MAX: usize = 64;
/// Bytes of a session owner's free text (`--owner`): a line for a human ("deploy of web-3 by
/// CI job 4411"), not a document; every session stores it, every `status` returns it.
pub const OWNER_TEXT_BYTES_MAX: usize = 256;
/// All the bytes of one owner description.
pub const OWNER_BYTES_MAX: usize =
    OWNER_HOST_BYTES_MAX + OWNER_USER_BYTES_MAX + OWNER_TEXT_BYTES_MAX;
/// A `describe` answer lists every holder and waiter with its owner: both must fit a message.
const _: () =
    assert!(HOLDERS_PER_LOCK_MAX * (OWNER_BYTES_MAX + 64) <= CLIENT_MESSAGE_BYTES_MAX / 2);
/// A `describe` answer lists every waiter with its owner: the full queue must fit a message.
const _: () =
    assert!(WAITERS_PER_LOCK_MAX * (OWNER_BYTES_MAX + 64) <= CLIENT_MESSAGE_BYTES_MAX / 2);
/// Bytes of an election's value (issue #32: `campaign`, `proclaim`): a leader's address or a
/// short description (etcd's election values are addresses in practice), not a configuration
/// store. Every grant's and proclaim's watch event carries it, and the watch buffer keeps
/// `WATCH_EVENTS_KEPT` events: at this size the buffer stays a few megabytes at worst.
pub const ELECTION_VALUE_BYTES_MAX: usize = 1024;
const _: () = assert!(WATCH_EVENTS_KEPT * ELECTION_VALUE_BYTES_MAX <= 16 * 1024 * 1024);
/// A `describe` answer carries one value (the exclusive holder's) beside its holders.
const _: () = assert!(
    ELECTION_VALUE_BYTES_MAX + HOLDERS_PER_LOCK_MAX * (OWNER_BYTES_MAX + 64)
        <= CLIENT_MESSAGE_BYTES_MAX / 2
);
/// Waiters shown per lock in a `list` answer (the queue's head, the longest waiting); the count
/// says how many there are. A list of `LIST_RESULTS_MAX` locks with whole queues would be
/// gigabytes.
pub const LIST_WAITERS_SHOWN_MAX: usize = 4;
/// Bytes of lock entries in one `List` answer, counted as it is built (names, owner
/// descriptions, a fixed allowance per lock and waiter): the answer is cut there (`truncated`)
/// rather than exceed the message limit when holders carry long owner descriptions.
pub const LIST_RESPONSE_BYTES_MAX: usize = CLIENT_MESSAGE_BYTES_MAX / 2;
/// Records the audit log keeps; the oldest is dropped first. Force-releases and revocations are
/// rare incident actions: a thousand covers months of them, and the whole log (each record at
/// most a reason, two actor strings and a lock name) fits one `Audit` answer.
pub const AUDIT_RECORDS_MAX: usize = 1_000;
/// Bytes of an administrative action's reason: a sentence or a ticket link.
pub const AUDIT_REASON_BYTES_MAX: usize = 1_024;
/// Bytes of each actor string of an audit record (the identity, the operator's claimed name).
pub const AUDIT_ACTOR_BYTES_MAX: usize = 256;
/// The most the audit log can hold: kept outside the table's byte budget (an operator's
/// force-release must work in a full table), so bounded here on its own.
pub const AUDIT_BYTES_MAX: usize = AUDIT_RECORDS_MAX
    * (AUDIT_REASON_BYTES_MAX + 2 * AUDIT_ACTOR_BYTES_MAX + LOCK_NAME_BYTES_MAX + 64);
const _: () = assert!(AUDIT_BYTES_MAX <= CLIENT_MESSAGE_BYTES_MAX / 2);
/// Force-released grants a session remembers, newest kept, so that its client's next
/// keepalive learns which of its locks were taken (the tokens travel in the answer). A client
/// renews every TTL/3; more force-releases of one session's locks between two renewals drop
/// the oldest, and the session then reports every grant up to the highest dropped token as
/// possibly lost (`revoked_through`), which is safe.
pub const REVOKED_GRANTS_PER_SESSION_MAX: usize = 64;
const _: () = assert!(
    KEEPALIVE_SESSIONS_MAX * (REVOKED_GRANTS_PER_SESSION_MAX + 4) * 10 <= CLIENT_MESSAGE_BYTES_MAX
);
/// Bytes of one chunk of a `Backup` stream (`latchkey snapshot save`): the encoded table is
/// sent in chunks of this size, never as one message, so a table of any size fits the client
/// message limit; a megabyte keeps the per-message overhead negligible.
pub const BACKUP_CHUNK_BYTES: usize = 1024 * 1024;
const _: () = assert!(2 * BACKUP_CHUNK_BYTES <= CLIENT_MESSAGE_BYTES_MAX);
/// Bytes of an encoded table a backup may hold, which the client buffers and `snapshot
/// restore` reads whole: a bound on what a client takes from a server (or a file) on trust.
/// `SESSIONS_MAX` keeps a table in the tens of megabytes; ten times the peer message limit
/// leaves room for long names and owner descriptions and still refuses a length field gone
/// wild before allocating it.
pub const BACKUP_TABLE_BYTES_MAX: u64 = 10 * PEER_MESSAGE_BYTES_MAX as u64;
/// Deadline of one `Backup` call (the whole stream), in milliseconds, instead of the client's
/// usual RPC timeout: a table of tens of megabytes is encoded and sent in one call.
pub const BACKUP_CALL_TIMEOUT_MS: u64 = 120_000;
const _: () = assert!(BACKUP_TABLE_BYTES_MAX >= PEER_MESSAGE_BYTES_MAX as u64);
/// Watch events (`latchkey watch`) one member keeps in memory, newest last, so that a watcher
/// that reconnects (to this member or, after a failover, to another) resumes where it stopped.
/// At a few thousand changes a second this covers the seconds a failover takes; older events
/// are gone, and a watcher asking for them is told so (a `Missed` notice), never skipped
/// silently. Bytes: at most this × (`LOCK_NAME_BYTES_MAX` + 64), under 6 MB.
pub const WATCH_EVENTS_KEPT: usize = 10_000;
/// Applied entries queued for the live watchers of one member (a broadcast channel). A watcher
/// that falls further behind re-reads from the kept events, so this only has to absorb a
/// burst; it is at most `WATCH_EVENTS_KEPT` so that catching up from them is possible.
pub const WATCH_CHANNEL_CAPACITY: usize = 1_024;
const _: () = assert!(WATCH_CHANNEL_CAPACITY <= WATCH_EVENTS_KEPT);
/// Watch streams one member serves at once (each is a task and a channel receiver); more are
/// refused with RESOURCE_EXHAUSTED.
pub const WATCHERS_MAX: usize = 1_000;
/// A watch stream with nothing to send says how far it got this often (a `Progress` message,
/// in milliseconds), so that its client can resume from there and can tell a quiet stream
/// from a dead member.
pub const WATCH_PROGRESS_MS: u64 = 2_000;
/// A client's watch that hears nothing for this long (milliseconds) takes its member for dead
/// and resumes on another: a few progress intervals, so one late message is not a failover.
pub const CLIENT_WATCH_SILENCE_MS: u64 = 4 * WATCH_PROGRESS_MS;
/// A watch stream on a member that has heard from no leader of its group for this many of the
/// group's longest failovers (its heartbeat plus three maximum election timeouts, as in
/// `LEADERLESS_MS_MAX_DEFAULT`), 3.8 s with the default timing, ends with UNAVAILABLE at its
/// next quiet moment (every `WATCH_PROGRESS_MS`), and its client resumes on another member.
/// Such a member was removed from the group (Raft never tells it so) or is cut off from the
/// rest: it applies nothing new, and its progress messages would tell the watcher that nothing
/// changed while the group went on.
/// Two, so that an ordinary election, at most one failover long, ends no watch.
pub const WATCH_OUT_OF_TOUCH_FAILOVERS: u32 = 2;
/// Items a watch of a cluster of several Raft groups holds, read from its groups' streams and
/// not yet taken by `Watch::next`: per group, so that one busy group's stream waits (and its
/// member keeps its events) rather than the client buffering without bound; a few, since the
/// reader takes them one at a time anyway.
pub const CLIENT_WATCH_GROUP_ITEMS_QUEUED_MAX: usize = 16;
const _: () = assert!(CLIENT_WATCH_SILENCE_MS >= 2 * WATCH_PROGRESS_MS);

// --- Groups (issue #16) -------------------------------------------------------------------

/// Raft groups one cluster may run (`serve --groups`). Every group is a Raft instance on every
/// member, with its own log directory, lease task and heartbeats to each follower (a heartbeat
/// per group per follower every `HEARTBEAT_MS_DEFAULT`), so the count multiplies the idle cost
/// of a member; 64 groups led by 3 to 5 members is several groups per core even on large
/// machines, past which a group's throughput, not their number, is what to grow. A session id
/// is `index * groups + group` (`groups.rs`), which leaves 58 bits of log index.
pub const GROUPS_MAX: u32 = 64;
/// The fewest replicas a group may be placed on (`serve --replicas R`, issue #16): one that
/// loses a member must keep a majority, so three. (0, the default, puts every group on every
/// member.) The most is the founding member count.
pub const REPLICAS_MIN: u32 = 3;
/// The largest log index whose session id fits beside the group in a u64
/// (`GroupShape::session_id`): over 2^58, more than a group writes in centuries at a million
/// entries a second.
pub const LOG_INDEX_MAX_WITH_GROUPS: u64 = u64::MAX / GROUPS_MAX as u64 - 1;
/// Member addresses whose peer channel the groups of a member share (`peer::SharedChannels`):
/// one per member, and a few stale ones of members that moved. A cluster has at most tens of
/// members; past this the cache starts over (a redial, not an error).
pub const PEER_SHARED_CHANNELS_MAX: usize = 64;
/// Election timeouts (`--election-timeout-max-ms` each) a member of a new cluster of several
/// groups waits for a group's founder (`node::founder_of`) to make the group known before it
/// initializes the group itself: long enough for the founder's first election and append to
/// reach every member that is up, so that the leaders spread as planned; short enough that a
/// group whose founder is down has a leader a few seconds after the others.
pub const FOUNDING_WAIT_ELECTIONS: u64 = 4;
/// Default of `ServerConfig::rebalance_after_ms` (`serve --rebalance-after-ms`): how long a
/// group's preferred leader must have been caught up and answering before its group is
/// handed back to it. Ten seconds: a member that restarts and catches up stays up a while
/// before it takes leaderships (a member that flaps does not pull groups back and forth), and
/// the leaders spread again within seconds of a return. Each transfer is one election: the new
/// leader resumes every lease of the group at a full TTL, as after any failover.
pub const REBALANCE_AFTER_MS_DEFAULT: u64 = 10_000;
/// How often (ms) a group's leader checks whether to hand the group to its preferred member.
pub const REBALANCE_CHECK_MS: u64 = 1_000;
/// How far (entries) the preferred member's log may trail the leader's for it to count as
/// caught up: a member under load never matches the leader's last entry at the instant of a
/// check; openraft's transfer then waits for it to flush the leader's last entry before it
/// campaigns, and a few dozen entries flush within milliseconds.
pub const REBALANCE_LAG_ENTRIES_MAX: u64 = 64;
const _: () = assert!(REBALANCE_CHECK_MS <= REBALANCE_AFTER_MS_DEFAULT);
/// How long (ms) a client's keepalive batch gathers in a cluster of several groups before it
/// goes out (`client/src/keepalive.rs`): the group sessions of one logical session are due at
/// the same instant but wake on any worker within a timer tick (1 ms), and one request per
/// member needs them in one batch. A renewal is due a third of a TTL (at least a second)
/// before its deadline, so 2 ms costs it nothing.
pub const KEEPALIVE_GATHER_MS: u64 = 2;
