//! A member's data dir: what it belongs to for life ([`DirRecord`]: a cluster, a member id, the
//! group and replica counts), checked against the flags in one function (`check_record`) before
//! the log is opened, so that a refused start ([`StartError`]) changes no byte of the dir; the
//! log directories (the member's one shared segment log, the migration from the redb log); and
//! who founds each group (`founder_of`, `placement`, `founder_record`).
//!
//! Knows nothing of a running [`Node`](super::Node): `Node::start` calls it.

use crate::cluster::member_addr::MemberAddr;
use crate::cluster::peer_auth::ClusterId;
use crate::config::ServerConfig;
use latchkey_log_store::{LogStore, LogStoreError, Migrated};
use latchkey_raft::TypeConfig;
use std::collections::BTreeMap;
use std::path::Path;

/// Log-store metadata key under which the cluster this data dir belongs to is recorded
/// ([`DirRecord`]).
pub(crate) const META_CLUSTER: &str = "cluster";
/// The same record as a file in the data dir, readable without opening the log.
pub(crate) const CLUSTER_FILE: &str = "cluster";
/// Written by `latchkey snapshot restore` into the data dir before it seeds anything, removed
/// once every group is seeded: a data dir that still has it was restored part way (a group
/// may be missing, and a start would found it empty), so a start refuses it.
pub(crate) const RESTORE_MARKER: &str = "restore-unfinished";
/// Where releases before membership changes recorded the member list the data dir was founded
/// with (log metadata key and file); such a dir belongs to `ClusterId::founded_by` that list.
pub(super) const META_MEMBERS_OLD: &str = "members";
pub(super) const MEMBERS_FILE_OLD: &str = "members";

/// What a data dir belongs to, for life: a cluster and a member id in it. Written when the
/// dir is first used (founding a cluster, or `--join`); the membership itself is in the log
/// and changes through it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DirRecord {
    pub(super) cluster: ClusterId,
    /// `None` in a dir from before membership changes, which did not record it.
    pub(super) member: Option<u64>,
    /// The dir was started with `--join`: it waits to be added and never founds a cluster.
    pub(super) joined: bool,
    /// The cluster's Raft groups (`--groups`, issue #16), fixed when it is founded; 1 in a dir
    /// from before groups, which does not record it.
    pub(super) groups: u32,
    /// Replicas per group (`--replicas`), fixed when it is founded; 0 (every member) in a dir
    /// that does not record it.
    pub(super) replicas: u32,
}

impl DirRecord {
    pub(super) fn encode(&self) -> String {
        let mut text = format!("cluster={}\n", self.cluster);
        if let Some(id) = self.member {
            text.push_str(&format!("member={id}\n"));
        }
        if self.joined {
            text.push_str("joined=true\n");
        }
        if self.groups != 1 {
            text.push_str(&format!("groups={}\n", self.groups));
        }
        if self.replicas != 0 {
            text.push_str(&format!("replicas={}\n", self.replicas));
        }
        text
    }

    pub(super) fn decode(text: &str) -> Result<DirRecord, String> {
        let mut cluster = None;
        let mut member = None;
        let mut joined = false;
        let mut groups = 1;
        let mut replicas = 0;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            match line.split_once('=') {
                Some(("cluster", v)) => cluster = Some(ClusterId::parse(v)?),
                Some(("member", v)) => {
                    member = Some(v.parse().map_err(|_| format!("bad member id {v:?}"))?)
                }
                Some(("joined", v)) => joined = v == "true",
                Some(("groups", v)) => {
                    groups = v
                        .parse()
                        .ok()
                        .filter(|g| latchkey_core::groups::check_groups(*g).is_ok())
                        .ok_or_else(|| format!("bad group count {v:?}"))?
                }
                Some(("replicas", v)) => {
                    replicas = v
                        .parse()
                        .ok()
                        .filter(|r| *r >= latchkey_core::limits::REPLICAS_MIN)
                        .ok_or_else(|| format!("bad replica count {v:?}"))?
                }
                _ => return Err(format!("unexpected line {line:?}")),
            }
        }
        Ok(DirRecord {
            cluster: cluster.ok_or("no cluster id")?,
            member,
            joined,
            groups,
            replicas,
        })
    }

    /// The record of a dir from before membership changes: its founding member list.
    pub(super) fn from_old_members(text: &str) -> Result<DirRecord, String> {
        let mut members = BTreeMap::new();
        for entry in text.trim().split(',') {
            let (id, addr) = entry
                .split_once('=')
                .ok_or_else(|| format!("bad member entry {entry:?}"))?;
            let id: u64 = id.parse().map_err(|_| format!("bad member id {id:?}"))?;
            members.insert(id, addr.to_owned());
        }
        Ok(DirRecord {
            cluster: ClusterId::founded_by(&members),
            member: None,
            joined: false,
            groups: 1,
            replicas: 0,
        })
    }
}

