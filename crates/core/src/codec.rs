//! Versioned encoding of the lock table for snapshots.
//!
//! Format: one version byte, then the table in postcard, then nothing. A reader refuses versions it does not
//! know rather than misreading them.

use crate::table::{DecodedTableV10, DecodedTableV7, DecodedTableV8, DecodedTableV9};
use crate::versioned::{self, VersionedError};
use crate::LockTable;

/// Version of the snapshot encoding written by this build.
/// 2: sessions record the order of their remembered outcomes (`Session::recorded`).
/// 4: each waiter carries the time its wait ends, and the table indexes waits by it.
/// 5: sessions no longer write the locks they hold (with tokens): decoding rebuilds them from the
///    locks' holders, so that each name is stored once in memory (issue #11).
/// 6: sessions carry their owner, the identity that created them under access control (issue
///    #13).
/// 7: sessions carry their owner description and force-released grants, waiters the time their
///    wait began, and the table its audit log (issue #14 items 6 and 7).
/// 8: the table carries the names used with several holders (read-write locks with readers,
///    semaphores; issue #32) after the audit log.
/// 9: the table carries elections' published values and queued campaigns' values after those
///    (issue #32), and sessions may remember a proclaim's answer.
/// 10: the table carries its lock-delays (asked for by held and queued acquires, and running;
///    issue #32 item 4) after those, and sessions may remember a lock-delay rejection.
/// 11: each remembered outcome, and each waiting request, carries the fingerprint of its
///    request (issue #35's attacker review, F2: a seq reused for another request is refused
///    `sequence-reused`, not answered with the first one's outcome).
///
/// A table whose sessions remember no fingerprint (`LockTable::fits_format_10`: one decoded
/// from an older snapshot, or whose sessions answered nothing since) is written in format 10,
/// one that uses nothing format 10 added either (`LockTable::fits_format_9`) in format
/// 9, one that uses nothing format 9 added either (`LockTable::fits_format_8`) in format 8, and
/// one that uses nothing format 8 added either (`LockTable::fits_format_7`) in format 7, byte
/// for byte what a build before each wrote, so that a member that reads only the older format
/// can still install it during a rolling upgrade; this build reads all five. A table whose
/// sessions answered a request since is format 11 only: a member of a build before it cannot
/// install that snapshot (it refuses the version, misreading nothing).
pub const SNAPSHOT_FORMAT_VERSION: u8 = 11;
/// The format before request fingerprints, still read, and still written for tables that fit
/// it.
pub const SNAPSHOT_FORMAT_VERSION_V10: u8 = 10;
/// The format before lock-delay, still read, and still written for tables that fit it.
pub const SNAPSHOT_FORMAT_VERSION_V9: u8 = 9;
/// The format before elections, still read, and still written for tables that fit it.
pub const SNAPSHOT_FORMAT_VERSION_V8: u8 = 8;
/// The format before issue #32, still read, and still written for tables that fit it.
pub const SNAPSHOT_FORMAT_VERSION_V7: u8 = 7;

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("snapshot is empty")]
    Empty,
    #[error(
        "snapshot format version {0} is not supported (this build reads \
         {SNAPSHOT_FORMAT_VERSION_V7} to {SNAPSHOT_FORMAT_VERSION})"
    )]
    UnknownVersion(u8),
    #[error("snapshot is corrupt: {0}")]
    Corrupt(#[from] postcard::Error),
    #[error("snapshot has {0} bytes after the table")]
    Trailing(usize),
    #[error("snapshot breaks an invariant: {0}")]
    Invalid(String),
}

impl From<VersionedError> for DecodeError {
    fn from(e: VersionedError) -> DecodeError {
        match e {
            VersionedError::Empty => DecodeError::Empty,
            VersionedError::UnknownVersion { found, .. } => DecodeError::UnknownVersion(found),
            VersionedError::Corrupt(e) => DecodeError::Corrupt(e),
        }
    }
}

pub fn encode_table(table: &LockTable) -> Vec<u8> {
    let bytes = if table.fits_format_7() {
        versioned::encode(SNAPSHOT_FORMAT_VERSION_V7, &table.as_format_7())
    } else if table.fits_format_8() {
        versioned::encode(SNAPSHOT_FORMAT_VERSION_V8, &table.as_format_8())
    } else if table.fits_format_9() {
        versioned::encode(SNAPSHOT_FORMAT_VERSION_V9, &table.as_format_9())
    } else if table.fits_format_10() {
        versioned::encode(SNAPSHOT_FORMAT_VERSION_V10, &table.as_format_10())
    } else {
        versioned::encode(SNAPSHOT_FORMAT_VERSION, table)
    };
    bytes.expect("serializing to memory cannot fail")
}

pub fn decode_table(bytes: &[u8]) -> Result<LockTable, DecodeError> {
    let (table, trailing): (LockTable, _) = match bytes.first() {
        Some(&SNAPSHOT_FORMAT_VERSION_V7) => {
            let (v7, trailing): (DecodedTableV7, _) =
                versioned::decode(SNAPSHOT_FORMAT_VERSION_V7, bytes)?;
            (LockTable::from(v7), trailing)
        }
        Some(&SNAPSHOT_FORMAT_VERSION_V8) => {
            let (v8, trailing): (DecodedTableV8, _) =
                versioned::decode(SNAPSHOT_FORMAT_VERSION_V8, bytes)?;
            (LockTable::from(v8), trailing)
        }
        Some(&SNAPSHOT_FORMAT_VERSION_V9) => {
            let (v9, trailing): (DecodedTableV9, _) =
                versioned::decode(SNAPSHOT_FORMAT_VERSION_V9, bytes)?;
            (LockTable::from(v9), trailing)
        }
        Some(&SNAPSHOT_FORMAT_VERSION_V10) => {
            let (v10, trailing): (DecodedTableV10, _) =
                versioned::decode(SNAPSHOT_FORMAT_VERSION_V10, bytes)?;
            (LockTable::from(v10), trailing)
        }
        _ => versioned::decode(SNAPSHOT_FORMAT_VERSION, bytes)?,
    };
    if !trailing.is_empty() {
        // Not what was written: a torn or concatenated file.
        return Err(DecodeError::Trailing(trailing.len()));
    }
    table.check_invariants().map_err(DecodeError::Invalid)?;
    Ok(table)
}
