//! The process-pause scenario with the CLI as the worker, against a real `latchkey serve`:
//! `latchkey lock --ttl 2s demo -- WRITER`, where WRITER writes to the fenced key-value example
//! service (`latchkey_testkit::FencedResource`, run in this process) with the `latchkey-lock` and
//! `latchkey-token` headers taken from `$LATCHKEY_LOCK` and `$LATCHKEY_TOKEN`.
//!
//! 1. Worker A's WRITER writes once (200), then waits for a line on its stdin.
//! 2. A's whole process group (the CLI and WRITER) is frozen with SIGSTOP past A's lease.
//! 3. Worker B (`latchkey lock` again) gets the lock with a higher token and writes (200).
//! 4. A resumes, WRITER first (the worst order for the resource: the stale writer runs before
//!    its supervisor can notice anything): its late write with the old token is refused (409,
//!    naming B's token). Then the CLI resumes: it finds the lock lost, stops WRITER and exits
//!    with status 4.
//!
//! WRITER is this test binary run again with a filter for exactly this test and
//! [`WRITER_ENV`] set (no curl needed), as `crates/client/tests/fencing_pause.rs` does.

mod common;

use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{signal, wait_until, Proc, Server, Work};
use latchkey_fence::{HIGHEST_HEADER, LOCK_ENV, LOCK_HEADER, TOKEN_ENV, TOKEN_HEADER};
use latchkey_testkit::FencedResource;
use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// This test's name: WRITER is this binary re-run with a filter for exactly this test.
const THIS_TEST: &str = "a_paused_cli_worker_is_stopped_and_its_late_write_is_refused";
/// Set in WRITER's environment (through the CLI's): `A` or `B`.
const WRITER_ENV: &str = "LATCHKEY_TEST_FENCE_WRITER";
/// The resource's address, for WRITER.
const RESOURCE_ENV: &str = "LATCHKEY_TEST_FENCE_RESOURCE";
/// The file WRITER appends its account to, one event a line.
const LOG_ENV: &str = "LATCHKEY_TEST_FENCE_LOG";
const LOCK: &str = "demo";
const KEY: &str = "orders";
const TTL: Duration = Duration::from_secs(2);
const T: Duration = Duration::from_secs(20);

