//! When this member last heard from its Raft group's leader.
//!
//! openraft tells a leader when a quorum last acknowledged it (`last_quorum_acked`), but tells
//! a follower nothing of the kind, and a member removed from its group may believe to its end
//! that it follows the leader that removed it: Raft never tells it, and that leader sends it
//! nothing more. Such a member, like one cut off from the rest, applies nothing new, and a
//! `watch` through it would stay silent, its progress messages saying "nothing happened"
//! while the group goes on. The peer service stamps every append (heartbeats included) and
//! snapshot that this member's Raft core accepts from a leader; [`crate::node::Node`]'s
//! `out_of_touch_for` reads the stamp (or, on a leader, the quorum's last acknowledgement), and a
//! quiet watch stream on a member without a leader for longer than
//! `limits::WATCH_OUT_OF_TOUCH_FAILOVERS` failovers ends, so that its client resumes on another
//! member.
//!
//! It also keeps where the leader it last heard from serves the HTTP API (issue #33): a
//! leader's appends carry it (`peer_auth::HTTP_ADDR_HEADER`), and a follower forwards HTTP
//! requests there (`api/http/forward.rs`). Kept with the sender's id and read only for the id
//! that Raft names leader, so an address heard from anyone else is never used.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The last time a leader's append or snapshot was accepted here (or this member stopped
/// leading), in milliseconds since `start` (the runtime's clock: the simulation's own under
/// turmoil).
#[derive(Debug)]
pub struct LeaderContact {
    start: Instant,
    heard_ms: AtomicU64,
    /// The last leader heard from that sent its HTTP address: (its id, `HOST:PORT`).
    leader_http: std::sync::Mutex<Option<(u64, String)>>,
}

impl Default for LeaderContact {
    /// Counts as heard now: a member that just started has had no time to hear from anyone.
    fn default() -> Self {
        LeaderContact {
            start: Instant::now(),
            heard_ms: AtomicU64::new(0),
            leader_http: Default::default(),
        }
    }
}

impl LeaderContact {
    /// A leader's append or snapshot was accepted just now.
    pub fn heard(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        // Appends are answered from several tasks: never move the stamp back.
        self.heard_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Leader `id`'s accepted append said it serves HTTP at `addr`.
    pub fn heard_http(&self, id: u64, addr: Option<String>) {
        let mut known = self.leader_http.lock().expect("leader http lock");
        match addr {
            Some(addr) => *known = Some((id, addr)),
            // A leader restarted without `--http-listen` serves no HTTP.
            None if known.as_ref().is_some_and(|(known, _)| *known == id) => *known = None,
            None => {}
        }
    }

    /// Where member `id` serves HTTP, if it is the last leader heard from that said so.
    pub fn http_of(&self, id: u64) -> Option<String> {
        let known = self.leader_http.lock().expect("leader http lock");
        known
            .as_ref()
            .filter(|(known, _)| *known == id)
            .map(|(_, addr)| addr.clone())
    }

    /// How long ago the last one was.
    pub fn since(&self) -> Duration {
        let heard = Duration::from_millis(self.heard_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(heard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_time_since_contact_grows_until_a_leader_is_heard_again() {
        let contact = LeaderContact::default();
        assert_eq!(contact.since(), Duration::ZERO);
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert_eq!(contact.since(), Duration::from_millis(1_500));
        contact.heard();
        assert_eq!(contact.since(), Duration::ZERO);
        tokio::time::advance(Duration::from_millis(700)).await;
        assert_eq!(contact.since(), Duration::from_millis(700));
    }

    #[test]
    fn a_leaders_http_address_is_given_only_for_that_leader() {
        let contact = LeaderContact::default();
        assert_eq!(contact.http_of(1), None);
        contact.heard_http(1, Some("h:7480".into()));
        assert_eq!(contact.http_of(1).as_deref(), Some("h:7480"));
        assert_eq!(contact.http_of(2), None, "not the member that said so");
        contact.heard_http(2, None);
        assert_eq!(contact.http_of(1).as_deref(), Some("h:7480"));
        contact.heard_http(1, None);
        assert_eq!(contact.http_of(1), None);
    }
}
