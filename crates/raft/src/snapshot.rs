//! The snapshot file: what a snapshot is on disk and on the wire (the same bytes).
//!
//! Format: one format-version byte, a CRC-32 (little endian) of the body, then the body in
//! postcard: the last applied log id, the last membership, the lock table as encoded by
//! `latchkey_core::codec::encode_table` (itself versioned), and (since version 2, issue #31)
//! the group's [`RemovedMembers`]. The checksum catches a damaged file or transfer that
//! postcard alone might decode into a wrong but well-formed table.
//!
//! Version 1 (no removed members) is still read, as an empty record: a member upgraded from it
//! knows of the removals in the log after its snapshot only. A release before version 2 cannot
//! read a version 2 file (nor install such a snapshot from a peer).
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

use crate::{LogId, RemovedMembers, StoredMembership};

/// Version of the snapshot file format written by this build. 2: the body ends with the
/// group's removed members. Version 1 is read too ([`SNAPSHOT_FILE_FORMAT_V1`]).
pub const SNAPSHOT_FILE_FORMAT_VERSION: u8 = 2;
/// The first format: no removed members.
pub const SNAPSHOT_FILE_FORMAT_V1: u8 = 1;
/// Name of the current snapshot inside the snapshot directory.
pub const SNAPSHOT_FILE_NAME: &str = "snapshot.bin";
/// Version byte and checksum.
const HEADER_BYTES: usize = 1 + 4;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotDecodeError {
    #[error("snapshot is shorter than its header")]
    Truncated,
    #[error("snapshot file format version {0} is not supported (this build reads {SNAPSHOT_FILE_FORMAT_V1} and {SNAPSHOT_FILE_FORMAT_VERSION})")]
    UnknownVersion(u8),
    #[error("snapshot checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("snapshot header is corrupt: {0}")]
    Corrupt(#[from] postcard::Error),
    #[error("snapshot table: {0}")]
    Table(#[from] DecodeError),
    #[error("snapshot table was applied up to {table} but the snapshot claims {claimed:?}")]
    IndexMismatch { table: u64, claimed: Option<u64> },
    #[error(
        "snapshot records {count} removed members, above the limit of {}",
        latchkey_core::limits::REMOVED_MEMBERS_MAX
    )]
    TooManyRemoved { count: usize },
    #[error("snapshot records member {id} removed at index {at}, after its own {claimed:?}")]
    RemovedAfter {
        id: u64,
        at: u64,
        claimed: Option<u64>,
    },
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
    /// Empty in a version 1 file.
    pub removed: RemovedMembers,
}

/// The body of version 2.
#[derive(Serialize, Deserialize)]
struct Body {
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    /// `encode_table` output.
    table: Vec<u8>,
    removed: RemovedMembers,
}

/// The body of version 1: version 2's without `removed`.
#[derive(Serialize, Deserialize)]
struct BodyV1 {
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    table: Vec<u8>,
}

pub fn encode(
    last_applied: &Option<LogId>,
    last_membership: &StoredMembership,
    removed: &RemovedMembers,
    table: &LockTable,
) -> Vec<u8> {
    let body = Body {
        last_applied: *last_applied,
        last_membership: last_membership.clone(),
        table: encode_table(table),
        removed: removed.clone(),
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
    let v1 = bytes[0] == SNAPSHOT_FILE_FORMAT_V1;
    let version = match v1 {
        true => SNAPSHOT_FILE_FORMAT_V1,
        false => SNAPSHOT_FILE_FORMAT_VERSION,
    };
    let after_version = versioned::strip_version(version, bytes)?;
    let (checksum, body) = after_version.split_at(HEADER_BYTES - 1);
    let stored = u32::from_le_bytes(checksum.try_into().expect("four bytes"));
    let computed = crc32(body);
    if stored != computed {
        return Err(SnapshotDecodeError::Checksum { stored, computed });
    }
    let body: Body = match v1 {
        true => {
            let v1: BodyV1 = postcard::from_bytes(body)?;
            Body {
                last_applied: v1.last_applied,
                last_membership: v1.last_membership,
                table: v1.table,
                removed: RemovedMembers::default(),
            }
        }
        false => postcard::from_bytes(body)?,
    };
    let table = decode_table(&body.table)?;
    // Normal entries are a subset of all entries, so the table can only lag the log id.
    let claimed = body.last_applied.as_ref().map(|l| l.index);
    if table.last_index() > claimed.unwrap_or(0) {
        return Err(SnapshotDecodeError::IndexMismatch {
            table: table.last_index(),
            claimed,
        });
    }
    // A snapshot may come from a peer: its record is held to the bound and to its own index.
    if body.removed.len() > latchkey_core::limits::REMOVED_MEMBERS_MAX {
        return Err(SnapshotDecodeError::TooManyRemoved {
            count: body.removed.len(),
        });
    }
    if let Some((id, at)) = body.removed.iter().find(|(_, at)| Some(*at) > claimed) {
        return Err(SnapshotDecodeError::RemovedAfter { id, at, claimed });
    }
    Ok(SnapshotContents {
        last_applied: body.last_applied,
        last_membership: body.last_membership,
        table,
        removed: body.removed,
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
        let bytes = encode(
            &None,
            &StoredMembership::default(),
            &RemovedMembers::default(),
            &LockTable::new(),
        );
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

    /// A snapshot may come from a peer: a record of removed members past the bound, or with a
    /// removal after the snapshot's own index, is refused.
    #[test]
    fn a_removed_members_record_past_its_bound_or_its_index_is_refused() {
        use crate::RemovedMembers;
        use latchkey_core::limits::REMOVED_MEMBERS_MAX;
        let at = |index| {
            use openraft::vote::RaftLeaderId;
            let leader = <crate::TypeConfig as openraft::RaftTypeConfig>::LeaderId::new(1, 1);
            Some(LogId::new(leader.to_committed(), index))
        };
        let membership = StoredMembership::default();
        let table = LockTable::new();
        let full = RemovedMembers::from_pairs((0..REMOVED_MEMBERS_MAX as u64).map(|i| (i, 5)));
        let contents = decode(&encode(&at(5), &membership, &full, &table)).unwrap();
        assert_eq!(contents.removed, full);
        let over = RemovedMembers::from_pairs((0..=REMOVED_MEMBERS_MAX as u64).map(|i| (i, 5)));
        assert!(matches!(
            decode(&encode(&at(5), &membership, &over, &table)),
            Err(SnapshotDecodeError::TooManyRemoved { .. })
        ));
        let later = RemovedMembers::from_pairs([(3, 6)]);
        assert!(matches!(
            decode(&encode(&at(5), &membership, &later, &table)),
            Err(SnapshotDecodeError::RemovedAfter { id: 3, at: 6, .. })
        ));
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
                let mut bytes = encode(&None, &StoredMembership::default(), &RemovedMembers::default(), &LockTable::new());
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
