//! The in-memory view every read is served from: which entries are live, where each one's bytes
//! are, the vote, committed log id, purge point and meta keys.
//!
//! It is updated when a write is *submitted* (before the writer has it on disk), so an appended
//! entry is readable as soon as `append` returns and a truncation or purge is visible at once,
//! as openraft requires; the vote and meta keys, which their callers wait for, change only once
//! durable. An entry's encoded bytes stay in memory until the batch holding it is synced; then
//! the newest synced ones stay in a bounded tail cache and the older ones are read back from
//! their segment (`Loc`). No file I/O here.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::ops::RangeInclusive;
use std::sync::Arc;

/// Where a synced entry's record (header included) is: segment number, offset, length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    pub(crate) segment: u64,
    pub(crate) offset: u64,
    pub(crate) len: u32,
}

#[derive(Debug)]
pub(crate) struct Slot<L> {
    pub(crate) log_id: L,
    /// The request that wrote it (0 when replayed from disk): a synced position is recorded
    /// only for the same write, not for a later one at the same index.
    seq: u64,
    /// The encoded entry; always present until synced, then while in the tail cache.
    bytes: Option<Arc<[u8]>>,
    /// Where it is on disk, once synced.
    loc: Option<Loc>,
}

/// Where a read finds an entry's bytes.
pub(crate) enum Source {
    Memory(Arc<[u8]>),
    Disk(Arc<File>, Loc),
}

/// The position of an entry that the writer synced, for [`Index::synced`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Synced {
    pub(crate) index: u64,
    pub(crate) seq: u64,
    pub(crate) loc: Loc,
}

#[derive(Debug)]
pub(crate) struct Index<L> {
    /// Sequence number the next request gets; requests enter the writer's queue in this order.
    pub(crate) next_seq: u64,
    pub(crate) entries: BTreeMap<u64, Slot<L>>,
    pub(crate) last_purged: Option<L>,
    last_purged_index: Option<u64>,
    /// The durable vote, encoded.
    pub(crate) vote: Option<Vec<u8>>,
    /// The last `save_committed`, encoded (submitted, not necessarily durable).
    pub(crate) committed: Option<Vec<u8>>,
    /// Durable application keys.
    pub(crate) meta: BTreeMap<String, Vec<u8>>,
    /// Set once a write or sync failed: memory and disk no longer agree, so every later request
    /// fails with this message rather than write after a hole (fail-stop).
    pub(crate) failed: Option<String>,
    /// Synced entries whose bytes are kept, and their total size.
    cached: BTreeSet<u64>,
    cached_bytes: usize,
    cache_bytes_max: usize,
    /// Read handles of the segment files that hold live entries.
    pub(crate) files: BTreeMap<u64, Arc<File>>,
}

impl<L: Clone> Index<L> {
    pub(crate) fn new(cache_bytes_max: usize) -> Self {
        Index {
            next_seq: 1,
            entries: BTreeMap::new(),
            last_purged: None,
            last_purged_index: None,
            vote: None,
            committed: None,
            meta: BTreeMap::new(),
            failed: None,
            cached: BTreeSet::new(),
            cached_bytes: 0,
            cache_bytes_max,
            files: BTreeMap::new(),
        }
    }

    pub(crate) fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    pub(crate) fn first_index(&self) -> Option<u64> {
        self.entries.keys().next().copied()
    }

    pub(crate) fn last_index(&self) -> Option<u64> {
        self.entries.keys().next_back().copied()
    }

    pub(crate) fn last_log_id(&self) -> Option<L> {
        self.entries.values().next_back().map(|s| s.log_id.clone())
    }

    /// Refuses an append of `count` entries from `first` that would leave a gap in the live log
    /// (which the next open would refuse as corrupt). An append may overwrite live entries from
    /// the first one on (openraft's conformance suite does); it drops the entries after the ones
    /// it overwrites (see [`Index::append`]).
    pub(crate) fn check_append(&self, first: u64) -> Result<(), String> {
        if let Some(p) = self.last_purged_index {
            if first <= p {
                return Err(format!(
                    "append at {first} is at or before the purge point {p}"
                ));
            }
        }
        match (
            self.first_index(),
            self.last_index(),
            self.last_purged_index,
        ) {
            (Some(lo), Some(hi), _) if first < lo || first > hi + 1 => Err(format!(
                "append at {first} leaves a gap in the live log {lo}..={hi}"
            )),
            (None, None, Some(p)) if first != p + 1 => Err(format!(
                "append at {first} leaves a gap after the purge point {p}"
            )),
            _ => Ok(()),
        }
    }

    fn remove_slot(&mut self, index: u64) {
        if self.cached.remove(&index) {
            let slot = &self.entries[&index];
            self.cached_bytes -= slot.bytes.as_ref().map_or(0, |b| b.len());
        }
        self.entries.remove(&index);
    }

