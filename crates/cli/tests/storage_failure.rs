//! A member whose log store fails for good (a full disk: ENOSPC; here the same failure through
//! a file-size limit, EFBIG, which needs no root and no small filesystem) must not linger as a
//! process that refuses every call with "shutting down": a supervisor could not tell it from a
//! working member. It exits non-zero with a line that says why, and a restart once the cause is
//! gone serves again from the same data dir (issue #14, "health that means something").
//!
//! Before the fix the process stayed up after the failure, `cluster status` reporting role
//! "shutdown", until it was killed.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_latchkey");

use latchkey_testkit::free_port;

/// Polls `latchkey cluster status` until this single member leads (bounded).
fn wait_leader(endpoint: &str, server: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new(BIN)
            .args(["cluster", "status", "--json", "--endpoints", endpoint])
            .output()
            .unwrap();
        if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("\"leader\"") {
            return;
        }
        assert!(
            server.try_wait().unwrap().is_none(),
            "the server exited before it led"
        );
        assert!(Instant::now() < deadline, "no leader within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_member_whose_log_store_fails_exits_and_a_restart_serves_again() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let endpoint = format!("127.0.0.1:{}", free_port());
    // Files above 200 KiB cannot be written (EFBIG; SIGXFSZ ignored, as the process would
    // otherwise be killed by it): the log file reaches that after a few hundred grants.
    let script = format!(
        "trap '' XFSZ; ulimit -f 200; exec {BIN} serve --listen {endpoint} --data-dir {}",
        data.display()
    );
    let mut server = Command::new("bash")
        .args(["-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_leader(&endpoint, &mut server);

    // Write until the member gives up (bounded: the bench stops after 60 s).
    let mut bench = Command::new(BIN)
        .args([
            "bench",
            "--workload",
            "uncontended",
            "--clients",
            "8",
            "--duration",
            "60s",
            "--warmup",
            "0s",
            "--endpoints",
            &endpoint,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = server.kill();
            let _ = server.wait();
            stop(&mut bench);
            panic!(
                "the member was still running 90 s after writes began; its last lines:\n{}",
                tail(&stderr_of(&mut server))
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    stop(&mut bench);
    let err = stderr_of(&mut server);
    assert_eq!(
        status.code(),
        Some(1),
        "exit status; stderr tail: {}",
        tail(&err)
    );
    assert!(
        err.contains("the Raft core stopped") && err.contains("File too large"),
        "the member must say why it exits: {}",
        tail(&err)
    );

    // The cause gone (no size limit), the same data dir serves again.
    let mut server = Command::new(BIN)
        .args(["serve", "--listen", &endpoint, "--data-dir"])
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_leader(&endpoint, &mut server);
    let lock = Command::new(BIN)
        .args([
            "lock",
            "--endpoints",
            &endpoint,
            "after-restart",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    stop(&mut server);
    assert!(
        lock.status.success(),
        "a lock after the restart: {}",
        String::from_utf8_lossy(&lock.stderr)
    );
}

fn stop(child: &mut std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// All a (finished) child wrote to its piped stderr.
fn stderr_of(child: &mut std::process::Child) -> String {
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut err)
        .expect("read stderr");
    err
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}
