//! Writes that were submitted to the writer but whose transaction has not committed yet.
//!
//! openraft requires appended entries to be readable as soon as `append` returns, but durable
//! only when the callback fires. A redb read transaction sees committed data only, so readers
//! merge the committed file with this overlay. Every change carries the sequence number of its
//! request; once the writer commits everything up to sequence `s`, it calls [`Pending::committed`]
//! to drop what the file now holds.
//!
//! The visible log is: file entries with `index < cut` (all of them if there is no cut) and
//! `index > purged`, then the overlay entries on top. The overlay is built so that this view is
//! the same before and after a commit, and before and after the clean-up that follows it; that is
//! what lets a reader take the overlay and a read transaction in either order relative to the
//! writer, as long as it takes both under the lock.

use std::collections::BTreeMap;
use std::ops::Bound;

/// A pending change, tagged with the sequence number of the request that made it.
#[derive(Clone, Debug)]
pub(crate) struct Tagged<T> {
    pub(crate) seq: u64,
    pub(crate) value: T,
}

#[derive(Debug)]
pub(crate) struct Pending<L> {
    /// Sequence number the next request gets. Requests enter the channel in this order.
    pub(crate) next_seq: u64,
    /// Appended entries not yet committed, already encoded (the bytes the file will hold).
    pub(crate) entries: BTreeMap<u64, Tagged<(L, Vec<u8>)>>,
    /// A pending truncation hides file entries at and after this index. The tag is the newest
    /// truncation since the cut was made: the cut may go only when that one is committed.
    pub(crate) cut: Option<Tagged<u64>>,
    /// A pending purge hides file entries up to and including this log id's index.
    pub(crate) purged: Option<Tagged<(L, u64)>>,
    /// A pending `save_committed`, already encoded.
    pub(crate) committed: Option<Tagged<Vec<u8>>>,
    /// Set once a write transaction failed: the file and the overlay no longer agree, so every
    /// later request fails with this message rather than write after a hole.
    pub(crate) failed: Option<String>,
}

impl<L: Clone> Pending<L> {
    pub(crate) fn new() -> Self {
        Pending {
            next_seq: 1,
            entries: BTreeMap::new(),
            cut: None,
            purged: None,
            committed: None,
            failed: None,
        }
    }

    pub(crate) fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    pub(crate) fn append(&mut self, seq: u64, index: u64, log_id: L, bytes: Vec<u8>) {
        self.entries.insert(
            index,
            Tagged {
                seq,
                value: (log_id, bytes),
            },
        );
    }

    /// Removes every entry at or after `from`.
    pub(crate) fn truncate(&mut self, seq: u64, from: u64) {
        self.entries.split_off(&from);
        let from = match &self.cut {
            // File entries at and after the old cut stay hidden; the new truncation must also be
            // committed before the cut can go, or the file would show entries it still holds.
            Some(cut) => cut.value.min(from),
            None => from,
        };
        self.cut = Some(Tagged { seq, value: from });
    }

    /// Removes every entry up to and including `index`.
    pub(crate) fn purge(&mut self, seq: u64, log_id: L, index: u64) {
        self.entries = self.entries.split_off(&index.saturating_add(1));
        self.purged = Some(Tagged {
            seq,
            value: (log_id, index),
        });
    }

    pub(crate) fn save_committed(&mut self, seq: u64, bytes: Vec<u8>) {
        self.committed = Some(Tagged { seq, value: bytes });
    }

    /// Everything up to and including `seq` is now in the file.
    pub(crate) fn committed(&mut self, seq: u64) {
        if self.cut.as_ref().is_some_and(|c| c.seq <= seq) {
            self.cut = None;
        }
        // Entries at or after a cut that is still pending must stay: the cut hides their copies
        // in the file.
        let cut = self.cut.as_ref().map_or(u64::MAX, |c| c.value);
        self.entries.retain(|&index, e| e.seq > seq || index >= cut);
        if self.purged.as_ref().is_some_and(|p| p.seq <= seq) {
            self.purged = None;
        }
        if self.committed.as_ref().is_some_and(|c| c.seq <= seq) {
            self.committed = None;
        }
    }

