//! End-to-end tests of `latchkey lock` against a real `latchkey serve` process: FIFO order and
//! fencing tokens, durability across kill -9, lease expiry of a paused holder, wait timeouts,
//! and the CLI stopping its COMMAND when the lock may be lost.

mod common;

use std::time::{Duration, Instant};

use common::{token_of, wait_until, Server, Work};
use nix::sys::signal::Signal;

/// Generous bound for anything that should take a second or two.
const T: Duration = Duration::from_secs(30);

/// A COMMAND that records its token under `tag`, then holds the lock until file `release`
/// exists.
fn hold_until_released(work: &Work, tag: &str) -> String {
    format!(
        "echo {tag} $LATCHKEY_TOKEN >> '{out}'; while [ ! -e '{release}' ]; do sleep 0.02; done",
        out = work.path("out").display(),
        release = work.path("release").display(),
    )
}

/// A COMMAND that records its token under `tag` and ends.
fn record(work: &Work, tag: &str) -> String {
    format!(
        "echo {tag} $LATCHKEY_TOKEN >> '{}'",
        work.path("out").display()
    )
}

#[test]
fn contenders_get_the_lock_in_fifo_order_with_increasing_tokens() {
    let server = Server::start();
    let work = Work::new();
    let dir = work.dir.path();

    let mut a = server.lock(
        "fifo",
        &["--ttl", "10s"],
        &hold_until_released(&work, "A"),
        dir,
    );
    wait_until("A holds the lock", T, || work.lines("out").len() == 1);
    let token_a = token_of(&work.lines("out")[0]);
    let status = server.status("fifo");
    assert_eq!(status["held"], true);
    assert_eq!(status["token"], token_a);
    assert_eq!(status["waiters"], 0);

    let mut b = server.lock("fifo", &[], &record(&work, "B"), dir);
    wait_until("B queued", T, || server.status("fifo")["waiters"] == 1);
    let mut c = server.lock("fifo", &[], &record(&work, "C"), dir);
    wait_until("C queued behind B", T, || {
        server.status("fifo")["waiters"] == 2
    });

    work.touch("release");
    assert_eq!(a.wait_code(T), 0, "A: {}", a.stderr());
    assert_eq!(b.wait_code(T), 0, "B: {}", b.stderr());
    assert_eq!(c.wait_code(T), 0, "C: {}", c.stderr());

    let lines = work.lines("out");
    let tags: Vec<&str> = lines.iter().map(|l| &l[..1]).collect();
    assert_eq!(tags, ["A", "B", "C"], "grant order: {lines:?}");
    let tokens: Vec<u64> = lines.iter().map(|l| token_of(l)).collect();
    assert!(
        tokens[0] < tokens[1] && tokens[1] < tokens[2],
        "tokens: {tokens:?}"
    );

    let status = server.status("fifo");
    assert_eq!(status["held"], false);
    assert!(status["token"].is_null());
    assert_eq!(status["waiters"], 0);
}

#[test]
fn command_exit_status_and_environment_pass_through() {
    let server = Server::start();
    let work = Work::new();
    let dir = work.dir.path();

    let env = format!(
        "echo \"$LATCHKEY_LOCK\" > '{}'; exit 7",
        work.path("env").display()
    );
    let mut p = server.lock("jobs/env", &[], &env, dir);
    assert_eq!(p.wait_code(T), 7, "{}", p.stderr());
    assert_eq!(work.lines("env"), ["jobs/env"]);

    // Died by SIGTERM: reported as the shell would, 128 + 15.
    let mut p = server.lock("jobs/env", &[], "kill -TERM $$", dir);
    assert_eq!(p.wait_code(T), 143, "{}", p.stderr());

    // Both runs released the lock.
    assert_eq!(server.status("jobs/env")["held"], false);
}

