//! The seams through which the server reads time and draws random numbers.
//!
//! Lease decisions use the monotonic clock (`now`); the wall clock (`wall_ms`) is only stamped
//! into commands, by the leader, for display ("held for") and for wait timeouts (a waiter's end
//! is `now_ms + wait_ms` of its Acquire, decided in the table from the entry's time). A
//! follower reads its monotonic clock too: the apply observer notes when it applied a lease
//! mark, and start-up gives recovered sessions a lease from now, so that the lease table is
//! ready if this member is elected. A simulation replaces this with clocks that have their own
//! offset and drift (`DriftClock`, which implements the client's `ClientClock` too).
//!
//! Not the client's clock: [`NodeClock`] stamps wall time and never converts timer spans; the
//! client's `ClientClock` never stamps wall time and turns a span on its clock into a tokio
//! timer (`timer_duration`).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

pub trait NodeClock: Send + Sync + 'static {
    /// Monotonic time. Every lease deadline on the leader is measured on it.
    fn now(&self) -> Instant;
    /// Wall-clock Unix milliseconds, for display only.
    fn wall_ms(&self) -> u64;
}

/// The real clocks of the machine (tokio's `Instant`, so paused-time tests also work).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemNodeClock;

impl NodeClock for SystemNodeClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wall_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

pub type SharedClock = Arc<dyn NodeClock>;

/// Sleep until `clock` reads `deadline`. Timers run on tokio's clock, so sleep for the
/// *duration* left on `clock` rather than until the instant: an instant taken from a clock that
/// runs slow or fast would lie in tokio's past (a busy loop) or too far ahead.
pub async fn sleep_until(clock: &dyn NodeClock, deadline: Instant) {
    tokio::time::sleep(deadline.saturating_duration_since(clock.now())).await
}

/// Where the leader draws random numbers (session secrets). A simulation seeds it.
pub trait Entropy: Send + Sync + 'static {
    fn next_u64(&self) -> u64;
}

/// The operating system's randomness.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn next_u64(&self) -> u64 {
        rand::random()
    }
}

pub type SharedEntropy = Arc<dyn Entropy>;