/// The cluster the flags name, if they name one: `--join ID`, or `--peers LIST` (the cluster
/// that list founds). Without either, a data dir's own record decides (a single node restarted
/// on another address keeps its cluster).
pub(super) fn named_cluster(config: &ServerConfig) -> Option<(ClusterId, &'static str)> {
    match &config.join {
        Some(id) => Some((id.clone(), "--join")),
        None if !config.peers.is_empty() => Some((ClusterId::founded_by(&config.peers), "--peers")),
        None => None,
    }
}
/// The log's segment directory inside the data dir.
pub(crate) const LOG_DIR: &str = "raft-log";
/// The log of a data dir from a build before the segment log (one redb file), migrated into
/// [`LOG_DIR`] on the first start (then renamed to `raft-log.redb.migrated` and kept).
pub(crate) const OLD_LOG_FILE: &str = "raft-log.redb";

/// Opens the log store of `data_dir`, first migrating a log of the previous (redb) build if the
/// dir has one and no segment directory yet.
pub(crate) fn open_log_dir(data_dir: &Path) -> Result<LogStore<TypeConfig>, LogStoreError> {
    migrate_log(data_dir)?;
    LogStore::<TypeConfig>::open(&data_dir.join(LOG_DIR))
}

pub(super) fn migrate_log(data_dir: &Path) -> Result<(), LogStoreError> {
    let old = data_dir.join(OLD_LOG_FILE);
    let new = data_dir.join(LOG_DIR);
    match latchkey_log_store::migrate_from_redb::<TypeConfig>(&old, &new)? {
        Migrated::Nothing => {}
        done => tracing::info!(?done, dir = %data_dir.display(), "migrated the Raft log from redb"),
    }
    Ok(())
}

/// Opens the Raft logs of a member's `groups` groups, one store per group in group order.
///
/// The groups share one log, group 0's (`<data-dir>/raft-log`), so that one writer commits
/// the appends of all of them with one `fdatasync` per batch (issue #16). A data dir of the
/// build before that keeps a log of its own in `group-N/raft-log` for each group N ≥ 1; such a
/// group keeps it (it is opened alone, as that build did), and nothing is moved.
pub(crate) fn open_member_logs(
    data_dir: &Path,
    groups: u32,
) -> Result<Vec<LogStore<TypeConfig>>, LogStoreError> {
    migrate_log(data_dir)?;
    let mut own = BTreeMap::new();
    let mut sharing = Vec::new();
    for group in 0..groups {
        let dir = crate::config::group_data_dir(data_dir, group);
        // An error reading the dir is not taken for "no log of its own": that could open the
        // group empty in the shared log beside the log it has.
        let has = |name: &str| {
            let path = dir.join(name);
            path.try_exists().map_err(|source| LogStoreError::Io {
                op: "look for",
                path,
                source,
            })
        };
        if group > 0 && (has(LOG_DIR)? || has(OLD_LOG_FILE)?) {
            own.insert(group, open_log_dir(&dir)?);
        } else {
            sharing.push(group);
        }
    }
    if !own.is_empty() {
        tracing::info!(
            groups = ?own.keys().collect::<Vec<_>>(),
            "these groups keep the Raft logs of their own that an older build made"
        );
    }
    let mut shared =
        LogStore::<TypeConfig>::open_groups(&data_dir.join(LOG_DIR), &sharing)?.into_iter();
    Ok((0..groups)
        .map(|group| {
            own.remove(&group)
                .unwrap_or_else(|| shared.next().expect("one shared store per sharing group"))
        })
        .collect())
}
/// The state machine's snapshot directory inside the data dir.
pub(crate) const SNAPSHOT_DIR: &str = "snapshots";

/// The record of a data dir that member `id` founds a cluster of `members` with (what
/// `latchkey snapshot restore` writes into the dirs it seeds, as a first start would).
pub(crate) fn founder_record(
    id: u64,
    members: &BTreeMap<u64, String>,
    groups: u32,
    replicas: u32,
) -> String {
    DirRecord {
        cluster: ClusterId::founded_by(members),
        member: Some(id),
        joined: false,
        groups,
        replicas,
    }
    .encode()
}

