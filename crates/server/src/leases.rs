//! Session leases, as the leader keeps them.
//!
//! Every member tracks a deadline per session (the apply observer adds and removes sessions as
//! entries apply), but only the leader's deadlines mean anything: when a node becomes leader it
//! restarts every deadline at a full TTL from that moment (leases are extended across a
//! failover, never cut short), and only the leader proposes expiries.
//!
//! Safety rests on one inequality: the leader's deadline for a session is at least the client's
//! own. The client counts from the *send* time of its last acknowledged renewal; the leader
//! counts from the *arrival* time of that renewal, which is later.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use latchkey_core::{limits, SessionId};
use tokio::time::Instant;

#[derive(Debug, Default)]
pub struct Leases {
    sessions: HashMap<SessionId, Lease>,
    /// Sessions whose expiry has been proposed and not yet applied: a keepalive can no longer
    /// save them, because the expiry entry may already be committed.
    expiring: HashSet<SessionId>,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    ttl: Duration,
    deadline: Instant,
}

impl Leases {
    /// A session was created (an entry applied): its lease starts now.
    pub fn created(&mut self, id: SessionId, ttl_ms: u64, now: Instant) {
        let ttl = Duration::from_millis(ttl_ms);
        self.sessions.insert(
            id,
            Lease {
                ttl,
                deadline: now + ttl,
            },
        );
    }

    /// A session left the table (closed or expired).
    pub fn removed(&mut self, id: SessionId) {
        self.sessions.remove(&id);
        self.expiring.remove(&id);
    }

    /// This node just became leader: restart every lease at a full TTL from now, and forget any
    /// expiry an earlier term of ours proposed (it either applied, or it will be re-decided).
    pub fn restart_all(&mut self, now: Instant) {
        self.expiring.clear();
        for lease in self.sessions.values_mut() {
            lease.deadline = now + lease.ttl;
        }
    }

    /// Renew a session from a keepalive that arrived at `arrived`. False when the session is
    /// unknown here or its expiry is already under way.
    pub fn renew(&mut self, id: SessionId, arrived: Instant) -> bool {
        if self.expiring.contains(&id) {
            return false;
        }
        match self.sessions.get_mut(&id) {
            Some(lease) => {
                // Never move a deadline backwards: a slow keepalive that arrives after a newer
                // one must not shorten the lease.
                lease.deadline = lease.deadline.max(arrived + lease.ttl);
                true
            }
            None => false,
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

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
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

    #[test]
    fn restart_all_extends_and_never_shortens_a_lease() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        l.created(SessionId(1), 1_000, t0);
        // Just before the deadline a new leader takes over: the lease runs a full TTL again.
        l.restart_all(t0 + Duration::from_millis(900));
        assert!(l.take_expired(t0 + Duration::from_millis(1_500)).is_empty());
        assert_eq!(
            l.take_expired(t0 + Duration::from_millis(1_900)),
            vec![SessionId(1)]
        );
    }

    #[test]
    fn a_late_keepalive_does_not_move_the_deadline_back() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        l.created(SessionId(1), 1_000, t0);
        assert!(l.renew(SessionId(1), t0 + Duration::from_millis(500)));
        assert!(l.renew(SessionId(1), t0 + Duration::from_millis(100)));
        assert!(l.take_expired(t0 + Duration::from_millis(1_400)).is_empty());
    }

    #[test]
    fn an_expiring_session_cannot_be_renewed_until_the_expiry_fails() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        l.created(SessionId(7), 1_000, t0);
        let later = t0 + Duration::from_millis(1_000);
        assert_eq!(l.take_expired(later), vec![SessionId(7)]);
        assert!(!l.renew(SessionId(7), later));
        // The same session is not proposed twice while its expiry is in flight.
        assert!(l.take_expired(later).is_empty());
        l.expiry_failed(&[SessionId(7)]);
        assert!(l.renew(SessionId(7), later));
    }
}
