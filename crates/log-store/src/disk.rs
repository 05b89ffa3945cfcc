//! The segment files: creating them, appending synced frames, rotation with a checkpoint,
//! deletion from the front, and replay on open.
//!
//! Crash rules (the same as the fence crate's log, `latchkey_fence::durable`):
//! - a new segment is written whole (header and checkpoint) under `<name>.tmp`, fsynced,
//!   renamed into place and the directory fsynced before anything is written to it, so every
//!   segment with a final name starts with a complete checkpoint; a leftover `.tmp` is an
//!   interrupted rotation and is removed on open;
//! - a torn group commit can only be at the end of the last segment: it was never acknowledged,
//!   so it is dropped and the file truncated, so later appends do not follow garbage;
//! - anything else damaged (a non-last segment, damage followed by a good frame, a bad header,
//!   a missing segment number, a gap in the entries) is [`LogStoreError::Corrupt`];
//! - after a failed write or fsync nothing more is written (`failed`): the kernel may have
//!   dropped the data while a later fsync reports success.
//! - zeros written ahead (preallocation, below) are not a torn write: on open they stay, and
//!   the writer goes on at the end of the last good frame, over them; anything else after the
//!   last good frame is cut off as before, and the zeros are written ahead again by the next
//!   append. Only the last segment ever has zeros after its frames: a segment is rotated
//!   only once its frames reach `segment_bytes`, which zeros are never written past, and a
//!   rotation first cuts off any zeros left (a log opened with smaller segments than it was
//!   written with), so a non-last segment still ends at its last frame.
//! - a log whose last segment is of format version 1 (unsalted frames, see `format`) is never
//!   appended to: replay is followed by a rotation to a segment of the current version, so the
//!   frames of any one segment are all of its header's version.
//! - after replay, every segment, the directory and its entry in its parent are fsynced before
//!   the store answers anything: what replay read may have been only in the page cache of a
//!   killed process.
//!
//! Preallocation (issue #35): an append that extends the file makes its `fdatasync` commit the
//! filesystem's journal (the file's size changed); one that overwrites blocks already written
//! does not. So the active segment keeps zeros written ahead of its frames: an append that
//! would run past them writes `preallocate_bytes` more (not past `segment_bytes`) after itself,
//! in the same `fdatasync`, and the next thousand or so appends overwrite zeros. The zeros are
//! best-effort: when the disk has no room for them, what was written of them is cut off again
//! (in the same `fdatasync`) and the append goes on without, so a nearly full disk stops the
//! store only when a frame itself does not fit, not `preallocate_bytes` earlier.
//!
//! Deletion: the front segment is deleted once every entry it holds is at or below the durable
//! purge point of its group and a later segment exists (which starts with a checkpoint of each
//! group's vote, committed log id, purge point and meta keys, so nothing else of the front
//! segment is needed); the directory is fsynced after each deletion, so the segments on disk
//! are always consecutive.
//!
//! Groups (issue #16): the Raft groups of one member share one log, so that one `fdatasync`
//! covers a batch of all of them. Each record belongs to the group of the last
//! [`Record::Group`] before it in its frame, group 0 if none; each group has its own
//! [`Index`] and its own [`Written`] state, and replay refuses a record of a group the member
//! does not run.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::format::{self, Record, Salt, FRAME_BATCH, FRAME_CHECKPOINT};
use crate::index::{Index, Loc};
use crate::{lock, LogStoreError};

const SEGMENT_SUFFIX: &str = ".seg";
/// Held locked (flock, exclusive) while a store has the directory open.
const LOCK_FILE: &str = "LOCK";
const TMP_SUFFIX: &str = ".tmp";

pub(crate) fn segment_name(number: u64) -> String {
    format!("{number:020}{SEGMENT_SUFFIX}")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> LogStoreError {
    let path = path.to_path_buf();
    move |source| LogStoreError::Io { op, path, source }
}

pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A Raft group's number in the shared log.
pub(crate) type Group = u32;

/// Each group's index, as the writer and the disk reach them.
pub(crate) type Indexes<L> = BTreeMap<Group, Arc<Mutex<Index<L>>>>;

/// What the writer has written of one group: the state a checkpoint records.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Written {
    pub(crate) vote: Option<Vec<u8>>,
    pub(crate) committed: Option<Vec<u8>>,
    /// (index, encoded log id)
    pub(crate) last_purged: Option<(u64, Vec<u8>)>,
    pub(crate) meta: BTreeMap<String, Vec<u8>>,
}

