//! Gate properties, run against both gates: lower rejected, equal accepted, locks independent,
//! admissions of one lock serialised in non-decreasing token order, durability across reopen.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use latchkey_fence::{
    limits, DurableConfig, DurableGate, FenceError, FenceGate, LockNameError, MemoryGate, Rejected,
};

/// Runs `test` against a fresh gate of each kind.
fn each_gate(test: impl Fn(&dyn Fn() -> Box<dyn GateUnderTest>)) {
    test(&|| Box::new(MemoryGate::new()));
    let dir = tempfile::tempdir().expect("tempdir");
    let counter = AtomicUsize::new(0);
    test(&|| {
        // A new directory per gate so that each call starts empty.
        let n = counter.fetch_add(1, Ordering::SeqCst);
        Box::new(
            DurableGate::open(dir.path().join(n.to_string()), DurableConfig::default())
                .expect("open durable gate"),
        )
    });
}

/// `FenceGate` has generic methods, so tests go through this object-safe shim.
trait GateUnderTest: Sync {
    fn admit_record(&self, lock: &str, token: u64, f: &mut dyn FnMut()) -> Result<(), FenceError>;
    fn check_dyn(&self, lock: &str, token: u64) -> Result<latchkey_fence::Admitted, FenceError>;
    fn highest_dyn(&self, lock: &str) -> Option<u64>;
}

impl<G: FenceGate> GateUnderTest for G {
    fn admit_record(&self, lock: &str, token: u64, f: &mut dyn FnMut()) -> Result<(), FenceError> {
        self.admit_then(lock, token, f)
    }
    fn check_dyn(&self, lock: &str, token: u64) -> Result<latchkey_fence::Admitted, FenceError> {
        self.check(lock, token)
    }
    fn highest_dyn(&self, lock: &str) -> Option<u64> {
        self.highest(lock)
    }
}

fn rejected(result: Result<impl std::fmt::Debug, FenceError>) -> Rejected {
    match result {
        Err(FenceError::Rejected(r)) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn lower_token_is_rejected_and_its_write_does_not_run() {
    each_gate(|new| {
        let gate = new();
        gate.check_dyn("orders", 5).expect("first token");
        let mut ran = false;
        let r = rejected(gate.admit_record("orders", 4, &mut || ran = true));
        assert!(!ran, "the stale write must not run");
        assert_eq!(
            r,
            Rejected {
                lock: "orders".into(),
                token: 4,
                highest: 5
            }
        );
        let message = r.to_string();
        assert!(
            message.contains("token 4") && message.contains("token 5") && message.contains("stale")
        );
        assert_eq!(gate.highest_dyn("orders"), Some(5));
    });
}

#[test]
fn equal_token_is_the_same_holder_and_accepted() {
    each_gate(|new| {
        let gate = new();
        let first = gate.check_dyn("orders", 5).expect("first");
        assert!(first.raised());
        assert_eq!(first.previous, None);
        let again = gate.check_dyn("orders", 5).expect("same holder again");
        assert!(!again.raised());
        assert_eq!(again.previous, Some(5));
        let mut ran = 0;
        gate.admit_record("orders", 5, &mut || ran += 1)
            .expect("write");
        gate.admit_record("orders", 5, &mut || ran += 1)
            .expect("write");
        assert_eq!(ran, 2);
    });
}

#[test]
fn higher_token_raises_the_limit_for_everyone_after() {
    each_gate(|new| {
        let gate = new();
        gate.check_dyn("orders", 5).expect("5");
        gate.check_dyn("orders", 9).expect("9");
        assert_eq!(rejected(gate.check_dyn("orders", 5)).highest, 9);
    });
}

#[test]
fn locks_are_independent() {
    each_gate(|new| {
        let gate = new();
        gate.check_dyn("a", 100).expect("a");
        gate.check_dyn("b", 1).expect("b is not limited by a");
        assert_eq!(rejected(gate.check_dyn("a", 1)).highest, 100);
        assert_eq!(gate.highest_dyn("a"), Some(100));
        assert_eq!(gate.highest_dyn("b"), Some(1));
        assert_eq!(gate.highest_dyn("c"), None);
    });
}

#[test]
fn invalid_lock_names_are_refused() {
    each_gate(|new| {
        let gate = new();
        assert!(matches!(
            gate.check_dyn("", 1),
            Err(FenceError::InvalidLockName(LockNameError::Empty))
        ));
        let long = "x".repeat(limits::LOCK_NAME_BYTES_MAX + 1);
        assert!(matches!(
            gate.check_dyn(&long, 1),
            Err(FenceError::InvalidLockName(LockNameError::TooLong { .. }))
        ));
        gate.check_dyn(&"x".repeat(limits::LOCK_NAME_BYTES_MAX), 1)
            .expect("the longest valid name");
    });
}

#[test]
fn a_full_gate_refuses_new_names_but_keeps_serving_known_ones() {
    let gate = MemoryGate::with_locks_max(2);
    gate.check("a", 1).expect("a");
    gate.check("b", 1).expect("b");
    match gate.check("c", 1) {
        Err(e @ FenceError::TooManyLocks { max: 2, .. }) => {
            assert!(e.to_string().contains("\"c\""), "{e}")
        }
        other => panic!("expected TooManyLocks, got {other:?}"),
    }
    gate.check("a", 2).expect("known names still work");
    assert_eq!(rejected(gate.check("b", 0)).highest, 1);
}

/// xorshift64*: a seeded generator so a failure replays.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[test]
fn concurrent_admissions_of_a_lock_run_in_non_decreasing_token_order() {
    const THREADS: u64 = 8;
    const OPS: u64 = 400;
    const LOCKS: [&str; 3] = ["a", "b", "c"];
    each_gate(|new| {
        let gate = new();
        // Written only inside the admitted write, i.e. under the gate's per-lock guard.
        let admitted: Vec<Mutex<Vec<u64>>> = LOCKS.iter().map(|_| Mutex::new(Vec::new())).collect();
        let rejections: Mutex<Vec<(usize, Rejected)>> = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (gate, admitted, rejections) = (&gate, &admitted, &rejections);
                s.spawn(move || {
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1));
                    for op in 0..OPS {
                        let l = (rng.next() % LOCKS.len() as u64) as usize;
                        // Tokens drift upwards with jitter, so both outcomes keep happening.
                        let token = op + rng.next() % 32;
                        let result = gate.admit_record(LOCKS[l], token, &mut || {
                            let mut seen = admitted[l].lock().expect("not poisoned");
                            // Widen the window in which a broken guard would let another
                            // admission of the same lock interleave.
                            std::thread::yield_now();
                            seen.push(token);
                        });
                        match result {
                            Ok(()) => {}
                            Err(FenceError::Rejected(r)) => {
                                rejections.lock().expect("not poisoned").push((l, r))
                            }
                            Err(e) => panic!("unexpected error {e}"),
                        }
                    }
                });
            }
        });
        let rejections = rejections.into_inner().expect("not poisoned");
        assert!(
            !rejections.is_empty(),
            "the workload must exercise rejection"
        );
        for (l, seen) in admitted.into_iter().enumerate() {
            let seen = seen.into_inner().expect("not poisoned");
            assert!(
                seen.len() > 10,
                "lock {} admitted too little to mean anything",
                LOCKS[l]
            );
            assert!(
                seen.windows(2).all(|w| w[0] <= w[1]),
                "lock {}: admitted tokens went down: {seen:?}",
                LOCKS[l]
            );
            assert_eq!(gate.highest_dyn(LOCKS[l]), seen.last().copied());
            let admitted_set: HashSet<u64> = seen.iter().copied().collect();
            for (rl, r) in rejections.iter().filter(|(rl, _)| *rl == l) {
                assert!(r.token < r.highest, "lock {rl}: {r}");
                assert!(
                    admitted_set.contains(&r.highest),
                    "a rejection must cite a token that was admitted: {r}"
                );
            }
        }
    });
}

