//! Replacing a small file atomically and durably, and making a directory durably, for the
//! crates that keep files beside the log (the server's `cluster` file and data dirs, the raft
//! crate's snapshot file and directory). Here because both depend on
//! this crate, and the core does no I/O. `latchkey-fence` keeps its own copy: it depends on no
//! other latchkey crate, so that a protected resource can use it alone.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Writes `dir/name` atomically and durably: a temporary file `dir/name.tmp`, fsync, rename over
/// `dir/name`, fsync the directory. After a crash at any point `dir/name` is either the old file
/// or the new one, complete.
pub fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    fs::rename(&tmp, dir.join(name))?;
    // The rename is durable only once the directory entry is.
    File::open(dir)?.sync_all()
}

/// Creates `dir` and any missing ancestors, durably: every directory this makes has its entry
/// in its parent fsynced, and so does `dir` when it was there already (a process killed after
/// making it may have left its entry only in the page cache). Without it, a power loss can take
/// away a directory whose files were each fsynced, e.g. a data dir's `snapshots/` after the log
/// was purged up to its snapshot.
pub fn create_dir_durably(dir: &Path) -> io::Result<()> {
    create_dir_syncing(dir, &mut |d| File::open(d)?.sync_all())
}

/// [`create_dir_durably`], fsyncing each directory with `sync` (tests record them).
fn create_dir_syncing(dir: &Path, sync: &mut dyn FnMut(&Path) -> io::Result<()>) -> io::Result<()> {
    let parent = |d: &Path| -> Option<PathBuf> {
        match d.parent() {
            Some(p) if p.as_os_str().is_empty() => Some(PathBuf::from(".")),
            p => p.map(Path::to_path_buf),
        }
    };
    // `dir` and its ancestors up to the first that exists, deepest first: the ones to make.
    let mut missing = Vec::new();
    let mut at = Some(dir.to_path_buf());
    while let Some(d) = at {
        if d.try_exists()? {
            break;
        }
        at = parent(&d);
        missing.push(d);
    }
    for d in missing.iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => {}
            // Made meanwhile by another process: as good.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    if !dir.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a directory", dir.display()),
        ));
    }
    // The dir itself, then each entry in its parent, deepest first: a parent is synced once
    // the child its entry names is.
    sync(dir)?;
    let entries = if missing.is_empty() {
        vec![dir.to_path_buf()]
    } else {
        missing
    };
    for d in &entries {
        if let Some(p) = parent(d) {
            sync(&p)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `create_dir_syncing(dir)` fsyncs, in order.
    fn synced_by(dir: &Path) -> Vec<PathBuf> {
        let mut synced = Vec::new();
        create_dir_syncing(dir, &mut |d| {
            synced.push(d.to_path_buf());
            Ok(())
        })
        .unwrap();
        synced
    }

    /// Regression (issue #31): the data dir's `snapshots/` was made without an fsync of its
    /// parent. Each directory made, and the one asked for, is fsynced and so is its entry,
    /// deepest first, so that a parent's fsync covers a child already durable.
    #[test]
    fn create_dir_durably_fsyncs_each_new_entry_in_its_parent() {
        let root = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            root.path().join("a"),
            root.path().join("a/b"),
            root.path().join("a/b/c"),
        );
        assert_eq!(
            synced_by(&c),
            [c.clone(), b.clone(), a, root.path().to_path_buf()],
            "a new chain: the dir, then each new entry's parent"
        );
        assert!(c.is_dir());
        // Made before (by a process that may have died before its fsync): synced again.
        assert_eq!(synced_by(&c), [c, b]);
        // The real thing on a real directory.
        create_dir_durably(&root.path().join("x/y")).unwrap();
        assert!(root.path().join("x/y").is_dir());
    }

    #[test]
    fn create_dir_durably_refuses_a_file_in_the_way() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("f");
        fs::write(&file, b"").unwrap();
        assert!(create_dir_durably(&file).is_err());
        assert!(create_dir_durably(&file.join("d")).is_err());
    }

    #[test]
    fn write_durably_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        write_durably(dir.path(), "members", b"1,2,3").unwrap();
        write_durably(dir.path(), "members", b"4").unwrap();
        assert_eq!(fs::read(dir.path().join("members")).unwrap(), b"4");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["members"]);
    }

    #[test]
    fn write_durably_into_a_missing_dir_fails() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        assert!(write_durably(&missing, "members", b"1").is_err());
    }
}
