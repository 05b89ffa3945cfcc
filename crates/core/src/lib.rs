//! The latchkey lock table: a pure, deterministic state machine.
//!
//! Layout:
//! - [`types`]: commands the leader proposes, outcomes the table returns, read-only views.
//! - [`table`]: [`LockTable`], whose `apply` is the whole state machine, plus queries: mutexes,
//!   read-write locks, counting semaphores and elections (issue #32; `docs/primitives.md`).
//! - [`codec`]: the versioned byte encoding of snapshots.
//! - [`versioned`]: the framing every versioned encoding shares (format byte + postcard).
//! - [`limits`]: every bound in the system, with the reason for its value.
//! - [`groups`]: which Raft group a lock name and a session id belong to (issue #16).
//! - [`watch`]: the events `latchkey watch` streams, derived from an applied entry (pure).
//!
//! Nothing here does I/O, reads a clock or draws a random number: the leader stamps time and
//! randomness into each [`Command`], so every member applies the same entries to the same result.
//! Fencing tokens are log indexes, which is why they increase across failovers and restarts.

pub mod codec;
pub mod groups;
pub mod limits;
pub mod table;
pub mod types;
pub mod versioned;
pub mod watch;

pub use groups::{group_of, group_of_session, GroupShape};
pub use table::{
    validate_name, validate_stored_name, validate_ttl_ms, validate_value, ContendedBudget, LockTable,
    TablePlant,
};
pub use types::*;
pub use watch::{watch_events, WatchEvent, WatchKind};

/// What a latchkey TLS port answers a plaintext HTTP/2 client, as its GOAWAY's debug data; the
/// client library recognises it and fails at once with this advice instead of retrying.
pub const TLS_REQUIRED_MESSAGE: &str = "latchkey: this server speaks TLS: use https:// and --ca";