/// Issue #33: a COMMAND that is not found exits 127 and one that cannot be executed 126, as a
/// shell reports them (both exited 1), the reason said once; either way the lock is released.
#[test]
fn a_command_not_found_exits_127_and_one_not_executable_126() {
    let server = Server::start();
    let work = Work::new();
    let dir = work.dir.path();
    let not_executable = work.path("not-executable");
    std::fs::write(&not_executable, "#!/bin/sh\ntrue\n").unwrap();
    for (command, code, reason) in [
        ("/nonexistent/command", 127, "No such file or directory"),
        (not_executable.to_str().unwrap(), 126, "Permission denied"),
    ] {
        let args: Vec<String> = [
            "lock",
            "--endpoints",
            &server.addr,
            "jobs/run",
            "--",
            command,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let out = common::run(&args, dir, T);
        assert_eq!(out.status.code(), Some(code), "{command}: {}", out.stderr);
        assert_eq!(out.stderr.matches(reason).count(), 1, "{}", out.stderr);
        assert!(!out.stderr.contains("os error"), "{}", out.stderr);
    }
    assert_eq!(server.status("jobs/run")["held"], false);
}

/// Issue #33: `latchkey list` with no locks says so, on stderr (stdout stays empty for scripts).
#[test]
fn list_without_locks_says_so_on_stderr() {
    let server = Server::start();
    let out = server.cli(&["list"]);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout, "");
    assert!(out.stderr.contains("no locks are held"), "{}", out.stderr);
    let json = server.cli(&["list", "--json"]);
    assert_eq!(json.stdout.trim(), "[]");
    assert_eq!(json.stderr, "", "--json says nothing else");
}

#[test]
fn wait_times_out_with_status_3() {
    let server = Server::start();
    let work = Work::new();
    let dir = work.dir.path();

    let _a = server.lock("busy", &[], &hold_until_released(&work, "A"), dir);
    wait_until("A holds the lock", T, || work.lines("out").len() == 1);

    for wait in ["200ms", "0"] {
        let started = Instant::now();
        let mut b = server.lock("busy", &["--wait", wait], &record(&work, "B"), dir);
        assert_eq!(b.wait_code(T), 3, "--wait {wait}: {}", b.stderr());
        if wait == "200ms" {
            assert!(
                started.elapsed() >= Duration::from_millis(200),
                "gave up early"
            );
        }
        // A wait that ran out says so; a try-lock (`--wait 0`) names who holds the lock.
        let says = if wait == "0" {
            "is held by session"
        } else {
            "timed out"
        };
        assert!(b.stderr().contains(says), "--wait {wait}: {}", b.stderr());
        // Issue #33: the lock is named once ("lock \"busy\": timed out waiting for lock
        // \"busy\"" before).
        assert_eq!(b.stderr().matches("\"busy\"").count(), 1, "{}", b.stderr());
    }
    assert_eq!(work.lines("out").len(), 1, "B's COMMAND must not run");
    wait_until("the timed-out waiters left the queue", T, || {
        server.status("busy")["waiters"] == 0
    });
    work.touch("release");
}

#[test]
fn held_lock_and_token_sequence_survive_kill_9_of_the_server() {
    let mut server = Server::start();
    let work = Work::new();
    let dir = work.dir.path();

    // A TTL long enough to ride out the restart with renewals failing meanwhile.
    let mut a = server.lock(
        "durable",
        &["--ttl", "30s"],
        &hold_until_released(&work, "A"),
        dir,
    );
    wait_until("A holds the lock", T, || work.lines("out").len() == 1);
    let token_a = token_of(&work.lines("out")[0]);
    let before = server.status("durable");
    assert_eq!(before["token"], token_a);

    server.kill9();
    server.restart();

    let after = server.status("durable");
    assert_eq!(after["held"], true, "{after}");
    assert_eq!(after["session"], before["session"], "{after}");
    assert_eq!(after["token"], token_a, "{after}");

    // A kept its lease through the outage and releases normally.
    work.touch("release");
    assert_eq!(a.wait_code(T), 0, "A: {}", a.stderr());

    let mut b = server.lock("durable", &[], &record(&work, "B"), dir);
    assert_eq!(b.wait_code(T), 0, "B: {}", b.stderr());
    let token_b = token_of(&work.lines("out")[1]);
    assert!(
        token_b > token_a,
        "token after restart {token_b} <= {token_a}"
    );
}