/// Each group's [`Written`]; a group appears once it has written one of these values, so two
/// replays of the same records compare equal however their group markers fell.
pub(crate) type WrittenByGroup = BTreeMap<Group, Written>;

/// Encodes the checkpoint frame (the first of a segment salted with `salt`) of every group's
/// state: group 0's records first with no marker, then each other group's after a
/// [`Record::Group`].
fn checkpoint(written: &WrittenByGroup, buf: &mut Vec<u8>, salt: &Salt) -> Result<(), String> {
    let start = format::begin_frame(buf, FRAME_CHECKPOINT, 0);
    for (&group, state) in written {
        if group != 0 {
            format::encode_record(buf, &Record::Group(group))?;
        }
        state.records(buf)?;
    }
    format::end_frame(buf, start, salt)
}

impl Written {
    fn records(&self, buf: &mut Vec<u8>) -> Result<(), String> {
        if let Some(v) = &self.vote {
            format::encode_record(buf, &Record::Vote(v))?;
        }
        if let Some(c) = &self.committed {
            format::encode_record(buf, &Record::Committed(c))?;
        }
        if let Some((upto, lp)) = &self.last_purged {
            format::encode_record(
                buf,
                &Record::Purge {
                    upto: *upto,
                    last_purged: lp,
                },
            )?;
        }
        for (key, value) in &self.meta {
            format::encode_record(buf, &Record::Meta { key, value })?;
        }
        Ok(())
    }

    /// Applies a state record (vote, committed, purge, meta) of this group.
    fn apply(&mut self, record: &Record<'_>) {
        match *record {
            Record::Vote(v) => self.vote = Some(v.to_vec()),
            Record::Committed(c) => self.committed = Some(c.to_vec()),
            Record::Purge { upto, last_purged } => {
                self.last_purged = Some((upto, last_purged.to_vec()))
            }
            Record::Meta { key, value } => {
                self.meta.insert(key.to_owned(), value.to_vec());
            }
            Record::Entry { .. } | Record::Truncate { .. } | Record::Group(_) => {}
        }
    }
}

#[derive(Debug)]
struct SegmentInfo {
    number: u64,
    /// Per group, the highest index of any entry record written to it (truncated ones
    /// included); a group with no entry in it is absent.
    max_entry: BTreeMap<Group, u64>,
}

/// The writer's side of the files. One lock (`Arc<Mutex<Disk>>`) orders every write: the
/// writer thread's batches, `write_meta`, rotation and deletion. Lock order: `Disk`, then
/// `Index`.
#[derive(Debug)]
pub(crate) struct Disk {
    dir: PathBuf,
    segment_bytes: u64,
    active: Arc<File>,
    /// Where the next frame goes: the end of the active segment's last frame.
    active_len: u64,
    /// The active segment file's length: the bytes from `active_len` to it are zeros written
    /// ahead (preallocation, see the module comment).
    allocated: u64,
    /// Zeros written ahead of an append that reaches `allocated`.
    preallocate_bytes: u64,
    /// The disk had no room for zeros ahead in the active segment: appends go on without
    /// them until the next segment (one warning, not one per append on a nearly full disk).
    zeros_refused: bool,
    /// The active segment's salt, and the sequence number of the next frame written to it.
    salt: Salt,
    next_frame_seq: u64,
    /// Oldest first; the last is the active one.
    segments: VecDeque<SegmentInfo>,
    pub(crate) written: WrittenByGroup,
    pub(crate) failed: Option<String>,
    buf: Vec<u8>,
    /// Tests only: the active segment's offset at which the disk is full (`fill_disk`).
    #[cfg(test)]
    full_at: Option<u64>,
    /// Released when the writer and every handle are gone.
    _lock: nix::fcntl::Flock<File>,
}

