//! The process-pause scenario end to end: worker A (a separate process: this test binary again,
//! in worker mode) takes the lock and is frozen with SIGSTOP past its lease; worker B gets the
//! lock with a higher token and writes; A resumes, its client library reports the lock lost,
//! and the write it sends anyway with its old token is refused by the fenced resource.
//!
//! The server is the real node (`latchkey_server::run`) on a loopback port with a temporary
//! data directory; the resource is the fenced key-value example service of `latchkey-fence`
//! (both from `latchkey-testkit`). The scenario itself is the example's
//! (`examples/pause_scenario/scenario.rs`), so the example a reader runs is the one tested here.

#[path = "../examples/pause_scenario/scenario.rs"]
mod scenario;

use std::time::Duration;

/// This test's name: worker A is this binary re-run with a filter for exactly this test.
const THIS_TEST: &str = "paused_holder_is_reported_lost_and_its_stale_write_is_rejected";

#[test]
fn paused_holder_is_reported_lost_and_its_stale_write_is_rejected() {
    if scenario::is_worker() {
        scenario::worker_a().expect("worker A");
        return;
    }
    let ttl = Duration::from_secs(2);
    let mut worker = std::process::Command::new(std::env::current_exe().expect("test binary"));
    worker.args(["--exact", THIS_TEST, "--nocapture", "--test-threads", "1"]);
    let config = scenario::Config {
        endpoints: None,
        ttl,
        lock: "pause-test/orders".to_owned(),
        key: "orders".to_owned(),
        worker,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let report = runtime
        .block_on(scenario::run(&config, &|line| eprintln!("{line}")))
        .expect("the scenario ran to the end");
    let (t1, t2) = (report.t1, report.t2);

    // A held the lock and wrote under it.
    assert!(t1 > 0, "{report:#?}");
    assert_eq!(report.a_first_write, 200, "{report:#?}");
    // B got the lock only after A's lease could have run out, with a higher token. A renews
    // every TTL/3, so its lease outlives the pause by about 2/3 of the TTL; half the TTL leaves
    // room for a late renewal on a loaded machine and still catches an early handover.
    assert!(
        report.paused_for >= ttl / 2,
        "B was granted the lock {:?} after A froze, before A's lease could pass",
        report.paused_for
    );
    assert!(t2 > t1, "t2 {t2} <= t1 {t1}");
    assert_eq!(report.b_write, 200, "{report:#?}");
    // A's client library reported the loss before A's stale write went out...
    assert!(!report.a_lost_reason.is_empty(), "{report:#?}");
    assert!(report.a_lost_before_write, "{report:#?}");
    assert_eq!(
        report.a_log,
        [
            format!("granted {t1} {}", report.a_session),
            "wrote 200 - false".to_owned(),
            "ready".to_owned(),
            format!("lost {}", report.a_lost_reason),
            format!("wrote 409 {t2} true"),
        ],
        "A's own account, in order: the write after the pause came after lost()"
    );
    // ...and the resource refused that write, naming the newer token.
    assert_eq!(report.a_stale_write, 409, "{report:#?}");
    assert_eq!(report.a_stale_highest, Some(t2), "{report:#?}");
    assert_eq!(
        report.resource_log,
        [(200, Some(t1)), (200, Some(t2)), (409, Some(t1))],
        "every write the resource saw: (status, token)"
    );
    assert_eq!(report.final_value.as_deref(), Some(scenario::B_VALUE));
    assert!(report.a_exit_ok, "worker A failed; see its stderr above");
    report.check().expect("the example's own verdict agrees");
}
