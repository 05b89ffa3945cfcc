//! The nemesis's CI mode on real processes (issue #34): every fault family once with no
//! violation, a planted client bug caught (by the checks, and by PostgreSQL's fence under
//! `docs/fencing.md`'s recipe), and a planted server bug caught. Needs root (network
//! namespaces) and the `latchkey` binary built beside this crate's (`cargo build -p latchkey`;
//! the server plant needs it a debug build, as `cargo build` makes it), so these tests are
//! `#[ignore]`d in a plain `cargo test`; `.ci/run` runs them with `--ignored`. They share the
//! machine's `lkn-` namespaces and take turns (the run holds a file lock).

use std::path::PathBuf;
use std::process::Command;

fn nemesis() -> &'static str {
    env!("CARGO_BIN_EXE_latchkey-nemesis")
}

/// The `latchkey` binary of the same build.
fn latchkey() -> PathBuf {
    let path = PathBuf::from(nemesis()).with_file_name("latchkey");
    assert!(
        path.exists(),
        "{} is missing: build it first (cargo build -p latchkey)",
        path.display()
    );
    path
}

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(nemesis())
        .arg("run")
        .arg("--latchkey")
        .arg(latchkey())
        .args(args)
        .output()
        .expect("running latchkey-nemesis");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    (out.status.code().unwrap_or(-1), stdout)
}

#[test]
#[ignore = "needs root and the latchkey binary; .ci/run runs it"]
fn every_fault_family_once_leaves_no_violation() {
    // The four workers of the Rust client and two running the real CLI, `latchkey lock`.
    let (code, out) = run(&["--ci", "--cli-workers", "2"]);
    assert_eq!(code, 0, "the run failed or found violations:\n{out}");
    for kind in [
        "IsolateLeader",
        "SplitLeaderMinority",
        "Bridge",
        "AsymmetricLeader",
        "ClientCutFromLeader",
        "KillLeader",
        "PauseLeader",
        "PauseWorker",
        "IsolateWorker",
        "ClockJumpLeader",
        "ClockJumpWorkers",
        "ClockStrobe",
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(kind) && l.split_whitespace().nth(1) == Some("1")),
            "{kind} was not made once:\n{out}"
        );
    }
    assert!(
        !out.contains("skipped:"),
        "a fault could not be made:\n{out}"
    );
    assert!(out.contains("violations: 0"), "{out}");
    // The PostgreSQL resource was written through the book's recipe all along.
    assert!(postgres(&out, "written") > 0, "{out}");
    assert!(cli_grants(&out) > 0, "{out}");
}

/// A count from the summary's `postgres:` line: `N written`, `N refused`, ...
fn postgres(out: &str, what: &str) -> u64 {
    let line = out
        .lines()
        .find(|l| l.starts_with("postgres: "))
        .unwrap_or_else(|| panic!("no postgres line:\n{out}"));
    let words: Vec<&str> = line.split([' ', ',']).collect();
    let at = words
        .iter()
        .position(|w| *w == what)
        .unwrap_or_else(|| panic!("no {what:?} in {line:?}"));
    words[at - 1].parse().unwrap()
}

#[test]
#[ignore = "needs root and the latchkey binary; .ci/run runs it"]
fn a_client_that_ignores_its_deadline_is_caught() {
    let (code, out) = run(&[
        "--ci",
        "--faults",
        "pause-worker",
        "--plant",
        "ignore-deadline",
    ]);
    assert_eq!(code, 1, "the planted bug was not caught:\n{out}");
    assert!(out.contains("[hold_overlap]"), "{out}");
    // The paused holder's late write, under its old token, was refused by `docs/fencing.md`'s
    // PostgreSQL recipe (the others wrote the row with higher tokens while it was stopped), and
    // PostgreSQL's log shows no fence going down.
    assert!(postgres(&out, "refused") >= 1, "{out}");
    assert!(!out.contains("[postgres_fence]"), "{out}");
}

