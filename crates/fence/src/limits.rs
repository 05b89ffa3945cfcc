//! Every bound in the fence crate, with the reason for its value.

/// A lock name is at most this many bytes of UTF-8: the same bound as the lock service
/// (`latchkey_core::limits::LOCK_NAME_BYTES_MAX`), so any name the service grants can be fenced.
/// Not imported from the core crate so that a resource does not depend on it.
pub const LOCK_NAME_BYTES_MAX: usize = 512;

/// Lock names one gate tracks by default. A gate never forgets a name (forgetting it would let a
/// stale holder of that lock back in), so the bound is what keeps memory finite: at most a few
/// hundred bytes per name, tens of megabytes in all. A resource fenced by more locks than this
/// should use the conditional update, which keeps the token next to the data.
pub const GATE_LOCKS_DEFAULT: usize = 65_536;
/// Upper bound on a configured `locks_max`; beyond it replay on open and compaction get slow
/// (the durable log is read whole into memory) and the conditional update is the better tool.
pub const GATE_LOCKS_MAX: usize = 1_000_000;
const _: () = assert!(GATE_LOCKS_DEFAULT <= GATE_LOCKS_MAX);

/// Bytes of one durable-log record: length (4) + checksum (4) + token (8) + name. A crash can
/// tear at most the last record, so this is also the largest torn tail replay will discard.
pub const LOG_RECORD_BYTES_MAX: usize = 4 + 4 + 8 + LOCK_NAME_BYTES_MAX;
/// The durable log is compacted once it is larger than this many times the bytes of its live
/// records (one per lock name). 4x bounds the disk use while keeping compaction rare: one
/// rewrite per three log's worth of grants.
pub const LOG_COMPACT_RATIO: u64 = 4;
/// ... and larger than this: below 1 MiB rewriting the file costs more than the space it saves.
pub const LOG_COMPACT_BYTES_MIN_DEFAULT: u64 = 1024 * 1024;

/// Bytes of an idempotency key: room for a UUID or a `tenant/operation/id` path, small enough
/// that a full store stays in the megabytes.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 256;
/// Results an idempotency store remembers by default. Retries of a key older than the last
/// this-many keys run again, so this must cover the retry window of the callers.
pub const IDEMPOTENCY_KEYS_DEFAULT: usize = 100_000;
/// Upper bound on a configured idempotency capacity (memory: keys plus results).
pub const IDEMPOTENCY_KEYS_MAX: usize = 10_000_000;
const _: () = assert!(IDEMPOTENCY_KEYS_DEFAULT <= IDEMPOTENCY_KEYS_MAX);
