//! Logs an operator can read (issue #14 item 4): with the default filter, a member that stays
//! down is reported once when it goes down and once when it comes back, not in a WARN line per
//! heartbeat retry (ten a second); `--log-format json` writes one JSON object per line.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{bin, free_port};

fn serve(id: usize, ports: &[u16], dir: &std::path::Path, extra: &[&str]) -> Child {
    let peers = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let log = std::fs::File::create(dir.join(format!("n{id}.log"))).unwrap();
    Command::new(bin())
        .args(["serve", "--id", &id.to_string(), "--listen"])
        .arg(format!("127.0.0.1:{}", ports[id - 1]))
        .arg("--data-dir")
        .arg(dir.join(format!("n{id}")))
        .args(["--peers", &peers])
        .args(extra)
        // The default filter is what is tested.
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn log_of(dir: &std::path::Path, id: usize) -> String {
    std::fs::read_to_string(dir.join(format!("n{id}.log"))).unwrap_or_default()
}

fn wait_log(dir: &std::path::Path, id: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log_of(dir, id).contains(what) {
        assert!(
            Instant::now() < deadline,
            "member {id} never logged {what:?}:\n{}",
            log_of(dir, id)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_member_down_is_logged_once_each_way_and_json_lines_parse() {
    let tmp = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut members = vec![
        serve(1, &ports, tmp.path(), &[]),
        serve(2, &ports, tmp.path(), &[]),
    ];
    for id in [1, 2] {
        wait_log(tmp.path(), id, "member 3 is unreachable");
    }
    // Three seconds of heartbeats to the missing member: about 30 retries per member.
    std::thread::sleep(Duration::from_secs(3));
    let before: Vec<String> = [1, 2].iter().map(|&id| log_of(tmp.path(), id)).collect();
    for log in &before {
        assert_eq!(log.matches("member 3 is unreachable").count(), 1, "{log}");
        assert!(
            log.lines().count() < 20,
            "{} lines in 3 s with a member down:\n{log}",
            log.lines().count()
        );
    }

    members.push(serve(3, &ports, tmp.path(), &["--log-format", "json"]));
    let leader = if log_of(tmp.path(), 1).contains("became leader") {
        1
    } else {
        2
    };
    wait_log(tmp.path(), leader, "member 3 is reachable again");
    wait_log(tmp.path(), 3, "latchkey node serving");
    for line in log_of(tmp.path(), 3).lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v.get("level").is_some() && v.get("fields").is_some(),
            "{line}"
        );
    }
    for m in &mut members {
        let _ = m.kill();
        let _ = m.wait();
    }
}

/// Issue #33: a failover in a healthy cluster (the leader killed, the others elect) leaves no
/// WARN line of openraft's own in the survivors' logs: its vote requests to the dead leader
/// logged 600-character error chains ("while requesting vote, error: Unreachable node:
/// tonic::status::Status ..."); the member's own "member N is unreachable" says it once.
#[test]
fn a_failover_logs_no_openraft_warnings() {
    let tmp = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut members: Vec<Child> = (1..=3)
        .map(|id| serve(id, &ports, tmp.path(), &[]))
        .collect();
    let leader = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(id) = (1..=3).find(|&id| log_of(tmp.path(), id).contains("became leader")) {
                break id;
            }
            assert!(Instant::now() < deadline, "no leader elected");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let _ = members[leader - 1].kill();
    let _ = members[leader - 1].wait();
    let survivors: Vec<usize> = (1..=3).filter(|&id| id != leader).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !survivors
        .iter()
        .any(|&id| log_of(tmp.path(), id).contains("became leader"))
    {
        assert!(Instant::now() < deadline, "no new leader elected");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A second of the new term, in which the dead leader is still asked for votes and
    // heartbeats.
    std::thread::sleep(Duration::from_secs(1));
    for &id in &survivors {
        let log = log_of(tmp.path(), id);
        let chatter: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("openraft"))
            .collect();
        assert!(chatter.is_empty(), "member {id}:\n{}", chatter.join("\n"));
    }
    // The new leader, which sends the dead one heartbeats, says it once instead.
    wait_until_logged(
        tmp.path(),
        &survivors,
        &format!("member {leader} is unreachable"),
    );
    for m in &mut members {
        let _ = m.kill();
        let _ = m.wait();
    }
}

/// Waits (bounded) until one of `ids` logged `what`.
fn wait_until_logged(dir: &std::path::Path, ids: &[usize], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ids.iter().any(|&id| log_of(dir, id).contains(what)) {
        assert!(Instant::now() < deadline, "none of {ids:?} logged {what:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