#[test]
fn durable_gate_keeps_the_highest_tokens_across_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let gate = DurableGate::open(dir.path(), DurableConfig::default()).expect("open");
        gate.check("orders", 5).expect("5");
        gate.check("orders", 7).expect("7");
        gate.check("users", 3).expect("3");
    }
    {
        let gate = DurableGate::open(dir.path(), DurableConfig::default()).expect("reopen");
        assert_eq!(gate.highest("orders"), Some(7));
        assert_eq!(gate.highest("users"), Some(3));
        assert_eq!(rejected(gate.check("orders", 6)).highest, 7);
        gate.check("orders", 7)
            .expect("the current holder goes on after a restart");
        gate.check("orders", 8).expect("8");
    }
    let gate = DurableGate::open(dir.path(), DurableConfig::default()).expect("reopen again");
    assert_eq!(gate.highest("orders"), Some(8));
}

#[test]
fn durable_gate_keeps_names_beyond_a_lowered_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let gate = DurableGate::open(dir.path(), DurableConfig::default()).expect("open");
        for name in ["a", "b", "c"] {
            gate.check(name, 10).expect("admit");
        }
    }
    let config = DurableConfig {
        locks_max: 1,
        ..DurableConfig::default()
    };
    let gate = DurableGate::open(dir.path(), config).expect("reopen with a lower bound");
    // Dropping a stored name would readmit its stale holders, so all three are kept.
    for name in ["a", "b", "c"] {
        assert_eq!(rejected(gate.check(name, 9)).highest, 10);
    }
    assert!(matches!(
        gate.check("d", 1),
        Err(FenceError::TooManyLocks { max: 1, .. })
    ));
}

#[test]
fn durable_gate_rejects_an_invalid_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = DurableConfig {
        locks_max: 0,
        ..DurableConfig::default()
    };
    assert!(DurableGate::open(dir.path(), config).is_err());
}

#[test]
fn a_panicking_write_keeps_its_token_admitted_and_the_gate_usable() {
    let gate = MemoryGate::new();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        gate.admit_then("orders", 5, || panic!("the write failed"))
    }));
    assert!(panicked.is_err());
    assert_eq!(gate.highest("orders"), Some(5));
    assert_eq!(rejected(gate.check("orders", 4)).highest, 5);
    gate.admit_then("orders", 6, || ())
        .expect("gate still usable");
}
