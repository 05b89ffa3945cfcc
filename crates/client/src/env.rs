//! The seams through which a [`Client`](crate::Client) reads time, opens connections and draws
//! the jitter of its retries: [`ClientEnv`]. The default is the machine ([`BootClock`], TCP,
//! OS-seeded randomness); the simulation (`latchkey-sim`) gives each simulated
//! client a drifting clock, turmoil's simulated TCP and a seeded generator, and so runs this
//! library, unchanged, against a simulated cluster.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::client::ClientConfig;

/// The client's clock (monotonic: it never goes back). Every lease deadline of a session is measured on it.
pub trait ClientClock: Send + Sync + 'static {
    /// Monotonic time.
    fn now(&self) -> Instant;

    /// How long tokio's timers must run for `local` to pass on this clock. Timers run on
    /// tokio's clock; a clock that runs fast or slow converts here. The system clock is tokio's
    /// own: `local` unchanged.
    fn timer_duration(&self, local: Duration) -> Duration {
        local
    }
}

/// Tokio's monotonic clock (so paused-time tests work too). It stops while the machine is
/// suspended: a holder resuming from suspend would believe its lease younger than it is.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

/// The default clock of a [`ClientEnv`]: time that keeps running while the machine is
/// suspended, so that a holder resuming from suspend sees its lease deadline passed at once
/// (`is_lost()`), as the server does.
///
/// On Linux, `now()` is a tokio instant taken at creation plus the `CLOCK_BOOTTIME` time
/// elapsed since then (`CLOCK_BOOTTIME` counts suspended time, `CLOCK_MONOTONIC`, tokio's,
/// does not). On other platforms it is tokio's monotonic clock ([`SystemClock`]): whether that
/// counts suspended time depends on the platform (macOS's does not), so a holder there may
/// learn of a loss only from its next renewal after a suspend. Timers still run on tokio's
/// clock, so the background renewal wakes on its monotonic schedule after a resume.
#[derive(Debug, Clone, Copy)]
pub struct BootClock {
    base: Instant,
    #[cfg(target_os = "linux")]
    boot_base: Duration,
}

impl BootClock {
    pub fn new() -> BootClock {
        BootClock {
            base: Instant::now(),
            #[cfg(target_os = "linux")]
            boot_base: boot_time(),
        }
    }
}

impl Default for BootClock {
    fn default() -> Self {
        BootClock::new()
    }
}

#[cfg(target_os = "linux")]
fn boot_time() -> Duration {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .expect("CLOCK_BOOTTIME exists on every Linux since 2.6.39");
    Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
}

/// The instant of `base`'s clock at which `boot_now` reads on the boot clock, `base` having
/// been taken when it read `boot_base`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn boot_instant(base: Instant, boot_base: Duration, boot_now: Duration) -> Instant {
    base + boot_now.saturating_sub(boot_base)
}

impl ClientClock for BootClock {
    #[cfg(target_os = "linux")]
    fn now(&self) -> Instant {
        boot_instant(self.base, self.boot_base, boot_time())
    }

    #[cfg(not(target_os = "linux"))]
    fn now(&self) -> Instant {
        let _ = self.base;
        Instant::now()
    }
}

impl ClientClock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// Sleeps until `clock` reads `at` (at once if it already does). Sleeps for durations rather
/// than until tokio instants, since `at` is an instant of `clock`, and checks the clock again
/// on waking: a timer may fire early on a clock that runs slow. Each sleep is at least tokio's
/// 1 ms timer tick: a converted remainder that rounds down to zero must not spin the loop
/// without letting time pass.
pub(crate) async fn sleep_until(clock: &dyn ClientClock, at: Instant) {
    loop {
        let now = clock.now();
        if now >= at {
            return;
        }
        let timer = clock.timer_duration(at - now).max(TIMER_TICK);
        tokio::time::sleep(timer).await;
    }
}

/// The resolution of tokio's timers ([`latchkey_core::limits::CLIENT_TIMER_TICK_MS`]).
const TIMER_TICK: Duration = Duration::from_millis(latchkey_core::limits::CLIENT_TIMER_TICK_MS);

