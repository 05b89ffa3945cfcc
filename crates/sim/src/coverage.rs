//! What lease states a run reached: a seed count proves nothing unless the seeds reach the
//! states a bug needs. Each count names the state and the bug (issue #9) that needs it; the CI
//! test asserts that its seeds reached every one.

use std::collections::BTreeMap;
use std::fmt;

use latchkey_core::{Mode, Op};
use latchkey_server::ProbeEvent;

use crate::history::{ElectionKind, ElectionRet, HistoryData};

/// Counts of the lease states one run (or several, summed) reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Snapshots a follower installed from the leader.
    pub snapshot_installs: usize,
    /// Leases resumed by a leader that had installed a snapshot since it last resumed them
    /// (or since it started): the state bug 1 needs (a mark applied before the install).
    pub resumed_after_install: usize,
    /// Sessions whose lease mark a resuming leader held differently from its table: exactly
    /// bug 1's stale mark. Always 0 unless that bug is planted (the fixed code rebuilds the
    /// lease table on every install), so the CI test asserts 0, and a plant hunt reads it to
    /// see whether a seed reached the bug's state at all.
    pub stale_marks_at_resume: usize,
    /// Leases resumed by a leader that, when it began its term, had not yet learned that a
    /// `MarkLeases` or `RenewLeases` of an earlier term committed (so had not applied it): the
    /// state bug 2 needs.
    pub resumed_before_lease_write_applied: usize,
    /// Of those, leases resumed by a leader that, when it began its term, had not learned that
    /// a `RenewLeases` of an earlier term committed: resumed at once, a lease would start from
    /// the mark that renewal lifted, though the old leader acknowledged the renewal to the
    /// client (bug 2 exactly, once the leader resumes before applying it).
    pub elected_before_renewal_applied: usize,
    /// Leases resumed while a committed `RenewLeases` of an earlier term was not yet applied
    /// here (the resuming leader's applied index was below it): bug 2 itself. Always 0 unless
    /// that bug is planted (the fixed code resumes only after applying its own first entry of
    /// the term), so the CI test asserts 0, and the planted bug's test asserts it was reached.
    pub resumed_with_renewal_unapplied: usize,
    /// Leader changes after the first leader resumed the leases.
    pub failovers: usize,
    /// Sessions renewed through the log (`RenewLeases` committed), summed.
    pub logged_renewals: usize,
    /// Sessions the cluster expired.
    pub sessions_expired: usize,
    /// Waits that ended at their wait timeout on the server (0 until the server reports them).
    pub wait_expiries: usize,
    /// Leader transfers a leader started (issue #16's rebalance, several groups only).
    pub transfers_started: usize,
    /// Of those, transfers whose named successor was the next member to resume the leases:
    /// a leader change by transfer, which skips the followers' leader lease.
    pub transfers_completed: usize,
    /// Requests a member outside the group answered with a hint to one of its replicas
    /// (replica subsets, `RunConfig::replicas`).
    pub sent_to_replica: usize,
    /// Keepalives that reached a node believing it led in a term below that of a leader that
    /// had already resumed the leases: the state a renewal without a quorum's confirmation
    /// needs (`Plant::renew_without_quorum`), the deposed leader extending leases its
    /// successor's clock already runs. The fixed code refuses them (it confirms leadership
    /// with a quorum after the keepalive arrived).
    pub keepalives_at_deposed_leader: usize,
    /// Grants of issue #32's primitives held across a failover (a new leader resumed the
    /// leases while its client believed it held it: between the answer and its last hold
    /// check): a reader's, a writer's of a read-write lock that also had readers, a permit's.
    /// What the checkers of those primitives need, to judge them across a change of leader
    /// (a new leader rebuilding the holders and queue from the log).
    pub readers_across_failover: usize,
    pub writers_across_failover: usize,
    pub permits_across_failover: usize,
    /// Lock-delays (issue #32 item 4, `RunConfig::lock_delay`) started by a delayed grant
    /// lost to its session's expiry, whose name was then granted to a waiter that asked before
    /// the delay could end: what the `lock_delay` checker judges (a grant during the delay).
    pub delays_then_waiter_granted: usize,
    /// Of those, the delays across which a new leader resumed the leases (between the loss and
    /// the waiter's grant): a delay timed afresh by a new leader.
    pub delays_across_failover: usize,
    /// Terms of an election (issue #32 item 1, `RunConfig::elections`): campaigns that won.
    pub election_terms: usize,
    /// Of those, the terms across which a new leader resumed the leases (between the win's
    /// answer and the leader's last check that it led): a leader that a new Raft leader
    /// rebuilt from the log, with its value and its queue of candidates.
    pub elections_across_failover: usize,
    /// Proclaims the server refused as `not-election-leader` (a term that had ended): the
    /// state a proclaim accepted past its term needs (`TablePlant::proclaim_past_term`).
    pub proclaims_refused: usize,
    /// Reads of the leader that returned a term after one of its proclaims was acknowledged:
    /// what "reads do not go back within a term" judges.
    pub reads_after_a_proclaim: usize,
    /// Reads of the leader answered while a term surely lasted over their whole interval:
    /// what "a lasting term is seen" judges (a read finding no leader there is a violation).
    pub reads_in_a_lasting_term: usize,
    /// Committed `Op::Batch` entries (issue #35: the leader's coalescing, `RunConfig::coalesce`),
    /// each of whose operations the checkers read as an entry of its own
    /// (`history::ops_in`).
    pub batch_entries: usize,
    /// Of those, the entries of two or more operations: operations of different clients that
    /// one entry applied (the leader proposes an operation gathered alone as itself, so every
    /// batch entry it makes has two or more; counted apart so that the requirement says so).
    pub batch_entries_of_several: usize,
    /// The `Batch` calls of two or more operations the clients sent (issue #35's client
    /// coalescing, `RunConfig::client_batch`): operations of different sessions of one client
    /// in one call, each answered as its own (`HistoryData::client_batches_of_several`; set for
    /// the whole run, not by [`Coverage::measure`] of a group).
    pub client_batches_of_several: usize,
    /// The operations in committed batch entries, summed.
    pub batched_ops: usize,
    /// Snapshots a member asked openraft for because the operations applied since its last
    /// snapshot reached `snapshot_every_entries` (issue #35's snapshots by operations, with
    /// the leader's coalescing on: `ProbeEvent::SnapshotAskedByOperations`). 0 means the
    /// trigger in `Node::lease_duties` never ran, and the snapshots the seeds built were all
    /// openraft's own, by entries.
    pub snapshots_asked_by_ops: usize,
    /// Of those asks, the ones after which the member built a snapshot itself (its count of
    /// operations went back with no snapshot installed on it since the ask:
    /// `ProbeEvent::SnapshotTakenAfterAsk`). A snapshot built after the ask, whether for it or
    /// by openraft's own policy in the meantime: the ask is not told apart from that.
    pub snapshots_built_after_ask: usize,
}

