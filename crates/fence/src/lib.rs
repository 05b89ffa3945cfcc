//! Fencing at the resource: the last line of defence against a lock holder that paused past its
//! lease and resumed believing it still holds the lock.
//!
//! A latchkey grant carries a fencing token that increases with every grant of a lock. The
//! resource remembers the highest token it has seen per lock and refuses anything lower; only the
//! resource can do this check, because a pause can happen after any check the holder makes.
//!
//! Layout:
//! - [`gate`]: the [`FenceGate`] trait, its errors, and the per-lock admission logic shared by
//!   the two gates.
//!   - [`memory`]: [`MemoryGate`], in memory, for a resource whose data dies with the process.
//!   - [`durable`]: [`DurableGate`], the highest token per lock kept in an fsynced append-only
//!     log, for a resource whose data survives a restart.
//! - [`sql`]: the conditional-update recipe for a database (SQL text for SQLite and PostgreSQL,
//!   and how to read a "no row updated" answer).
//! - [`idempotency`]: [`IdempotencyStore`], the fallback for resources that cannot check tokens.
//! - [`header`]: names of the HTTP headers and environment variables that carry a token.
//! - [`limits`]: every bound in this crate, with its reason.
//!
//! This crate has no network or async dependency on purpose: it is embedded in the resource.
//! A whole fenced service over HTTP is an example, not part of the library:
//! `examples/fenced_kv/` (`cargo run -p latchkey-fence --example fenced_kv`).

pub mod durable;
pub mod gate;
pub mod header;
pub mod idempotency;
pub mod limits;
pub mod memory;
pub mod sql;

mod crc;

pub use durable::{DurableConfig, DurableGate, StorageError};
pub use gate::{validate_lock_name, Admitted, FenceError, FenceGate, LockNameError, Rejected};
pub use header::{
    format_token, parse_token, TokenParseError, HIGHEST_HEADER, LOCK_ENV, LOCK_HEADER, TOKEN_ENV,
    TOKEN_HEADER,
};
pub use idempotency::{IdempotencyError, IdempotencyStore, Outcome};
pub use memory::MemoryGate;
