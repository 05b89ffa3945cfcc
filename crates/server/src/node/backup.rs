//! Backup and restore (`latchkey snapshot save` / `latchkey snapshot restore`).
//!
//! The backup file (written by the CLI from a `Backup` stream, see `ops.rs` `backup`):
//!
//! ```text
//! "latchkey-backup\n"                       16 bytes, so `file` and a human can tell it
//! format version byte, postcard BackupHeader   (core `versioned` framing)
//! the table                                 core `codec::encode_table` output (itself versioned)
//! SHA-256 of everything before it           32 bytes: a damaged or truncated file is refused
//! ```
//!
//! The header records the last applied index, the source cluster's members and fingerprint,
//! and the table's length and SHA-256 as the leader computed them (checked end to end).
//!
//! A cluster of several Raft groups (issue #16) is saved as format version 2: the version byte,
//! a postcard list of one `BackupHeader` per group (in group order), then every group's table
//! in that order, then the SHA-256 of everything before it. A cluster of one group is still
//! saved as version 1, which builds before groups read.
//!
//! Restore seeds a new member's data dir so that `latchkey serve` starts from the table as if
//! it had installed a snapshot: the state machine's snapshot file holds the table at a log id
//! whose index is the backup's applied index, with the new cluster's member list as its
//! membership, and the log store records that log id as purged, so openraft starts with an
//! empty log after it. New entries then get higher indexes, and tokens (log indexes) keep
//! increasing across the restore. Every member of the new cluster is restored from the same
//! file: they start with identical logs and elect a leader as any cluster does. A file of G
//! groups seeds G groups (group 0 in the data dir, group g in `group-g/`, as `serve --groups G`
//! keeps them), each table held to its group (its locks' names hash to it), and the new
//! cluster must be started with the same `--groups`: the seeded dirs record it.
//!
//! Save: the leader confirms its leadership (a linearizable read), then encodes the table and
//! the applied index under one read lock of the state machine (`ops.rs` `backup`); nothing of
//! a backup goes through the log. With several groups the client backs up each group at its
//! leader (`BackupRequest.group`). Restore: the seeded log id is (term 0, the lowest member id,
//! the applied index), the same on every member restored with the same list, and the first
//! election's term 1 puts every new entry above it. `LockTable::restart_leases` lifts every
//! lease mark before the table is written, so every restored session gets a full TTL from the
//! new cluster's start (the old cluster's clock means nothing there). The new cluster's record
//! is the one a founder's first start writes (`node::founder_record`). Restore refuses a data
//! dir that holds anything, and until every group is seeded the dir holds
//! `restore-unfinished` (`node::data_dir::RESTORE_MARKER`), which a start refuses
//! (`StartError::RestoreUnfinished`): it could otherwise found a missing group empty.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use latchkey_core::codec::{decode_table, DecodeError};
use latchkey_core::versioned::{self, VersionedError};
use latchkey_core::{limits, GroupShape, LockTable};
use latchkey_log_store::LogStore;
use latchkey_raft::{LogId, Membership, StoredMembership, TypeConfig};
use openraft::storage::RaftLogStorage;
use openraft::vote::RaftLeaderId;
use openraft::{BasicNode, RaftTypeConfig};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::node;

/// The first bytes of every backup file.
pub const BACKUP_MAGIC: &[u8; 16] = b"latchkey-backup\n";
/// Version of the backup file format written by this build.
pub const BACKUP_FILE_FORMAT_VERSION: u8 = 1;
/// Version of the backup file format of a cluster of several Raft groups.
pub const BACKUP_GROUPS_FILE_FORMAT_VERSION: u8 = 2;
const CHECKSUM_BYTES: usize = 32;

/// What a backup came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupHeader {
    /// The last log index applied to the table: every fencing token issued is at most this.
    pub applied_index: u64,
    /// The source cluster's members (`ID=ADDR,...`) and fingerprint.
    pub members: String,
    pub fingerprint: String,
    pub table_bytes: u64,
    pub table_sha256: [u8; 32],
}