impl Coverage {
    pub fn measure(h: &HistoryData) -> Coverage {
        let mut c = Coverage::default();
        // Per node: a snapshot installed since it last resumed the leases.
        let mut installed_since_led: BTreeMap<u64, bool> = BTreeMap::new();
        let mut resumed_terms: usize = 0;
        // The last transfer started and not yet followed by a resume: (term, successor).
        let mut transferring: Option<(u64, u64)> = None;
        // The highest term whose leader resumed the leases so far.
        let mut resumed_term: u64 = 0;
        // Per node: asked for a snapshot by operations, and whether one was installed since.
        let mut asked_by_ops: BTreeMap<u64, bool> = BTreeMap::new();
        for p in &h.probed {
            match &p.event {
                ProbeEvent::SnapshotInstalled { .. } => {
                    c.snapshot_installs += 1;
                    installed_since_led.insert(p.node, true);
                    if let Some(installed) = asked_by_ops.get_mut(&p.node) {
                        *installed = true;
                    }
                }
                ProbeEvent::SnapshotAskedByOperations { .. } => {
                    c.snapshots_asked_by_ops += 1;
                    asked_by_ops.insert(p.node, false);
                }
                ProbeEvent::SnapshotTakenAfterAsk => {
                    if asked_by_ops.remove(&p.node) == Some(false) {
                        c.snapshots_built_after_ask += 1;
                    }
                }
                ProbeEvent::LeasesResumed {
                    term,
                    applied_index,
                    stale_marks,
                    ..
                } => {
                    resumed_terms += 1;
                    resumed_term = resumed_term.max(*term);
                    if let Some((from_term, to)) = transferring {
                        if *term > from_term {
                            c.transfers_completed += usize::from(p.node == to);
                            transferring = None;
                        }
                    }
                    c.stale_marks_at_resume += stale_marks;
                    if installed_since_led.insert(p.node, false) == Some(true) {
                        c.resumed_after_install += 1;
                    }
                    if unapplied_at_term_start(h, *term, p.node, any_lease_write) {
                        c.resumed_before_lease_write_applied += 1;
                    }
                    if unapplied_at_term_start(h, *term, p.node, renewal) {
                        c.elected_before_renewal_applied += 1;
                    }
                    if h.committed
                        .range(applied_index + 1..)
                        .any(|(_, e)| e.leader.0 < *term && e.ops().any(renewal))
                    {
                        c.resumed_with_renewal_unapplied += 1;
                    }
                }
                ProbeEvent::LeasesRenewedThroughLog { sessions } => {
                    c.logged_renewals += sessions.len()
                }
                ProbeEvent::SessionsExpired { sessions } => c.sessions_expired += sessions.len(),
                ProbeEvent::WaitsExpired { count } => c.wait_expiries += count,
                ProbeEvent::LeaderTransferStarted { term, to } => {
                    c.transfers_started += 1;
                    transferring = Some((*term, *to));
                }
                ProbeEvent::SentToReplica { .. } => c.sent_to_replica += 1,
                ProbeEvent::KeepAliveAtLeader { term } => {
                    c.keepalives_at_deposed_leader += usize::from(*term < resumed_term)
                }
            }
        }
        c.failovers = resumed_terms.saturating_sub(1);
        for entry in h.committed.values() {
            if let Some(Op::Batch(ops)) = &entry.op {
                c.batch_entries += 1;
                c.batch_entries_of_several += usize::from(ops.len() >= 2);
                c.batched_ops += ops.len();
            }
        }
        c.count_primitives_across_failover(h);
        c.count_delays(h);
        c.count_elections(h);
        c
    }

