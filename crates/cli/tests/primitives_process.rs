//! Read-write locks and counting semaphores (issue #32) through real `latchkey lock`
//! processes on a real 3-member cluster. Each COMMAND records when it started and stopped, by
//! its own clock reads, in a file of its own; the test checks the overlaps of those intervals:
//! a COMMAND runs only while its CLI holds the grant, so what the COMMANDs saw running at once
//! the lock had granted at once.

mod common;

use std::time::Duration;

use common::cluster::Cluster;
use common::{wait_until, Proc, Work};

/// Bound for anything that should take a few seconds (an election, a grant).
const T: Duration = Duration::from_secs(20);
/// Bound for a whole run of contenders to finish (they take turns).
const RUN: Duration = Duration::from_secs(120);

/// One COMMAND's run: its tag, its fencing token, and its start and stop (ns, wall clock).
#[derive(Debug, Clone)]
struct Run {
    tag: String,
    token: u64,
    start: u128,
    stop: u128,
}

/// A `latchkey lock` of `name` taking it as `how` (`--shared`, `--permits 3`, or nothing), whose
/// COMMAND appends `start NS TOKEN`, sleeps `hold`, and appends `stop NS` to `work/tag`.
fn contender(
    cluster: &Cluster,
    work: &Work,
    name: &str,
    how: &[&str],
    tag: &str,
    hold: &str,
) -> Proc {
    let file = work.path(tag);
    let script = format!(
        "echo start $(date +%s%N) $LATCHKEY_TOKEN >> '{f}'; sleep {hold}; \
         echo stop $(date +%s%N) >> '{f}'",
        f = file.display()
    );
    let mut args: Vec<String> = [
        "lock",
        "--endpoints",
        &cluster.endpoints(),
        "--wait",
        "100s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(how.iter().map(|s| s.to_string()));
    args.extend(
        [name, "--", "sh", "-c", &script]
            .iter()
            .map(|s| s.to_string()),
    );
    Proc::spawn(&args, work.dir.path())
}

fn started(work: &Work, tag: &str) -> bool {
    work.lines(tag).iter().any(|l| l.starts_with("start "))
}

/// The run `tag`'s COMMAND recorded (it must have started and stopped).
fn run_of(work: &Work, tag: &str) -> Run {
    let lines = work.lines(tag);
    let field = |prefix: &str, n: usize| -> u128 {
        lines
            .iter()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(n)?.parse().ok())
            .unwrap_or_else(|| panic!("{tag}: no {prefix:?} line with field {n} in {lines:?}"))
    };
    Run {
        tag: tag.to_owned(),
        token: field("start ", 2) as u64,
        start: field("start ", 1),
        stop: field("stop ", 1),
    }
}

/// The most runs of `runs` that overlapped at any instant, and the runs at that instant.
fn most_at_once(runs: &[Run]) -> (usize, Vec<String>) {
    let mut best = (0, Vec::new());
    for r in runs {
        // The most at once is reached at some run's start.
        let at = r.start;
        let during: Vec<String> = runs
            .iter()
            .filter(|o| o.start <= at && at < o.stop)
            .map(|o| o.tag.clone())
            .collect();
        if during.len() > best.0 {
            best = (during.len(), during);
        }
    }
    best
}

/// Waits for every process to exit 0.
fn all_succeed(procs: &mut [(String, Proc)], cluster: &Cluster) {
    for (tag, p) in procs.iter_mut() {
        let status = p.wait(RUN);
        assert!(
            status.success(),
            "{tag} ({:?}) ended with {status:?}; stderr:\n{}\n{}",
            p.args,
            p.stderr(),
            cluster.logs()
        );
    }
}

