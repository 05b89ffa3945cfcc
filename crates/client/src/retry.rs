//! Retry budget and exponential backoff with jitter.

use std::time::Duration;

use latchkey_core::limits;
use rand::Rng;

/// How one logical request is retried on UNAVAILABLE and transport errors. Both bounds apply:
/// whichever is reached first ends the retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first one included.
    pub attempts_max: u32,
    /// Time from the first attempt after which no new attempt starts.
    pub elapsed_max: Duration,
    /// The shorter time after which no new attempt starts while no attempt has reached a
    /// server (every name failed to resolve, every connection was refused or timed out): an
    /// election answers "no leader yet", a dead or misspelled endpoint does not answer.
    pub unreachable_max: Duration,
    /// Backoff before the second attempt; doubles after each failure.
    pub backoff_initial: Duration,
    /// Cap of the doubling.
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    /// Sized to ride out a leader election (about 1 s, see
    /// `limits::LEADERLESS_MS_MAX_DEFAULT`) and a quick restart of a single node, to find a
    /// new leader soon after its election (`limits::CLIENT_BACKOFF_MS_MAX`), and to give up well
    /// within a human's patience when the cluster is really down.
    fn default() -> Self {
        RetryPolicy {
            attempts_max: limits::CLIENT_ATTEMPTS_MAX,
            elapsed_max: Duration::from_millis(limits::CLIENT_RETRY_ELAPSED_MS_MAX),
            unreachable_max: Duration::from_millis(limits::CLIENT_UNREACHABLE_MS_MAX),
            backoff_initial: Duration::from_millis(limits::CLIENT_BACKOFF_MS_INITIAL),
            backoff_max: Duration::from_millis(limits::CLIENT_BACKOFF_MS_MAX),
        }
    }
}

/// The delays of one retry sequence.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(policy: &RetryPolicy) -> Backoff {
        Backoff {
            next: policy.backoff_initial,
            max: policy.backoff_max.max(policy.backoff_initial),
        }
    }

    /// The ceiling of the next delay, before jitter.
    #[cfg(test)]
    pub(crate) fn ceiling(&self) -> Duration {
        self.next
    }

    /// The next delay: uniformly in `[ceiling/2, ceiling]` ("equal jitter"), so that clients
    /// that failed together do not retry together, yet each waits at least half the step.
    pub(crate) fn next_delay(&mut self, rng: &mut impl Rng) -> Duration {
        let ceiling = self.next;
        self.next = (self.next * 2).min(self.max);
        let half = ceiling / 2;
        let jitter_ns = rng.random_range(0..=(ceiling - half).as_nanos() as u64);
        half + Duration::from_nanos(jitter_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn delays_double_up_to_the_cap_and_stay_within_jitter_bounds() {
        let policy = RetryPolicy {
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_millis(400),
            ..RetryPolicy::default()
        };
        for seed in 0..100 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut backoff = Backoff::new(&policy);
            let ceilings = [50, 100, 200, 400, 400, 400];
            for ceiling_ms in ceilings {
                let ceiling = Duration::from_millis(ceiling_ms);
                assert_eq!(backoff.ceiling(), ceiling);
                let d = backoff.next_delay(&mut rng);
                assert!(d >= ceiling / 2 && d <= ceiling, "{d:?} for {ceiling:?}");
            }
        }
    }

    #[test]
    fn jitter_spreads_delays() {
        let policy = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(7);
        let delays: std::collections::HashSet<Duration> = (0..20)
            .map(|_| Backoff::new(&policy).next_delay(&mut rng))
            .collect();
        assert!(delays.len() > 10, "jitter should vary: {delays:?}");
    }

    #[test]
    fn default_budget_rides_out_an_election() {
        // The backoff alone before the budget runs out must exceed a 3 s election.
        let policy = RetryPolicy::default();
        let mut backoff = Backoff::new(&policy);
        let mut total_min = Duration::ZERO;
        for _ in 1..policy.attempts_max {
            total_min += backoff.ceiling() / 2;
            let _ = backoff.next_delay(&mut rand::rng());
        }
        assert!(total_min >= Duration::from_secs(3), "{total_min:?}");
        assert!(total_min <= policy.elapsed_max);
    }
}
