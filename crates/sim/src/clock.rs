//! Per-host clocks and seeded randomness.
//!
//! Every host (server node or client) reads time through a [`DriftClock`]: turmoil's simulated
//! time, running faster or slower by a fixed rate within [`DRIFT_PPM_MAX`]. The monotonic clock
//! has no offset: a monotonic clock's absolute value means nothing across hosts (the server
//! sleeps for durations measured on its clock, `latchkey_server::clock::sleep_until`). The wall
//! clock, display only, gets an offset as well.

use std::sync::Mutex;
use std::time::Duration;

use latchkey_server::{Entropy, NodeClock};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// Every simulated host's clock runs off true time by at most this much, either way: the whole
/// drift the design assumes (`limits::CLOCK_DRIFT_PPM_MAX`, a test-independent bound with its
/// reason there), so that the runs reach the edges of what the lease rules must survive.
pub const DRIFT_PPM_MAX: i64 = latchkey_core::limits::CLOCK_DRIFT_PPM_MAX as i64;

/// Unix time at which every simulation starts (wall clocks are display only).
const EPOCH_MS: u64 = 1_700_000_000_000;

/// True time since the simulation started, the same for every host: what histories record.
pub fn true_now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// A clock that runs `drift_ppm` parts per million fast (or slow, if negative).
#[derive(Debug)]
pub struct DriftClock {
    /// Turmoil instant at which this clock was made; drift accumulates from here.
    origin: Instant,
    /// True time at `origin`.
    origin_true: Duration,
    drift_ppm: i64,
    wall_offset_ms: i64,
}

impl DriftClock {
    pub fn new(drift_ppm: i64, wall_offset_ms: i64) -> DriftClock {
        assert!(
            drift_ppm.abs() <= DRIFT_PPM_MAX,
            "drift beyond the documented bound"
        );
        DriftClock {
            origin: Instant::now(),
            origin_true: true_now(),
            drift_ppm,
            wall_offset_ms,
        }
    }

    /// `elapsed` true time as this clock measures it.
    fn skew(&self, elapsed: Duration) -> Duration {
        let nanos = elapsed.as_nanos() as i128;
        let skewed = nanos + nanos * self.drift_ppm as i128 / 1_000_000;
        Duration::from_nanos(skewed.max(0) as u64)
    }

    /// The true time at which this clock reads `local` (for an instant it gave out, such as a
    /// deadline the client library computed on it).
    pub fn true_time(&self, local: Instant) -> Duration {
        self.origin_true + self.true_duration(local.saturating_duration_since(self.origin))
    }

    /// The true duration this clock needs to measure `local` (to sleep on turmoil time).
    pub fn true_duration(&self, local: Duration) -> Duration {
        let nanos = local.as_nanos() as i128;
        Duration::from_nanos((nanos * 1_000_000 / (1_000_000 + self.drift_ppm as i128)) as u64)
    }
}

impl NodeClock for DriftClock {
    fn now(&self) -> Instant {
        self.origin + self.skew(Instant::now() - self.origin)
    }

    fn wall_ms(&self) -> u64 {
        let local = self.skew(true_now()).as_millis() as i64;
        (EPOCH_MS as i64 + self.wall_offset_ms + local).max(0) as u64
    }
}

/// The client library reads the same clock through its own seam.
impl latchkey_client::ClientClock for DriftClock {
    fn now(&self) -> Instant {
        <DriftClock as NodeClock>::now(self)
    }

    fn timer_duration(&self, local: Duration) -> Duration {
        self.true_duration(local)
    }
}

/// Session secrets from a seed.
#[derive(Debug)]
pub struct SeededEntropy(Mutex<StdRng>);

impl SeededEntropy {
    pub fn new(seed: u64) -> SeededEntropy {
        SeededEntropy(Mutex::new(StdRng::seed_from_u64(seed)))
    }
}

impl Entropy for SeededEntropy {
    fn next_u64(&self) -> u64 {
        self.0.lock().expect("entropy lock").random()
    }
}
