//! The seams through which a [`Client`](crate::Client) reads time, opens connections and draws
//! the jitter of its retries: [`ClientEnv`]. The default is the machine (tokio's monotonic
//! clock, TCP, OS-seeded randomness); the simulation (`latchkey-sim`) gives each simulated
//! client a drifting clock, turmoil's simulated TCP and a seeded generator, and so runs this
//! library, unchanged, against a simulated cluster.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::client::ClientConfig;

/// The client's monotonic clock. Every lease deadline of a session is measured on it.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time.
    fn now(&self) -> Instant;

    /// How long tokio's timers must run for `local` to pass on this clock. Timers run on
    /// tokio's clock; a clock that runs fast or slow converts here. The system clock is tokio's
    /// own: `local` unchanged.
    fn timer_duration(&self, local: Duration) -> Duration {
        local
    }
}

/// Tokio's monotonic clock (so paused-time tests work too).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// Sleeps until `clock` reads `at` (at once if it already does). Sleeps for durations rather
/// than until tokio instants, since `at` is an instant of `clock`, and checks the clock again
/// on waking: a timer may fire early on a clock that runs slow. Each sleep is at least tokio's
/// 1 ms timer tick: a converted remainder that rounds down to zero must not spin the loop
/// without letting time pass.
pub(crate) async fn sleep_until(clock: &dyn Clock, at: Instant) {
    loop {
        let now = clock.now();
        if now >= at {
            return;
        }
        let timer = clock.timer_duration(at - now).max(TIMER_TICK);
        tokio::time::sleep(timer).await;
    }
}

/// The resolution of tokio's timers.
const TIMER_TICK: Duration = Duration::from_millis(1);

/// Opens the channel to one endpoint.
pub trait Connector: Send + Sync + 'static {
    /// A lazily connected channel to `uri` (`http://host:port`, already validated): it must not
    /// fail when the endpoint is down; the first RPC on it does.
    fn channel(&self, uri: &str, config: &ClientConfig) -> Channel;
}

/// Plain TCP (HTTP/2 without TLS), with `config.connect_timeout` and no Nagle delay.
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    fn channel(&self, uri: &str, config: &ClientConfig) -> Channel {
        Endpoint::from_shared(uri.to_owned())
            .expect("endpoint URIs are validated before use")
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            .connect_lazy()
    }
}

/// Time, connections and randomness of a [`Client`](crate::Client).
#[derive(Clone)]
pub struct ClientEnv {
    pub clock: Arc<dyn Clock>,
    pub connector: Arc<dyn Connector>,
    /// Seed of the retry jitter; `None` draws one from the operating system.
    pub seed: Option<u64>,
}

impl Default for ClientEnv {
    fn default() -> Self {
        ClientEnv {
            clock: Arc::new(SystemClock),
            connector: Arc::new(TcpConnector),
            seed: None,
        }
    }
}

impl fmt::Debug for ClientEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientEnv")
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock that runs at half tokio's speed.
    struct Slow(Instant);

    impl Clock for Slow {
        fn now(&self) -> Instant {
            self.0 + (Instant::now() - self.0) / 2
        }
        fn timer_duration(&self, local: Duration) -> Duration {
            local * 2
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sleeping_on_a_slow_clock_takes_longer_in_tokio_time() {
        let clock = Slow(Instant::now());
        let start = Instant::now();
        let at = clock.now() + Duration::from_secs(1);
        sleep_until(&clock, at).await;
        assert!(clock.now() >= at);
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        // An instant already passed returns at once.
        sleep_until(&clock, at).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }
}