    /// A submitted (unsynced) entry. It replaces the entry at its index and drops every entry
    /// after it: a Raft log is a prefix, so no entry may outlive the one it followed (openraft
    /// truncates before it overwrites, so this only makes sure; replay does the same).
    pub(crate) fn append(&mut self, seq: u64, index: u64, log_id: L, bytes: Arc<[u8]>) {
        self.truncate(index);
        self.entries.insert(
            index,
            Slot {
                log_id,
                seq,
                bytes: Some(bytes),
                loc: None,
            },
        );
    }

    /// Removes every entry at or after `from`.
    pub(crate) fn truncate(&mut self, from: u64) {
        let gone: Vec<u64> = self.entries.range(from..).map(|(&i, _)| i).collect();
        for i in gone {
            self.remove_slot(i);
        }
    }

    /// Removes every entry up to and including `upto`, which becomes the purge point.
    pub(crate) fn purge(&mut self, log_id: L, upto: u64) {
        let gone: Vec<u64> = self.entries.range(..=upto).map(|(&i, _)| i).collect();
        for i in gone {
            self.remove_slot(i);
        }
        self.last_purged = Some(log_id);
        self.last_purged_index = Some(upto);
    }

    /// The writer synced these entries: record where they are and move their bytes into the
    /// tail cache (dropping the oldest cached bytes beyond its bound).
    pub(crate) fn synced(&mut self, entries: &[Synced]) {
        for s in entries {
            let Some(slot) = self.entries.get_mut(&s.index) else {
                continue; // truncated or purged since
            };
            if slot.seq != s.seq {
                continue; // overwritten by a later append, which is still pending
            }
            slot.loc = Some(s.loc);
            if let Some(b) = &slot.bytes {
                if self.cached.insert(s.index) {
                    self.cached_bytes += b.len();
                }
            }
        }
        self.evict();
    }

    fn evict(&mut self) {
        while self.cached_bytes > self.cache_bytes_max {
            let Some(oldest) = self.cached.pop_first() else {
                break;
            };
            let slot = self
                .entries
                .get_mut(&oldest)
                .expect("cached entries are live");
            debug_assert!(slot.loc.is_some(), "only synced entries leave memory");
            self.cached_bytes -= slot.bytes.take().map_or(0, |b| b.len());
        }
    }

    /// An entry read back from a segment on open. More lenient than [`Index::check_append`]
    /// while replaying: the first segment left may start after the purge point its checkpoint
    /// names, because the segments that held the entries in between were deleted once a later
    /// purge (further on in the log) covered them; [`Index::check_replayed`] checks the result.
    pub(crate) fn replay_entry(
        &mut self,
        index: u64,
        log_id: L,
        loc: Loc,
        bytes: &[u8],
    ) -> Result<(), String> {
        if let Some(p) = self.last_purged_index {
            if index <= p {
                return Err(format!("entry {index} is at or before the purge point {p}"));
            }
        }
        if let (Some(lo), Some(hi)) = (self.first_index(), self.last_index()) {
            if index < lo || index > hi + 1 {
                return Err(format!(
                    "entry {index} leaves a gap in the live log {lo}..={hi}"
                ));
            }
        }
        // As `append`: the entry replaces its index and everything after it.
        self.truncate(index);
        self.entries.insert(
            index,
            Slot {
                log_id,
                seq: 0,
                bytes: Some(bytes.into()),
                loc: Some(loc),
            },
        );
        self.cached.insert(index);
        self.cached_bytes += bytes.len();
        self.evict();
        Ok(())
    }

    /// After replay: the live log is contiguous and starts right after the purge point.
    pub(crate) fn check_replayed(&self) -> Result<(), String> {
        if let (Some(first), Some(p)) = (self.first_index(), self.last_purged_index) {
            if first != p + 1 {
                return Err(format!(
                    "the live log starts at {first}, not right after the purge point {p}"
                ));
            }
        }
        let (Some(lo), Some(hi)) = (self.first_index(), self.last_index()) else {
            return Ok(());
        };
        if (hi - lo + 1) as usize != self.entries.len() {
            return Err(format!("the live log {lo}..={hi} has gaps"));
        }
        Ok(())
    }

    /// Where to find the bytes of every live entry in `range`, in index order.
    pub(crate) fn sources(&self, range: RangeInclusive<u64>) -> Result<Vec<(u64, Source)>, String> {
        self.entries
            .range(range)
            .map(|(&i, slot)| {
                let source = match (&slot.bytes, slot.loc) {
                    (Some(b), _) => Source::Memory(b.clone()),
                    (None, Some(loc)) => {
                        let file = self.files.get(&loc.segment).ok_or_else(|| {
                            format!("entry {i} is in segment {}, which is gone", loc.segment)
                        })?;
                        Source::Disk(file.clone(), loc)
                    }
                    (None, None) => unreachable!("an unsynced entry keeps its bytes"),
                };
                Ok((i, source))
            })
            .collect()
    }