    /// The file entries a reader may show: below the cut and above the pending purge.
    pub(crate) fn file_bounds(&self) -> (Bound<u64>, Bound<u64>) {
        let low = match &self.purged {
            Some(p) => Bound::Excluded(p.value.1),
            None => Bound::Unbounded,
        };
        let high = match &self.cut {
            Some(c) => Bound::Excluded(c.value),
            None => Bound::Unbounded,
        };
        (low, high)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model file: what the writer has committed so far.
    fn view(file: &BTreeMap<u64, u8>, p: &Pending<u64>) -> Vec<(u64, u8)> {
        let bounds = p.file_bounds();
        let mut out: BTreeMap<u64, u8> = file
            .iter()
            .filter(|(k, _)| std::ops::RangeBounds::contains(&bounds, *k))
            .map(|(&k, &v)| (k, v))
            .collect();
        for (&k, e) in &p.entries {
            out.insert(k, e.value.1[0]);
        }
        out.into_iter().collect()
    }

    #[derive(Clone, Debug)]
    enum Op {
        Append(u64, u8),
        Truncate(u64),
        Purge(u64),
    }

    fn apply_to_file(file: &mut BTreeMap<u64, u8>, op: &Op) {
        match *op {
            Op::Append(i, v) => {
                file.insert(i, v);
            }
            Op::Truncate(from) => {
                file.split_off(&from);
            }
            Op::Purge(upto) => {
                *file = file.split_off(&(upto + 1));
            }
        }
    }

    /// Submits `ops` in order. `commits` holds `(submitted, upto)` pairs: once `submitted` ops
    /// are in, the writer commits the first `upto` of them (a lagging writer), then cleans up.
    /// After every step the merged view must equal a store that applied every op at once.
    fn check(ops: &[Op], commits: &[(usize, usize)]) {
        let mut file = BTreeMap::new();
        let mut truth = BTreeMap::new();
        let mut p = Pending::<u64>::new();
        let mut committed_upto = 0;
        let expect = |truth: &BTreeMap<u64, u8>| truth.clone().into_iter().collect::<Vec<_>>();
        for (n, op) in ops.iter().enumerate() {
            let seq = p.take_seq();
            match *op {
                Op::Append(i, v) => p.append(seq, i, i, vec![v]),
                Op::Truncate(from) => p.truncate(seq, from),
                Op::Purge(upto) => p.purge(seq, upto, upto),
            }
            apply_to_file(&mut truth, op);
            assert_eq!(view(&file, &p), expect(&truth), "after op {n}");
            for &(_, upto) in commits.iter().filter(|(submitted, _)| *submitted == n + 1) {
                for op in &ops[committed_upto..upto] {
                    apply_to_file(&mut file, op);
                }
                committed_upto = committed_upto.max(upto);
                assert_eq!(
                    view(&file, &p),
                    expect(&truth),
                    "{commits:?}: commit {upto}"
                );
                p.committed(upto as u64);
                assert_eq!(view(&file, &p), expect(&truth), "{commits:?}: clean {upto}");
            }
        }
    }

    #[test]
    fn view_is_stable_across_commits_of_truncations_and_purges() {
        use Op::*;
        let ops = [
            Append(1, 1),
            Append(2, 2),
            Append(3, 3),
            Truncate(2),
            Append(2, 12),
            Append(3, 13),
            Append(4, 14),
            Truncate(4),
            Append(4, 24),
            Purge(1),
            Truncate(3),
            Append(3, 33),
            Append(4, 34),
        ];
        let n = ops.len();
        // Every schedule of two lagging commits, then the rest.
        for s1 in 1..=n {
            for u1 in 1..=s1 {
                for s2 in s1..=n {
                    for u2 in u1..=s2 {
                        check(&ops, &[(s1, u1), (s2, u2), (n, n)]);
                    }
                }
            }
        }
    }

    /// A truncation at a higher index than a pending cut keeps the cut until it commits too;
    /// letting the cut go with the first one would show entries the second one removed.
    #[test]
    fn later_truncation_keeps_the_cut_until_it_commits() {
        use Op::*;
        let ops = [
            Append(7, 1),
            Append(8, 1),
            Append(9, 1),
            Append(10, 1),
            Truncate(7),
            Append(7, 2),
            Append(8, 2),
            Append(9, 2),
            Append(10, 2),
            Append(11, 2),
            Truncate(10),
        ];
        // The writer commits the first truncation and the appends after it, not the second.
        check(&ops, &[(11, 10), (11, 11)]);
    }
}