/// Takes the directory's lock, or fails at once if another store holds it.
fn lock_dir(dir: &Path) -> Result<nix::fcntl::Flock<File>, LogStoreError> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_err("open", &path))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(
        |(_, errno)| LogStoreError::Locked {
            path: dir.to_path_buf(),
            source: io::Error::from(errno),
        },
    )
}

/// A new segment's salt: random, and never shown outside the data directory (why: the module
/// comment of `format`).
fn random_salt() -> Result<Salt, LogStoreError> {
    let path = Path::new("/dev/urandom");
    let mut salt = Salt::default();
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut salt))
        .map_err(io_err("read a segment salt from", path))?;
    Ok(salt)
}

/// Writes segment `number` (header + checkpoint of `written`, under a new salt) under a
/// temporary name, fsyncs it, renames it into place and fsyncs the directory. Returns the open
/// file, its length and its salt; the next frame written to it is the 1st (the checkpoint is
/// the 0th).
fn create_segment(
    dir: &Path,
    number: u64,
    written: &WrittenByGroup,
) -> Result<(File, u64, Salt), LogStoreError> {
    let salt = random_salt()?;
    let mut buf = format::segment_header(number, &salt).to_vec();
    checkpoint(written, &mut buf, &salt)
        .map_err(|e| LogStoreError::Corrupt(format!("cannot encode a checkpoint: {e}")))?;
    let path = dir.join(segment_name(number));
    let tmp = dir.join(format!("{}{TMP_SUFFIX}", segment_name(number)));
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        f.write_all(&buf)
            .and_then(|()| f.sync_all())
            .map_err(io_err("write", &tmp))?;
    }
    fs::rename(&tmp, &path).map_err(io_err("rename into place", &path))?;
    sync_dir(dir).map_err(io_err("sync directory", dir))?;
    let f = open_segment(&path)?;
    Ok((f, buf.len() as u64, salt))
}

/// A write that failed for want of room (a full filesystem, a quota, the file size limit),
/// not of the device.
fn is_out_of_space(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded | io::ErrorKind::FileTooLarge
    )
}

fn open_segment(path: &Path) -> Result<File, LogStoreError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err("open", path))
}

impl Disk {
    fn fail(&mut self, msg: String) -> String {
        self.failed.get_or_insert(msg).clone()
    }

    /// Appends `self.buf` (one complete frame, the `next_frame_seq`th) to the active segment and
    /// `fdatasync`s it, with zeros written ahead after it when it reaches past those already
    /// there. The zeros are best-effort: on a full disk (or quota, or file size limit) the
    /// part of them written is cut off again and the frame is synced alone; only a failure of
    /// the frame's own write, of that cut, or of the sync stops the store.
    fn write_buf_synced(&mut self) -> Result<u64, String> {
        if let Some(msg) = &self.failed {
            return Err(msg.clone());
        }
        let at = self.active_len;
        let end = at + self.buf.len() as u64;
        let result = self
            .write_at(&self.buf, at)
            .and_then(|()| match self.zeros_ahead_of(end) {
                // Rare (once per `preallocate_bytes`), so a buffer of its own each time.
                Some(to) => match self.write_at(&vec![0; (to - end) as usize], end) {
                    Ok(()) => Ok(to),
                    Err(e) if is_out_of_space(&e) => {
                        tracing::warn!(
                            "log store: no room for the zeros written ahead of the appends \
                             ({e}); appending without them until the next segment"
                        );
                        self.zeros_refused = true;
                        self.active.set_len(end).map(|()| end)
                    }
                    Err(e) => Err(e),
                },
                None => Ok(self.allocated.max(end)),
            })
            .and_then(|allocated| self.active.sync_data().map(|()| allocated));
        match result {
            Ok(allocated) => {
                self.active_len = end;
                self.allocated = allocated;
                self.next_frame_seq += 1;
                Ok(at)
            }
            Err(e) => Err(self.fail(format!("log store write failed: {e}"))),
        }
    }

