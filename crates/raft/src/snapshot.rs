//! The snapshot file: what a snapshot is on disk and on the wire (the same bytes).
//!
//! Format: one format-version byte, a CRC-32 (little endian) of the body, then the body in
//! postcard: the last applied log id, the last membership, and the lock table as encoded by
//! `latchkey_core::codec::encode_table` (itself versioned). The checksum catches a damaged file
//! or transfer that postcard alone might decode into a wrong but well-formed table.
//!
//! Only the latest snapshot is kept, at `<snapshot_dir>/snapshot.bin`. It is replaced atomically:
//! write a temporary file, fsync it, rename it over, fsync the directory. A crash at any point
//! leaves either the old or the new snapshot, never a mix.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use latchkey_core::codec::{decode_table, encode_table, DecodeError};
use latchkey_core::versioned::{self, VersionedError};
use latchkey_core::LockTable;
use serde::{Deserialize, Serialize};

use crate::{LogId, StoredMembership};

/// Version of the snapshot file format written by this build.
pub const SNAPSHOT_FILE_FORMAT_VERSION: u8 = 1;
/// Name of the current snapshot inside the snapshot directory.
pub const SNAPSHOT_FILE_NAME: &str = "snapshot.bin";
/// Version byte and checksum.
const HEADER_BYTES: usize = 1 + 4;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotDecodeError {
    #[error("snapshot is shorter than its header")]
    Truncated,
    #[error("snapshot file format version {0} is not supported (this build reads {SNAPSHOT_FILE_FORMAT_VERSION})")]
    UnknownVersion(u8),
    #[error("snapshot checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("snapshot header is corrupt: {0}")]
    Corrupt(#[from] postcard::Error),
    #[error("snapshot table: {0}")]
    Table(#[from] DecodeError),
    #[error("snapshot table was applied up to {table} but the snapshot claims {claimed:?}")]
    IndexMismatch { table: u64, claimed: Option<u64> },
}

impl From<VersionedError> for SnapshotDecodeError {
    fn from(e: VersionedError) -> SnapshotDecodeError {
        match e {
            VersionedError::Empty => SnapshotDecodeError::Truncated,
            VersionedError::UnknownVersion { found, .. } => {
                SnapshotDecodeError::UnknownVersion(found)
            }
            VersionedError::Corrupt(e) => SnapshotDecodeError::Corrupt(e),
        }
    }
}

/// A decoded snapshot.
#[derive(Debug)]
pub struct SnapshotContents {
    pub last_applied: Option<LogId>,
    pub last_membership: StoredMembership,
    pub table: LockTable,
}

#[derive(Serialize, Deserialize)]
struct Body {
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    /// `encode_table` output.
    table: Vec<u8>,
}

pub fn encode(
    last_applied: &Option<LogId>,
    last_membership: &StoredMembership,
    table: &LockTable,
) -> Vec<u8> {
    let body = Body {
        last_applied: *last_applied,
        last_membership: last_membership.clone(),
        table: encode_table(table),
    };
    let body = postcard::to_stdvec(&body).expect("serializing to memory cannot fail");
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.push(SNAPSHOT_FILE_FORMAT_VERSION);
    out.extend_from_slice(&crc32(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

pub fn decode(bytes: &[u8]) -> Result<SnapshotContents, SnapshotDecodeError> {
    if bytes.len() < HEADER_BYTES {
        return Err(SnapshotDecodeError::Truncated);
    }
    // The version byte is checked like every versioned encoding's; the checksum sits between
    // it and the postcard body, so the rest is read here.
    let after_version = versioned::strip_version(SNAPSHOT_FILE_FORMAT_VERSION, bytes)?;
    let (checksum, body) = after_version.split_at(HEADER_BYTES - 1);
    let stored = u32::from_le_bytes(checksum.try_into().expect("four bytes"));
    let computed = crc32(body);
    if stored != computed {
        return Err(SnapshotDecodeError::Checksum { stored, computed });
    }
    let body: Body = postcard::from_bytes(body)?;
    let table = decode_table(&body.table)?;
    // Normal entries are a subset of all entries, so the table can only lag the log id.
    let claimed = body.last_applied.as_ref().map(|l| l.index);
    if table.last_index() > claimed.unwrap_or(0) {
        return Err(SnapshotDecodeError::IndexMismatch {
            table: table.last_index(),
            claimed,
        });
    }
    Ok(SnapshotContents {
        last_applied: body.last_applied,
        last_membership: body.last_membership,
        table,
    })
}

pub fn snapshot_path(dir: &Path) -> PathBuf {
    dir.join(SNAPSHOT_FILE_NAME)
}

/// Replaces the snapshot in `dir` with `bytes`, atomically and durably (through
/// `<snapshot_dir>/snapshot.bin.tmp`).
pub fn write_atomically(dir: &Path, bytes: &[u8]) -> io::Result<()> {
    latchkey_log_store::write_durably(dir, SNAPSHOT_FILE_NAME, bytes)
}

/// Reads the snapshot in `dir`, if there is one.
pub fn read(dir: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::read(snapshot_path(dir)) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// CRC-32 (IEEE 802.3, as in zlib).
fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_zlib_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn every_flipped_byte_is_rejected() {
        let bytes = encode(&None, &StoredMembership::default(), &LockTable::new());
        assert!(decode(&bytes).is_ok());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "flipped byte {i} was accepted");
        }
        assert!(matches!(
            decode(&bytes[..3]),
            Err(SnapshotDecodeError::Truncated)
        ));
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
    }

    /// Hostile input (issue #13): a snapshot file arrives from a peer or the disk. Its checksum
    /// stops random damage, so the body is mutated and the checksum rewritten to match, which
    /// reaches the decoders behind it: the result is contents whose table passes every
    /// invariant, or an error; never a panic.
    mod hostile_input {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

            #[test]
            fn a_mutated_body_with_a_matching_checksum_decodes_or_is_refused(
                edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
                cut in any::<usize>(),
            ) {
                let mut bytes = encode(&None, &StoredMembership::default(), &LockTable::new());
                let mut body = bytes.split_off(HEADER_BYTES);
                for (at, v) in edits {
                    if body.is_empty() {
                        body.push(v);
                    } else {
                        let at = at % body.len();
                        body[at] = v;
                    }
                }
                body.truncate(cut % (body.len() + 1));
                bytes.truncate(1);
                bytes.extend_from_slice(&crc32(&body).to_le_bytes());
                bytes.extend_from_slice(&body);
                if let Ok(contents) = decode(&bytes) {
                    prop_assert!(contents.table.check_invariants().is_ok());
                }
            }

            #[test]
            fn noise_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                prop_assert!(decode(&bytes).is_err());
            }
        }
    }
}
