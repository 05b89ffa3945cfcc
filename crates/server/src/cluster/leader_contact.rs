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
}

impl Default for LeaderContact {
    /// Counts as heard now: a member that just started has had no time to hear from anyone.
    fn default() -> Self {
        LeaderContact {
            start: Instant::now(),
            heard_ms: AtomicU64::new(0),
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
}
