//! The run's watchdog: a simulation step that never returns (a host spinning without letting
//! simulated time advance) fails the run, with its seed's replay command, rather than hang CI.

use std::sync::Arc;
use std::time::Duration;

/// Wall-clock time one simulation step may take before the run is declared livelocked: some
/// host keeps itself busy without letting simulated time advance (a task that spins). In a real
/// process that is a core burning at 100 %.
const STEP_WALL_MAX: Duration = Duration::from_secs(60);

/// Fails the run (and the process: a step cannot be interrupted) when a step never returns.
/// Steps taken, the simulated time, the faults so far, and whether the run ended.
type WatchState = (u64, Duration, Vec<String>, bool);

pub(crate) struct Watchdog {
    state: Arc<std::sync::Mutex<WatchState>>,
}

impl Watchdog {
    pub(crate) fn start(seed: u64, groups: u32, replicas: u32) -> Watchdog {
        let state: Arc<std::sync::Mutex<WatchState>> = Arc::new(std::sync::Mutex::new((
            0,
            Duration::ZERO,
            Vec::new(),
            false,
        )));
        let watched = state.clone();
        std::thread::spawn(move || {
            let mut last = (u64::MAX, std::time::Instant::now());
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let s = watched.lock().expect("watchdog lock");
                if s.3 {
                    return;
                }
                if s.0 != last.0 {
                    last = (s.0, std::time::Instant::now());
                } else if last.1.elapsed() > STEP_WALL_MAX {
                    eprintln!(
                        "=== latchkey-sim: seed {seed} FAILED ===\nreplay: {}\nviolation: [livelock] \
                         a host spun for {STEP_WALL_MAX:?} of wall time without letting simulated \
                         time pass, at simulated time {:.3}s\nfaults:",
                        crate::config::replay_command(seed, groups, replicas),
                        s.1.as_secs_f64()
                    );
                    for f in &s.2 {
                        eprintln!("  {f}");
                    }
                    std::process::exit(3);
                }
            }
        });
        Watchdog { state }
    }

    pub(crate) fn stepped(&self, now: Duration, faults: &[String]) {
        let mut s = self.state.lock().expect("watchdog lock");
        s.0 += 1;
        s.1 = now;
        if s.2.len() != faults.len() {
            s.2 = faults.to_vec();
        }
    }

    pub(crate) fn stop(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.3 = true;
        }
    }
}

impl Drop for Watchdog {
    /// Also when a run unwinds: a panicking run must not look like a livelock.
    fn drop(&mut self) {
        self.stop();
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_owned(),
        (_, Some(s)) => s.clone(),
        _ => "(not a string)".to_owned(),
    }
}