#[derive(Debug, thiserror::Error)]
pub enum BackupFileError {
    #[error("not a latchkey backup file (it does not start with the backup header)")]
    NotABackup,
    #[error("backup file is damaged or truncated: its checksum does not match its contents")]
    Checksum,
    #[error("backup file format version {found} is not supported (this build reads {expected})")]
    UnknownVersion { found: u8, expected: u8 },
    #[error("backup file header is corrupt: {0}")]
    Header(String),
    #[error("backup file holds {found} bytes of table, its header says {expected}")]
    Length { found: u64, expected: u64 },
    #[error("backup table is {bytes} bytes, over the limit of {max}")]
    TooLarge { bytes: u64, max: u64 },
    #[error("backup table does not match the SHA-256 the leader computed")]
    TableChecksum,
    #[error("backup table: {0}")]
    Table(#[from] DecodeError),
    #[error("backup file holds {found} Raft groups; a cluster has 1 to {max}", max = limits::GROUPS_MAX)]
    Groups { found: usize },
    #[error("backup table of Raft group {group} of {groups}: {reason}")]
    WrongGroup {
        group: u32,
        groups: u32,
        reason: String,
    },
}

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The byte ranges of the chunks a table of `len` bytes is streamed in: consecutive, each at
/// most `chunk` bytes, covering it all; one empty range for an empty table (the header still
/// needs a message to ride in).
pub fn chunk_ranges(len: usize, chunk: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    assert!(chunk > 0, "a chunk holds at least one byte");
    let count = len.div_ceil(chunk).max(1);
    (0..count).map(move |i| i * chunk..((i + 1) * chunk).min(len))
}

/// The whole file for `header` and `table` (checked against the header first).
pub fn encode_file(header: &BackupHeader, table: &[u8]) -> Result<Vec<u8>, BackupFileError> {
    encode_groups_file(&[(header.clone(), table)])
}

/// The whole file for one (header, table) per Raft group, in group order (each checked against
/// its header first): format version 1 for one group, 2 for several.
pub fn encode_groups_file(groups: &[(BackupHeader, &[u8])]) -> Result<Vec<u8>, BackupFileError> {
    check_group_count(groups.len())?;
    for (header, table) in groups {
        check_table(header, table)?;
    }
    let mut out = BACKUP_MAGIC.to_vec();
    let header = match groups {
        [(header, _)] => versioned::encode(BACKUP_FILE_FORMAT_VERSION, header),
        _ => {
            let headers: Vec<&BackupHeader> = groups.iter().map(|(h, _)| h).collect();
            versioned::encode(BACKUP_GROUPS_FILE_FORMAT_VERSION, &headers)
        }
    };
    out.extend(header.map_err(|e| BackupFileError::Header(e.to_string()))?);
    for (_, table) in groups {
        out.extend_from_slice(table);
    }
    let sum = sha256(&out);
    out.extend_from_slice(&sum);
    Ok(out)
}

fn check_group_count(found: usize) -> Result<(), BackupFileError> {
    if found == 0 || found > limits::GROUPS_MAX as usize {
        return Err(BackupFileError::Groups { found });
    }
    Ok(())
}

fn check_table(header: &BackupHeader, table: &[u8]) -> Result<(), BackupFileError> {
    let found = table.len() as u64;
    if found > limits::BACKUP_TABLE_BYTES_MAX {
        return Err(BackupFileError::TooLarge {
            bytes: found,
            max: limits::BACKUP_TABLE_BYTES_MAX,
        });
    }
    if found != header.table_bytes {
        return Err(BackupFileError::Length {
            found,
            expected: header.table_bytes,
        });
    }
    if sha256(table) != header.table_sha256 {
        return Err(BackupFileError::TableChecksum);
    }
    Ok(())
}

/// Reads a backup file's bytes: one header and decoded table (whose invariants hold) per Raft
/// group, in group order; each table is held to its group (`GroupShape`) when there are several.
pub fn decode_file(bytes: &[u8]) -> Result<Vec<(BackupHeader, LockTable)>, BackupFileError> {
    let Some(rest) = bytes.strip_prefix(BACKUP_MAGIC.as_slice()) else {
        return Err(BackupFileError::NotABackup);
    };
    if rest.len() < CHECKSUM_BYTES {
        return Err(BackupFileError::Checksum);
    }
    let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
    if sha256(body) != sum {
        return Err(BackupFileError::Checksum);
    }
    let after_magic = &body[BACKUP_MAGIC.len()..];
    let header_error = |e: VersionedError| match e {
        VersionedError::UnknownVersion { found, .. } => BackupFileError::UnknownVersion {
            found,
            expected: BACKUP_GROUPS_FILE_FORMAT_VERSION,
        },
        e => BackupFileError::Header(e.to_string()),
    };
    let (headers, mut tables): (Vec<BackupHeader>, _) = match after_magic.first() {
        Some(&BACKUP_GROUPS_FILE_FORMAT_VERSION) => {
            versioned::decode(BACKUP_GROUPS_FILE_FORMAT_VERSION, after_magic)
                .map_err(header_error)?
        }
        _ => {
            let (header, rest) =
                versioned::decode(BACKUP_FILE_FORMAT_VERSION, after_magic).map_err(header_error)?;
            (vec![header], rest)
        }
    };
    check_group_count(headers.len())?;
    let groups = headers.len() as u32;
    let mut out = Vec::with_capacity(headers.len());
    for (group, header) in (0..).zip(headers) {
        // Each length was bounded by `check_table`'s limit only after it is cut: bound it first.
        let len = usize::try_from(header.table_bytes)
            .ok()
            .filter(|&len| len <= tables.len())
            .ok_or(BackupFileError::Length {
                found: tables.len() as u64,
                expected: header.table_bytes,
            })?;
        let (table, rest) = tables.split_at(len);
        tables = rest;
        check_table(&header, table)?;
        let mut table = decode_table(table)?;
        if groups > 1 {
            let shape = GroupShape::new(group, groups).expect("the group count was checked");
            table.set_shape(shape);
            table
                .check_invariants()
                .map_err(|reason| BackupFileError::WrongGroup {
                    group,
                    groups,
                    reason,
                })?;
        }
        out.push((header, table));
    }
    if !tables.is_empty() {
        return Err(BackupFileError::Length {
            found: out.iter().map(|(h, _)| h.table_bytes).sum::<u64>() + tables.len() as u64,
            expected: out.iter().map(|(h, _)| h.table_bytes).sum(),
        });
    }
    Ok(out)
}

/// Writes `bytes` to `path` atomically and durably (temp file, fsync, rename, fsync the dir).
pub fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    latchkey_log_store::write_durably(dir, &name.to_string_lossy(), bytes)
}

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("data dir {0} is not empty: restore seeds a new member's data dir only")]
    DataDirNotEmpty(PathBuf),
    // The path only: the cause is the `source`, which an error chain prints after it (it was
    // said twice: "F: backup file is damaged ...: backup file is damaged ...").
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}")]
    File {
        path: PathBuf,
        source: BackupFileError,
    },
    #[error("log store: {0}")]
    LogStore(String),
    #[error("this node's id {id} is not in the member list {members}")]
    NotAMember { id: u64, members: String },
    #[error("{0}")]
    Replicas(latchkey_core::groups::BadReplicas),
}

