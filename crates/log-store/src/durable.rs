//! Replacing a small file atomically and durably, for the crates that keep files beside the log
//! (the server's `members` file, the raft crate's snapshot file). Here because both depend on
//! this crate, and the core does no I/O. `latchkey-fence` keeps its own copy: it depends on no
//! other latchkey crate, so that a protected resource can use it alone.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

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

#[cfg(test)]
mod tests {
    use super::*;

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