    /// `pwrite`s all of `buf` at `at` in the active segment.
    fn write_at(&self, buf: &[u8], at: u64) -> io::Result<()> {
        #[cfg(test)]
        if let Some(full_at) = self.full_at {
            // A full disk: the bytes before `full_at` are written, then ENOSPC.
            let room = full_at.saturating_sub(at).min(buf.len() as u64) as usize;
            self.active.write_all_at(&buf[..room], at)?;
            if room < buf.len() {
                return Err(io::Error::from_raw_os_error(nix::libc::ENOSPC));
            }
            return Ok(());
        }
        self.active.write_all_at(buf, at)
    }

    /// The end of the zeros to write ahead after a frame that ends at `end`: none while
    /// zeros already reach past it, none at or past the segment's size (it rotates there),
    /// none after the disk had no room for them in this segment.
    fn zeros_ahead_of(&self, end: u64) -> Option<u64> {
        if self.zeros_refused || end <= self.allocated || end >= self.segment_bytes {
            return None;
        }
        Some(
            end.saturating_add(self.preallocate_bytes)
                .min(self.segment_bytes),
        )
    }

    /// Encodes `records` as one batch frame, writes it with one write and one fsync, and
    /// returns, for every entry record among them, its group and index with its location. The
    /// records start in group 0; a [`Record::Group`] names the group of those after it.
    pub(crate) fn write_batch<'r>(
        &mut self,
        records: impl IntoIterator<Item = Record<'r>>,
    ) -> Result<Vec<(Group, u64, Loc)>, String> {
        if let Some(msg) = &self.failed {
            return Err(msg.clone());
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let mut entries = Vec::new();
        let start = format::begin_frame(&mut buf, FRAME_BATCH, self.next_frame_seq);
        let mut max_entry = self
            .segments
            .back()
            .map(|s| s.max_entry.clone())
            .unwrap_or_default();
        // Applied to `self.written` only once the frame is durable: a failed batch is not a
        // state a later checkpoint may record.
        let mut written = Vec::new();
        let mut group: Group = 0;
        let encoded: Result<(), String> = records.into_iter().try_for_each(|r| {
            let at = format::encode_record(&mut buf, &r)?;
            match r {
                Record::Entry { index, .. } => {
                    let len = u32::try_from(buf.len() - at)
                        .map_err(|_| format!("log entry {index} is too large"))?;
                    entries.push((group, index, at, len));
                    let max = max_entry.entry(group).or_insert(index);
                    *max = (*max).max(index);
                }
                Record::Group(g) => group = g,
                Record::Truncate { .. } => {}
                Record::Vote(_)
                | Record::Committed(_)
                | Record::Purge { .. }
                | Record::Meta { .. } => written.push((group, r)),
            }
            Ok(())
        });
        let result = encoded
            .and_then(|()| format::end_frame(&mut buf, start, &self.salt))
            .map_err(|e| self.fail(format!("log store encoding failed: {e}")));
        self.buf = buf;
        result?;
        let at = self.write_buf_synced()?;
        for (group, record) in &written {
            self.written.entry(*group).or_default().apply(record);
        }
        self.segments
            .back_mut()
            .expect("an active segment")
            .max_entry = max_entry;
        let segment = self.segments.back().expect("an active segment").number;
        Ok(entries
            .into_iter()
            .map(|(group, index, off, len)| {
                (
                    group,
                    index,
                    Loc {
                        segment,
                        offset: at + off as u64,
                        len,
                    },
                )
            })
            .collect())
    }

    /// After a batch: start a new segment if the active one is full, then delete front
    /// segments that hold only purged entries. A failure is fail-stop like a failed write.
    pub(crate) fn maintain<L: Clone>(&mut self, indexes: &Indexes<L>) -> Result<(), String> {
        if self.failed.is_some() {
            return Ok(());
        }
        self.rotate_if_full(indexes)
            .and_then(|()| self.delete_purged(indexes))
            .map_err(|e| self.fail(e.to_string()))
    }

    fn rotate_if_full<L: Clone>(&mut self, indexes: &Indexes<L>) -> Result<(), LogStoreError> {
        if self.active_len < self.segment_bytes {
            return Ok(());
        }
        let number = self.segments.back().expect("an active segment").number + 1;
        if self.allocated > self.active_len {
            // Zeros written ahead under a larger `segment_bytes` than this open's: a segment
            // that is not the last must end at its last frame.
            let path = self.dir.join(segment_name(number - 1));
            self.active
                .set_len(self.active_len)
                .and_then(|()| self.active.sync_all())
                .map_err(io_err("cut the zeros written ahead off", &path))?;
            self.allocated = self.active_len;
        }
        let (file, len, salt) = create_segment(&self.dir, number, &self.written)?;
        let file = Arc::new(file);
        for index in indexes.values() {
            lock(index).files.insert(number, file.clone());
        }
        self.segments.push_back(SegmentInfo {
            number,
            max_entry: BTreeMap::new(),
        });
        self.active = file;
        self.active_len = len;
        self.allocated = len;
        self.zeros_refused = false;
        self.salt = salt;
        self.next_frame_seq = 1;
        Ok(())
    }

    fn delete_purged<L: Clone>(&mut self, indexes: &Indexes<L>) -> Result<(), LogStoreError> {
        let purged = |group: &Group| {
            self.written
                .get(group)
                .and_then(|w| w.last_purged.as_ref())
                .map(|(upto, _)| *upto)
        };
        while self.segments.len() > 1 {
            let front = &self.segments[0];
            // Every group's entries in it must be purged, not only one group's.
            let deletable = front
                .max_entry
                .iter()
                .all(|(group, &max)| purged(group).is_some_and(|p| max <= p));
            if !deletable {
                break;
            }
            let number = front.number;
            for index in indexes.values() {
                lock(index).files.remove(&number);
            }
            let path = self.dir.join(segment_name(number));
            fs::remove_file(&path).map_err(io_err("delete", &path))?;
            // One at a time, so that the segments left after a crash are consecutive.
            sync_dir(&self.dir).map_err(io_err("sync directory", &self.dir))?;
            self.segments.pop_front();
        }
        Ok(())
    }

    /// The index `group` must purge up to for the oldest segment to be deleted, when its entries
    /// there hold it back and the log has more than `held_back_max` segments.
    pub(crate) fn held_back_by(&self, group: Group, held_back_max: usize) -> Option<u64> {
        if self.segments.len() <= held_back_max {
            return None;
        }
        let max = *self.segments.front()?.max_entry.get(&group)?;
        let purged = self
            .written
            .get(&group)
            .and_then(|w| w.last_purged.as_ref())
            .map(|(upto, _)| *upto);
        (purged < Some(max)).then_some(max)
    }

    /// Makes the disk full `room` bytes past the active segment's current length: a write
    /// reaching past that writes what fits, then fails with ENOSPC (for the tests of zeros
    /// written ahead on a full disk).
    #[cfg(test)]
    pub(crate) fn fill_disk(&mut self, room: u64) {
        self.full_at = Some(self.allocated.max(self.active_len) + room);
    }

    /// Makes every later write fail for real: the active segment is swapped for a read-only
    /// handle of the same file, so `pwrite` returns `EBADF` (for the fail-stop tests).
    #[cfg(test)]
    pub(crate) fn break_writes(&mut self) {
        let number = self.segments.back().expect("an active segment").number;
        let path = self.dir.join(segment_name(number));
        self.active = Arc::new(File::open(path).expect("reopen read-only"));
    }

    /// Segment numbers on disk, oldest first (for tests).
    #[cfg(test)]
    pub(crate) fn segment_numbers(&self) -> Vec<u64> {
        self.segments.iter().map(|s| s.number).collect()
    }
}

