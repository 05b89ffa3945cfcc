//! The idempotency store: a key runs once, failures are not remembered, bounded by capacity,
//! and (its stated limit) it does nothing against a stale holder doing a different unit of work.

use std::cell::Cell;
use std::convert::Infallible;

use latchkey_fence::idempotency::{IdempotencyError, IdempotencyStore, Outcome};
use latchkey_fence::limits;

fn ok<V>(v: V) -> Result<V, Infallible> {
    Ok(v)
}

#[test]
fn a_retried_key_returns_the_first_result_without_running_again() {
    let store = IdempotencyStore::new();
    let runs = Cell::new(0);
    let charge = || {
        runs.set(runs.get() + 1);
        ok(format!("charge #{}", runs.get()))
    };
    let first = store.run("payment/inv-1", charge).expect("first");
    let retry = store.run("payment/inv-1", charge).expect("retry");
    assert_eq!(first, Outcome::Fresh("charge #1".to_owned()));
    assert_eq!(retry, Outcome::Replayed("charge #1".to_owned()));
    assert_eq!(runs.get(), 1);
    assert_eq!(store.get("payment/inv-1").as_deref(), Some("charge #1"));
}

#[test]
fn a_different_key_runs_even_from_a_stale_holder() {
    // The documented limit: the store cannot tell a stale holder from a current one.
    let store = IdempotencyStore::new();
    store.run("payment/inv-1", || ok(1)).expect("new holder");
    let stale = store
        .run("payment/inv-2", || ok(2))
        .expect("stale holder, other work");
    assert_eq!(stale, Outcome::Fresh(2));
}

#[test]
fn a_failed_run_is_not_remembered_so_a_retry_runs() {
    let store: IdempotencyStore<u32> = IdempotencyStore::new();
    let failed = store.run("k", || Err::<u32, _>("card declined"));
    assert!(matches!(
        failed,
        Err(IdempotencyError::Work("card declined"))
    ));
    assert_eq!(store.get("k"), None);
    assert_eq!(store.run("k", || ok(7)).expect("retry"), Outcome::Fresh(7));
}

#[test]
fn a_panicking_run_frees_its_key() {
    let store: IdempotencyStore<u32> = IdempotencyStore::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        store.run("k", || -> Result<u32, Infallible> { panic!("boom") })
    }));
    assert!(result.is_err());
    assert_eq!(store.run("k", || ok(1)).expect("retry"), Outcome::Fresh(1));
}

#[test]
fn a_key_in_progress_is_refused_not_run_twice() {
    let store: IdempotencyStore<u32> = IdempotencyStore::new();
    let outer = store
        .run("k", || {
            let inner = store.run("k", || ok(2));
            assert!(matches!(inner, Err(IdempotencyError::InProgress { ref key }) if key == "k"));
            ok(1)
        })
        .expect("outer");
    assert_eq!(outer, Outcome::Fresh(1));
}

#[test]
fn the_oldest_completed_key_is_evicted_at_capacity() {
    let store = IdempotencyStore::with_capacity(2);
    for (k, v) in [("k1", 1), ("k2", 2), ("k3", 3)] {
        store.run(k, || ok(v)).expect("run");
    }
    assert_eq!(store.get("k1"), None, "evicted");
    assert_eq!(
        store.run("k3", || ok(30)).expect("k3"),
        Outcome::Replayed(3)
    );
    assert_eq!(
        store.run("k2", || ok(20)).expect("k2"),
        Outcome::Replayed(2)
    );
    // Beyond the window a retry runs again: why the capacity must cover the retry window.
    assert_eq!(store.run("k1", || ok(10)).expect("k1"), Outcome::Fresh(10));
}

#[test]
fn a_store_full_of_work_in_progress_refuses_new_keys() {
    let store: IdempotencyStore<u32> = IdempotencyStore::with_capacity(1);
    store
        .run("k1", || {
            let other = store.run("k2", || ok(2));
            assert!(matches!(other, Err(IdempotencyError::Full { capacity: 1 })));
            ok(1)
        })
        .expect("k1");
    assert_eq!(
        store.run("k2", || ok(2)).expect("now room"),
        Outcome::Fresh(2)
    );
}

#[test]
fn keys_are_bounded() {
    let store: IdempotencyStore<u32> = IdempotencyStore::new();
    assert!(matches!(
        store.run("", || ok(1)),
        Err(IdempotencyError::InvalidKey { len: 0, .. })
    ));
    let long = "k".repeat(limits::IDEMPOTENCY_KEY_BYTES_MAX + 1);
    assert!(matches!(
        store.run(&long, || ok(1)),
        Err(IdempotencyError::InvalidKey { .. })
    ));
}