/// A server bug: members that answer keepalives on their own belief that they lead, without
/// the read-index round that confirms it with a quorum (`Plant::renew_without_quorum`, put in
/// through the debug binary's `LATCHKEY_TEST_PLANT`). Two workers contend for one lock: one of
/// the Rust client, one running the real CLI (`latchkey lock NAME -- COMMAND`). The leader is
/// split from the other two members just after a worker was granted the lock; both workers
/// still reach both sides. The deposed leader keeps the holder's lease alive alone, the
/// majority's new leader expires it (the holder's keepalives never reach it) and grants the
/// lock to the other worker, and the holder, whose client deadline the deposed leader kept
/// moving, acts as the holder through its five-second critical section: two holders at one
/// real time. Unplanted, the deposed leader refuses the holder's renewals (its read-index round
/// fails): the holder renews at the new leader or finds its lock lost before its second hold
/// check (the CLI stops its COMMAND), and the run finds nothing.
#[test]
#[ignore = "needs root and the latchkey binary; .ci/run runs it"]
fn a_deposed_leader_that_renews_leases_alone_is_caught() {
    let (code, out) = run(&[
        "--ci",
        "--faults",
        "split-leader-minority",
        "--server-plant",
        "renew-without-quorum",
        "--workers",
        "1",
        "--cli-workers",
        "1",
        "--locks",
        "1",
        "--ttl-secs",
        "2",
        "--hold-ms",
        "5000",
        "--fault-secs",
        "7",
    ]);
    assert!(out.contains("(aimed: worker"), "{out}");
    // Between the two workers: the Rust client's (1) and the CLI's (2).
    caught_between_workers_1_and_2(code, &out);
    assert!(cli_grants(&out) > 0, "{out}");
}

/// A planted run's verdict: caught (exit 1), two holders at once, workers 1 and 2.
fn caught_between_workers_1_and_2(code: i32, out: &str) {
    assert_eq!(
        code, 1,
        "the planted bug was not caught (exit 2: the run could not be made; the plant needs a \
         debug build of latchkey):\n{out}"
    );
    let overlap = out
        .lines()
        .find(|l| l.contains("[hold_overlap]"))
        .unwrap_or_else(|| panic!("no hold_overlap:\n{out}"));
    assert!(
        overlap.contains("client: 1,") && overlap.contains("client: 2,"),
        "{overlap}"
    );
}

/// A bug of the CLI: `latchkey lock` that leaves COMMAND running when its lock may be lost
/// (`LockPlant::ignores_deadline`, put in through the debug binary's `LATCHKEY_TEST_PLANT`).
/// Two CLI workers contend for one lock, TTL 2 s, 5 s critical sections; one is cut from
/// everyone inside its critical section for 8 s. Its `latchkey lock` cannot renew; the cluster
/// expires its session and grants the lock to the other worker, while the cut worker's
/// COMMAND, never stopped, makes its second hold check. Unplanted, the CLI stops COMMAND at
/// its deadline, before the cluster can expire the session, and the run finds nothing.
#[test]
#[ignore = "needs root and the latchkey binary; .ci/run runs it"]
fn a_cli_that_leaves_its_command_running_past_the_deadline_is_caught() {
    let (code, out) = run(&[
        "--ci",
        "--faults",
        "isolate-worker",
        "--cli-plant",
        "ignore-deadline",
        "--workers",
        "0",
        "--cli-workers",
        "2",
        "--locks",
        "1",
        "--ttl-secs",
        "2",
        "--hold-ms",
        "5000",
        "--fault-secs",
        "8",
    ]);
    assert!(out.contains("inside its critical section)"), "{out}");
    caught_between_workers_1_and_2(code, &out);
}

/// The summary's count of grants to the workers running `latchkey lock`.
fn cli_grants(out: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix("grants to `latchkey lock` workers: "))
        .unwrap_or_else(|| panic!("no count of the CLI workers' grants:\n{out}"))
        .trim()
        .parse()
        .unwrap()
}
