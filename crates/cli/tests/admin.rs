//! Issue #14 items 6 and 7 on a real `latchkey serve`: who holds a lock (`--owner`, the owner
//! in `status --json`, the `lock --wait 0` message), and the audited incident tools
//! (`admin release`, `admin revoke`, `audit`). Access control's refusal of them is in
//! `acl.rs`.

mod common;

use std::time::Duration;

use common::{token_of, wait_until, Server, Work};

/// Generous bound for anything that should take a second or two.
const T: Duration = Duration::from_secs(30);
const EXIT_WAIT_TIMED_OUT: i32 = 3;
const EXIT_LOCK_LOST: i32 = 4;

/// A COMMAND that records its token under `tag`, then sleeps (until stopped).
fn record_and_sleep(work: &Work, tag: &str) -> String {
    format!(
        "echo {tag} $LATCHKEY_TOKEN >> '{}'; exec sleep 100",
        work.path("out").display()
    )
}

fn assert_ok(out: &common::Output) {
    assert!(
        out.status.success(),
        "{:?}\nstdout: {}\nstderr: {}",
        out.status,
        out.stdout,
        out.stderr
    );
}

#[test]
fn status_shows_the_holders_owner_and_each_waiter_and_a_try_lock_says_who_holds_it() {
    let server = Server::start();
    let work = Work::new();
    let dir = work.dir.path();
    let mut a = server.lock(
        "job",
        &["--owner", "nightly deploy"],
        &record_and_sleep(&work, "A"),
        dir,
    );
    wait_until("A holds the lock", T, || work.lines("out").len() == 1);
    let mut b = server.lock("job", &["--owner", "second"], "true", dir);
    wait_until("B queued", T, || server.status("job")["waiters"] == 1);

    let status = server.status("job");
    let owner = &status["owner"];
    assert_eq!(owner["pid"], a.pid(), "{status}");
    assert_eq!(owner["text"], "nightly deploy", "{status}");
    assert!(
        owner["host"].as_str().is_some_and(|h| !h.is_empty()),
        "{status}"
    );
    assert!(owner["user"].is_string(), "{status}");
    assert_eq!(status["queue"][0]["owner"]["pid"], b.pid(), "{status}");
    assert_eq!(status["queue"][0]["owner"]["text"], "second", "{status}");
    assert!(status["queue"][0]["waited_ms"].is_u64(), "{status}");

    let human = server.cli(&["status", "job"]);
    assert_ok(&human);
    let holder_pid = format!("pid {}", a.pid());
    assert!(
        human.stdout.contains(&holder_pid) && human.stdout.contains("nightly deploy"),
        "{}",
        human.stdout
    );
    assert!(human.stdout.contains("1. session"), "{}", human.stdout);
    let list = server.cli(&["list"]);
    assert_ok(&list);
    assert!(list.stdout.contains(&holder_pid), "{}", list.stdout);
    assert!(
        list.stdout.contains("1 waiting, longest"),
        "{}",
        list.stdout
    );

    // A try-lock names the holder as of its own request.
    let tried = server.cli(&["lock", "--wait", "0", "job", "--", "true"]);
    assert_eq!(
        tried.status.code(),
        Some(EXIT_WAIT_TIMED_OUT),
        "{}",
        tried.stderr
    );
    let session = status["session"].as_u64().unwrap();
    let says = format!("is held by session {session} (host ");
    assert!(
        tried.stderr.contains(&says) && tried.stderr.contains(&holder_pid),
        "{}",
        tried.stderr
    );

    a.signal_group(nix::sys::signal::Signal::SIGKILL);
    let _ = a.wait(T);
    b.signal_group(nix::sys::signal::Signal::SIGKILL);
    let _ = b.wait(T);
}