/// Opens the channel to one endpoint.
pub trait ClientConnector: Send + Sync + 'static {
    /// A lazily connected channel to `uri` (`http://host:port`, already validated): it must not
    /// fail when the endpoint is down; the first RPC on it does.
    fn channel(&self, uri: &str, config: &ClientConfig) -> Channel;

    /// Whether `https://` endpoints get TLS from this connector; a client refuses them when
    /// they would not (issue #13: they used to be dialed in plaintext without a word).
    fn speaks_tls(&self) -> bool {
        false
    }
}

/// Plain TCP (HTTP/2 without TLS), with `config.connect_timeout` and no Nagle delay.
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpConnector;

impl TcpConnector {
    /// The endpoint of `uri` with the settings every connection of the client gets.
    pub(crate) fn endpoint(uri: &str, config: &ClientConfig) -> Endpoint {
        Endpoint::from_shared(uri.to_owned())
            .expect("endpoint URIs are validated before use")
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            // Requests cancelled at their attempt deadline reset their streams; HTTP/2 remembers
            // only a few (h2: 10), and a late answer on a forgotten one counts as a peer error.
            // Past 1,024 such errors the connection is closed (ENHANCE_YOUR_CALM) and every
            // session on it fails at once: seen with 5,000 sessions on a busy node.
            .http2_max_concurrent_reset_streams(
                latchkey_core::limits::CLIENT_RESET_STREAMS_REMEMBERED,
            )
            // A stopped member, or one a partition cut off silently, is left within about 2 s
            // rather than at the attempt's deadline (see the limits).
            .http2_keep_alive_interval(Duration::from_millis(
                latchkey_core::limits::CLIENT_PING_INTERVAL_MS,
            ))
            .keep_alive_timeout(Duration::from_millis(
                latchkey_core::limits::CLIENT_PING_TIMEOUT_MS,
            ))
            .keep_alive_while_idle(false)
    }
}

impl ClientConnector for TcpConnector {
    fn channel(&self, uri: &str, config: &ClientConfig) -> Channel {
        TcpConnector::endpoint(uri, config).connect_lazy()
    }
}

/// Time, connections and randomness of a [`Client`](crate::Client).
#[derive(Clone)]
pub struct ClientEnv {
    pub clock: Arc<dyn ClientClock>,
    pub connector: Arc<dyn ClientConnector>,
    /// Seed of the retry jitter; `None` draws one from the operating system.
    pub seed: Option<u64>,
    /// Told the number of operations of every `Batch` call the client's coalescing sends
    /// (`ClientConfig::batch`), before it is sent: the simulation counts the calls that
    /// carried two or more. `None`: nobody is told.
    pub batch_sent: Option<BatchSent>,
}

/// See [`ClientEnv::batch_sent`].
pub type BatchSent = Arc<dyn Fn(usize) + Send + Sync>;

impl Default for ClientEnv {
    fn default() -> Self {
        ClientEnv {
            clock: Arc::new(BootClock::new()),
            connector: Arc::new(TcpConnector),
            seed: None,
            batch_sent: None,
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

    #[test]
    fn boot_time_maps_onto_instants_from_the_base() {
        let base = Instant::now();
        let boot_base = Duration::from_secs(1_000);
        assert_eq!(boot_instant(base, boot_base, boot_base), base);
        // An hour of suspend counts like any other hour.
        assert_eq!(
            boot_instant(base, boot_base, boot_base + Duration::from_secs(3_600)),
            base + Duration::from_secs(3_600)
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn boot_clock_starts_at_tokios_now_and_never_runs_behind_it() {
        let before = Instant::now();
        let clock = BootClock::new();
        let first = clock.now();
        assert!(first >= before);
        let second = clock.now();
        assert!(second >= first);
        // Without a suspend in between, boot time passes at least as fast as monotonic time
        // (it counts the same ticks plus suspended time); a broken mapping (a wrong base, a
        // unit slip) would land far off.
        let t = Instant::now();
        let b = clock.now();
        assert!(b + Duration::from_millis(50) >= t, "{b:?} {t:?}");
    }

    /// A clock that runs at half tokio's speed.
    struct Slow(Instant);

    impl ClientClock for Slow {
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
