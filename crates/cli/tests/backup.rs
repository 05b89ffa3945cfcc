//! Issue #14 item 5 on real `latchkey serve` processes: `latchkey snapshot save` from a running
//! cluster and `latchkey snapshot restore` into a new one (new data dirs, new ports), and the
//! refusals of a non-empty data dir and of a damaged file.

mod common;

use std::path::Path;
use std::time::Duration;

use common::cluster::{Cluster, Timing};
use common::{run, token_of, wait_until, Output, Proc, Server, Work, CLI_TIMEOUT};
use nix::sys::signal::Signal;
use serde_json::Value;

/// Generous bound for anything that should take a second or two.
const T: Duration = Duration::from_secs(30);
/// The sessions' lease: short, so that expiries come soon, and long enough that a new
/// cluster elects a leader and answers well within it.
const TTL: &str = "6s";

fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{:?}\nstdout: {}\nstderr: {}",
        out.status,
        out.stdout,
        out.stderr
    );
}

fn status(cluster: &Cluster, name: &str) -> Value {
    let out = cluster.cli(&[
        "status",
        "--json",
        name,
        "--endpoints",
        &cluster.endpoints(),
    ]);
    assert_ok(&out);
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {:?}", out.stdout))
}

/// `latchkey lock --ttl TTL NAME -- sh -c SCRIPT` against `cluster`.
fn lock(cluster: &Cluster, name: &str, wait: &str, script: &str, dir: &Path) -> Proc {
    let args: Vec<String> = [
        "lock",
        "--endpoints",
        &cluster.endpoints(),
        "--ttl",
        TTL,
        "--wait",
        wait,
        name,
        "--",
        "sh",
        "-c",
        script,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Proc::spawn(&args, dir)
}

fn record_and_sleep(work: &Work, tag: &str) -> String {
    format!(
        "echo {tag} $LATCHKEY_TOKEN >> '{}'; exec sleep 100",
        work.path("out").display()
    )
}

fn latchkey(args: &[&str], dir: &Path) -> Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    run(&args, dir, CLI_TIMEOUT)
}