#[test]
fn admin_release_stops_the_holders_command_hands_the_lock_on_and_is_audited() {
    let server = Server::start();
    let work = Work::new();
    let dir = work.dir.path();
    // A short TTL: the holder learns of the release at its next renewal (every TTL/3).
    let mut a = server.lock(
        "stuck",
        &["--ttl", "3s"],
        &record_and_sleep(&work, "A"),
        dir,
    );
    wait_until("A holds the lock", T, || work.lines("out").len() == 1);
    let token_a = token_of(&work.lines("out")[0]);
    let mut b = server.lock("stuck", &[], &record_and_sleep(&work, "B"), dir);
    wait_until("B queued", T, || server.status("stuck")["waiters"] == 1);

    // A release conditional on another token changes nothing.
    let wrong = server.cli(&[
        "admin",
        "release",
        "stuck",
        "--token",
        &(token_a + 1000).to_string(),
        "--reason",
        "wrong token",
    ]);
    assert_eq!(wrong.status.code(), Some(1), "{}", wrong.stderr);
    assert!(wrong.stderr.contains("token-mismatch"), "{}", wrong.stderr);
    assert_eq!(server.status("stuck")["token"], token_a);

    let released = server.cli(&[
        "admin",
        "release",
        "stuck",
        "--token",
        &token_a.to_string(),
        "--reason",
        "INC-42 deploy hung",
    ]);
    assert_ok(&released);
    wait_until("B holds the lock", T, || work.lines("out").len() == 2);
    let token_b = token_of(&work.lines("out")[1]);
    assert!(token_b > token_a, "{token_b} after {token_a}");
    assert_eq!(
        a.wait_code(T),
        EXIT_LOCK_LOST,
        "A's COMMAND is stopped: {}",
        a.stderr()
    );
    // Said as what happened (issue #33), not as a lock that "may be lost".
    assert!(
        a.stderr().contains("was force-released by an operator"),
        "{}",
        a.stderr()
    );
    assert!(!a.stderr().contains("may be lost"), "{}", a.stderr());

    let audit = server.cli(&["audit", "--json"]);
    assert_ok(&audit);
    let records: serde_json::Value = serde_json::from_str(&audit.stdout).unwrap();
    assert_eq!(records.as_array().map(Vec::len), Some(1), "{records}");
    let r = &records[0];
    assert_eq!(r["action"], "force-release");
    assert_eq!(r["lock"], "stuck");
    assert_eq!(r["token"], token_a);
    assert_eq!(r["next_token"], token_b);
    assert_eq!(r["identity"], "anonymous");
    assert_eq!(r["reason"], "INC-42 deploy hung");
    assert!(r["at_ms"].as_u64().is_some_and(|t| t > 0), "{r}");

    // Revoke B's session: the lock is free, B's COMMAND stopped, and the log has both, newest
    // last.
    let session_b = server.status("stuck")["session"].as_u64().unwrap();
    let revoked = server.cli(&[
        "admin",
        "revoke",
        &session_b.to_string(),
        "--reason",
        "runaway worker",
    ]);
    assert_ok(&revoked);
    assert_eq!(server.status("stuck")["held"], false);
    assert_eq!(b.wait_code(T), EXIT_LOCK_LOST, "{}", b.stderr());
    let audit = server.cli(&["audit"]);
    assert_ok(&audit);
    let lines: Vec<&str> = audit.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", audit.stdout);
    assert!(lines[0].contains("force-release stuck"), "{}", lines[0]);
    assert!(
        lines[1].contains(&format!("revoke session {session_b}"))
            && lines[1].contains("runaway worker"),
        "{}",
        lines[1]
    );

    // Errors are clear and change nothing: a free lock, a missing session, no reason.
    let free = server.cli(&["admin", "release", "stuck", "--reason", "again"]);
    assert_eq!(free.status.code(), Some(1));
    assert!(free.stderr.contains("not held"), "{}", free.stderr);
    let gone = server.cli(&[
        "admin",
        "revoke",
        &session_b.to_string(),
        "--reason",
        "again",
    ]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(gone.stderr.contains("does not exist"), "{}", gone.stderr);
    let no_reason = server.cli(&["admin", "revoke", "7"]);
    assert_eq!(no_reason.status.code(), Some(2), "{}", no_reason.stderr);
}

/// Issue #33: the client library's own log lines stay out of a command's output unless `-v`
/// (with the default filter, no RUST_LOG): the force-released holder's stderr has the CLI's
/// sentence, and the library's warning ("an operator force-released a lock of this session")
/// only with `-v`.
#[test]
fn the_librarys_log_lines_show_only_with_verbose() {
    let server = Server::start();
    let work = Work::new();
    let library_line = "an operator force-released a lock of this session";
    for (name, verbose) in [("quiet", false), ("verbose", true)] {
        let mut args: Vec<String> = vec!["lock".into(), "--endpoints".into(), server.addr.clone()];
        if verbose {
            args.push("-v".into());
        }
        args.extend(["--ttl", "3s", name, "--", "sleep", "60"].map(String::from));
        let mut p = common::Proc::spawn_with(&args, work.dir.path(), |c| {
            c.env_remove("RUST_LOG");
        });
        wait_until("held", T, || server.status(name)["held"] == true);
        let released = server.cli(&["admin", "release", name, "--reason", "test"]);
        assert_ok(&released);
        assert_eq!(p.wait_code(T), EXIT_LOCK_LOST, "{}", p.stderr());
        let stderr = p.stderr();
        assert!(
            stderr.contains("was force-released by an operator"),
            "{stderr}"
        );
        assert_eq!(
            stderr.contains(library_line),
            verbose,
            "-v {verbose}: {stderr}"
        );
    }
}