/// What a restore wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub header: BackupHeader,
    /// The index the new member's log starts after (the table's snapshot index): the highest
    /// of the groups seeded here (0 if none: a member outside every group).
    pub index: u64,
    /// The Raft groups seeded; the new cluster is started with `--groups` this.
    pub groups: u32,
    /// Replicas per group (0: every member); the new cluster is started with `--replicas`
    /// this.
    pub replicas: u32,
    /// The sessions and locks of the groups seeded on this member (with replica subsets, only
    /// the groups it replicates).
    pub sessions: usize,
    pub locks: usize,
}

/// Seeds the empty (or missing) `data_dir` of member `id` of a new cluster of `members` from
/// the backup file at `file`, with `replicas` replicas per group (`serve --replicas`; 0: every
/// member): a group is seeded only on its replicas (`replicas_of`), with them as its voters,
/// and a member outside it starts it empty, as a founding member outside a group does.
/// Refuses a data dir that holds anything, and a replica count the member list cannot have.
pub async fn restore(
    file: &Path,
    data_dir: &Path,
    id: u64,
    members: &BTreeMap<u64, String>,
    replicas: u32,
) -> Result<Restored, RestoreError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RestoreError::Io { path, source }
    };
    let members_text = node::members_text(members);
    if !members.contains_key(&id) {
        return Err(RestoreError::NotAMember {
            id,
            members: members_text,
        });
    }
    // Checked with the group count once the file is read, before anything is written.
    latchkey_core::groups::check_replica_count(replicas).map_err(RestoreError::Replicas)?;
    match std::fs::read_dir(data_dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(RestoreError::DataDirNotEmpty(data_dir.to_path_buf()));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(data_dir)(e)),
    }
    let bytes = std::fs::read(file).map_err(io(file))?;
    let images = decode_file(&bytes).map_err(|source| RestoreError::File {
        path: file.to_path_buf(),
        source,
    })?;
    drop(bytes);
    let groups = images.len() as u32;
    latchkey_core::groups::check_replicas(replicas, members.len(), groups)
        .map_err(RestoreError::Replicas)?;
    // Until every group is seeded, a start refuses the dir (it could found a missing group
    // empty, its locks gone and its tokens restarted low).
    latchkey_log_store::create_dir_durably(data_dir).map_err(io(data_dir))?;
    latchkey_log_store::write_durably(data_dir, node::data_dir::RESTORE_MARKER, b"")
        .map_err(io(data_dir))?;
    // Every dir belongs to the new cluster, as if this member had founded it with `members`.
    let record = node::founder_record(id, members, groups, replicas);
    // The dir was empty, so there is nothing to migrate and no group has a log of its own: the
    // groups' shared log, opened as a start opens it.
    let mut logs = node::open_member_logs(data_dir, groups)
        .map_err(|e| RestoreError::LogStore(e.to_string()))?;
    let mut restored: Option<Restored> = None;
    for ((group, (header, table)), log) in (0..).zip(images).zip(&mut logs) {
        // Where `serve --groups` keeps group `group` (`ServerConfig::for_group`).
        let dir = crate::config::group_data_dir(data_dir, group);
        let voters: BTreeMap<u64, String> =
            latchkey_core::groups::replicas_of(group, members.keys().copied(), replicas)
                .into_iter()
                .map(|v| (v, members[&v].clone()))
                .collect();
        // A member outside the group has nothing of it to seed; the others count its table.
        let (index, sessions, locks) = if voters.contains_key(&id) {
            seed_group(&dir, log, table, &header, &voters, &record).await?
        } else {
            (0, 0, 0)
        };
        let r = restored.get_or_insert(Restored {
            header,
            index,
            groups,
            replicas,
            sessions: 0,
            locks: 0,
        });
        r.index = r.index.max(index);
        r.sessions += sessions;
        r.locks += locks;
    }
    // The purges were only queued: the restore is done once they are durable (an error here
    // fails the restore, which the marker then still says).
    for log in &logs {
        log.sync()
            .await
            .map_err(|e| RestoreError::LogStore(e.to_string()))?;
    }
    drop(logs);
    let marker = data_dir.join(node::data_dir::RESTORE_MARKER);
    std::fs::remove_file(&marker).map_err(io(&marker))?;
    // The removal is durable before the restore says it is done.
    std::fs::File::open(data_dir)
        .and_then(|d| d.sync_all())
        .map_err(io(data_dir))?;
    Ok(restored.expect("a backup file holds at least one group"))
}