#[test]
fn a_saved_cluster_restores_into_a_new_one_with_its_holders_queues_leases_and_tokens() {
    let work = Work::new();
    let dir = work.dir.path();
    let file = work.path("latchkey.backup");
    let old = Cluster::start(3);

    // "a": held by A, B queued; "b": held by C.
    let a = lock(&old, "a", "60s", &record_and_sleep(&work, "A"), dir);
    wait_until("A holds a", T, || work.lines("out").len() == 1);
    let b = lock(&old, "a", "60s", &record_and_sleep(&work, "B"), dir);
    wait_until("B queued on a", T, || status(&old, "a")["waiters"] == 1);
    let c = lock(&old, "b", "60s", &record_and_sleep(&work, "C"), dir);
    wait_until("C holds b", T, || work.lines("out").len() == 2);
    let before_a = status(&old, "a");
    let before_b = status(&old, "b");
    let highest_before = work.lines("out").iter().map(|l| token_of(l)).max().unwrap();

    let save = old.cli(&[
        "snapshot",
        "save",
        file.to_str().unwrap(),
        "--endpoints",
        &old.endpoints(),
    ]);
    assert_ok(&save);
    assert!(save.stdout.contains(&old.peers_flag()), "{}", save.stdout);

    // Nobody renews the sessions from now on: the lock CLIs are stopped (SIGSTOP, so that they
    // cannot close their sessions either). Once the old cluster expired them, more than a TTL
    // has passed since their last renewal: a restored lease that counted from before the
    // backup would be over before the new cluster starts.
    for p in [&a, &b, &c] {
        p.signal_group(Signal::SIGSTOP);
    }
    wait_until("the old cluster expired C's session", T, || {
        status(&old, "b")["held"] == false
    });
    drop((a, b, c));
    drop(old);

    let new = Cluster::start_seeded(3, Timing::default(), |cluster, id| {
        let data_dir = cluster.data_dir(id);
        let out = latchkey(
            &[
                "snapshot",
                "restore",
                file.to_str().unwrap(),
                "--data-dir",
                data_dir.to_str().unwrap(),
                "--id",
                &id.to_string(),
                "--peers",
                &cluster.peers_flag(),
            ],
            dir,
        );
        assert_ok(&out);
    });

    // The same locks, held by the same sessions under the same tokens, the same queue.
    let after_a = status(&new, "a");
    let after_b = status(&new, "b");
    for key in ["held", "session", "token"] {
        assert_eq!(
            after_a[key], before_a[key],
            "{key}: {before_a} vs {after_a}"
        );
        assert_eq!(
            after_b[key], before_b[key],
            "{key}: {before_b} vs {after_b}"
        );
    }
    assert_eq!(after_a["held"], true, "{after_a}");
    assert_eq!(after_b["held"], true, "{after_b}");
    let sessions = |s: &Value| -> Vec<Value> {
        s["queue"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["session"].clone())
            .collect()
    };
    assert_eq!(sessions(&after_a), sessions(&before_a), "{after_a}");
    assert_eq!(sessions(&after_a).len(), 1, "{after_a}");

    // A new waiter queues behind B; when the restored sessions expire, it gets "a" with a
    // token above every token the old cluster issued.
    let d = lock(&new, "a", "60s", &record_and_sleep(&work, "D"), dir);
    wait_until("D queued behind B", T, || status(&new, "a")["waiters"] == 2);
    assert_eq!(
        status(&new, "a")["queue"][0]["session"],
        before_a["queue"][0]["session"]
    );
    wait_until("D holds a", Duration::from_secs(60), || {
        work.lines("out").len() == 3
    });
    let lines = work.lines("out");
    let d_token = token_of(&lines[2]);
    assert!(lines[2].starts_with("D "), "{lines:?}");
    assert!(
        d_token > highest_before,
        "new token {d_token} is not above the old {highest_before}"
    );

    // C's session, never renewed on the new cluster, expires there like any other.
    wait_until(
        "C's restored session expired",
        Duration::from_secs(60),
        || status(&new, "b")["held"] == false,
    );
    drop(d);
}

#[test]
fn restore_refuses_a_data_dir_in_use_and_a_damaged_or_foreign_file() {
    let server = Server::start();
    let work = Work::new();
    let dir = work.dir.path();
    let file = work.path("one.backup");
    assert_ok(&server.cli(&["snapshot", "save", file.to_str().unwrap()]));
    let restore = |file: &Path, data_dir: &Path| {
        latchkey(
            &[
                "snapshot",
                "restore",
                file.to_str().unwrap(),
                "--data-dir",
                data_dir.to_str().unwrap(),
            ],
            dir,
        )
    };

    // The running server's own data dir.
    let out = restore(&file, &server.data_dir());
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stderr.contains("is not empty"), "{}", out.stderr);

    let bytes = std::fs::read(&file).unwrap();
    let truncated = work.path("truncated.backup");
    std::fs::write(&truncated, &bytes[..bytes.len() - 10]).unwrap();
    let mut flipped = bytes.clone();
    let middle = bytes.len() / 2;
    flipped[middle] ^= 0x01;
    let corrupt = work.path("corrupt.backup");
    std::fs::write(&corrupt, &flipped).unwrap();
    for damaged in [&truncated, &corrupt] {
        let target = work.path("fresh");
        let out = restore(damaged, &target);
        assert!(!out.status.success(), "{out:?}");
        assert!(
            out.stderr.contains("damaged or truncated"),
            "{}",
            out.stderr
        );
        // Said once (issue #33: the file's error was printed twice).
        assert_eq!(
            out.stderr.matches("damaged or truncated").count(),
            1,
            "{}",
            out.stderr
        );
        assert!(!target.exists(), "a refused restore left {target:?} behind");
    }
    let foreign = work.path("foreign.backup");
    std::fs::write(&foreign, b"not a backup at all").unwrap();
    let out = restore(&foreign, &work.path("fresh"));
    assert!(!out.status.success(), "{out:?}");
    assert!(
        out.stderr.contains("not a latchkey backup"),
        "{}",
        out.stderr
    );

    // The intact file still restores.
    assert_ok(&restore(&file, &work.path("fresh")));
}