    fn count_elections(&mut self, h: &HistoryData) {
        if h.elections.is_empty() {
            return;
        }
        let failovers_at = Self::failovers_at(h);
        for term in crate::checkers::election_terms(h).into_values().flatten() {
            self.election_terms += 1;
            let Some(until) = term.until else { continue };
            if failovers_at.iter().any(|&t| term.from < t && t <= until) {
                self.elections_across_failover += 1;
            }
        }
        self.proclaims_refused += (h.elections.iter())
            .filter(|e| {
                matches!(e.kind, ElectionKind::Proclaim { .. })
                    && matches!(e.ret, Some((ElectionRet::NotLeader, _)))
            })
            .count();
        let (after_proclaim, in_lasting_term) = crate::checkers::election_reads_judged(h);
        self.reads_after_a_proclaim += after_proclaim;
        self.reads_in_a_lasting_term += in_lasting_term;
    }

    /// Every resume of the leases but the first term's, in true time: a new leader.
    fn failovers_at(h: &HistoryData) -> Vec<std::time::Duration> {
        let mut first_term = None;
        let mut out = Vec::new();
        for p in &h.probed {
            if let ProbeEvent::LeasesResumed { term, .. } = p.event {
                match first_term {
                    None => first_term = Some(term),
                    Some(t) if term > t => out.push(p.at),
                    Some(_) => {}
                }
            }
        }
        out
    }

