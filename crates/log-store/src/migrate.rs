//! Reading a data dir of the previous build, whose log was one redb file
//! (`<data-dir>/raft-log.redb`), into a segment directory. redb stays a dependency for this
//! alone.
//!
//! The old file's tables: `raft_log` (index -> encoded entry), `raft_state` (`vote`,
//! `committed`, `last_purged`) and `app_meta` (the server's keys), all values in the same
//! versioned encoding (`codec`) the segments hold, so values are copied byte for byte.
//!
//! Steps, each durable before the next: the new directory is written under a temporary name
//! (`<new>.migrating`) and fsynced, opened once as a store (so a log this build cannot read is
//! refused before anything changes), renamed into place (the commit point) and the parent
//! fsynced; then the old file is renamed to `<old>.migrated` (kept, never deleted) and the
//! parent fsynced again. A crash before the commit point leaves the old file as it was (the
//! temporary directory is redone); a crash after it leaves a complete new directory, and the
//! next call only finishes the rename of the old file.

use std::fs;
use std::path::{Path, PathBuf};

use openraft::type_config::alias::LogIdOf;
use openraft::RaftTypeConfig;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use crate::disk::{self, Written};
use crate::{codec, LogStore, LogStoreError};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_state");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("app_meta");

/// What [`migrate_from_redb`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Migrated {
    /// There was no old file (or the new directory was already complete): nothing to do.
    Nothing,
    /// The new directory already existed (an earlier migration reached its commit point); the
    /// old file was only renamed to `<old>.migrated`.
    FinishedEarlierMigration,
    /// The old file was copied into the new directory: this many entries.
    Migrated { entries: u64 },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> LogStoreError {
    let path = path.to_path_buf();
    move |source| LogStoreError::Io { op, path, source }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Migrates the redb log `old_file` into the segment directory `new_dir`, if `old_file` exists
/// and `new_dir` does not (see the module comment for the steps and crash behaviour). Both
/// must be in the same directory, so that the renames are atomic.
pub fn migrate_from_redb<C: RaftTypeConfig>(
    old_file: &Path,
    new_dir: &Path,
) -> Result<Migrated, LogStoreError> {
    let migrated_name = with_suffix(old_file, ".migrated");
    let dir = parent(new_dir);
    if !old_file.exists() {
        return Ok(Migrated::Nothing);
    }
    // The kept copy of an earlier migration is never replaced: a data dir that has both was
    // run by an older build again after an upgrade, and which log is right is the operator's
    // call, not a rename's.
    if migrated_name.exists() {
        return Err(LogStoreError::Io {
            op: "migrate (a copy of an earlier migration is already kept; move one of them away)",
            path: migrated_name,
            source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        });
    }
    if new_dir.exists() {
        fs::rename(old_file, &migrated_name).map_err(io_err("rename", old_file))?;
        disk::sync_dir(dir).map_err(io_err("sync directory", dir))?;
        return Ok(Migrated::FinishedEarlierMigration);
    }

    let old_err = |e: redb::Error| LogStoreError::OldLog {
        path: old_file.to_path_buf(),
        source: e,
    };
    let db = redb::Database::open(old_file).map_err(|e| old_err(e.into()))?;
    let txn = db.begin_read().map_err(|e| old_err(e.into()))?;

    let mut written = Written::default();
    match txn.open_table(STATE) {
        Ok(state) => {
            let get = |key: &str| -> Result<Option<Vec<u8>>, LogStoreError> {
                Ok(state
                    .get(key)
                    .map_err(|e| old_err(e.into()))?
                    .map(|v| v.value().to_vec()))
            };
            written.vote = get("vote")?;
            written.committed = get("committed")?;
            if let Some(bytes) = get("last_purged")? {
                let log_id: LogIdOf<C> = codec::decode(&bytes, &"last purged log id")
                    .map_err(|e| LogStoreError::Corrupt(format!("{}: {e}", old_file.display())))?;
                written.last_purged = Some((log_id.index(), bytes));
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(old_err(e.into())),
    }
    match txn.open_table(META) {
        Ok(meta) => {
            for row in meta.iter().map_err(|e| old_err(e.into()))? {
                let (k, v) = row.map_err(|e| old_err(e.into()))?;
                written
                    .meta
                    .insert(k.value().to_owned(), v.value().to_vec());
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(old_err(e.into())),
    }

    let tmp = with_suffix(new_dir, ".migrating");
    if tmp.exists() {
        // A migration that crashed before its commit point.
        fs::remove_dir_all(&tmp).map_err(io_err("remove", &tmp))?;
    }
    let mut entries = 0u64;
    // A log of the redb build is of one group, group 0.
    let written = std::collections::BTreeMap::from([(0, written)]);
    match txn.open_table(LOG) {
        Ok(log) => {
            let rows = log.iter().map_err(|e| old_err(e.into()))?.map(|row| {
                let (k, v) = row.map_err(|e| old_err(e.into()))?;
                entries += 1;
                Ok((k.value(), v.value().to_vec()))
            });
            disk::write_fresh(&tmp, &written, rows)?;
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {
            disk::write_fresh(&tmp, &written, std::iter::empty())?
        }
        Err(e) => return Err(old_err(e.into())),
    }
    drop(txn);
    drop(db);

    // Everything this build checks on open (contiguity, every entry's index, the values'
    // format) is checked before the commit point.
    drop(LogStore::<C>::open(&tmp)?);

    fs::rename(&tmp, new_dir).map_err(io_err("rename into place", new_dir))?;
    disk::sync_dir(dir).map_err(io_err("sync directory", dir))?;
    fs::rename(old_file, &migrated_name).map_err(io_err("rename", old_file))?;
    disk::sync_dir(dir).map_err(io_err("sync directory", dir))?;
    tracing::info!(
        from = %old_file.display(),
        to = %new_dir.display(),
        entries,
        "migrated the Raft log from redb to segment files; the old file is kept as {}",
        migrated_name.display()
    );
    Ok(Migrated::Migrated { entries })
}