/// How replay turns stored bytes into log ids: the entry's (checking its index) and a purge
/// record's.
pub(crate) struct Decoders<'a, L> {
    pub(crate) entry: &'a DecodeEntry<L>,
    pub(crate) log_id: &'a DecodeLogId<L>,
}

/// Decodes the entry stored at an index (refusing one whose own index differs) to its log id.
pub(crate) type DecodeEntry<L> = dyn Fn(u64, &[u8]) -> Result<L, String>;
/// Decodes a purge record's log id, with its index.
pub(crate) type DecodeLogId<L> = dyn Fn(&[u8]) -> Result<(L, u64), String>;

/// Opens (creating if needed) the segment directory `dir` and replays it into one index per
/// group of `groups`; a record of any other group is corruption.
pub(crate) fn load<L: Clone>(
    dir: &Path,
    groups: &[Group],
    segment_bytes: u64,
    preallocate_bytes: u64,
    cache_bytes: usize,
    decode: &Decoders<'_, L>,
) -> Result<(BTreeMap<Group, Index<L>>, Disk), LogStoreError> {
    // A new directory's entry is made durable with everything else at the end of `load`.
    fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
    let dir_lock = lock_dir(dir)?;
    let mut numbers = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let entry = entry.map_err(io_err("list", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(TMP_SUFFIX) {
            // An interrupted rotation (or migration): the rename never happened.
            let path = entry.path();
            fs::remove_file(&path).map_err(io_err("remove", &path))?;
        } else if let Some(n) = parse_segment_name(name) {
            numbers.push(n);
        }
    }
    numbers.sort_unstable();
    if numbers.is_empty() {
        let (file, _, _) = create_segment(dir, 1, &WrittenByGroup::new())?;
        drop(file);
        numbers.push(1);
    }
    for pair in numbers.windows(2) {
        if pair[1] != pair[0] + 1 {
            return Err(LogStoreError::Corrupt(format!(
                "{}: segment {} follows segment {}: segments are missing",
                dir.display(),
                pair[1],
                pair[0]
            )));
        }
    }

    let mut indexes: BTreeMap<Group, Index<L>> = groups
        .iter()
        .map(|&g| (g, Index::new(cache_bytes)))
        .collect();
    let mut written = WrittenByGroup::new();
    let mut segments = VecDeque::new();
    let mut active = None;
    for (i, &number) in numbers.iter().enumerate() {
        let last = i + 1 == numbers.len();
        let path = dir.join(segment_name(number));
        let file = open_segment(&path)?;
        let mut buf = Vec::new();
        (&file)
            .read_to_end_at(&mut buf)
            .map_err(io_err("read", &path))?;
        let corrupt = |offset: usize, reason: &dyn std::fmt::Display| {
            LogStoreError::Corrupt(format!("{} at byte {offset}: {reason}", path.display()))
        };
        let parsed = format::parse_segment(&buf, number, last).map_err(|e| match e {
            format::SegmentError::BadHeader(reason) => corrupt(0, &reason),
            format::SegmentError::Corrupt { offset, reason } => corrupt(
                offset,
                &format_args!(
                    "{reason}{}",
                    if last {
                        "; valid data follows, so this is not a torn write from a crash"
                    } else {
                        " in a segment that is not the last"
                    }
                ),
            ),
        })?;
        if parsed.frames.is_empty() {
            // A segment gets its final name only once its checkpoint is durable.
            return Err(corrupt(parsed.valid_len, &"the segment has no checkpoint"));
        }
        let mut info = SegmentInfo {
            number,
            max_entry: BTreeMap::new(),
        };
        for (k, frame) in parsed.frames.iter().enumerate() {
            let at = frame.at;
            let is_checkpoint = frame.kind == FRAME_CHECKPOINT;
            match (k, frame.kind) {
                (0, FRAME_CHECKPOINT) | (1.., FRAME_BATCH) => {}
                (0, _) => return Err(corrupt(at, &"the segment does not start with a checkpoint")),
                _ => return Err(corrupt(at, &"unexpected frame kind")),
            }
            let mut state = if is_checkpoint {
                WrittenByGroup::new()
            } else {
                written.clone()
            };
            // Every frame starts in group 0.
            let mut group: Group = 0;
            for record in format::records(&buf, frame.body.clone()) {
                let (off, range, record) = record.map_err(|e| corrupt(at, &e))?;
                let fail = |e: String| corrupt(off, &e);
                if let Record::Group(g) = record {
                    group = g;
                    continue;
                }
                let Some(index) = indexes.get_mut(&group) else {
                    return Err(fail(format!(
                        "a record of Raft group {group}, which this log is not opened for \
                         (groups {groups:?})"
                    )));
                };
                match record {
                    Record::Entry { index: n, bytes } if !is_checkpoint => {
                        let log_id = (decode.entry)(n, bytes).map_err(fail)?;
                        let loc = Loc {
                            segment: number,
                            offset: off as u64,
                            len: (range.end - range.start) as u32,
                        };
                        index.replay_entry(n, log_id, loc, bytes).map_err(fail)?;
                        let max = info.max_entry.entry(group).or_insert(n);
                        *max = (*max).max(n);
                    }
                    Record::Truncate { from } if !is_checkpoint => index.truncate(from),
                    Record::Entry { .. } | Record::Truncate { .. } => {
                        return Err(fail("a checkpoint holds a log record".into()))
                    }
                    Record::Purge { upto, last_purged } => {
                        let (log_id, at_index) = (decode.log_id)(last_purged).map_err(fail)?;
                        if at_index != upto {
                            return Err(fail(format!(
                                "purge up to {upto} names log id index {at_index}"
                            )));
                        }
                        index.purge(log_id, upto);
                        state.entry(group).or_default().apply(&record);
                    }
                    Record::Vote(_) | Record::Committed(_) | Record::Meta { .. } => {
                        state.entry(group).or_default().apply(&record)
                    }
                    Record::Group(_) => unreachable!("handled above"),
                }
            }
            // A checkpoint restates what the segments before it say; if they are still
            // there, they must agree.
            if is_checkpoint && i > 0 && state != written {
                return Err(corrupt(
                    at,
                    &"the checkpoint disagrees with the segments before it",
                ));
            }
            written = state;
        }
        // Zeros after the frames of a segment written on are kept for it to write over; a
        // version 1 segment is never written on (it stops being the last at once, below), so
        // it is cut back to its frames like any torn tail.
        let zeros_ahead = matches!(parsed.version, format::Version::V2(_))
            && buf[parsed.valid_len..].iter().all(|&b| b == 0);
        if last && parsed.valid_len < buf.len() && !zeros_ahead {
            tracing::warn!(
                path = %path.display(),
                dropped_bytes = buf.len() - parsed.valid_len,
                "dropping a torn write at the end of the Raft log (never acknowledged)"
            );
            file.set_len(parsed.valid_len as u64)
                .and_then(|()| file.sync_all())
                .map_err(io_err("truncate torn tail of", &path))?;
        }
        let file = Arc::new(file);
        for index in indexes.values_mut() {
            index.files.insert(number, file.clone());
        }
        segments.push_back(info);
        if last {
            let allocated = if zeros_ahead {
                buf.len()
            } else {
                parsed.valid_len
            };
            active = Some((
                file,
                parsed.valid_len as u64,
                allocated as u64,
                parsed.version,
                parsed.frames.len(),
            ));
        }
    }
    for (group, index) in &indexes {
        index.check_replayed().map_err(|e| {
            LogStoreError::Corrupt(format!("{} (Raft group {group}): {e}", dir.display()))
        })?;
    }
    // What replay read may be only in the page cache: a process killed between a batch's
    // `write` and its `fdatasync`, or between a rotation's rename and its directory fsync,
    // leaves bytes and names the kernel shows but the disk does not hold. Openraft is about to
    // act on them as persisted (a vote it will not contradict, entries it counts toward a
    // quorum), and later batches would be acknowledged in a segment whose name a power loss
    // could still take away. So make all of it durable before anything is answered: every
    // segment, the directory's entries, and the directory's own entry in its parent.
    let files = &indexes.values().next().expect("at least one group").files;
    for (number, file) in files {
        file.sync_all()
            .map_err(io_err("sync segment", &dir.join(segment_name(*number))))?;
    }
    sync_dir(dir).map_err(io_err("sync directory", dir))?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    sync_dir(parent).map_err(io_err("sync directory", parent))?;
    let (mut active, mut active_len, mut allocated, version, frames) =
        active.expect("at least one segment");
    let (salt, next_frame_seq) = match version {
        format::Version::V2(salt) => (salt, frames as u64),
        // A log of the build before issue #31: its frames are not salted, so nothing more is
        // written to it; a new segment of the current version starts here, with a checkpoint
        // of everything replayed, and the old segments are read with their own rule until
        // they are purged and deleted. Only now that what replay read is durable: a checkpoint
        // that outlived the state it restates would disagree with it on the next open.
        format::Version::V1 => {
            let number = segments.back().expect("at least one segment").number + 1;
            let (file, len, salt) = create_segment(dir, number, &written)?;
            let file = Arc::new(file);
            for index in indexes.values_mut() {
                index.files.insert(number, file.clone());
            }
            segments.push_back(SegmentInfo {
                number,
                max_entry: BTreeMap::new(),
            });
            tracing::info!(
                dir = %dir.display(),
                segment = number,
                "the last log segment is of format version 1; writing on in a new one of version 2"
            );
            (active, active_len, allocated) = (file, len, len);
            (salt, 1)
        }
    };
    for (group, index) in &mut indexes {
        let state = written.get(group).cloned().unwrap_or_default();
        index.vote = state.vote;
        index.committed = state.committed;
        index.meta = state.meta;
        index.debug_check();
    }
    Ok((
        indexes,
        Disk {
            dir: dir.to_path_buf(),
            segment_bytes,
            active,
            active_len,
            allocated,
            preallocate_bytes,
            zeros_refused: false,
            salt,
            next_frame_seq,
            segments,
            written,
            failed: None,
            buf: Vec::new(),
            #[cfg(test)]
            full_at: None,
            _lock: dir_lock,
        },
    ))
}

/// `read_to_end` without moving a cursor the writer relies on (it writes at offsets).
trait ReadToEndAt {
    fn read_to_end_at(self, buf: &mut Vec<u8>) -> io::Result<()>;
}

impl ReadToEndAt for &File {
    fn read_to_end_at(self, buf: &mut Vec<u8>) -> io::Result<()> {
        let len = self.metadata()?.len() as usize;
        buf.resize(len, 0);
        self.read_exact_at(buf, 0)
    }
}

/// Writes a fresh segment directory at `dir` (which must not exist) holding `written` as the
/// checkpoint and `entries` (index, encoded entry) after it, fsynced. For migration.
pub(crate) fn write_fresh(
    dir: &Path,
    written: &WrittenByGroup,
    entries: impl Iterator<Item = Result<(u64, Vec<u8>), LogStoreError>>,
) -> Result<(), LogStoreError> {
    fs::create_dir(dir).map_err(io_err("create directory", dir))?;
    let (file, mut len, salt) = create_segment(dir, 1, written)?;
    let path = dir.join(segment_name(1));
    // Frames of at most about 1 MiB: a frame's length is a u32, and none of this is torn (it is
    // fsynced before the directory is renamed into place).
    const FRAME_BYTES: usize = 1 << 20;
    let mut buf = Vec::new();
    let mut seq = 1;
    let mut start = format::begin_frame(&mut buf, FRAME_BATCH, seq);
    let flush = |buf: &mut Vec<u8>, len: &mut u64| -> Result<(), LogStoreError> {
        file.write_all_at(buf, *len)
            .map_err(io_err("write", &path))?;
        *len += buf.len() as u64;
        buf.clear();
        Ok(())
    };
    for entry in entries {
        let (index, bytes) = entry?;
        format::encode_record(
            &mut buf,
            &Record::Entry {
                index,
                bytes: &bytes,
            },
        )
        .map_err(LogStoreError::Corrupt)?;
        if buf.len() >= FRAME_BYTES {
            format::end_frame(&mut buf, start, &salt).map_err(LogStoreError::Corrupt)?;
            flush(&mut buf, &mut len)?;
            seq += 1;
            start = format::begin_frame(&mut buf, FRAME_BATCH, seq);
        }
    }
    format::end_frame(&mut buf, start, &salt).map_err(LogStoreError::Corrupt)?;
    flush(&mut buf, &mut len)?;
    file.sync_all().map_err(io_err("sync", &path))?;
    sync_dir(dir).map_err(io_err("sync directory", dir))
}
