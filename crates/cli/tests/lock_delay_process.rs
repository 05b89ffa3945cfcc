//! Lock-delay (issue #32 item 4) through real processes: a `latchkey lock --lock-delay` holder
//! killed with kill -9 (its session then expires) keeps the lock from its waiter until the
//! delay has run from the expiry; a holder whose COMMAND ends cleanly hands over at once.
//! Times come from this machine's one clock: the server's stamps (`status`'s
//! `delay_remaining_ms`) and the waiter's COMMAND's own `date` read, so the checks are lower
//! bounds (never "no earlier than"), not speeds.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{wait_until, Proc, Server, Work};
use nix::sys::signal::Signal;

/// Bound for anything that should take a few seconds (a grant, an expiry).
const T: Duration = Duration::from_secs(20);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// A waiter whose COMMAND appends `start MS TOKEN` to `work/tag` and exits.
fn waiter(server: &Server, work: &Work, name: &str, tag: &str) -> Proc {
    let f = work.path(tag);
    let script = format!(
        "echo start $(($(date +%s%N) / 1000000)) $LATCHKEY_TOKEN >> '{}'",
        f.display()
    );
    server.lock(name, &["--wait", "60s"], &script, work.dir.path())
}

fn start_ms(work: &Work, tag: &str) -> Option<u64> {
    work.lines(tag).iter().find_map(|l| {
        l.strip_prefix("start ")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

#[test]
fn a_killed_holder_s_lock_delay_runs_before_its_waiter_is_granted() {
    const DELAY_MS: u64 = 4_000;
    let mut server = Server::start();
    server.wait_ready().expect("server ready");
    let work = Work::new();
    // The holder: no COMMAND, so the lock is held by the CLI itself until it dies.
    let args: Vec<String> = [
        "lock",
        "--endpoints",
        &server.addr,
        "--ttl",
        "2s",
        "--lock-delay",
        "4s",
        "door",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let holder = Proc::spawn(&args, work.dir.path());
    wait_until("the holder holds door", T, || {
        server.status("door")["held"] == true
    });
    let status = server.status("door");
    assert_eq!(status["lock_delay_ms"], DELAY_MS, "{status}");
    let first_token = status["token"].as_u64().expect("token");
    let mut w = waiter(&server, &work, "door", "w");
    wait_until("the waiter queues", T, || {
        server.status("door")["waiters"] == 1
    });

    holder.signal_group(Signal::SIGKILL);
    // The session expires (about 2 s later); then the delay runs with no holder.
    let mut seen_delay: Option<(u64, u64)> = None;
    wait_until("the lock-delay runs", T, || {
        let before = now_ms();
        let s = server.status("door");
        if let Some(left) = s["delay_remaining_ms"].as_u64() {
            assert_eq!(s["held"], false, "a holder during the delay: {s}");
            assert!(left <= DELAY_MS, "{s}");
            seen_delay = Some((before, left));
        }
        seen_delay.is_some() || start_ms(&work, "w").is_some()
    });
    let (before, left) = seen_delay.unwrap_or_else(|| {
        panic!(
            "the waiter was granted with no lock-delay seen: {:?}",
            work.lines("w")
        )
    });
    // The delay ends at the server's stamp `until` >= before + left; the grant is made no
    // earlier, and the waiter's COMMAND starts after its grant.
    assert_eq!(
        w.wait(T + Duration::from_millis(DELAY_MS)).code(),
        Some(0),
        "{}",
        w.stderr()
    );
    let started = start_ms(&work, "w").expect("the waiter's COMMAND ran");
    assert!(
        started >= before + left,
        "granted at {started}, before the delay's end {}",
        before + left
    );
    let token: u64 = work.lines("w")[0]
        .split_whitespace()
        .nth(2)
        .and_then(|t| t.parse().ok())
        .expect("token");
    assert!(token > first_token);
}

/// An operator takes a lock whose holder asked for a lock-delay (5 minutes here), so the delay
/// starts under the holder's token; the same request again (a retry after a lost answer)
/// answers the same and ends nothing, nor does a release naming no token (nobody holds the
/// lock: it says how to end the delay). Ending it is its own request, `--end-delay`, which
/// knows no token: `status` shows the delay's, the client names it, and the waiter is granted
/// at once, not after the delay. Before the request said what it ends, the retry ended the
/// delay its first attempt had started.
#[test]
fn an_operator_s_retried_release_keeps_the_delay_and_end_delay_ends_it() {
    let mut server = Server::start();
    server.wait_ready().expect("server ready");
    let work = Work::new();
    let args: Vec<String> = [
        "lock",
        "--endpoints",
        &server.addr,
        "--lock-delay",
        "5m",
        "gate",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _holder = Proc::spawn(&args, work.dir.path());
    wait_until("the holder holds gate", T, || {
        server.status("gate")["held"] == true
    });
    let lost_token = server.status("gate")["token"].as_u64().expect("token");
    let mut w = waiter(&server, &work, "gate", "w");
    wait_until("the waiter queues", T, || {
        server.status("gate")["waiters"] == 1
    });
    let token_arg = lost_token.to_string();
    let release = [
        "admin", "release", "gate", "--token", &token_arg, "--reason", "wedged",
    ];
    let first = server.cli(&release);
    assert!(first.status.success(), "{}\n{}", first.stderr, first.stdout);
    let delayed = |what: &str| {
        let status = server.status("gate");
        assert_eq!(status["delay_token"], lost_token, "{what}: {status}");
        assert_eq!(status["held"], false, "{what}: {status}");
        assert_eq!(status["waiters"], 1, "{what}: {status}");
    };
    delayed("the release started the delay");
    let retry = server.cli(&release);
    assert!(retry.status.success(), "{}\n{}", retry.stderr, retry.stdout);
    assert_eq!(retry.stdout, first.stdout, "the first attempt's answer");
    delayed("after the retry");
    let plain = server.cli(&["admin", "release", "gate", "--reason", "wedged"]);
    assert!(!plain.status.success(), "{}", plain.stdout);
    assert!(plain.stderr.contains("--end-delay"), "{}", plain.stderr);
    delayed("after a release naming no token");
    assert!(start_ms(&work, "w").is_none(), "granted during the delay");

    let end = server.cli(&[
        "admin",
        "release",
        "gate",
        "--end-delay",
        "--reason",
        "the job is gone",
    ]);
    assert!(end.status.success(), "{}\n{}", end.stderr, end.stdout);
    assert!(end.stdout.contains("lock-delay ended"), "{}", end.stdout);
    assert_eq!(w.wait(T).code(), Some(0), "{}", w.stderr());
    let token: u64 = work.lines("w")[0]
        .split_whitespace()
        .nth(2)
        .and_then(|t| t.parse().ok())
        .expect("token");
    assert!(token > lost_token);
    // Its retry, with or without the token (the server's refusal, and the client's own): no
    // delay runs, nothing is proposed, the new holder keeps the lock.
    for args in [
        &["admin", "release", "gate", "--end-delay", "--reason", "x"][..],
        &[
            "admin",
            "release",
            "gate",
            "--end-delay",
            "--token",
            &token_arg,
            "--reason",
            "x",
        ],
    ] {
        let again = server.cli(args);
        assert!(!again.status.success(), "{args:?}: {}", again.stdout);
        assert!(
            again.stderr.contains("no lock-delay"),
            "{args:?}: {}",
            again.stderr
        );
    }
    assert_eq!(
        server.status("gate")["held"],
        false,
        "the waiter's COMMAND ended"
    );
}

/// Debian's libfaketime, which steps a process's wall clock from a file (as the nemesis does).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The attacker review of issue #32: a delay timed on the leader's wall clock (the entry's
/// stamp plus the delay) ended as soon as that clock stepped forward, which is the one thing a
/// lock-delay promises a resource that cannot check tokens. The leader now times it on its
/// monotonic clock: a +1 h step of the server's wall clock in the middle of an 8-s delay hands
/// the name over no earlier than the delay's length after it started.
#[test]
fn a_forward_step_of_the_leader_s_wall_clock_does_not_end_a_lock_delay_early() {
    const DELAY_MS: u64 = 8_000;
    if !std::path::Path::new(LIBFAKETIME).exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "libfaketime is missing: .ci/run installs it (apt-get install libfaketime)"
        );
        eprintln!("skipped: {LIBFAKETIME} is not installed (apt-get install libfaketime)");
        return;
    }
    let work = Work::new();
    let clock = work.path("clock");
    std::fs::write(&clock, "+0\n").expect("clock file");
    let clock_path = clock.display().to_string();
    let mut server = Server::start_with_env(
        &[],
        &[
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME_TIMESTAMP_FILE", &clock_path),
            ("FAKETIME_CACHE_DURATION", "1"),
            // The wall clock only, as a real step: timers and leases keep counting.
            ("DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    server.wait_ready().expect("server ready");
    let args: Vec<String> = [
        "lock",
        "--endpoints",
        &server.addr,
        "--ttl",
        "2s",
        "--lock-delay",
        "8s",
        "door",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let holder = Proc::spawn(&args, work.dir.path());
    wait_until("the holder holds door", T, || {
        server.status("door")["held"] == true
    });
    // A wait longer than the step: waits are timed by the entries' stamps, and a wait that
    // ended would take the waiter out of the test's question.
    let f = work.path("w");
    let script = format!(
        "echo start $(($(date +%s%N) / 1000000)) >> '{}'",
        f.display()
    );
    let mut w = server.lock("door", &["--wait", "3h"], &script, work.dir.path());
    wait_until("the waiter queues", T, || {
        server.status("door")["waiters"] == 1
    });
    holder.signal_group(Signal::SIGKILL);
    wait_until("the lock-delay runs", T, || {
        let s = server.status("door");
        assert!(
            start_ms(&work, "w").is_none(),
            "granted with no delay seen: {s}"
        );
        s["delay_remaining_ms"].as_u64().is_some()
    });
    let started = std::time::Instant::now();
    // Step the server's wall clock an hour forward (libfaketime reads the file within 1 s).
    let tmp = work.path("clock.new");
    std::fs::write(&tmp, "+3600\n").expect("clock file");
    std::fs::rename(&tmp, &clock).expect("clock file");
    // A wall-clock delay ended within about a second of the step; this one runs on. The delay
    // started no later than `started`, and the check stops well before its end.
    while started.elapsed() < Duration::from_millis(DELAY_MS / 2) {
        let s = server.status("door");
        assert_eq!(s["held"], false, "handed over after the clock step: {s}");
        assert!(
            start_ms(&work, "w").is_none(),
            "the waiter was granted {:?} after the delay started, not {DELAY_MS} ms: {s}",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // It ends all the same, its length after it started.
    assert_eq!(
        w.wait(T + Duration::from_millis(DELAY_MS)).code(),
        Some(0),
        "{}",
        w.stderr()
    );
    assert!(started.elapsed() >= Duration::from_millis(DELAY_MS / 2));
}

#[test]
fn a_clean_exit_hands_over_at_once_despite_a_lock_delay() {
    let mut server = Server::start();
    server.wait_ready().expect("server ready");
    let work = Work::new();
    let gate = work.path("gate");
    // The holder's COMMAND ends when the test touches `gate`.
    let script = format!("while [ ! -e '{}' ]; do sleep 0.05; done", gate.display());
    let mut holder = server.lock("door", &["--lock-delay", "5m"], &script, work.dir.path());
    wait_until("the holder holds door", T, || {
        server.status("door")["held"] == true
    });
    let mut w = waiter(&server, &work, "door", "w");
    wait_until("the waiter queues", T, || {
        server.status("door")["waiters"] == 1
    });
    work.touch("gate");
    assert_eq!(holder.wait(T).code(), Some(0), "{}", holder.stderr());
    // A delay would keep the waiter out for 5 minutes; it is granted well within T.
    assert_eq!(w.wait(T).code(), Some(0), "{}", w.stderr());
    assert!(start_ms(&work, "w").is_some());
}

/// Conflict events (issue #32 item 5): a holder learns from its keepalives that someone waits
/// for its lock (`LockGuard::contended`); `latchkey lock` says so on stderr, once.
#[test]
fn a_holder_is_told_when_someone_waits_for_its_lock() {
    let mut server = Server::start();
    server.wait_ready().expect("server ready");
    let work = Work::new();
    let gate = work.path("gate");
    let script = format!("while [ ! -e '{}' ]; do sleep 0.05; done", gate.display());
    let mut holder = server.lock("door", &["--ttl", "3s"], &script, work.dir.path());
    wait_until("the holder holds door", T, || {
        server.status("door")["held"] == true
    });
    // Alone, through a few renewals (every second with a 3 s TTL): nobody waits, no line.
    std::thread::sleep(Duration::from_millis(2_500));
    assert!(
        !holder.stderr().contains("someone is waiting"),
        "{}",
        holder.stderr()
    );
    let mut w = waiter(&server, &work, "door", "w");
    wait_until("the holder is told", T, || {
        holder
            .stderr()
            .contains("someone is waiting for lock \"door\"")
    });
    work.touch("gate");
    assert_eq!(holder.wait(T).code(), Some(0), "{}", holder.stderr());
    assert_eq!(w.wait(T).code(), Some(0), "{}", w.stderr());
    assert_eq!(
        holder.stderr().matches("someone is waiting").count(),
        1,
        "{}",
        holder.stderr()
    );
}

/// The Rust client against a real server: a guard's `contended()` completes once someone
/// queues for its lock, and a waiter's `positions` channel follows its place in the queue
/// (2, then 1 once the holder ahead is granted and the next long-poll answers).
#[test]
fn the_rust_client_hears_contention_and_follows_its_queue_position() {
    use latchkey_client::Client;
    use tokio::sync::watch;
    let mut server = Server::start();
    server.wait_ready().expect("server ready");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = Client::connect([server.addr.clone()])
            .await
            .expect("client");
        let ttl = Duration::from_secs(3);
        let a = client.session(ttl).await.expect("session a");
        let b = client.session(ttl).await.expect("session b");
        let c = client.session(ttl).await.expect("session c");
        let held = a
            .lock("q")
            .wait(Some(Duration::ZERO))
            .await
            .expect("a takes q");
        assert!(!held.is_contended());
        let (tx_b, mut rx_b) = watch::channel(0u32);
        let b_wait = tokio::spawn(async move {
            let g = b
                .lock("q")
                .positions(tx_b)
                .wait(Some(Duration::from_secs(60)))
                .await;
            (g, b)
        });
        tokio::time::timeout(T, rx_b.wait_for(|p| *p == 1))
            .await
            .expect("b at position 1")
            .expect("its sender lives");
        tokio::time::timeout(T, held.contended())
            .await
            .expect("a's guard to be told");
        assert!(held.is_contended());
        let (tx_c, mut rx_c) = watch::channel(0u32);
        let c_wait = tokio::spawn(async move {
            let g = c
                .lock("q")
                .positions(tx_c)
                .wait(Some(Duration::from_secs(60)))
                .await;
            (g, c)
        });
        tokio::time::timeout(T, rx_c.wait_for(|p| *p == 2))
            .await
            .expect("c at position 2")
            .expect("its sender lives");
        held.release().await.expect("a releases");
        let (g_b, b) = tokio::time::timeout(T, b_wait)
            .await
            .expect("b granted")
            .unwrap();
        let g_b = g_b.expect("b's grant");
        tokio::time::timeout(T, rx_c.wait_for(|p| *p == 1))
            .await
            .expect("c at position 1")
            .expect("its sender lives");
        g_b.release().await.expect("b releases");
        let (g_c, c) = tokio::time::timeout(T, c_wait)
            .await
            .expect("c granted")
            .unwrap();
        g_c.expect("c's grant").release().await.expect("c releases");
        for s in [a, b, c] {
            let _ = s.close().await;
        }
    });
}
