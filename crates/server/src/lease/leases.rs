//! Session leases, as the leader keeps them.
//!
//! Every member tracks a deadline per session (the apply observer adds and removes sessions as
//! entries apply), but only the leader's deadlines mean anything, and only the leader proposes
//! expiries.
//!
//! Safety rests on one inequality: the leader's deadline for a session is never earlier than
//! the client's own. The client counts from the *send* time of its last acknowledged renewal;
//! the leader from the *arrival* time of that renewal, which is later.
//!
//! Failover. A new leader cannot know when the old one last renewed a session (keepalives do
//! not write the log), so it must restart the lease at a full TTL, unless the session carries a
//! lease *mark* in the log: `MarkLeases` records that the session had gone unrenewed for `u`
//! when the mark was proposed, and while a mark stands the leader renews that session only
//! through the log (`RenewLeases`). A standing mark therefore proves "no renewal since", and the
//! new leader gives the session only its remaining `TTL − u` (stretched for clock drift),
//! counted from when it applied the mark, which is after the mark was made.
//!
//! The leader marks a session when half its TTL passes without renewal, and marks every session
//! when it takes office. So however often leaders change, a session whose client is gone
//! expires within `TTL/2 + election + TTL (+ one more election if its deadline falls while
//! there is no leader)` of its last renewal: a leader that dies just before marking leaves the
//! next one no mark, so that one restarts the lease at a full TTL, and every later leader
//! resumes from its mark. That is within 2 × TTL when the TTL is at least about twice the
//! election time (the 15 s default is; etcd issues #9888/#9395 describe the unbounded version).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use latchkey_core::{limits, Op, Outcome, SessionId, SessionInfo};

use crate::probe::Plant;
use tokio::time::Instant;

// Clone, Eq and Hash: the lease model (crates/lease-model) keeps a `Leases` per member in its
// states; ordered collections keep those states deterministic.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub struct Leases {
    sessions: BTreeMap<SessionId, LeaseRecord>,
    /// Sessions whose expiry has been proposed and not yet applied: a keepalive can no longer
    /// save them, because the expiry entry may already be committed.
    expiring: BTreeSet<SessionId>,
    /// Sessions this leader marked whose mark is not yet committed. Their marks are computed
    /// afresh each time they are proposed (never re-sent stale), until one commits.
    unlogged_marks: BTreeSet<SessionId>,
    /// The term in which this node, as leader, resumed every lease ([`Leases::resume`]). Only
    /// then do its deadlines mean anything: a keepalive of any other term is told to retry.
    resumed_term: Option<u64>,
    /// Fixed bugs put back on purpose, for the checkers' own tests.
    plant: Plant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct LeaseRecord {
    ttl: Duration,
    deadline: Instant,
    /// This leader has proposed (or inherited) a mark for the session: renew through the log.
    marked: bool,
    /// The mark standing in the applied state: unrenewed for this long when marked, and the
    /// local time this member applied the mark (or, for a mark it found in an installed
    /// snapshot or at start-up, the time it found it: later than the mark was made).
    applied_mark: Option<(Duration, Instant)>,
    /// Arrival time of the last renewal this node granted (as a confirmed leader, in any
    /// term). A new term never moves the deadline before it plus the TTL.
    renewed_at: Option<Instant>,
}

/// What a keepalive may do for one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renew {
    /// Renewed in memory; answer alive.
    Renewed,
    /// A mark may stand in the log: renew through a `RenewLeases` entry first.
    NeedsLog,
    /// Unknown here, or its expiry is under way.
    Gone,
    /// This node has not resumed the leases of the term the keepalive was confirmed in (it was
    /// just elected and has not applied the old leader's tail yet, or just lost office): the
    /// client must ask again.
    NotResumed,
}