/// A semaphore of 3 over 10 `latchkey lock --permits 3` processes, with the leader killed
/// (kill -9) while the first three run: never more than 3 COMMANDs at once, exactly 3 at
/// some point (the permits are used), every one runs to its end, and each grant has a token
/// of its own.
#[test]
fn a_semaphore_of_three_never_runs_four_across_a_leader_kill() {
    const CONTENDERS: usize = 10;
    let mut cluster = Cluster::start(3);
    let (leader, _) = cluster.wait_leader(&[], T);
    let work = Work::new();
    let mut procs: Vec<(String, Proc)> = (0..CONTENDERS)
        .map(|i| {
            let tag = format!("job{i}");
            let p = contender(&cluster, &work, "jobs", &["--permits", "3"], &tag, "2");
            (tag, p)
        })
        .collect();
    let tags: Vec<String> = procs.iter().map(|(t, _)| t.clone()).collect();
    wait_until("three jobs run", T, || {
        tags.iter().filter(|t| started(&work, t)).count() >= 3
    });
    // `status` shows the semaphore: its permits, each holder with a token of its own, and the
    // queue of the others.
    let endpoints = cluster.endpoints();
    let out = cluster.cli(&["status", "--json", "jobs", "--endpoints", &endpoints]);
    assert!(out.status.success(), "status: {}", out.stderr);
    let status: serde_json::Value = serde_json::from_str(&out.stdout).expect("status --json");
    assert_eq!(
        (&status["mode"], &status["permits"]),
        (&"permits".into(), &3.into()),
        "{status}"
    );
    let holders = status["holders"].as_array().expect("holders");
    assert!((1..=3).contains(&holders.len()), "{status}");
    assert!(
        status["queue"]
            .as_array()
            .expect("queue")
            .iter()
            .all(|w| w["mode"] == "permits"),
        "{status}"
    );
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos();
    cluster.kill9(leader);
    all_succeed(&mut procs, &cluster);

    let runs: Vec<Run> = tags.iter().map(|t| run_of(&work, t)).collect();
    assert!(
        runs.iter().filter(|r| r.start > killed_at).count() >= 3,
        "the run did not go on across the leader's kill: {runs:#?}"
    );
    let (most, at_once) = most_at_once(&runs);
    assert!(
        most <= 3,
        "{most} jobs ran at once under a semaphore of 3: {at_once:?}\n{runs:#?}"
    );
    assert_eq!(
        most, 3,
        "the three permits were never used together: {runs:#?}"
    );
    let mut tokens: Vec<u64> = runs.iter().map(|r| r.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        CONTENDERS,
        "each permit grant has its own token: {runs:#?}"
    );
}

/// A read-write lock under mixed load: readers (`--shared`) run together, a writer (no flag)
/// runs alone, and every process runs to its end. Two readers start first (so the lock is
/// read-held), then writers and readers arrive mixed.
#[test]
fn readers_overlap_and_a_writer_overlaps_nobody() {
    let cluster = Cluster::start(3);
    cluster.wait_leader(&[], T);
    let work = Work::new();
    let mut procs: Vec<(String, Proc)> = Vec::new();
    for tag in ["r0", "r1"] {
        let p = contender(&cluster, &work, "cfg", &["--shared"], tag, "2");
        procs.push((tag.to_owned(), p));
    }
    wait_until("the first two readers run together", T, || {
        started(&work, "r0") && started(&work, "r1")
    });
    for tag in ["w0", "r2", "r3", "w1", "r4", "w2", "r5"] {
        let (how, hold): (&[&str], &str) = if tag.starts_with('w') {
            (&[], "0.5")
        } else {
            (&["--shared"], "1")
        };
        let p = contender(&cluster, &work, "cfg", how, tag, hold);
        procs.push((tag.to_owned(), p));
    }
    all_succeed(&mut procs, &cluster);

    let runs: Vec<Run> = procs.iter().map(|(t, _)| run_of(&work, t)).collect();
    let overlap = |a: &Run, b: &Run| a.start < b.stop && b.start < a.stop;
    for w in runs.iter().filter(|r| r.tag.starts_with('w')) {
        let beside: Vec<&str> = runs
            .iter()
            .filter(|o| o.tag != w.tag && overlap(w, o))
            .map(|o| o.tag.as_str())
            .collect();
        assert!(
            beside.is_empty(),
            "writer {} ran beside {beside:?}: {runs:#?}",
            w.tag
        );
    }
    let (r0, r1) = (&runs[0], &runs[1]);
    assert!(
        overlap(r0, r1),
        "the first readers did not overlap: {runs:#?}"
    );
    // A writer's token is above every grant before it, and below every one after (readers
    // granted one by one each have their own; the order their COMMANDs start in need not be
    // the order of their grants, so only pairs with a writer are compared).
    let mut by_start = runs.clone();
    by_start.sort_by_key(|r| r.start);
    for (i, a) in by_start.iter().enumerate() {
        for b in &by_start[i + 1..] {
            if a.tag.starts_with('w') || b.tag.starts_with('w') {
                assert!(
                    a.token < b.token,
                    "{} started before {} with a token not below: {by_start:#?}",
                    a.tag,
                    b.tag
                );
            }
        }
    }
}
