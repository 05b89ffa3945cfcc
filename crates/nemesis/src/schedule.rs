//! What the nemesis does and when: a fixed schedule of every fault family for CI, or a seeded
//! random one for long runs.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::limits;

/// One family of faults. "The leader" is the member the cluster elected when the fault starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum FaultKind {
    /// The leader's link goes down: nobody, clients included, reaches it.
    IsolateLeader,
    /// The leader (with up to a minority of the others) is cut from the rest of the members;
    /// clients still reach both sides.
    SplitLeaderMinority,
    /// The leader and one follower cannot reach each other; the others see both.
    Bridge,
    /// The leader's packets to the followers are dropped; theirs to it still arrive.
    AsymmetricLeader,
    /// Every client is cut from the leader (both ways); the members still see each other.
    ClientCutFromLeader,
    /// kill -9 of the leader; restarted on its data directory when the fault ends.
    KillLeader,
    /// SIGSTOP of the leader; SIGCONT when the fault ends.
    PauseLeader,
    /// SIGSTOP of a worker inside its critical section, for longer than its lease.
    PauseWorker,
    /// A worker's link goes down inside its critical section (a worker of the Rust client or
    /// one running the CLI): it reaches no member and cannot renew, while its process runs
    /// on; by its deadline it must stop acting as the holder (the CLI: stop COMMAND).
    IsolateWorker,
    /// The leader's wall clock steps 1 to 10 minutes ahead or behind (libfaketime); back when
    /// the fault ends. Its monotonic clock, which leases use, does not move.
    ClockJumpLeader,
    /// Every worker's wall clock steps 1 to 10 minutes ahead or behind: a client's deadline
    /// is on its boot clock and must not move with it.
    ClockJumpWorkers,
    /// The leader's and every worker's wall clocks flip between a step ahead and a step behind
    /// (1 to 10 minutes) every `limits::CLOCK_STROBE_FLIP`, each host in its own phase, until
    /// the fault ends.
    ClockStrobe,
}

impl FaultKind {
    pub const ALL: [FaultKind; 12] = [
        FaultKind::IsolateLeader,
        FaultKind::SplitLeaderMinority,
        FaultKind::Bridge,
        FaultKind::AsymmetricLeader,
        FaultKind::ClientCutFromLeader,
        FaultKind::KillLeader,
        FaultKind::PauseLeader,
        FaultKind::PauseWorker,
        FaultKind::IsolateWorker,
        FaultKind::ClockJumpLeader,
        FaultKind::ClockJumpWorkers,
        FaultKind::ClockStrobe,
    ];
}

/// One fault: starts `at` after the workload started, healed `lasts` later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub at: Duration,
    pub lasts: Duration,
}

/// How long a worker pause lasts: past the lease, so that the cluster expires the session and
/// grants its lock to another while the worker is stopped.
pub fn worker_pause(ttl: Duration) -> Duration {
    ttl * 2 + Duration::from_secs(1)
}

/// Each of `kinds` once, in order: `lasts` each (a worker pause [`worker_pause`]), `gap`
/// between one's heal and the next's start.
pub fn fixed(kinds: &[FaultKind], lasts: Duration, gap: Duration, ttl: Duration) -> Vec<Fault> {
    let mut at = gap;
    kinds
        .iter()
        .map(|&kind| {
            let lasts = match kind {
                FaultKind::PauseWorker => worker_pause(ttl),
                _ => lasts,
            };
            let f = Fault { kind, at, lasts };
            at += lasts + gap;
            f
        })
        .collect()
}

/// Faults drawn from `kinds` with `seed` until `total`: each lasts 1–12 s (a worker pause
/// [`worker_pause`]), with 1–8 s of calm between them.
pub fn random(seed: u64, kinds: &[FaultKind], total: Duration, ttl: Duration) -> Vec<Fault> {
    assert!(!kinds.is_empty(), "at least one fault kind");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut at = Duration::from_secs(rng.random_range(1..=8));
    while out.len() < limits::FAULTS_MAX {
        let kind = kinds[rng.random_range(0..kinds.len())];
        let lasts = match kind {
            FaultKind::PauseWorker => worker_pause(ttl),
            _ => Duration::from_millis(rng.random_range(1_000..=12_000)),
        };
        if at + lasts > total {
            break;
        }
        out.push(Fault { kind, at, lasts });
        at += lasts + Duration::from_millis(rng.random_range(1_000..=8_000));
    }
    out
}

/// How long a schedule runs, to its last heal.
pub fn length(faults: &[Fault]) -> Duration {
    faults
        .iter()
        .map(|f| f.at + f.lasts)
        .max()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule_within_its_length() {
        let ttl = Duration::from_secs(3);
        let a = random(7, &FaultKind::ALL, Duration::from_secs(600), ttl);
        assert_eq!(a, random(7, &FaultKind::ALL, Duration::from_secs(600), ttl));
        assert_ne!(a, random(8, &FaultKind::ALL, Duration::from_secs(600), ttl));
        assert!(length(&a) <= Duration::from_secs(600));
        assert!(a.len() > 20, "{} faults in ten minutes", a.len());
        for pair in a.windows(2) {
            assert!(
                pair[0].at + pair[0].lasts < pair[1].at,
                "faults never overlap"
            );
        }
    }

    #[test]
    fn the_fixed_schedule_runs_every_kind_once() {
        let f = fixed(
            &FaultKind::ALL,
            Duration::from_secs(5),
            Duration::from_secs(4),
            Duration::from_secs(3),
        );
        let kinds: Vec<FaultKind> = f.iter().map(|f| f.kind).collect();
        assert_eq!(kinds, FaultKind::ALL);
        assert_eq!(f[0].at, Duration::from_secs(4));
        assert_eq!(f[1].at, Duration::from_secs(13));
    }
}