    fn count_delays(&mut self, h: &HistoryData) {
        let lost = crate::checkers::lost_delays(h);
        if lost.is_empty() {
            return;
        }
        let failovers_at = Self::failovers_at(h);
        for l in lost {
            let Some(next) = l.next else { continue };
            if next.invoked >= l.lost_at + l.delay {
                continue;
            }
            self.delays_then_waiter_granted += 1;
            if failovers_at
                .iter()
                .any(|&t| l.lost_at < t && t <= next.answered)
            {
                self.delays_across_failover += 1;
            }
        }
    }

    fn count_primitives_across_failover(&mut self, h: &HistoryData) {
        let failovers_at = Self::failovers_at(h);
        let with_modes = h.names_with_modes();
        for hold in h.holds() {
            if !failovers_at
                .iter()
                .any(|&t| hold.from < t && t <= hold.until)
            {
                continue;
            }
            match hold.mode {
                Mode::Shared => self.readers_across_failover += 1,
                Mode::Exclusive if with_modes.contains(&hold.lock) => {
                    self.writers_across_failover += 1
                }
                Mode::Exclusive => {}
                Mode::Permits(_) => self.permits_across_failover += 1,
            }
        }
    }

    /// Every count of `self` and `other` added.
    pub fn add(&mut self, other: &Coverage) {
        self.snapshot_installs += other.snapshot_installs;
        self.resumed_after_install += other.resumed_after_install;
        self.stale_marks_at_resume += other.stale_marks_at_resume;
        self.resumed_before_lease_write_applied += other.resumed_before_lease_write_applied;
        self.elected_before_renewal_applied += other.elected_before_renewal_applied;
        self.resumed_with_renewal_unapplied += other.resumed_with_renewal_unapplied;
        self.failovers += other.failovers;
        self.logged_renewals += other.logged_renewals;
        self.sessions_expired += other.sessions_expired;
        self.wait_expiries += other.wait_expiries;
        self.transfers_started += other.transfers_started;
        self.transfers_completed += other.transfers_completed;
        self.sent_to_replica += other.sent_to_replica;
        self.keepalives_at_deposed_leader += other.keepalives_at_deposed_leader;
        self.readers_across_failover += other.readers_across_failover;
        self.writers_across_failover += other.writers_across_failover;
        self.permits_across_failover += other.permits_across_failover;
        self.delays_then_waiter_granted += other.delays_then_waiter_granted;
        self.delays_across_failover += other.delays_across_failover;
        self.election_terms += other.election_terms;
        self.elections_across_failover += other.elections_across_failover;
        self.proclaims_refused += other.proclaims_refused;
        self.reads_after_a_proclaim += other.reads_after_a_proclaim;
        self.reads_in_a_lasting_term += other.reads_in_a_lasting_term;
        self.batch_entries += other.batch_entries;
        self.batch_entries_of_several += other.batch_entries_of_several;
        self.client_batches_of_several += other.client_batches_of_several;
        self.batched_ops += other.batched_ops;
        self.snapshots_asked_by_ops += other.snapshots_asked_by_ops;
        self.snapshots_built_after_ask += other.snapshots_built_after_ask;
    }
}

fn any_lease_write(op: &Op) -> bool {
    matches!(op, Op::MarkLeases { .. } | Op::RenewLeases { .. })
}

fn renewal(op: &Op) -> bool {
    matches!(op, Op::RenewLeases { .. })
}

/// Whether `node`, when it began `term`, had not learned that an entry of an earlier term
/// below its first entry, of the kind `kind` picks, committed.
fn unapplied_at_term_start(h: &HistoryData, term: u64, node: u64, kind: fn(&Op) -> bool) -> bool {
    let Some(start) = h
        .term_starts
        .iter()
        .find(|t| t.term == term && t.node == node)
    else {
        return false;
    };
    let applied = start.commit_index.unwrap_or(0);
    // A node whose log lost acknowledged entries (the planted storage bug) can know a commit
    // index at or past its own first entry of the term: nothing lies between.
    if applied + 1 >= start.first_index {
        return false;
    }
    h.committed
        .range(applied + 1..start.first_index)
        .any(|(_, c)| c.leader.0 < term && c.ops().any(kind))
}