/// A cluster of two Raft groups saves both groups' tables in one file, and a new cluster of
/// two groups restored from it has each lock in its group, held by the same session under
/// the same token; the next grant of each lock is above its token there. The new cluster
/// places its groups on replica subsets (four members, `--replicas 3`: group 0 on members 1-3,
/// group 1 on 2-4), so each member is seeded with only the groups it replicates.
#[test]
fn a_saved_cluster_of_two_groups_restores_every_group() {
    let work = Work::new();
    let dir = work.dir.path();
    let file = work.path("latchkey.backup");
    let groups = ["--groups", "2"];
    let old = Cluster::start_configured(1, Timing::default(), &groups);
    let names = common::names_by_group(2);
    let mut holders = Vec::new();
    for (i, name) in names.iter().enumerate() {
        holders.push(lock(
            &old,
            name,
            "60s",
            &record_and_sleep(&work, "old"),
            dir,
        ));
        wait_until(&format!("{name} held"), T, || {
            work.lines("out").len() == i + 1
        });
    }
    let before: Vec<Value> = names.iter().map(|n| status(&old, n)).collect();
    for (g, s) in before.iter().enumerate() {
        assert_eq!(s["group"], g, "{s}");
    }

    let save = old.cli(&[
        "snapshot",
        "save",
        file.to_str().unwrap(),
        "--endpoints",
        &old.endpoints(),
    ]);
    assert_ok(&save);
    assert!(save.stdout.contains("2 Raft groups"), "{}", save.stdout);
    for p in &holders {
        p.signal_group(Signal::SIGSTOP);
    }
    drop(holders);
    drop(old);

    let placed = ["--groups", "2", "--replicas", "3"];
    let new = Cluster::start_seeded_configured(4, Timing::default(), &placed, |cluster, id| {
        let data_dir = cluster.data_dir(id);
        let out = latchkey(
            &[
                "snapshot",
                "restore",
                file.to_str().unwrap(),
                "--data-dir",
                data_dir.to_str().unwrap(),
                "--id",
                &id.to_string(),
                "--peers",
                &cluster.peers_flag(),
                "--replicas",
                "3",
            ],
            dir,
        );
        assert_ok(&out);
        assert!(
            out.stdout.contains("--groups 2 --replicas 3"),
            "{}",
            out.stdout
        );
        // Member 1 is outside group 1 and member 4 outside group 0 (kept in the data dir
        // itself): nothing of it is seeded.
        let group_1 = cluster.data_dir(id).join("group-1");
        assert_eq!(group_1.exists(), id != 1, "member {id}'s group 1");
        let group_0 = cluster.data_dir(id).join("snapshots");
        assert_eq!(group_0.exists(), id != 4, "member {id}'s group 0");
    });
    for (name, was) in names.iter().zip(&before) {
        let now = status(&new, name);
        for key in ["held", "session", "token", "group"] {
            assert_eq!(now[key], was[key], "{name} {key}: {was} vs {now}");
        }
        assert_eq!(now["held"], true, "{now}");
    }
    // The restored sessions are never renewed: they expire, and each lock's next grant is
    // above every token of the old cluster.
    let mut takers = Vec::new();
    for (i, name) in names.iter().enumerate() {
        takers.push(lock(
            &new,
            name,
            "60s",
            &record_and_sleep(&work, "new"),
            dir,
        ));
        wait_until(
            &format!("{name} taken on the new cluster"),
            Duration::from_secs(60),
            || work.lines("out").len() == names.len() + i + 1,
        );
    }
    // Per lock: tokens of different groups are not comparable.
    for (line, was) in work.lines("out")[names.len()..].iter().zip(&before) {
        assert!(line.starts_with("new "), "{line}");
        let (token, old) = (token_of(line), was["token"].as_u64().unwrap());
        assert!(
            token > old,
            "{}: new token {token} is not above the old {old}",
            was["name"]
        );
    }
    drop(takers);
}