    /// Bytes of synced entries held in memory (for tests of the bound).
    #[cfg(test)]
    pub(crate) fn cached_bytes(&self) -> usize {
        self.cached_bytes
    }

    /// Structural invariants, asserted in this crate's own tests after every change the writer
    /// makes: the cache accounting matches, and only synced entries may have left memory. It
    /// walks every live entry, so it is not run in other builds: in a debug build of the server
    /// a live log of 140,000 entries (crates/cli/tests/snapshot_stream.rs) made every group
    /// commit walk them all under the index lock, and the test crawled at ~50 entries/s.
    pub(crate) fn debug_check(&self) {
        if cfg!(test) {
            let mut bytes = 0;
            for i in &self.cached {
                let slot = &self.entries[i];
                assert!(slot.loc.is_some(), "cached entry {i} is synced");
                bytes += slot.bytes.as_ref().map_or(0, |b| b.len());
            }
            assert_eq!(bytes, self.cached_bytes, "cache accounting");
            for (i, slot) in &self.entries {
                assert!(
                    slot.bytes.is_some() || slot.loc.is_some(),
                    "entry {i} is somewhere"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(i: u64) -> Loc {
        Loc {
            segment: 1,
            offset: i * 100,
            len: 10,
        }
    }

    #[test]
    fn appends_that_would_leave_a_gap_are_refused() {
        let mut idx = Index::<u64>::new(1 << 20);
        assert!(idx.check_append(5).is_ok(), "an empty log starts anywhere");
        for i in 5..=7 {
            idx.append(1, i, i, Arc::from(&b"x"[..]));
        }
        assert!(idx.check_append(8).is_ok());
        assert!(idx.check_append(6).is_ok(), "overwrite");
        assert!(idx.check_append(9).is_err());
        assert!(idx.check_append(4).is_err());
        idx.purge(10, 10);
        assert!(idx.entries.is_empty());
        assert!(idx.check_append(10).is_err());
        assert!(idx.check_append(12).is_err());
        assert!(idx.check_append(11).is_ok());
    }

    #[test]
    fn an_append_over_an_entry_drops_the_entries_after_it() {
        let mut idx = Index::<u64>::new(1 << 20);
        for i in 5..=7 {
            idx.append(1, i, i, Arc::from(&b"x"[..]));
        }
        idx.append(2, 6, 60, Arc::from(&b"y"[..]));
        assert_eq!(idx.entries.keys().copied().collect::<Vec<_>>(), [5, 6]);
        assert_eq!(idx.entries[&6].log_id, 60);
        assert_eq!(idx.last_index(), Some(6));
    }

    #[test]
    fn the_tail_cache_keeps_the_newest_synced_entries_within_its_bound() {
        let mut idx = Index::<u64>::new(30);
        for i in 1..=5 {
            idx.append(i, i, i, Arc::from(&[0u8; 10][..]));
        }
        assert_eq!(idx.cached_bytes(), 0, "unsynced bytes are not the cache's");
        let synced: Vec<Synced> = (1..=5)
            .map(|i| Synced {
                index: i,
                seq: i,
                loc: loc(i),
            })
            .collect();
        idx.synced(&synced);
        idx.debug_check();
        assert_eq!(idx.cached_bytes(), 30);
        let in_memory: Vec<u64> = idx
            .sources(3..=5)
            .unwrap()
            .into_iter()
            .filter(|(_, s)| matches!(s, Source::Memory(_)))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(in_memory, [3, 4, 5]);
        // Entries 1 and 2 are on disk, in a segment the index has no handle of here.
        assert!(idx.sources(1..=1).is_err());
        idx.truncate(4);
        idx.debug_check();
        assert_eq!(idx.cached_bytes(), 10);
    }

    #[test]
    fn a_sync_of_an_overwritten_entry_does_not_move_the_newer_one() {
        let mut idx = Index::<u64>::new(1 << 20);
        idx.append(1, 1, 1, Arc::from(&b"old"[..]));
        idx.append(2, 1, 1, Arc::from(&b"new"[..]));
        idx.synced(&[Synced {
            index: 1,
            seq: 1,
            loc: loc(1),
        }]);
        idx.debug_check();
        assert!(
            idx.entries[&1].loc.is_none(),
            "the newer write is not synced yet"
        );
    }

    #[test]
    fn replay_accepts_a_start_after_the_checkpoint_purge_point_but_checks_the_end() {
        let mut idx = Index::<u64>::new(1 << 20);
        idx.purge(20, 20);
        idx.replay_entry(101, 101, loc(101), b"e").unwrap();
        idx.replay_entry(102, 102, loc(102), b"e").unwrap();
        assert!(idx.replay_entry(104, 104, loc(104), b"e").is_err());
        assert!(
            idx.check_replayed().is_err(),
            "entries 21..=100 are missing"
        );
        idx.purge(100, 100);
        idx.check_replayed().unwrap();
    }
}