#[test]
fn a_paused_cli_worker_is_stopped_and_its_late_write_is_refused() {
    if let Ok(role) = std::env::var(WRITER_ENV) {
        writer(&role);
        return;
    }
    let server = Server::start();
    let resource = FencedResource::start().expect("the resource starts");
    let work = Work::new();
    let worker = |role: &str, options: &[&str], stdin: Stdio| {
        let mut args: Vec<String> = ["lock", "--endpoints", &server.addr, "--ttl", "2s"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(options.iter().map(|s| s.to_string()));
        args.extend([LOCK.into(), "--".into()]);
        args.push(
            std::env::current_exe()
                .expect("test binary")
                .display()
                .to_string(),
        );
        args.extend(
            ["--exact", THIS_TEST, "--nocapture", "--test-threads", "1"].map(str::to_owned),
        );
        let log = work.path(&format!("{role}.log"));
        Proc::spawn_with(&args, work.dir.path(), |c| {
            c.env(WRITER_ENV, role)
                .env(RESOURCE_ENV, resource.addr.to_string())
                .env(LOG_ENV, log)
                .stdin(stdin);
        })
    };
    let event = |role: &str, tag: &str| -> Option<Vec<String>> {
        work.lines(&format!("{role}.log"))
            .into_iter()
            .find(|l| l.split_whitespace().next() == Some(tag))
            .map(|l| l.split_whitespace().skip(1).map(str::to_owned).collect())
    };

    // 1. A holds the lock and writes under it.
    let mut a = worker("A", &[], Stdio::piped());
    let mut a_stdin = a.take_stdin().expect("A's stdin");
    wait_until("A's first write", T, || event("A", "waiting").is_some());
    let start = event("A", "start").unwrap();
    let (a_child, t1): (i32, u64) = (start[0].parse().unwrap(), start[1].parse().unwrap());
    assert_eq!(
        event("A", "wrote").unwrap(),
        ["200", "-"],
        "A's first write"
    );

    // 2. Freeze A: the CLI and WRITER (one process group).
    a.signal_group(Signal::SIGSTOP);
    let paused_at = Instant::now();

    // 3. B queues, gets the lock once A's lease ran out, and writes.
    let mut b = worker("B", &["--wait", "30s"], Stdio::null());
    wait_until("B gets the lock", T, || event("B", "start").is_some());
    let b_granted_after = paused_at.elapsed();
    wait_until("B writes", T, || event("B", "wrote").is_some());
    let t2: u64 = event("B", "start").unwrap()[1].parse().unwrap();
    assert!(t2 > t1, "t2 {t2} <= t1 {t1}");
    assert_eq!(event("B", "wrote").unwrap(), ["200", "-"], "B's write");
    assert_eq!(b.wait_code(T), 0, "B: {}", b.stderr());
    // A renews every TTL/3, so its lease outlives the freeze by about 2/3 TTL; half the TTL
    // leaves room for a late renewal on a loaded machine and still catches an early handover.
    assert!(
        b_granted_after >= TTL / 2,
        "B got the lock {b_granted_after:?} after A froze, before A's lease could run out"
    );

    // 4. A resumes, WRITER first: its late write carries the old token and is refused.
    a_stdin
        .write_all(b"go\n")
        .expect("telling A's WRITER to write");
    a_stdin.flush().unwrap();
    signal(a_child, Signal::SIGCONT);
    wait_until("A's late write", T, || event("A", "late").is_some());
    assert_eq!(
        event("A", "late").unwrap(),
        ["409".to_owned(), t2.to_string()],
        "A's late write: refused, naming B's token"
    );
    // Then the CLI: the lock is lost, so it stops WRITER and exits 4.
    let resumed_at = Instant::now();
    signal(a.pid(), Signal::SIGCONT);
    let code = a.wait_code(T);
    let a_stopped_after = resumed_at.elapsed();
    let a_err = a.stderr();
    assert_eq!(code, 4, "A's CLI: {a_err}");
    assert!(a_err.contains("may be lost"), "{a_err}");
    assert!(a_err.contains("COMMAND stopped"), "{a_err}");
    assert_eq!(
        kill(Pid::from_raw(a_child), None),
        Err(Errno::ESRCH),
        "A's WRITER outlived its CLI"
    );
    let a_log = work.lines("A.log");
    assert_eq!(
        a_log.last().map(|l| l.starts_with("late")),
        Some(true),
        "A's WRITER did nothing after its late write: {a_log:?}"
    );

    // The resource saw exactly these writes, and kept B's value.
    let value = resource.get(KEY);
    let log: Vec<(u16, Option<u64>)> = resource
        .stop()
        .expect("the resource stops cleanly")
        .into_iter()
        .map(|a| (a.status, a.token))
        .collect();
    assert_eq!(
        log,
        [(200, Some(t1)), (200, Some(t2)), (409, Some(t1))],
        "every write the resource saw: (status, token)"
    );
    assert_eq!(value.as_deref(), Some(&b"B"[..]));
    println!("A's CLI said:\n{a_err}");
    println!(
        "A token {t1}, frozen; B granted {b_granted_after:?} later with token {t2}; A's late \
         write refused (409); A's CLI exited 4 {a_stopped_after:?} after it resumed"
    );
}

/// WRITER: run by `latchkey lock` with the lock and token in its environment. Appends its
/// account to the log: `start PID TOKEN`, `wrote STATUS HIGHEST`, and for A `waiting`, then
/// (after a line on stdin) `late STATUS HIGHEST`; then A waits for stdin to close.
fn writer(role: &str) {
    let log_path = std::env::var(LOG_ENV).expect("log path");
    let resource: SocketAddr = std::env::var(RESOURCE_ENV)
        .expect("resource address")
        .parse()
        .unwrap();
    let lock = std::env::var(LOCK_ENV).expect("LATCHKEY_LOCK from the CLI");
    let token = std::env::var(TOKEN_ENV).expect("LATCHKEY_TOKEN from the CLI");
    let note = |line: String| {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("writer log");
        f.write_all(format!("{line}\n").as_bytes()).expect("log");
    };
    note(format!("start {} {token}", std::process::id()));
    let (status, highest) = put(resource, &lock, &token, role);
    note(format!("wrote {status} {highest}"));
    if role != "A" {
        return;
    }
    note("waiting".into());
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    if stdin.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let (status, highest) = put(resource, &lock, &token, "A-late");
    note(format!("late {status} {highest}"));
    // Keep running, as a stale worker would, until stopped (or stdin closes).
    let _ = std::io::copy(&mut stdin, &mut std::io::sink());
}

/// `PUT /kv/KEY` with the fencing headers; the status and the `latchkey-highest` header (`-`
/// when absent).
fn put(resource: SocketAddr, lock: &str, token: &str, value: &str) -> (u16, String) {
    let request = format!(
        "PUT /kv/{KEY} HTTP/1.1\r\nhost: {resource}\r\n{LOCK_HEADER}: {lock}\r\n\
         {TOKEN_HEADER}: {token}\r\ncontent-length: {}\r\n\r\n{value}",
        value.len()
    );
    let mut stream = TcpStream::connect_timeout(&resource, T).expect("connect to the resource");
    stream.set_read_timeout(Some(T)).unwrap();
    stream.write_all(request.as_bytes()).expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    let head = answer.split("\r\n\r\n").next().unwrap_or_default();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {answer:?}"));
    let highest = head
        .split("\r\n")
        .skip(1)
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case(HIGHEST_HEADER)
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| "-".to_owned());
    (status, highest)
}
