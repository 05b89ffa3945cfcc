//! [`RemovedMembers`]: the member ids a Raft group's membership changes took out, and when.
//!
//! A removed member keeps its credentials (its certificate naming `member-ID`, the cluster
//! secret), and a member takes messages from an authenticated sender outside its membership
//! when the message vouches for it (a leader's committed vote, a candidate's longer log), so
//! that a member that missed the change adding a member can still follow and elect it. Those
//! claims are the sender's own: a removed member could claim a higher committed vote and have
//! a follower install its snapshot. The record lets the peer service refuse a removed id
//! whatever its message claims (`PeerService::check_member` in the server), as etcd refuses
//! "a message from removed member".
//!
//! It is part of the replicated state: every member derives it from the same committed
//! membership entries (`LockStateMachine` applies them, in log order), and it is carried in
//! the snapshot file, so it survives a restart, a log purge and a snapshot install. An id is
//! recorded by the entry whose membership no longer has it (voter or learner) while the
//! previous one had it, and dropped again by a later entry that has it (`cluster add` of the
//! same id). Bounded by `limits::REMOVED_MEMBERS_MAX` (the oldest removal is forgotten first).

use std::collections::BTreeMap;

use latchkey_core::limits::REMOVED_MEMBERS_MAX;
use serde::{Deserialize, Serialize};

use crate::Membership;

/// Member ids removed from a group's membership, each with the log index of the membership
/// entry that removed it. At most [`REMOVED_MEMBERS_MAX`].
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedMembers {
    /// Member id -> the index of the entry that removed it.
    by_id: BTreeMap<u64, u64>,
}

impl RemovedMembers {
    /// The log index at which `id` was removed, if it was and was not added again since.
    pub fn removed_at(&self, id: u64) -> Option<u64> {
        self.by_id.get(&id).copied()
    }

    /// (id, index of its removal), by id.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_id.iter().map(|(id, at)| (*id, *at))
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Records the membership entry at `index` that changed `before` into `after`: an id of
    /// `before` (voter or learner, in any of its configs) that `after` has not is removed at
    /// `index`; an id `after` has is no longer removed (added again). Past the bound the oldest
    /// removals are forgotten, and returned (for a log line).
    pub fn record(&mut self, before: &Membership, after: &Membership, index: u64) -> Vec<u64> {
        for (id, _) in after.nodes() {
            self.by_id.remove(id);
        }
        for (id, _) in before.nodes() {
            if after.get_node(id).is_none() {
                self.by_id.insert(*id, index);
            }
        }
        self.trim()
    }

    /// A record of these (id, index) pairs, as they are (tests).
    #[cfg(test)]
    pub(crate) fn from_pairs(pairs: impl IntoIterator<Item = (u64, u64)>) -> RemovedMembers {
        RemovedMembers {
            by_id: pairs.into_iter().collect(),
        }
    }

    /// Forgets the oldest removals (lowest index, then lowest id) past the bound.
    fn trim(&mut self) -> Vec<u64> {
        let mut forgotten = Vec::new();
        while self.by_id.len() > REMOVED_MEMBERS_MAX {
            let oldest = self
                .by_id
                .iter()
                .min_by_key(|(id, at)| (**at, **id))
                .map(|(id, _)| *id)
                .expect("over the bound, so not empty");
            self.by_id.remove(&oldest);
            forgotten.push(oldest);
        }
        forgotten
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::Node;

    fn nodes(ids: &[u64]) -> BTreeMap<u64, Node> {
        ids.iter()
            .map(|id| {
                let addr = format!("127.0.0.1:{}", 7000 + id);
                (*id, Node { addr })
            })
            .collect()
    }

    /// `configs` (a joint membership when more than one), and `learners` beside their voters.
    fn membership(configs: &[&[u64]], learners: &[u64]) -> Membership {
        let mut all: Vec<u64> = configs.iter().flat_map(|c| c.iter().copied()).collect();
        all.extend(learners);
        let configs = configs
            .iter()
            .map(|c| c.iter().copied().collect::<BTreeSet<_>>())
            .collect();
        Membership::new(configs, nodes(&all)).unwrap()
    }

    fn voters(ids: &[u64]) -> Membership {
        membership(&[ids], &[])
    }

    #[test]
    fn an_id_the_next_membership_lacks_is_removed_at_that_entry_and_cleared_when_added_again() {
        let mut removed = RemovedMembers::default();
        assert!(removed
            .record(&Membership::default(), &voters(&[1, 2, 3]), 2)
            .is_empty());
        assert!(removed.is_empty(), "the first membership removes no one");
        // Joint consensus: the joint config still has 3; the uniform one after it does not.
        let joint = membership(&[&[1, 2, 3], &[1, 2]], &[]);
        removed.record(&voters(&[1, 2, 3]), &joint, 10);
        assert_eq!(
            removed.removed_at(3),
            None,
            "3 is still in the joint config"
        );
        removed.record(&joint, &voters(&[1, 2]), 11);
        assert_eq!(removed.removed_at(3), Some(11));
        assert_eq!(removed.removed_at(1), None);
        // Added again under the same id, as a learner first: a member again.
        let with_learner = membership(&[&[1, 2]], &[3]);
        removed.record(&voters(&[1, 2]), &with_learner, 20);
        assert_eq!(removed.removed_at(3), None);
        // Removing a learner records it too.
        removed.record(&with_learner, &voters(&[1, 2]), 21);
        assert_eq!(removed.removed_at(3), Some(21));
    }

    #[test]
    fn past_the_bound_the_oldest_removal_is_forgotten() {
        // Full, the oldest removal (lowest index) being id 100's.
        let mut removed = RemovedMembers::from_pairs(
            (0..REMOVED_MEMBERS_MAX as u64).map(|id| (id + 100, id + 1)),
        );
        let forgotten = removed.record(&voters(&[1, 2]), &voters(&[1]), 5_000);
        assert_eq!(forgotten, vec![100]);
        assert_eq!(removed.removed_at(100), None);
        assert_eq!(removed.removed_at(101), Some(2));
        assert_eq!(removed.removed_at(2), Some(5_000));
        assert_eq!(removed.len(), REMOVED_MEMBERS_MAX);
    }
}