impl fmt::Display for Coverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} snapshot installs, {} leases resumed after an install ({} stale marks), {} \
             resumed before a committed lease write was applied ({} before a renewal; {} with \
             it unapplied), {} failovers ({} by a leader transfer, of {} started), {} logged \
             renewals, {} sessions expired, {} wait expiries, {} clients sent to a replica, {} \
             keepalives at a deposed leader, held across a failover: {} readers, {} writers of \
             a read-write lock, {} permits",
            self.snapshot_installs,
            self.resumed_after_install,
            self.stale_marks_at_resume,
            self.resumed_before_lease_write_applied,
            self.elected_before_renewal_applied,
            self.resumed_with_renewal_unapplied,
            self.failovers,
            self.transfers_completed,
            self.transfers_started,
            self.logged_renewals,
            self.sessions_expired,
            self.wait_expiries,
            self.sent_to_replica,
            self.keepalives_at_deposed_leader,
            self.readers_across_failover,
            self.writers_across_failover,
            self.permits_across_failover
        )?;
        // Only with lock-delays in the run: a run without them reads as it did before.
        if self.delays_then_waiter_granted > 0 {
            write!(
                f,
                ", {} lock-delays followed by a waiter's grant ({} across a failover)",
                self.delays_then_waiter_granted, self.delays_across_failover
            )?;
        }
        // Likewise only with elections in the run.
        if self.election_terms > 0 {
            write!(
                f,
                ", {} election terms ({} across a failover), {} proclaims refused after their \
                 term, {} reads of a term after its proclaim, {} reads in a surely lasting term",
                self.election_terms,
                self.elections_across_failover,
                self.proclaims_refused,
                self.reads_after_a_proclaim,
                self.reads_in_a_lasting_term
            )?;
        }
        // Likewise only with batch entries in the run (coalescing, issue #35).
        if self.batch_entries > 0 {
            write!(
                f,
                ", {} batch entries committed ({} of two or more operations, {} operations)",
                self.batch_entries, self.batch_entries_of_several, self.batched_ops
            )?;
        }
        // And with the clients' batching (issue #35).
        if self.client_batches_of_several > 0 {
            write!(
                f,
                ", {} client Batch calls of two or more operations",
                self.client_batches_of_several
            )?;
        }
        // And with snapshots asked for by operations (coalescing, issue #35).
        if self.snapshots_asked_by_ops > 0 {
            write!(
                f,
                ", {} snapshots asked for by operations ({} built after the ask)",
                self.snapshots_asked_by_ops, self.snapshots_built_after_ask
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use latchkey_core::{Op, SessionId};
    use latchkey_server::ProbeEvent;

    use super::Coverage;
    use crate::history::{Committed, HistoryData, Probed, TermStart};

    fn probe(h: &mut HistoryData, node: u64, event: ProbeEvent) {
        h.probed.push(Probed {
            at: Duration::ZERO,
            node,
            event,
        });
    }

    /// Leases resumed by the leader of `term`, after applying nothing in particular.
    fn resumed(term: u64) -> ProbeEvent {
        ProbeEvent::LeasesResumed {
            term,
            applied_index: 0,
            stale_marks: 0,
            leases: Vec::new(),
        }
    }

    fn commit(h: &mut HistoryData, index: u64, term: u64, op: Op) {
        h.committed.insert(
            index,
            Committed {
                leader: (term, 1),
                op: Some(op),
                known_at: Duration::ZERO,
                digest: index,
                seen_by: 1,
            },
        );
    }

    #[test]
    fn counts_a_resume_after_an_install_once_per_install() {
        let mut h = HistoryData::default();
        probe(&mut h, 1, resumed(1));
        probe(&mut h, 2, ProbeEvent::SnapshotInstalled { last_index: 9 });
        probe(&mut h, 1, ProbeEvent::SnapshotInstalled { last_index: 9 });
        probe(&mut h, 2, resumed(2));
        probe(&mut h, 2, resumed(3));
        let c = Coverage::measure(&h);
        assert_eq!(
            (c.snapshot_installs, c.resumed_after_install, c.failovers),
            (2, 1, 2)
        );
    }

    #[test]
    fn counts_a_snapshot_after_an_ask_as_built_only_without_an_install_between() {
        let mut h = HistoryData::default();
        let ask = ProbeEvent::SnapshotAskedByOperations { ops: 40 };
        probe(&mut h, 1, ask.clone());
        probe(&mut h, 2, ask.clone());
        probe(&mut h, 2, ProbeEvent::SnapshotInstalled { last_index: 9 });
        probe(&mut h, 1, ProbeEvent::SnapshotTakenAfterAsk); // built by node 1
        probe(&mut h, 2, ProbeEvent::SnapshotTakenAfterAsk); // installed on node 2
        probe(&mut h, 3, ProbeEvent::SnapshotTakenAfterAsk); // no ask on node 3
        let c = Coverage::measure(&h);
        assert_eq!(
            (c.snapshots_asked_by_ops, c.snapshots_built_after_ask),
            (2, 1)
        );
    }

    #[test]
    fn counts_a_keepalive_at_a_leader_only_once_a_later_term_resumed_the_leases() {
        let mut h = HistoryData::default();
        let keepalive = |term| ProbeEvent::KeepAliveAtLeader { term };
        probe(&mut h, 1, resumed(1));
        probe(&mut h, 1, keepalive(1)); // the leader of the newest term
        probe(&mut h, 2, keepalive(2)); // elected, not yet resumed: not counted
        probe(&mut h, 2, resumed(2));
        probe(&mut h, 1, keepalive(1)); // deposed: counted
        probe(&mut h, 2, keepalive(2));
        probe(&mut h, 1, keepalive(1)); // counted
        assert_eq!(Coverage::measure(&h).keepalives_at_deposed_leader, 2);
    }

    #[test]
    fn counts_a_term_begun_before_the_old_leaders_lease_write_was_known_committed() {
        let mut h = HistoryData::default();
        commit(
            &mut h,
            5,
            1,
            Op::RenewLeases {
                ids: vec![SessionId(1)],
            },
        );
        let start = |node, commit_index| TermStart {
            term: 2,
            node,
            first_index: 6,
            commit_index,
            at: Duration::ZERO,
        };
        // Node 2 knew entry 5 committed; node 3 knew only up to 4.
        h.term_starts.push(start(2, Some(5)));
        h.term_starts.push(start(3, Some(4)));
        let resumed = ProbeEvent::LeasesResumed {
            term: 2,
            applied_index: 6,
            stale_marks: 0,
            leases: Vec::new(),
        };
        probe(&mut h, 2, resumed.clone());
        let c = Coverage::measure(&h);
        assert_eq!(
            (
                c.resumed_before_lease_write_applied,
                c.elected_before_renewal_applied
            ),
            (0, 0)
        );
        probe(&mut h, 3, resumed);
        let c = Coverage::measure(&h);
        assert_eq!(
            (
                c.resumed_before_lease_write_applied,
                c.elected_before_renewal_applied
            ),
            (1, 1)
        );
    }

    #[test]
    fn counts_a_resume_below_an_earlier_terms_committed_renewal() {
        let mut h = HistoryData::default();
        commit(
            &mut h,
            5,
            1,
            Op::RenewLeases {
                ids: vec![SessionId(1)],
            },
        );
        let resumed = |applied_index| ProbeEvent::LeasesResumed {
            term: 2,
            applied_index,
            stale_marks: 0,
            leases: Vec::new(),
        };
        // Node 2 resumed having applied its own first entry of the term (6), as the fixed
        // code does; node 3 resumed having applied only up to 4.
        probe(&mut h, 2, resumed(6));
        assert_eq!(Coverage::measure(&h).resumed_with_renewal_unapplied, 0);
        probe(&mut h, 3, resumed(4));
        assert_eq!(Coverage::measure(&h).resumed_with_renewal_unapplied, 1);
    }
}