/// The member that founds group `group` of a new cluster of members `ids`: the (group mod
/// N)-th by id, so that N members lead about G/N groups each. Also the group's preferred
/// leader later, over its voters (`Node::rebalance_leadership`).
pub(crate) fn founder_of(group: u32, ids: impl IntoIterator<Item = u64>) -> u64 {
    let mut ids: Vec<u64> = ids.into_iter().collect();
    assert!(!ids.is_empty(), "a cluster has members");
    ids.sort_unstable();
    ids[group as usize % ids.len()]
}

/// The replicas group `group` is founded on with `config`'s `--replicas`, and their client
/// addresses (see `Node::placement`); empty without replica subsets or a founding list.
pub(super) fn placement(config: &ServerConfig, group: u32) -> Vec<(u64, String)> {
    if config.replicas == 0 || config.peers.is_empty() {
        return Vec::new();
    }
    latchkey_core::groups::replicas_of(group, config.peers.keys().copied(), config.replicas)
        .into_iter()
        .map(|id| {
            let addr = MemberAddr::split(&config.peers[&id]).client.to_owned();
            (id, addr)
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("data dir {dir}: {source}")]
    DataDir { dir: String, source: std::io::Error },
    #[error("log store: {0}")]
    LogStore(String),
    #[error("state machine: {0}")]
    StateMachine(String),
    #[error(
        "data dir {dir} belongs to cluster {recorded}, but {flag} names cluster {given}; refusing \
         to start (start it with the flags it was founded or joined with, or a fresh data dir)"
    )]
    ClusterMismatch {
        dir: String,
        recorded: ClusterId,
        flag: &'static str,
        given: ClusterId,
    },
    #[error(
        "data dir {dir} belongs to member {recorded}, but this node was started with --id {given}; \
         refusing to start"
    )]
    MemberMismatch {
        dir: String,
        recorded: u64,
        given: u64,
    },
    #[error(
        "data dir {dir} belongs to a cluster of {recorded} Raft groups, but this node was started \
         with --groups {given}; refusing to start (a cluster's group count is fixed when it is \
         founded)"
    )]
    GroupsMismatch {
        dir: String,
        recorded: u32,
        given: u32,
    },
    #[error(
        "data dir {dir} belongs to a cluster of {recorded} replicas per Raft group (0: every \
         member), but this node was started with --replicas {given}; refusing to start (a \
         cluster's placement is fixed when it is founded)"
    )]
    ReplicasMismatch {
        dir: String,
        recorded: u32,
        given: u32,
    },
    #[error("data dir {dir}: unreadable cluster record: {why}")]
    BadRecord { dir: String, why: String },
    #[error(
        "data dir {dir}: a `latchkey snapshot restore` into it did not finish; refusing to start \
         (remove the data dir and restore it again)"
    )]
    RestoreUnfinished { dir: String },
    #[error("raft: {0}")]
    Raft(String),
}

/// A data dir belongs to one cluster and one member id for life: a node started on it with
/// flags naming another would form a different cluster around the same log. The one
/// comparison of a dir's record (its `cluster` file, or the log's own record) with the flags.
pub(super) fn check_record(
    dir: &Path,
    recorded: &DirRecord,
    config: &ServerConfig,
) -> Result<(), StartError> {
    if let Some((given, flag)) = named_cluster(config) {
        if given != recorded.cluster {
            return Err(StartError::ClusterMismatch {
                dir: dir.display().to_string(),
                recorded: recorded.cluster.clone(),
                flag,
                given,
            });
        }
    }
    if recorded.groups != config.groups {
        return Err(StartError::GroupsMismatch {
            dir: dir.display().to_string(),
            recorded: recorded.groups,
            given: config.groups,
        });
    }
    if recorded.replicas != config.replicas {
        return Err(StartError::ReplicasMismatch {
            dir: dir.display().to_string(),
            recorded: recorded.replicas,
            given: config.replicas,
        });
    }
    match recorded.member {
        Some(member) if member != config.id => Err(StartError::MemberMismatch {
            dir: dir.display().to_string(),
            recorded: member,
            given: config.id,
        }),
        _ => Ok(()),
    }
}

