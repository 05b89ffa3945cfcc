//! Leader election (issue #32) through real `latchkey elect` processes on a real 3-member
//! cluster, across a kill -9 of the Raft leader's member. Each candidate's COMMAND records when
//! it started and stopped (its own clock reads, with its token) in a file of its own; an
//! observer (`latchkey elect --observe --json`) prints each leader. A COMMAND runs only while
//! its CLI leads, so COMMANDs that never overlap are terms that never overlapped.

mod common;

use std::time::Duration;

use common::cluster::Cluster;
use common::{wait_until, Proc, Work};

/// Bound for anything that should take a few seconds (an election, a grant).
const T: Duration = Duration::from_secs(30);
/// Bound for the whole run of candidates.
const RUN: Duration = Duration::from_secs(120);

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}

/// A `latchkey elect NAME --value TAG` whose COMMAND appends `start NS TOKEN`, runs for
/// `hold` seconds and appends `stop NS` to `work/TAG` (also when stopped by SIGTERM).
fn candidate(cluster: &Cluster, work: &Work, name: &str, tag: &str, hold: &str) -> Proc {
    let file = work.path(tag);
    let script = format!(
        "f='{f}'; echo start $(date +%s%N) $LATCHKEY_TOKEN >> \"$f\"; \
         trap 'echo stop $(date +%s%N) >> \"$f\"; exit 143' TERM; \
         sleep {hold} & wait $!; echo stop $(date +%s%N) >> \"$f\"",
        f = file.display()
    );
    let endpoints = cluster.endpoints();
    let args: Vec<String> = [
        "elect",
        "--endpoints",
        &endpoints,
        "--value",
        tag,
        name,
        "--",
        "sh",
        "-c",
        &script,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Proc::spawn(&args, work.dir.path())
}

/// A COMMAND's term: its token, start and stop (ns, wall clock).
#[derive(Debug, Clone)]
struct Term {
    token: u64,
    start: u128,
    stop: u128,
}

fn term_of(work: &Work, tag: &str) -> Term {
    let lines = work.lines(tag);
    let field = |prefix: &str, n: usize| -> u128 {
        lines
            .iter()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(n)?.parse().ok())
            .unwrap_or_else(|| panic!("{tag}: no {prefix:?} line with field {n} in {lines:?}"))
    };
    Term {
        token: field("start ", 2) as u64,
        start: field("start ", 1),
        stop: field("stop ", 1),
    }
}

fn started(work: &Work, tag: &str) -> bool {
    work.lines(tag).iter().any(|l| l.starts_with("start "))
}

/// The observer's lines as (session, token, value).
fn observed(observer: &Proc) -> Vec<(u64, u64, String)> {
    observer
        .stdout()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            (
                v["session"].as_u64().expect("session"),
                v["token"].as_u64().expect("token"),
                v["value"].as_str().expect("value").to_owned(),
            )
        })
        .collect()
}

/// Two candidates and an observer (whose watch starts on the member to be killed); the Raft
/// leader's member is killed while the first candidate's COMMAND runs. The first COMMAND stops before the second starts, the second
/// leads with a higher token, and the observer prints each leader exactly once, in order,
/// with its value.
#[test]
fn an_election_hands_over_across_a_leader_kill_and_the_observer_sees_each_leader_once() {
    let mut cluster = Cluster::start(3);
    let (leader, _) = cluster.wait_leader(&[], T);
    let work = Work::new();
    let endpoints = cluster.endpoints();
    // The observer asks the member that will be killed first, so that its watch has to
    // resume on another one.
    let mut first_the_leader = vec![cluster.addr(leader)];
    first_the_leader.extend(
        cluster
            .ids()
            .into_iter()
            .filter(|id| *id != leader)
            .map(|id| cluster.addr(id)),
    );
    let observer_endpoints = first_the_leader.join(",");
    let observer_args: Vec<String> = [
        "elect",
        "--observe",
        "--json",
        "--endpoints",
        &observer_endpoints,
        "svc",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let observer = Proc::spawn(&observer_args, work.dir.path());

    let mut a = candidate(&cluster, &work, "svc", "a", "6");
    wait_until("a leads", T, || started(&work, "a"));
    let mut b = candidate(&cluster, &work, "svc", "b", "1");
    // b waits in the queue: `status` shows a leading with its value.
    wait_until("b queued behind a", T, || {
        let out = cluster.cli(&["status", "--json", "svc", "--endpoints", &endpoints]);
        out.status.success()
            && serde_json::from_str::<serde_json::Value>(&out.stdout)
                .is_ok_and(|s| s["waiters"] == 1)
    });
    let out = cluster.cli(&["status", "--json", "svc", "--endpoints", &endpoints]);
    let status: serde_json::Value = serde_json::from_str(&out.stdout).expect("status --json");
    assert_eq!(status["value"], "a", "{status}");

    let killed_at = now_ns();
    cluster.kill9(leader);
    for (tag, p) in [("a", &mut a), ("b", &mut b)] {
        let s = p.wait(RUN);
        assert!(
            s.success(),
            "candidate {tag} ended with {s:?}; stderr:\n{}\n{}",
            p.stderr(),
            cluster.logs()
        );
    }
    let (ta, tb) = (term_of(&work, "a"), term_of(&work, "b"));
    assert!(
        ta.start < killed_at && killed_at < ta.stop,
        "the kill was not during a's term: {ta:?} killed at {killed_at}"
    );
    assert!(
        ta.stop < tb.start,
        "b's COMMAND started before a's stopped: {ta:?} {tb:?}"
    );
    assert!(
        ta.token < tb.token,
        "tokens did not increase: {ta:?} {tb:?}"
    );

    wait_until("the observer saw both leaders", T, || {
        observed(&observer).len() >= 2
    });
    let seen = observed(&observer);
    let tokens: Vec<(u64, String)> = seen.iter().map(|(_, t, v)| (*t, v.clone())).collect();
    assert_eq!(
        tokens,
        vec![(ta.token, "a".into()), (tb.token, "b".into())],
        "the observer saw {seen:?}; stderr:\n{}",
        observer.stderr()
    );
    drop(observer);
}