/// Seeds `dir` with one group's table: its snapshot file (with `voters` as its membership), a
/// `log` that starts after it, and the data dir's `record` (`node::founder_record`). Answers the
/// index the log starts after, and the table's sessions and locks.
async fn seed_group(
    dir: &Path,
    log: &mut LogStore<TypeConfig>,
    mut table: LockTable,
    header: &BackupHeader,
    voters: &BTreeMap<u64, String>,
    record: &str,
) -> Result<(u64, usize, usize), RestoreError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RestoreError::Io { path, source }
    };
    // A new cluster counts every lease from its own start (see `LockTable::restart_leases`).
    table.restart_leases();
    // The table's own index is at most the applied index (blank and membership entries apply
    // no command); the larger keeps every later token above every earlier one.
    let index = header.applied_index.max(table.last_index());
    // Term 0: the new cluster's first election is term 1, so its first entry's log id (term 1,
    // index + 1) is above this one, as openraft requires of a log. The node in it is the
    // lowest voter id, so that every member restored with the same list has the same log id
    // (members that disagree on the log id at one index break openraft's assertions).
    let first = *voters.keys().next().expect("id is a voter");
    let leader = <TypeConfig as RaftTypeConfig>::LeaderId::new(0, first).to_committed();
    let log_id = LogId::new(leader, index);
    let nodes: BTreeMap<u64, BasicNode> = voters
        .iter()
        .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
        .collect();
    let membership = StoredMembership::new(Some(log_id), Membership::from(nodes));

    let snapshots = dir.join(node::data_dir::SNAPSHOT_DIR);
    latchkey_log_store::create_dir_durably(&snapshots).map_err(io(&snapshots))?;
    let snapshot = latchkey_raft::snapshot::encode(
        &Some(log_id),
        &membership,
        // A new cluster: no member was ever removed from it.
        &Default::default(),
        &table,
    );
    latchkey_raft::snapshot::write_atomically(&snapshots, &snapshot).map_err(io(&snapshots))?;

    // The log starts after the snapshot: openraft reads (purged, last] as empty. (The purge is
    // queued to the writer; `restore` waits until it is durable before the marker goes.)
    log.purge(log_id)
        .await
        .map_err(|e| RestoreError::LogStore(e.to_string()))?;
    log.write_meta(node::data_dir::META_CLUSTER, record.as_bytes())
        .map_err(|e| RestoreError::LogStore(e.to_string()))?;
    latchkey_log_store::write_durably(dir, node::data_dir::CLUSTER_FILE, record.as_bytes())
        .map_err(io(dir))?;
    Ok((index, table.sessions().count(), table.lock_count()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Vec<u8> {
        let table = latchkey_core::codec::encode_table(&LockTable::new());
        let header = BackupHeader {
            applied_index: 7,
            members: "1=127.0.0.1:1".into(),
            fingerprint: "ab".into(),
            table_bytes: table.len() as u64,
            table_sha256: sha256(&table),
        };
        encode_file(&header, &table).unwrap()
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // one range is the answer, not a range of items
    fn chunks_cover_the_table_in_order_within_the_chunk_size() {
        assert_eq!(chunk_ranges(0, 4).collect::<Vec<_>>(), [0..0]);
        assert_eq!(chunk_ranges(4, 4).collect::<Vec<_>>(), [0..4]);
        assert_eq!(chunk_ranges(10, 4).collect::<Vec<_>>(), [0..4, 4..8, 8..10]);
    }

    #[test]
    fn a_file_round_trips() {
        let [(header, table)]: [_; 1] = decode_file(&file()).unwrap().try_into().unwrap();
        assert_eq!(header.applied_index, 7);
        assert_eq!(table.last_index(), 0);
    }

    /// Group `group` of `groups`' table holding one lock of that group, and its encoding.
    fn group_table(group: u32, groups: u32) -> (BackupHeader, Vec<u8>) {
        use latchkey_core::{Command, Op, SessionKey};
        let mut t = LockTable::new();
        t.set_shape(GroupShape::new(group, groups).unwrap());
        let created = t.apply(
            5,
            &Command {
                now_ms: 0,
                op: Op::CreateSession {
                    ttl_ms: limits::SESSION_TTL_MS_DEFAULT,
                    secret: 9,
                },
            },
        );
        let id = match created.outcome {
            latchkey_core::Outcome::SessionCreated { id, .. } => id,
            o => panic!("{o:?}"),
        };
        let name = (0..)
            .map(|i| format!("l{i}"))
            .find(|n| latchkey_core::group_of(n, groups) == group)
            .unwrap();
        let acquire = Command {
            now_ms: 0,
            op: Op::Acquire {
                session: SessionKey { id, secret: 9 },
                seq: 1,
                name,
                wait_ms: 0,
            },
        };
        let granted = t.apply(6, &acquire).outcome;
        assert!(
            matches!(granted, latchkey_core::Outcome::Granted { .. }),
            "{granted:?}"
        );
        let table = latchkey_core::codec::encode_table(&t);
        let header = BackupHeader {
            applied_index: 6,
            members: "1=127.0.0.1:1".into(),
            fingerprint: format!("group-{group}"),
            table_bytes: table.len() as u64,
            table_sha256: sha256(&table),
        };
        (header, table)
    }

    /// A file of two groups round-trips, each table held to its group; a file whose group 1
    /// holds group 0's table is refused; every flipped byte and truncation is refused.
    #[test]
    fn a_file_of_two_groups_round_trips_and_holds_each_table_to_its_group() {
        let parts = [group_table(0, 2), group_table(1, 2)];
        let borrowed: Vec<(BackupHeader, &[u8])> = parts
            .iter()
            .map(|(h, t)| (h.clone(), t.as_slice()))
            .collect();
        let bytes = encode_groups_file(&borrowed).unwrap();
        assert_eq!(bytes[BACKUP_MAGIC.len()], BACKUP_GROUPS_FILE_FORMAT_VERSION);
        let decoded = decode_file(&bytes).unwrap();
        assert_eq!(decoded.len(), 2);
        for (g, (header, table)) in decoded.iter().enumerate() {
            assert_eq!(header.fingerprint, format!("group-{g}"));
            assert_eq!(table.shape(), GroupShape::new(g as u32, 2).unwrap());
            assert_eq!(table.lock_count(), 1);
        }
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(decode_file(&bad).is_err(), "flipped byte {i} was accepted");
            assert!(
                decode_file(&bytes[..i]).is_err(),
                "truncation to {i} was accepted"
            );
        }

        // Group 0's table saved as group 1's (its session and its lock are group 0's).
        let wrong = [group_table(0, 2), group_table(0, 2)];
        let borrowed: Vec<(BackupHeader, &[u8])> = wrong
            .iter()
            .map(|(h, t)| (h.clone(), t.as_slice()))
            .collect();
        match decode_file(&encode_groups_file(&borrowed).unwrap()) {
            Err(BackupFileError::WrongGroup {
                group: 1,
                groups: 2,
                ..
            }) => {}
            other => panic!("{:?}", other.map(|v| v.len())),
        }
        assert!(matches!(
            encode_groups_file(&[]),
            Err(BackupFileError::Groups { found: 0 })
        ));

        // Files whose checksum is right but whose lengths lie: a header claiming more table
        // than follows, bytes after the last table, no group, more groups than a cluster has.
        let craft = |headers: &[BackupHeader], tables: &[u8]| {
            let mut out = BACKUP_MAGIC.to_vec();
            out.extend(versioned::encode(BACKUP_GROUPS_FILE_FORMAT_VERSION, &headers).unwrap());
            out.extend_from_slice(tables);
            let sum = sha256(&out);
            out.extend_from_slice(&sum);
            out
        };
        let headers: Vec<BackupHeader> = parts.iter().map(|(h, _)| h.clone()).collect();
        let tables: Vec<u8> = parts.iter().flat_map(|(_, t)| t.clone()).collect();
        assert_eq!(decode_file(&craft(&headers, &tables)).unwrap().len(), 2);
        let mut long = headers.clone();
        long[1].table_bytes += 1;
        assert!(matches!(
            decode_file(&craft(&long, &tables)),
            Err(BackupFileError::Length { .. })
        ));
        let mut trailing = tables.clone();
        trailing.push(0);
        assert!(matches!(
            decode_file(&craft(&headers, &trailing)),
            Err(BackupFileError::Length { .. })
        ));
        long[1].table_bytes = u64::MAX;
        assert!(matches!(
            decode_file(&craft(&long, &tables)),
            Err(BackupFileError::Length { .. })
        ));
        assert!(matches!(
            decode_file(&craft(&[], &[])),
            Err(BackupFileError::Groups { found: 0 })
        ));
        let many = vec![headers[0].clone(); limits::GROUPS_MAX as usize + 1];
        assert!(matches!(
            decode_file(&craft(&many, &[])),
            Err(BackupFileError::Groups { .. })
        ));
    }

    /// A restore of two groups seeds group 0 in the dir and group 1 in `group-1/`, each with
    /// the group count in its record and no unfinished-restore marker left; a dir that still
    /// has the marker (a restore that stopped part way) is refused at start.
    #[tokio::test]
    async fn a_restore_of_two_groups_seeds_both_and_a_half_restored_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let parts = [group_table(0, 2), group_table(1, 2)];
        let borrowed: Vec<(BackupHeader, &[u8])> = parts
            .iter()
            .map(|(h, t)| (h.clone(), t.as_slice()))
            .collect();
        let file = tmp.path().join("b.backup");
        std::fs::write(&file, encode_groups_file(&borrowed).unwrap()).unwrap();
        let data = tmp.path().join("data");
        let members: BTreeMap<u64, String> = [(1, "127.0.0.1:7420".to_owned())].into();
        let restored = restore(&file, &data, 1, &members, 0).await.unwrap();
        assert_eq!(
            (restored.groups, restored.locks, restored.sessions),
            (2, 2, 2)
        );
        for dir in [data.clone(), data.join("group-1")] {
            let record = std::fs::read_to_string(dir.join(node::data_dir::CLUSTER_FILE)).unwrap();
            assert!(record.contains("groups=2"), "{}: {record}", dir.display());
            assert!(
                dir.join(node::data_dir::SNAPSHOT_DIR).is_dir(),
                "{}",
                dir.display()
            );
        }
        assert!(!data.join(node::data_dir::RESTORE_MARKER).exists());

        let mut config =
            crate::config::ServerConfig::single(1, "127.0.0.1:7420".parse().unwrap(), data.clone());
        config.groups = 2;
        std::fs::write(data.join(node::data_dir::RESTORE_MARKER), b"").unwrap();
        match node::Node::open_log_stores(&config) {
            Err(node::StartError::RestoreUnfinished { .. }) => {}
            other => panic!("{:?}", other.map(|_| "opened")),
        }
        std::fs::remove_file(data.join(node::data_dir::RESTORE_MARKER)).unwrap();
        assert!(node::Node::open_log_stores(&config).is_ok());
    }

    #[test]
    fn every_flipped_byte_and_every_truncation_is_refused() {
        let bytes = file();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(decode_file(&bad).is_err(), "flipped byte {i} was accepted");
            assert!(
                decode_file(&bytes[..i]).is_err(),
                "truncation to {i} was accepted"
            );
        }
    }
}
