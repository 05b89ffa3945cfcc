//! Whole-cluster restarts and crashed clients on a real 3-node cluster: every held lock, queue
//! and the token counter survive kill -9 of all members, and a crashed holder's session
//! expires within its lease window so that the next waiter gets the lock.

mod common;

use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::{token_of, wait_until, Proc, READY_TIMEOUT};
use latchkey_client::Client;
use nix::sys::signal::Signal;

const T: Duration = Duration::from_secs(20);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn held_locks_queues_and_the_token_counter_survive_killing_every_member() {
    let mut cluster = Cluster::start(3);
    let rt = runtime();
    let client = rt
        .block_on(Client::connect(
            cluster.endpoints().split(',').map(str::to_owned),
        ))
        .unwrap();
    let holder = rt
        .block_on(client.session(Duration::from_secs(15)))
        .unwrap();
    let waiter = rt
        .block_on(client.session(Duration::from_secs(15)))
        .unwrap();
    let held = rt.block_on(holder.lock("held").wait(Some(T))).unwrap();
    let counter = rt.block_on(holder.lock("counter").wait(Some(T))).unwrap();
    let max_before = counter.token();
    rt.block_on(counter.release()).unwrap();
    // The waiter queues behind the holder; its wait rides out the restart.
    let waiter_id = waiter.id();
    let waiting = rt.spawn(async move {
        let r = waiter
            .lock("held")
            .wait(Some(Duration::from_secs(60)))
            .await;
        (r, waiter)
    });
    wait_until("the waiter is queued", T, || {
        rt.block_on(client.describe("held"))
            .is_ok_and(|i| i.waiters == 1)
    });

    for id in cluster.ids() {
        cluster.kill9(id);
    }
    let down_at = Instant::now();
    for id in cluster.ids() {
        cluster.restart(id);
    }
    cluster
        .wait_healthy(READY_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    println!(
        "all members killed and restarted; serving again after {:?}",
        down_at.elapsed()
    );

    let info = rt.block_on(client.describe("held")).unwrap();
    let h = info.holder.clone().expect("still held after the restart");
    assert_eq!(
        (h.session, h.token),
        (holder.id(), held.token()),
        "{info:?}"
    );
    assert_eq!(info.waiters, 1, "{info:?}");
    assert!(!holder.is_lost(), "the holder's lease survives the restart");

    // The queue survived: releasing hands the lock to the waiter, with a higher token.
    rt.block_on(held.release()).unwrap();
    let (granted, waiter) = rt.block_on(waiting).unwrap();
    let granted = granted.expect("the waiter gets the lock");
    assert_eq!(granted.session_id(), waiter_id);
    assert!(
        granted.token() > max_before,
        "{} <= {max_before}",
        granted.token()
    );
    // The token counter survived: a fresh grant is above every earlier one.
    let again = rt.block_on(holder.lock("counter").wait(Some(T))).unwrap();
    assert!(again.token() > granted.token());
    rt.block_on(again.release()).unwrap();
    rt.block_on(granted.release()).unwrap();
    rt.block_on(waiter.close()).unwrap();
    rt.block_on(holder.close()).unwrap();
}

/// The window in which a crashed holder's lock passes on. Measured from the kill: the last
/// renewal arrived at most TTL/3 (the renewal period) before it, so the server expires the
/// session no earlier than 2/3 TTL after the kill (the lower bound is safety and has no slack),
/// and no later than 2 x TTL after the last renewal (the failover bound; without a failover it
/// is 1 x TTL). The upper bound gets 1.5 s of slack for process scheduling on a loaded 2-core
/// machine, the waiter's wake-up and its COMMAND writing the file.
#[test]
fn a_crashed_holders_lock_passes_to_the_next_waiter_within_its_lease_window() {
    crashed_holder(Duration::from_secs(3), false);
}

/// The same with a failover right after the crash: the new leader restarts the lease (it
/// cannot know the last renewal), yet the lock passes on within 2 x TTL of the last renewal.
#[test]
fn a_crashed_holders_lock_passes_on_within_two_ttls_across_a_leader_failover() {
    crashed_holder(Duration::from_secs(4), true);
}

fn crashed_holder(ttl: Duration, kill_leader: bool) {
    let mut cluster = Cluster::start(3);
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("out");
    let ttl_flag = format!("{}s", ttl.as_secs());
    let lock = |tag: &str, extra: &[&str], script: String| {
        let mut args: Vec<String> = vec!["lock".into(), "--endpoints".into(), cluster.endpoints()];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend([
            "crash".into(),
            "--".into(),
            "sh".into(),
            "-c".into(),
            script,
        ]);
        let _ = tag;
        Proc::spawn(&args, work.path())
    };
    let record = |tag: &str, then: &str| {
        format!("echo {tag} $LATCHKEY_TOKEN >> '{}'; {then}", out.display())
    };
    let lines = || {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let holder = lock("A", &["--ttl", &ttl_flag], record("A", "sleep 1000"));
    wait_until("A holds the lock", T, || lines().len() == 1);
    let mut waiter = lock("B", &["--wait", "60s"], record("B", "true"));
    wait_until("B is queued", T, || {
        let s = cluster.cli(&[
            "status",
            "--json",
            "--endpoints",
            &cluster.endpoints(),
            "crash",
        ]);
        serde_json::from_str::<serde_json::Value>(&s.stdout).is_ok_and(|v| v["waiters"] == 1)
    });

    let leader = cluster.wait_leader(&[], T).0;
    let killed_at = Instant::now();
    holder.signal_group(Signal::SIGKILL);
    if kill_leader {
        cluster.kill9(leader);
    }
    wait_until("B gets the lock", 2 * ttl + T, || lines().len() == 2);
    let passed_after = killed_at.elapsed();
    println!(
        "holder killed (TTL {ttl:?}, leader killed too: {kill_leader}) -> next waiter granted \
         after {passed_after:?}"
    );
    assert_eq!(waiter.wait_code(T), 0, "B: {}", waiter.stderr());
    let l = lines();
    assert!(l[0].starts_with('A') && l[1].starts_with('B'), "{l:?}");
    assert!(token_of(&l[1]) > token_of(&l[0]), "{l:?}");
    assert!(
        passed_after >= ttl * 2 / 3,
        "the lock passed on {passed_after:?} after the kill, before the lease could have run out"
    );
    assert!(
        passed_after <= 2 * ttl + Duration::from_millis(1_500),
        "the lock passed on only {passed_after:?} after the kill (TTL {ttl:?})"
    );
    drop(holder);
}