#[test]
fn paused_holder_loses_the_lock_after_its_ttl_and_the_next_waiter_gets_a_higher_token() {
    let server = Server::start();
    let work = Work::new();
    let dir = work.dir.path();
    let ttl = Duration::from_secs(2);

    let mut a = server.lock(
        "paused",
        &["--ttl", "2s"],
        &hold_until_released(&work, "A"),
        dir,
    );
    wait_until("A holds the lock", T, || work.lines("out").len() == 1);
    let mut b = server.lock("paused", &[], &record(&work, "B"), dir);
    wait_until("B queued", T, || server.status("paused")["waiters"] == 1);

    // Freeze A's CLI and COMMAND: renewals stop.
    a.signal_group(Signal::SIGSTOP);
    let paused_at = Instant::now();
    assert_eq!(b.wait_code(T), 0, "B: {}", b.stderr());
    let waited = paused_at.elapsed();
    // A renews every TTL/3, so its lease outlives the pause by about 2/3 of the TTL; half the
    // TTL leaves room for a late renewal on a loaded machine and still catches a handover
    // that does not wait for the lease.
    assert!(
        waited >= ttl / 2,
        "the lock changed hands {waited:?} after the holder paused, before its TTL could pass"
    );
    let lines = work.lines("out");
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(token_of(&lines[1]) > token_of(&lines[0]), "{lines:?}");

    // Resumed, A's CLI sees that its deadline passed and stops its COMMAND.
    a.signal_group(Signal::SIGCONT);
    assert_eq!(a.wait_code(T), 4, "A: {}", a.stderr());
    assert!(a.stderr().contains("may be lost"), "{}", a.stderr());
}

#[test]
fn cli_stops_its_command_when_the_server_stops_answering() {
    let mut server = Server::start();
    let work = Work::new();
    let dir = work.dir.path();

    // One COMMAND exits on SIGTERM; the other ignores it and must be SIGKILLed.
    let polite = format!(
        "trap 'echo TERM >> \"{out}\"; exit 0' TERM; echo started >> '{out}'; while true; do sleep 0.02; done",
        out = work.path("polite").display()
    );
    let stubborn = format!(
        "trap '' TERM; echo started >> '{}'; while true; do sleep 0.02; done",
        work.path("stubborn").display()
    );
    let mut p = server.lock("stop/polite", &["--ttl", "2s"], &polite, dir);
    let mut s = server.lock("stop/stubborn", &["--ttl", "2s"], &stubborn, dir);
    wait_until("both COMMANDs run", T, || {
        work.lines("polite").len() == 1 && work.lines("stubborn").len() == 1
    });

    server.pause();
    assert_eq!(p.wait_code(T), 4, "polite: {}", p.stderr());
    assert_eq!(s.wait_code(T), 4, "stubborn: {}", s.stderr());
    server.resume();

    assert_eq!(
        work.lines("polite"),
        ["started", "TERM"],
        "COMMAND got SIGTERM"
    );
    assert!(p.stderr().contains("may be lost"), "{}", p.stderr());
    assert!(s.stderr().contains("SIGKILL"), "{}", s.stderr());
}