pub(crate) fn members_text(members: &BTreeMap<u64, String>) -> String {
    members
        .iter()
        .map(|(id, addr)| format!("{id}={addr}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub(super) fn bad_record(dir: &Path) -> impl FnOnce(String) -> StartError + '_ {
    move |why| StartError::BadRecord {
        dir: dir.display().to_string(),
        why,
    }
}

/// The data dir's record as its files say (`cluster`, or the old `members`), if it has one.
pub(super) fn read_record_file(dir: &Path) -> Result<Option<DirRecord>, StartError> {
    let read = |name: &str| match std::fs::read_to_string(dir.join(name)) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(data_dir_error(dir)(e)),
    };
    if let Some(text) = read(CLUSTER_FILE)? {
        return DirRecord::decode(&text).map(Some).map_err(bad_record(dir));
    }
    match read(MEMBERS_FILE_OLD)? {
        Some(text) => DirRecord::from_old_members(&text)
            .map(Some)
            .map_err(bad_record(dir)),
        None => Ok(None),
    }
}

pub(super) fn data_dir_error(dir: &Path) -> impl FnOnce(std::io::Error) -> StartError + '_ {
    move |source| StartError::DataDir {
        dir: dir.display().to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data dir's group count and replica count are fixed when its cluster is founded: a
    /// start with either changed is refused before anything is opened.
    #[test]
    fn a_start_with_another_group_or_replica_count_is_refused() {
        let peers: BTreeMap<u64, String> = (1..=4).map(|i| (i, format!("h:{i}"))).collect();
        let mut config =
            ServerConfig::cluster(2, "127.0.0.1:1".parse().unwrap(), "unused".into(), peers);
        config.groups = 4;
        config.replicas = 3;
        let recorded = DirRecord {
            cluster: ClusterId::founded_by(&config.peers),
            member: Some(2),
            joined: false,
            groups: 4,
            replicas: 3,
        };
        let dir = Path::new("unused");
        assert!(check_record(dir, &recorded, &config).is_ok());
        let every = ServerConfig {
            replicas: 0,
            ..config.clone()
        };
        assert!(matches!(
            check_record(dir, &recorded, &every),
            Err(StartError::ReplicasMismatch {
                recorded: 3,
                given: 0,
                ..
            })
        ));
        let fewer = ServerConfig {
            groups: 2,
            ..config.clone()
        };
        assert!(matches!(
            check_record(dir, &recorded, &fewer),
            Err(StartError::GroupsMismatch { .. })
        ));
        // Member 2 founds group 1 and replicates groups 0, 1 and 3 (placement, founder first).
        let placed: Vec<Vec<u64>> = (0..4)
            .map(|g| {
                placement(&config, g)
                    .into_iter()
                    .map(|(id, _)| id)
                    .collect()
            })
            .collect();
        assert_eq!(
            placed,
            vec![vec![1, 2, 3], vec![2, 3, 4], vec![3, 4, 1], vec![4, 1, 2]]
        );
        assert!(
            placement(&every, 0).is_empty(),
            "every member: no placement"
        );
    }

    #[test]
    fn a_dir_record_round_trips_and_an_old_member_list_keeps_its_cluster() {
        let founders: BTreeMap<u64, String> = [(1, "h:1".to_owned()), (2, "h:2".to_owned())].into();
        let record = DirRecord {
            cluster: ClusterId::founded_by(&founders),
            member: Some(2),
            joined: true,
            groups: 1,
            replicas: 0,
        };
        assert_eq!(DirRecord::decode(&record.encode()), Ok(record.clone()));
        // A dir of a sharded cluster records its group count; one without the line has one.
        let sharded = DirRecord {
            groups: 8,
            ..record.clone()
        };
        assert!(sharded.encode().contains("groups=8\n"));
        assert_eq!(DirRecord::decode(&sharded.encode()), Ok(sharded));
        assert!(!record.encode().contains("groups"));
        // So does a cluster of replica subsets its replica count; one without the line has
        // every member in every group.
        let placed = DirRecord {
            groups: 6,
            replicas: 3,
            ..record.clone()
        };
        assert!(placed.encode().contains("replicas=3\n"));
        assert_eq!(DirRecord::decode(&placed.encode()), Ok(placed));
        assert!(!record.encode().contains("replicas"));
        for bad in ["0", "2", "x"] {
            let text = format!("cluster={}\nreplicas={bad}\n", record.cluster);
            assert!(DirRecord::decode(&text).is_err(), "{text}");
        }
        for bad in ["0", "65", "x"] {
            let text = format!("cluster={}\ngroups={bad}\n", record.cluster);
            assert!(DirRecord::decode(&text).is_err(), "{text}");
        }
        // A data dir of a release before membership changes recorded `1=h:1,2=h:2`: it keeps
        // the cluster (and so the peer fingerprint) it had.
        let old = DirRecord::from_old_members("1=h:1,2=h:2").unwrap();
        assert_eq!(old.cluster, record.cluster);
        assert_eq!((old.member, old.joined), (None, false));
        assert!(DirRecord::decode("cluster=xyz\n").is_err());
        assert!(DirRecord::decode("member=1\n").is_err());
    }

    /// A member's groups share group 0's log (one writer, one fsync per batch); a group that
    /// has a log of its own, made by the build before they shared one, keeps it.
    #[test]
    fn groups_share_one_log_except_those_an_older_build_gave_their_own() {
        let fresh = tempfile::tempdir().unwrap();
        {
            let logs = open_member_logs(fresh.path(), 3).unwrap();
            logs[2].write_meta("k", b"two").unwrap();
            logs[1].write_meta("k", b"one").unwrap();
            assert_eq!(logs[0].read_meta("k").unwrap(), None);
        }
        for g in 1..3 {
            assert!(!crate::config::group_data_dir(fresh.path(), g)
                .join(LOG_DIR)
                .exists());
        }
        let logs = open_member_logs(fresh.path(), 3).unwrap();
        assert_eq!(
            logs[2].read_meta("k").unwrap().as_deref(),
            Some(&b"two"[..])
        );
        assert_eq!(
            logs[1].read_meta("k").unwrap().as_deref(),
            Some(&b"one"[..])
        );
        drop(logs);

        // The older layout: group 1 with `group-1/raft-log`.
        let old = tempfile::tempdir().unwrap();
        let own = crate::config::group_data_dir(old.path(), 1).join(LOG_DIR);
        LogStore::<TypeConfig>::open(&own)
            .unwrap()
            .write_meta("k", b"old one")
            .unwrap();
        {
            let logs = open_member_logs(old.path(), 3).unwrap();
            assert_eq!(
                logs[1].read_meta("k").unwrap().as_deref(),
                Some(&b"old one"[..])
            );
            logs[2].write_meta("k", b"two").unwrap();
            logs[1].write_meta("k2", b"still own").unwrap();
        }
        let reread = LogStore::<TypeConfig>::open(&own).unwrap();
        assert_eq!(
            reread.read_meta("k2").unwrap().as_deref(),
            Some(&b"still own"[..])
        );
        drop(reread);
        let logs = open_member_logs(old.path(), 3).unwrap();
        assert_eq!(
            logs[2].read_meta("k").unwrap().as_deref(),
            Some(&b"two"[..])
        );
        assert!(!crate::config::group_data_dir(old.path(), 2)
            .join(LOG_DIR)
            .exists());
    }

    /// A data dir of a build before the segment log holds `raft-log.redb`: the first open moves
    /// its entries and keys into `raft-log/` and keeps the old file; a second open finds the
    /// segment log and migrates nothing.
    #[tokio::test]
    async fn a_data_dir_with_a_redb_log_is_migrated_once() {
        use latchkey_log_store::VALUE_FORMAT_VERSION;
        use openraft::entry::RaftEntry;
        use openraft::vote::RaftLeaderId;
        use openraft::{RaftLogReader, RaftTypeConfig};
        use redb::TableDefinition;

        let dir = tempfile::tempdir().unwrap();
        let log_id = |i| {
            latchkey_raft::LogId::new(
                <TypeConfig as RaftTypeConfig>::LeaderId::new(1, 1).to_committed(),
                i,
            )
        };
        {
            let db = redb::Database::create(dir.path().join(OLD_LOG_FILE)).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut log = txn
                    .open_table(TableDefinition::<u64, &[u8]>::new("raft_log"))
                    .unwrap();
                for i in 0..=3 {
                    let entry = latchkey_raft::Entry::new_blank(log_id(i));
                    let bytes =
                        latchkey_core::versioned::encode(VALUE_FORMAT_VERSION, &entry).unwrap();
                    log.insert(i, bytes.as_slice()).unwrap();
                }
                let mut meta = txn
                    .open_table(TableDefinition::<&str, &[u8]>::new("app_meta"))
                    .unwrap();
                meta.insert(META_CLUSTER, &b"the record"[..]).unwrap();
            }
            txn.commit().unwrap();
        }
        for open in 1..=2 {
            let mut log = open_log_dir(dir.path()).unwrap();
            let entries = log.try_get_log_entries(..).await.unwrap();
            let ids: Vec<_> = entries.iter().map(|e| e.log_id()).collect();
            assert_eq!(ids, (0..=3).map(log_id).collect::<Vec<_>>(), "open {open}");
            assert_eq!(
                log.read_meta(META_CLUSTER).unwrap().as_deref(),
                Some(&b"the record"[..])
            );
            drop(log);
            assert!(dir.path().join(LOG_DIR).is_dir());
            assert!(!dir.path().join(OLD_LOG_FILE).exists());
            assert!(dir.path().join("raft-log.redb.migrated").is_file());
        }
    }
}