/// Stretch a duration measured on another member's clock so that it is not shorter in real
/// time on ours: both clocks may be off by `CLOCK_DRIFT_PPM_MAX`.
fn stretched(d: Duration) -> Duration {
    d + d * (2 * limits::CLOCK_DRIFT_PPM_MAX) as u32 / 1_000_000
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl Leases {
    pub fn new(plant: Plant) -> Leases {
        Leases {
            plant,
            ..Leases::default()
        }
    }

    /// A session was created (an entry applied): its lease starts now.
    pub fn created(&mut self, id: SessionId, ttl_ms: u64, now: Instant) {
        let ttl = Duration::from_millis(ttl_ms);
        self.sessions.insert(
            id,
            LeaseRecord {
                ttl,
                deadline: now + ttl,
                marked: false,
                applied_mark: None,
                renewed_at: None,
            },
        );
    }

    /// Keeps the lease table in step with one entry applied at `now` (the apply observer's
    /// part, `waiters.rs`; the lease model calls it too): a created session gets its lease,
    /// every op that ends a session ends its lease (else the leader would propose its expiry
    /// at its old deadline, and, that finding it gone, keep it as expiring), and marks and
    /// logged renewals are applied.
    pub fn applied(&mut self, op: &Op, outcome: &Outcome, now: Instant) {
        match (op, outcome) {
            // Owned or not: every created session gets its lease.
            (_, Outcome::SessionCreated { id, ttl_ms }) => self.created(*id, *ttl_ms, now),
            (Op::CloseSession { session }, Outcome::SessionClosed) => self.removed(session.id),
            (Op::RevokeSession { session, .. }, Outcome::SessionRevoked { .. }) => {
                self.removed(*session)
            }
            (Op::ExpireSessions { .. }, Outcome::SessionsExpired { ids }) => {
                for id in ids {
                    self.removed(*id);
                }
            }
            (Op::MarkLeases { marks }, Outcome::LeasesMarked { .. }) => {
                for (id, unrenewed_ms) in marks {
                    self.mark_applied(*id, *unrenewed_ms, now);
                }
            }
            (Op::RenewLeases { .. }, Outcome::LeasesRenewed { ids }) => {
                for id in ids {
                    self.renew_applied(*id);
                }
            }
            _ => {}
        }
    }

    /// A session recovered at start-up (from a snapshot), with the mark it carries.
    pub fn recovered(&mut self, id: SessionId, ttl_ms: u64, mark_ms: Option<u64>, now: Instant) {
        self.created(id, ttl_ms, now);
        if let Some(u) = mark_ms {
            self.mark_applied(id, u, now);
        }
    }

    /// The state machine installed a snapshot: the table was replaced without entries. The
    /// lease table becomes a function of the installed table: exactly its sessions, each with
    /// the mark the table carries (found `now`, so counted from `now`: later, never earlier),
    /// and nothing this node applied before the install. A mark applied here and lifted by a
    /// `RenewLeases` this node never applied would otherwise stand, and a later term would
    /// resume the lease from it and expire a live session (issue #9, bug 1).
    pub fn installed(&mut self, live: impl IntoIterator<Item = SessionInfo>, now: Instant) {
        if self.plant.stale_mark_after_install {
            self.reconcile_keeping_marks(live, now);
            return;
        }
        let mut sessions = BTreeMap::new();
        for s in live {
            let renewed_at = self.sessions.get(&s.id).and_then(|l| l.renewed_at);
            let ttl = Duration::from_millis(s.ttl_ms);
            sessions.insert(
                s.id,
                LeaseRecord {
                    ttl,
                    deadline: now + ttl,
                    marked: false,
                    applied_mark: s.lease_mark_ms.map(|u| (Duration::from_millis(u), now)),
                    renewed_at,
                },
            );
        }
        self.sessions = sessions;
        self.expiring.clear();
        self.unlogged_marks.clear();
        // Only a follower installs snapshots; a leader's resumed term cannot survive one.
        self.resumed_term = None;
    }

    /// The pre-fix reconcile, kept only for the planted bug: add missing sessions, drop gone
    /// ones, keep every known session's old mark.
    fn reconcile_keeping_marks(
        &mut self,
        live: impl IntoIterator<Item = SessionInfo>,
        now: Instant,
    ) {
        let mut seen = BTreeSet::new();
        for s in live {
            seen.insert(s.id);
            if !self.sessions.contains_key(&s.id) {
                self.recovered(s.id, s.ttl_ms, s.lease_mark_ms, now);
            }
        }
        self.sessions.retain(|id, _| seen.contains(id));
        self.expiring.retain(|id| seen.contains(id));
        self.unlogged_marks.retain(|id| seen.contains(id));
    }

    /// Make the lease table hold exactly the table's sessions, each with the table's mark. The
    /// apply observer keeps the two in step entry by entry and [`Leases::installed`] after a
    /// snapshot, so this changes nothing unless something was missed; it runs as a node takes
    /// office, as a last line. A mark that differs from the table's is taken from the table,
    /// counted from `now`; a matching one keeps the time it was applied.
    pub fn reconcile(&mut self, live: impl IntoIterator<Item = SessionInfo>, now: Instant) {
        if self.plant.stale_mark_after_install {
            self.reconcile_keeping_marks(live, now);
            return;
        }
        let mut seen = BTreeSet::new();
        for s in live {
            seen.insert(s.id);
            match self.sessions.get_mut(&s.id) {
                None => self.recovered(s.id, s.ttl_ms, s.lease_mark_ms, now),
                Some(l) => {
                    let want = s.lease_mark_ms.map(Duration::from_millis);
                    if l.applied_mark.map(|(u, _)| u) != want {
                        tracing::warn!(session = %s.id, "lease mark out of step with the table; taken from the table");
                        l.applied_mark = want.map(|u| (u, now));
                    }
                }
            }
        }
        self.sessions.retain(|id, _| seen.contains(id));
        self.expiring.retain(|id| seen.contains(id));
        self.unlogged_marks.retain(|id| seen.contains(id));
    }

    /// This node, leader of `term`, has applied every entry up to its own first entry of the
    /// term (so every mark and logged renewal the old leaders committed): reconcile with the
    /// table and restart every lease ([`Leases::restart_all`]). Keepalives confirmed in `term`
    /// are renewed from now on.
    ///
    /// Returns how many sessions had a mark here that their table does not carry (or the
    /// other way round) before the reconcile: what a missed snapshot rebuild would leave.
    pub fn resume(
        &mut self,
        term: u64,
        live: impl IntoIterator<Item = SessionInfo>,
        now: Instant,
    ) -> usize {
        let live: Vec<SessionInfo> = live.into_iter().collect();
        let stale = live
            .iter()
            .filter(|s| {
                self.sessions
                    .get(&s.id)
                    .is_some_and(|l| l.applied_mark.map(|(u, _)| ms(u)) != s.lease_mark_ms)
            })
            .count();
        self.reconcile(live, now);
        self.restart_all(now);
        self.resumed_term = Some(term);
        stale
    }

    /// How long each session's lease has left at `now`, by session (for the simulation's
    /// probe: one element per session).
    pub fn remaining(&self, now: Instant) -> Vec<(SessionId, Duration)> {
        self.sessions
            .iter()
            .map(|(id, l)| (*id, l.deadline.saturating_duration_since(now)))
            .collect()
    }

    /// This node is no longer the leader that resumed the leases.
    pub fn stepped_down(&mut self) {
        self.resumed_term = None;
    }

    /// The term whose leases this node resumed, if it leads.
    pub fn resumed_term(&self) -> Option<u64> {
        self.resumed_term
    }

    /// A session left the table (closed or expired).
    pub fn removed(&mut self, id: SessionId) {
        self.sessions.remove(&id);
        self.expiring.remove(&id);
        self.unlogged_marks.remove(&id);
    }

    /// A `MarkLeases` entry applied here at `now`.
    pub fn mark_applied(&mut self, id: SessionId, unrenewed_ms: u64, now: Instant) {
        if let Some(l) = self.sessions.get_mut(&id) {
            l.applied_mark = Some((Duration::from_millis(unrenewed_ms), now));
        }
    }

    /// A `RenewLeases` entry applied here.
    pub fn renew_applied(&mut self, id: SessionId) {
        if let Some(l) = self.sessions.get_mut(&id) {
            l.applied_mark = None;
        }
    }

    /// This node just became leader. Restart every unmarked lease at a full TTL from now
    /// (extend, never cut short); give a marked one its remaining time from its mark. Every
    /// session is then marked by this leader; [`Leases::marks_to_log`] gives the marks to
    /// propose.
    pub fn restart_all(&mut self, now: Instant) {
        self.expiring.clear();
        self.unlogged_marks.clear();
        for (id, l) in self.sessions.iter_mut() {
            let resumed = match l.applied_mark {
                Some((unrenewed, applied_at)) => {
                    applied_at + stretched(l.ttl.saturating_sub(unrenewed))
                }
                None => now + l.ttl,
            };
            l.deadline = match l.renewed_at {
                Some(r) => resumed.max(r + l.ttl),
                None => resumed,
            };
            l.marked = true;
            self.unlogged_marks.insert(*id);
        }
    }

    /// The marks to propose now: every session this leader marked whose mark has not committed,
    /// with how long it has gone unrenewed as of `now`. At most `LEASE_MARK_BATCH_MAX`.
    pub fn marks_to_log(&self, now: Instant) -> Vec<(SessionId, u64)> {
        let mut marks: Vec<(SessionId, u64)> = self
            .unlogged_marks
            .iter()
            .filter_map(|id| self.sessions.get(id).map(|l| (id, l)))
            .filter(|(_, l)| l.marked)
            .map(|(id, l)| {
                let left = l.deadline.saturating_duration_since(now);
                (*id, ms(l.ttl.saturating_sub(left)))
            })
            .collect();
        marks.sort();
        marks.truncate(limits::LEASE_MARK_BATCH_MAX);
        marks
    }

    /// These marks committed.
    pub fn marks_logged(&mut self, marks: &[(SessionId, u64)]) {
        for (id, _) in marks {
            self.unlogged_marks.remove(id);
        }
    }

    /// A keepalive that arrived at `arrived`, after leadership was confirmed in `term`.
    pub fn renew(&mut self, id: SessionId, arrived: Instant, term: u64) -> Renew {
        if self.resumed_term != Some(term) {
            return Renew::NotResumed;
        }
        if self.expiring.contains(&id) {
            return Renew::Gone;
        }
        match self.sessions.get_mut(&id) {
            None => Renew::Gone,
            Some(l) if l.marked => Renew::NeedsLog,
            Some(l) => {
                // Never move a deadline backwards: a slow keepalive that arrives after a newer
                // one must not shorten the lease.
                l.deadline = l.deadline.max(arrived + l.ttl);
                l.renewed_at = Some(l.renewed_at.map_or(arrived, |r| r.max(arrived)));
                Renew::Renewed
            }
        }
    }

    /// A `RenewLeases` entry for the session committed: renew it and lift this leader's mark.
    pub fn renew_logged(&mut self, id: SessionId, arrived: Instant) -> bool {
        if self.expiring.contains(&id) {
            return false;
        }
        match self.sessions.get_mut(&id) {
            None => false,
            Some(l) => {
                l.marked = false;
                self.unlogged_marks.remove(&id);
                l.deadline = l.deadline.max(arrived + l.ttl);
                l.renewed_at = Some(l.renewed_at.map_or(arrived, |r| r.max(arrived)));
                true
            }
        }
    }

    /// Mark the unmarked sessions that have gone unrenewed for half their TTL (their marks are
    /// then among [`Leases::marks_to_log`]).
    pub fn mark_stale(&mut self, now: Instant) {
        for (id, l) in self.sessions.iter_mut() {
            let left = l.deadline.saturating_duration_since(now);
            if !l.marked && left * 2 <= l.ttl {
                l.marked = true;
                self.unlogged_marks.insert(*id);
            }
        }
    }

    /// Take the sessions whose deadline has passed and mark them expiring. At most
    /// `EXPIRE_BATCH_MAX` at a time.
    pub fn take_expired(&mut self, now: Instant) -> Vec<SessionId> {
        let mut out: Vec<SessionId> = self
            .sessions
            .iter()
            .filter(|(id, l)| l.deadline <= now && !self.expiring.contains(id))
            .map(|(id, _)| *id)
            .take(limits::EXPIRE_BATCH_MAX)
            .collect();
        out.sort();
        self.expiring.extend(out.iter().copied());
        out
    }

    /// An expiry proposal failed (e.g. we lost leadership): the sessions are not expiring.
    pub fn expiry_failed(&mut self, ids: &[SessionId]) {
        for id in ids {
            self.expiring.remove(id);
        }
    }

    /// The earliest deadline of a session not already expiring, to sleep until.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.sessions
            .iter()
            .filter(|(id, _)| !self.expiring.contains(id))
            .map(|(_, l)| l.deadline)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: SessionId = SessionId(1);

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    /// The table's view of the lease table's sessions (as a node taking office reads it).
    fn table_of(l: &Leases) -> Vec<SessionInfo> {
        l.sessions
            .iter()
            .map(|(id, s)| SessionInfo {
                id: *id,
                ttl_ms: ms(s.ttl),
                lease_mark_ms: s.applied_mark.map(|(u, _)| ms(u)),
            })
            .collect()
    }

    /// Take office in the next term with the table agreeing with the lease table.
    fn take_office(l: &mut Leases, term: &mut u64, now: Instant) {
        *term += 1;
        let live = table_of(l);
        l.resume(*term, live, now);
    }

    #[test]
    fn a_new_leader_restarts_an_unmarked_lease_at_a_full_ttl() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        let mut term = 0;
        l.created(S, 1_000, t0);
        // Just before the deadline a new leader takes over: the lease runs a full TTL again.
        take_office(&mut l, &mut term, at(t0, 900));
        assert_eq!(l.marks_to_log(at(t0, 900)), vec![(S, 0)]);
        assert!(l.take_expired(at(t0, 1_800)).is_empty());
        assert_eq!(l.take_expired(at(t0, 1_900)), vec![S]);
    }

    #[test]
    fn a_new_leader_gives_a_marked_lease_only_its_remaining_time() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        let mut term = 0;
        l.created(S, 10_000, t0);
        // The old leader marked the session unrenewed for 6 s; this member applied it at 6 s.
        l.mark_applied(S, 6_000, at(t0, 6_000));
        take_office(&mut l, &mut term, at(t0, 9_000));
        // Remaining 4 s from the mark, stretched by the drift allowance (2 %): 10.08 s.
        assert!(l.take_expired(at(t0, 10_000)).is_empty());
        assert_eq!(l.take_expired(at(t0, 10_100)), vec![S]);
    }

    #[test]
    fn repeated_leader_changes_do_not_keep_a_dead_session_alive() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        let mut term = 0;
        l.created(S, 10_000, t0);
        // Leaders change every 3 s; each marks every session as it takes office and the marks
        // reach the log and are applied right away.
        let mut now = at(t0, 3_000);
        let mut expired_at = None;
        for _ in 0..20 {
            take_office(&mut l, &mut term, now);
            let marks = l.marks_to_log(now);
            l.marks_logged(&marks);
            for (id, u) in marks {
                l.mark_applied(id, u, now);
            }
            if !l.take_expired(now).is_empty() {
                expired_at = Some(now);
                break;
            }
            now += Duration::from_millis(3_000);
        }
        let expired_at = expired_at.expect("the session expired");
        assert!(
            expired_at <= at(t0, 2 * 10_000),
            "expired {:?} after the last renewal",
            expired_at - t0
        );
    }

    /// Office taken at `t0` and every session's first mark lifted by a logged renewal at `t0`:
    /// a leader in steady state.
    fn steady_leader(ttl_ms: u64, t0: Instant) -> (Leases, u64) {
        let mut l = Leases::default();
        let mut term = 0;
        l.created(S, ttl_ms, t0);
        take_office(&mut l, &mut term, t0);
        let marks = l.marks_to_log(t0);
        l.marks_logged(&marks);
        assert!(l.renew_logged(S, t0));
        (l, term)
    }

    #[test]
    fn a_new_term_never_cuts_short_a_renewal_this_node_granted() {
        let t0 = Instant::now();
        let (mut l, mut term) = steady_leader(10_000, t0);
        // Renewed here at 8 s as leader; another leader then marked it unrenewed for 6 s (its
        // clock), and this node applied the mark at 6 s... then took office again.
        assert_eq!(l.renew(S, at(t0, 8_000), term), Renew::Renewed);
        l.mark_applied(S, 6_000, at(t0, 6_000));
        l.stepped_down();
        take_office(&mut l, &mut term, at(t0, 8_100));
        assert!(l.take_expired(at(t0, 17_999)).is_empty());
    }

    #[test]
    fn a_marked_session_renews_only_through_the_log() {
        let t0 = Instant::now();
        let (mut l, term) = steady_leader(1_000, t0);
        l.mark_stale(at(t0, 400));
        assert!(l.marks_to_log(at(t0, 400)).is_empty());
        l.mark_stale(at(t0, 500));
        assert_eq!(l.marks_to_log(at(t0, 500)), vec![(S, 500)]);
        assert_eq!(l.renew(S, at(t0, 600), term), Renew::NeedsLog);
        assert!(l.renew_logged(S, at(t0, 600)));
        // Renewed through the log before its mark committed: the mark is not proposed at all.
        assert!(l.marks_to_log(at(t0, 600)).is_empty());
        assert_eq!(l.renew(S, at(t0, 700), term), Renew::Renewed);
        assert!(l.take_expired(at(t0, 1_650)).is_empty());
    }

    /// Regression: a new leader's first mark proposal can fail ("not the leader" a moment after
    /// the election); its marks were then never written, so a quick second failover restarted
    /// those leases at a full TTL. Uncommitted marks are now proposed again, computed afresh.
    #[test]
    fn a_mark_that_failed_to_commit_is_proposed_again_with_a_fresh_value() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        let mut term = 0;
        l.created(S, 10_000, t0);
        take_office(&mut l, &mut term, at(t0, 1_000));
        assert_eq!(l.marks_to_log(at(t0, 1_000)), vec![(S, 0)]);
        // The proposal failed: nothing was logged. A tick later the mark is still due, and it
        // says how long the session has gone unrenewed by then.
        assert_eq!(l.marks_to_log(at(t0, 1_300)), vec![(S, 300)]);
        l.marks_logged(&[(S, 300)]);
        assert!(l.marks_to_log(at(t0, 1_400)).is_empty());
    }

    /// Regression: a follower that caught up through an installed snapshot never saw the
    /// snapshot's sessions created (no entries were applied), so as leader it had no lease for
    /// them and they never expired.
    #[test]
    fn taking_office_adds_sessions_only_the_table_knows_and_drops_gone_ones() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        l.created(SessionId(5), 1_000, t0);
        let live = [SessionInfo {
            id: S,
            ttl_ms: 1_000,
            lease_mark_ms: None,
        }];
        l.resume(1, live, at(t0, 100));
        assert_eq!(l.take_expired(at(t0, 1_100)), vec![S]);
        assert!(
            l.take_expired(at(t0, 5_000)).is_empty(),
            "session 5 is gone"
        );
    }

    #[test]
    fn a_late_keepalive_does_not_move_the_deadline_back() {
        let t0 = Instant::now();
        let (mut l, term) = steady_leader(1_000, t0);
        assert_eq!(l.renew(S, at(t0, 400), term), Renew::Renewed);
        assert_eq!(l.renew(S, at(t0, 100), term), Renew::Renewed);
        assert!(l.take_expired(at(t0, 1_350)).is_empty());
    }

    #[test]
    fn an_expiring_session_cannot_be_renewed_until_the_expiry_fails() {
        let t0 = Instant::now();
        let (mut l, term) = steady_leader(1_000, t0);
        let later = at(t0, 1_000);
        assert_eq!(l.take_expired(later), vec![S]);
        assert_eq!(l.renew(S, later, term), Renew::Gone);
        assert!(!l.renew_logged(S, later));
        // The same session is not proposed twice while its expiry is in flight.
        assert!(l.take_expired(later).is_empty());
        l.expiry_failed(&[S]);
        assert_eq!(l.renew(S, later, term), Renew::Renewed);
    }

    /// A follower applied a new leader's mark at 1 s, fell behind before the `RenewLeases` that
    /// lifted it, caught up at 60 s by a snapshot whose table has no mark, and took office at
    /// 61 s. Returns its leases then.
    fn elected_after_installing_past_a_lifted_mark(plant: Plant, t0: Instant) -> Leases {
        let mut l = Leases::new(plant);
        l.created(S, 10_000, t0);
        l.mark_applied(S, 0, at(t0, 1_000));
        let installed = [SessionInfo {
            id: S,
            ttl_ms: 10_000,
            lease_mark_ms: None,
        }];
        l.installed(installed, at(t0, 60_000));
        l.resume(7, installed, at(t0, 61_000));
        l
    }

    /// Regression (issue #9, bug 1): elected after such an install, a node resumed the lease
    /// from the stale mark (applied a minute earlier) and expired the live session at once.
    #[test]
    fn a_snapshot_install_drops_a_mark_the_installed_table_does_not_have() {
        let t0 = Instant::now();
        let mut l = elected_after_installing_past_a_lifted_mark(Plant::default(), t0);
        assert!(
            l.take_expired(at(t0, 61_000 + 9_999)).is_empty(),
            "a live session expired from a mark the table no longer has"
        );
        assert_eq!(l.take_expired(at(t0, 71_000)), vec![S]);
    }

    /// The planted version of bug 1 is really the bug (the switch the checkers' tests use).
    #[test]
    fn the_planted_stale_mark_expires_the_session_at_once() {
        let t0 = Instant::now();
        let plant = Plant {
            stale_mark_after_install: true,
            ..Plant::default()
        };
        let mut l = elected_after_installing_past_a_lifted_mark(plant, t0);
        assert_eq!(l.take_expired(at(t0, 61_000)), vec![S]);
    }

    /// A snapshot whose table carries a mark gives the lease only its remaining time, counted
    /// from the install (later than the mark was made).
    #[test]
    fn a_mark_found_in_an_installed_snapshot_counts_from_the_install() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        let installed = [SessionInfo {
            id: S,
            ttl_ms: 10_000,
            lease_mark_ms: Some(4_000),
        }];
        l.installed(installed, at(t0, 1_000));
        l.resume(2, installed, at(t0, 2_000));
        // 6 s left from 1 s, stretched by 2 %: 7.12 s.
        assert!(l.take_expired(at(t0, 7_100)).is_empty());
        assert_eq!(l.take_expired(at(t0, 7_200)), vec![S]);
    }

    /// Issue #9: between winning an election and resuming the leases, a keepalive confirmed in
    /// the new term is neither renewed (a previous leader's mark may stand) nor answered gone.
    #[test]
    fn a_keepalive_before_the_term_resumed_is_told_to_retry() {
        let t0 = Instant::now();
        let (mut l, term) = steady_leader(10_000, t0);
        l.stepped_down();
        assert_eq!(l.renew(S, at(t0, 100), term), Renew::NotResumed);
        assert_eq!(l.renew(S, at(t0, 100), term + 1), Renew::NotResumed);
        assert_eq!(
            l.renew(SessionId(99), at(t0, 100), term + 1),
            Renew::NotResumed
        );
        let live = table_of(&l);
        l.resume(term + 1, live, at(t0, 200));
        assert_eq!(l.renew(S, at(t0, 300), term), Renew::NotResumed);
        assert_eq!(l.renew(S, at(t0, 300), term + 1), Renew::NeedsLog);
    }
}