/// Whether process `pid` has ended: no such process, or a zombie nobody reaped yet (an orphan
/// waits for init, which in some containers never reaps).
fn gone(pid: i32) -> bool {
    if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
        == Err(nix::errno::Errno::ESRCH)
    {
        return true;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // "pid (comm) S ...": the state follows the last ')'.
    stat.rsplit(')')
        .next()
        .is_some_and(|rest| rest.trim_start().starts_with('Z'))
}

/// A COMMAND whose shell starts a grandchild (`sleep 300`), writes its pid to `pidfile`, runs
/// `then`, and waits.
fn with_grandchild(work: &Work, then: &str) -> String {
    format!(
        "sleep 300 & echo $! > '{pidfile}.tmp'; mv '{pidfile}.tmp' '{pidfile}'; {then}; wait",
        pidfile = work.path("pidfile").display()
    )
}

fn grandchild_pid(work: &Work) -> i32 {
    wait_until("COMMAND started its grandchild", T, || {
        work.lines("pidfile").len() == 1
    });
    work.lines("pidfile")[0].trim().parse().expect("a pid")
}

/// Regression: only COMMAND's own process was signalled, so what a `sh -c` started kept running
/// after the lock was lost.
#[test]
fn lost_lock_stops_the_commands_grandchildren_too() {
    let mut server = Server::start();
    let work = Work::new();
    let mut p = server.lock(
        "stop/tree",
        &["--ttl", "2s"],
        &with_grandchild(&work, "true"),
        work.dir.path(),
    );
    let grandchild = grandchild_pid(&work);
    assert!(!gone(grandchild));

    server.pause();
    assert_eq!(p.wait_code(T), 4, "{}", p.stderr());
    wait_until("the grandchild is gone", T, || gone(grandchild));
    server.resume();
}

/// Regression: the CLI reported on stderr before signalling, so with a stderr nobody reads
/// (a full pipe) it blocked in the report and never stopped COMMAND.
#[test]
fn lost_lock_stops_command_even_when_stderr_is_full() {
    let mut server = Server::start();
    let work = Work::new();
    // COMMAND fills the pipe (far more than a pipe holds) and blocks writing to it.
    let script = with_grandchild(&work, "head -c 4000000 /dev/zero >&2");
    let args: Vec<String> = [
        "lock",
        "--endpoints",
        &server.addr,
        "--ttl",
        "2s",
        "stop/stderr",
        "--",
        "sh",
        "-c",
        &script,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // The read end stays in the test's Child and is never read.
    let _p = common::Proc::spawn_with(&args, work.dir.path(), |c| {
        c.stderr(std::process::Stdio::piped());
    });
    let grandchild = grandchild_pid(&work);

    server.pause();
    wait_until("the grandchild is gone", T, || gone(grandchild));
    server.resume();
}

/// SIGTERM and SIGINT sent to `latchkey lock` reach COMMAND's group, which runs apart from the
/// CLI's: SIGTERM stops COMMAND's grandchildren too. (A non-interactive shell starts its
/// background jobs with SIGINT ignored, so SIGINT is checked on COMMAND itself.)
#[test]
fn signals_to_the_cli_are_forwarded_to_commands_group() {
    let server = Server::start();

    let work = Work::new();
    let mut p = server.lock(
        "fwd/term",
        &[],
        &with_grandchild(&work, "true"),
        work.dir.path(),
    );
    let grandchild = grandchild_pid(&work);
    common::signal(p.pid(), Signal::SIGTERM);
    wait_until("the grandchild is gone", T, || gone(grandchild));
    // The shell died of the signal; the CLI reports it as sh would.
    assert_eq!(p.wait_code(T), 143, "{}", p.stderr());

    let mut p = server.lock(
        "fwd/int",
        &[],
        &format!(
            "echo started > '{}'; while true; do sleep 0.02; done",
            work.path("int").display()
        ),
        work.dir.path(),
    );
    wait_until("COMMAND runs", T, || work.lines("int").len() == 1);
    common::signal(p.pid(), Signal::SIGINT);
    assert_eq!(p.wait_code(T), 130, "{}", p.stderr());

    // Both released the lock when COMMAND ended.
    assert_eq!(server.status("fwd/term")["held"], false);
    assert_eq!(server.status("fwd/int")["held"], false);
}

/// Issue #33: with `$USER` (and `LOGNAME`, `USERNAME`) unset, as under cron, systemd or
/// `env -i`, the holder's owner still names a user: the uid's name (it was empty).
#[test]
fn without_user_in_the_environment_the_owner_is_the_uids_name() {
    let server = Server::start();
    let work = Work::new();
    let status = std::process::Command::new(common::bin())
        .args([
            "lock",
            "--endpoints",
            &server.addr,
            "jobs/owner",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!(
            "{} status --json --endpoints {} jobs/owner > '{}'",
            common::bin(),
            server.addr,
            work.path("status").display()
        ))
        .env_remove("USER")
        .env_remove("LOGNAME")
        .env_remove("USERNAME")
        .current_dir(work.dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let seen: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(work.path("status")).unwrap()).unwrap();
    let user = seen["owner"]["user"].as_str().unwrap_or_default();
    assert!(!user.is_empty(), "{seen}");
}

/// Issue #33: `latchkey lock NAME` without COMMAND holds the lock until Ctrl-C (SIGINT) or
/// SIGTERM, printing its token on stdout, as `etcdctl lock NAME` does; then it releases the
/// lock and exits 0. It was a usage error ("the following required arguments were not
/// provided: <COMMAND>...").
#[test]
fn lock_without_a_command_holds_until_a_signal_and_prints_its_token() {
    let server = Server::start();
    let work = Work::new();
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        let args: Vec<String> = ["lock", "--endpoints", &server.addr, "jobs/held"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut p = common::Proc::spawn(&args, work.dir.path());
        wait_until("the token printed", T, || !p.stdout().trim().is_empty());
        let token: u64 = p.stdout().trim().parse().expect("a token on stdout");
        let status = server.status("jobs/held");
        assert_eq!(status["held"], true, "{status}");
        assert_eq!(status["token"], token, "{status}");
        assert!(
            p.try_status().is_none(),
            "it holds until signalled: {}",
            p.stderr()
        );
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid()), signal).unwrap();
        assert_eq!(p.wait_code(T), 0, "{signal}: {}", p.stderr());
        assert!(
            p.stderr().contains("released lock \"jobs/held\""),
            "{}",
            p.stderr()
        );
        assert_eq!(server.status("jobs/held")["held"], false);
    }
}
