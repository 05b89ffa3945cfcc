//! `latchkey bench` end to end: each workload runs for a second or two against a cluster the
//! bench starts itself, and its JSON report must be sane (figures present and consistent,
//! no errors or token violations where none can happen). Never a speed: CI machines differ.

mod common;

use std::time::Duration;

use serde_json::Value;

/// One bench run: cluster start (an election takes 1-2 s), warm-up, window, teardown.
const BENCH_TIMEOUT: Duration = Duration::from_secs(90);

/// Runs `latchkey bench --json ARGS`; its parsed report.
fn bench(args: &[&str]) -> Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut argv: Vec<String> = vec!["bench".into(), "--json".into()];
    argv.extend(args.iter().map(|s| s.to_string()));
    let out = common::run(&argv, dir.path(), BENCH_TIMEOUT);
    assert!(
        out.status.success(),
        "bench {args:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("bench {args:?} printed no JSON ({e}):\n{}", out.stdout))
}

fn f(report: &Value, path: &[&str]) -> f64 {
    let mut v = report;
    for key in path {
        v = &v[*key];
    }
    v.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number in {report:#}"))
}

/// Figures every workload has: ops, ordered percentiles, server costs, CPU.
fn assert_common(r: &Value, members: usize) {
    assert!(f(r, &["ops"]) > 0.0, "{r:#}");
    assert!(f(r, &["ops_per_s"]) > 0.0, "{r:#}");
    assert!(f(r, &["window_s"]) > 0.0, "{r:#}");
    let (p50, p99, p999, max) = (
        f(r, &["acquire", "p50_ms"]),
        f(r, &["acquire", "p99_ms"]),
        f(r, &["acquire", "p999_ms"]),
        f(r, &["acquire", "max_ms"]),
    );
    assert!(
        0.0 < p50 && p50 <= p99 && p99 <= p999 && p999 <= max,
        "{r:#}"
    );
    assert_eq!(r["token_violations"], 0, "{r:#}");
    assert!(f(r, &["cpu", "bench_cpu_s"]) >= 0.0, "{r:#}");
    assert_eq!(
        r["cpu"]["servers"].as_array().map(Vec::len),
        Some(members),
        "{r:#}"
    );
    assert!(r["server"].is_object(), "server metrics missing: {r:#}");
}

fn assert_release_percentiles(r: &Value) {
    let (p50, p99, p999) = (
        f(r, &["release", "p50_ms"]),
        f(r, &["release", "p99_ms"]),
        f(r, &["release", "p999_ms"]),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= p999, "{r:#}");
}

#[test]
fn uncontended_reports_pairs_and_two_requests_and_entries_each() {
    // Without coalescing (the before figures' mode, issue #35): each operation a call and an
    // entry of its own, which is what this counts. Batching and coalescing are counted in
    // `clients_share_the_connections_they_are_given`.
    let r = bench(&[
        "--cluster",
        "1",
        "--workload",
        "uncontended",
        "--clients",
        "4",
        "--no-coalesce",
        "--duration",
        "1500ms",
        "--warmup",
        "500ms",
    ]);
    assert_common(&r, 1);
    assert_release_percentiles(&r);
    assert_eq!(r["op"], "pair");
    assert_eq!(r["errors_total"], 0, "{r:#}");
    // Each pair is an acquire and a release: both are requests and log entries. Pairs in
    // flight at the window's ends make the ratio only about 2.
    for per_op in ["requests_per_op", "log_entries_per_op"] {
        let n = f(&r, &["server", per_op]);
        assert!((1.5..=3.0).contains(&n), "{per_op} {n}: {r:#}");
    }
    assert!(f(&r, &["server", "requests_by_method", "acquire"]) > 0.0);
    assert!(f(&r, &["server", "requests_by_method", "release"]) > 0.0);
    // Every entry is fsynced, and group commit puts one or more in each fdatasync.
    let commits = f(&r, &["server", "log_commits"]);
    assert!(
        commits > 0.0 && commits <= f(&r, &["server", "log_entries"]),
        "{r:#}"
    );
}

#[test]
fn contended_counts_handoffs_between_clients_in_token_order() {
    let r = bench(&[
        "--cluster",
        "1",
        "--workload",
        "contended",
        "--clients",
        "4",
        "--duration",
        "1500ms",
        "--warmup",
        "500ms",
    ]);
    assert_common(&r, 1);
    assert_release_percentiles(&r);
    assert_eq!(r["op"], "handoff");
    assert_eq!(r["errors_total"], 0, "{r:#}");
    let handoffs = f(&r, &["ops"]);
    let to_other = f(&r, &["handoffs_to_other_client"]);
    assert!(to_other > 0.0 && to_other <= handoffs, "{r:#}");
    // One grant per handoff, so the acquire latencies are as many as the handoffs.
    assert_eq!(f(&r, &["acquire", "count"]), handoffs, "{r:#}");
    assert!(f(&r, &["server", "log_entries_per_op"]) > 0.0, "{r:#}");
}

#[test]
fn herd_reports_requests_and_entries_per_handoff() {
    let r = bench(&[
        "--cluster",
        "1",
        "--workload",
        "herd",
        "--clients",
        "32",
        "--duration",
        "1500ms",
        "--warmup",
        "500ms",
    ]);
    assert_common(&r, 1);
    assert_eq!(r["errors_total"], 0, "{r:#}");
    assert!(f(&r, &["server", "requests_per_op"]) > 0.0, "{r:#}");
    assert!(f(&r, &["server", "log_entries_per_op"]) > 0.0, "{r:#}");
}

#[test]
fn hold_reports_memory_per_lock_and_keepalives() {
    // A 3 s lease renews every second: the 2 s window sees every session's keepalives.
    let r = bench(&[
        "--cluster",
        "1",
        "--workload",
        "hold",
        "--clients",
        "4",
        "--locks",
        "400",
        "--ttl",
        "3s",
        "--duration",
        "2s",
        "--warmup",
        "500ms",
    ]);
    assert_common(&r, 1);
    assert_eq!(r["errors_total"], 0, "{r:#}");
    assert_eq!(r["hold"]["locks"], 400, "{r:#}");
    let memory = r["hold"]["memory"].as_array().expect("memory per node");
    assert_eq!(memory.len(), 1, "{r:#}");
    assert!(memory[0]["rss_after_bytes"].as_u64().unwrap() > 0, "{r:#}");
    assert!(memory[0]["bytes_per_lock"].is_number(), "{r:#}");
    assert!(
        f(&r, &["server", "keepalive_requests_per_s"]) > 0.0,
        "{r:#}"
    );
}

#[test]
fn failover_measures_kill_to_grant_and_loses_no_grant() {
    let r = bench(&[
        "--cluster",
        "3",
        "--workload",
        "failover",
        "--rounds",
        "1",
        "--clients",
        "2",
        "--duration",
        "1s",
        "--warmup",
        "500ms",
    ]);
    assert_common(&r, 3);
    let times = r["failover"]["kill_to_grant_ms"].as_array().expect("times");
    assert_eq!(times.len(), 1, "{r:#}");
    let (min, median, max) = (
        f(&r, &["failover", "kill_to_grant_min_ms"]),
        f(&r, &["failover", "kill_to_grant_median_ms"]),
        f(&r, &["failover", "kill_to_grant_max_ms"]),
    );
    assert!(0.0 < min && min <= median && median <= max, "{r:#}");
    // The killed leader's requests count too (read just before the kill): every pair is at
    // least an acquire and a release, more with the retries of the failover.
    let per_op = f(&r, &["server", "requests_per_op"]);
    assert!(per_op >= 1.5, "requests_per_op {per_op}: {r:#}");
}

/// `--connections`, `--batch` and `--no-coalesce` (issue #35): the clients' sessions over fewer
/// `Client`s, their operations in calls of their own and an entry each with `--no-coalesce`
/// (the before figures), in Batch calls with `--batch` and in shared entries by default, said in
/// the report; more connections than clients is a usage error.
#[test]
fn clients_share_the_connections_they_are_given() {
    let r = bench(&[
        "--cluster",
        "1",
        "--clients",
        "4",
        "--connections",
        "2",
        "--no-coalesce",
        "--duration",
        "1s",
        "--warmup",
        "300ms",
    ]);
    assert_common(&r, 1);
    assert_eq!(
        (r["clients"].clone(), r["connections"].clone()),
        (4.into(), 2.into())
    );
    assert_eq!(r["errors_total"], 0, "{r:#}");
    // Without `--batch`: every operation in a call of its own; `--no-coalesce`: an entry each.
    assert_eq!(r["batch"], false, "{r:#}");
    assert!(
        f(&r, &["server", "requests_by_method", "acquire"]) > 0.0,
        "{r:#}"
    );
    let by_method = &r["server"]["requests_by_method"];
    assert!(by_method["batch"].as_f64().unwrap_or(0.0) == 0.0, "{r:#}");
    assert!(f(&r, &["server", "operations_per_entry"]) <= 1.0, "{r:#}");
    // `--batch` (issue #35 item 2): the operations ride Batch calls, none goes alone; the
    // member's coalescing (item 3, the default) writes a batch's operations in shared entries.
    let r = bench(&[
        "--cluster",
        "1",
        "--clients",
        "8",
        "--connections",
        "1",
        "--batch",
        "--duration",
        "1s",
        "--warmup",
        "300ms",
    ]);
    assert_common(&r, 1);
    assert_eq!(r["batch"], true, "{r:#}");
    assert_eq!(r["errors_total"], 0, "{r:#}");
    let by_method = &r["server"]["requests_by_method"];
    assert!(
        f(&r, &["server", "requests_by_method", "batch"]) > 0.0,
        "{r:#}"
    );
    assert!(by_method["acquire"].as_f64().unwrap_or(0.0) == 0.0, "{r:#}");
    assert!(by_method["release"].as_f64().unwrap_or(0.0) == 0.0, "{r:#}");
    assert!(f(&r, &["server", "operations_per_entry"]) > 1.0, "{r:#}");
    let dir = tempfile::tempdir().expect("temp dir");
    let argv: Vec<String> = ["bench", "--clients", "2", "--connections", "3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let out = common::run(&argv, dir.path(), BENCH_TIMEOUT);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("--connections must be 1 to --clients (2)"),
        "{}",
        out.stderr
    );
}

#[test]
fn failover_without_a_cluster_of_its_own_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let argv: Vec<String> = ["bench", "--workload", "failover", "--cluster", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let out = common::run(&argv, dir.path(), BENCH_TIMEOUT);
    // A usage error (issue #14: exit 2 everywhere).
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--cluster 3 or 5"), "{}", out.stderr);
}

/// Processes whose parent is `pid`.
fn children(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            // Field 4, the parent, comes right after the state that follows the ')'.
            stat.rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1)?.parse::<i32>().ok())
                == Some(pid)
        })
        .collect()
}

fn alive(pid: i32) -> bool {
    // A zombie has exited; only its entry waits to be reaped.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .is_some_and(|i| !stat[i + 1..].trim_start().starts_with('Z'))
    })
}

/// Starts a long bench on its own cluster; once its members run, `stop`s it and checks that
/// none of them outlives it.
fn assert_members_die_with_the_bench(stop: nix::sys::signal::Signal) {
    let dir = tempfile::tempdir().expect("temp dir");
    let argv: Vec<String> = ["bench", "--cluster", "3", "--duration", "10m"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Its cluster's temporary directory goes into ours: a bench killed -9 cannot remove it.
    let tmp = dir.path().to_owned();
    let mut bench = common::Proc::spawn_with(&argv, dir.path(), |c| {
        c.env("TMPDIR", tmp);
    });
    let mut members = Vec::new();
    common::wait_until("the bench's 3 members", BENCH_TIMEOUT, || {
        members = children(bench.pid());
        members.len() == 3
    });
    common::signal(bench.pid(), stop);
    bench.wait(BENCH_TIMEOUT);
    common::wait_until("every member to exit", BENCH_TIMEOUT, || {
        !members.iter().any(|&m| alive(m))
    });
}

#[test]
fn an_interrupted_bench_stops_its_cluster() {
    assert_members_die_with_the_bench(nix::sys::signal::Signal::SIGINT);
}

/// Without the parent-death signal, a bench killed -9 left its members running forever.
#[test]
fn a_bench_killed_9_leaves_no_member_running() {
    assert_members_die_with_the_bench(nix::sys::signal::Signal::SIGKILL);
}

/// The semaphore workload: every client on one semaphore of 3 permits, over three members,
/// each holding its permit 20 ms (so that more than 3 holders would overlap in the bench's
/// count: with the bench asking the server for 4 permits while counting 3, this failed with
/// '... grants found more holders of the semaphore than its 3 permits').
#[test]
fn semaphore_turns_on_one_semaphore_never_exceed_its_permits() {
    let r = bench(&[
        "--workload",
        "semaphore",
        "--permits",
        "3",
        "--hold",
        "20ms",
        "--clients",
        "8",
        "--cluster",
        "3",
        "--duration",
        "2s",
        "--warmup",
        "1s",
    ]);
    assert_common(&r, 3);
    assert_eq!(r["op"], "grant", "{r:#}");
    assert_eq!(r["permits"], 3, "{r:#}");
    assert_eq!(r["holders_over_permits"], 0, "{r:#}");
}

/// Processes (alive, not zombies) whose command line or environment mentions `marker`: a bench's
/// election candidates name it (their election) and their COMMANDs have it in `LATCHKEY_LOCK`.
fn processes_naming(marker: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            ["cmdline", "environ"].iter().any(|file| {
                std::fs::read(format!("/proc/{pid}/{file}"))
                    .is_ok_and(|bytes| String::from_utf8_lossy(&bytes).contains(marker))
            })
        })
        .filter(|&pid| alive(pid))
        .collect()
}

/// A lock-name prefix no other test's process has.
fn unique_prefix(what: &str) -> String {
    format!("smoke-{what}-{}/", std::process::id())
}

/// Issue #32's election failover figure: real `latchkey elect` processes, the leader's killed
/// -9 each round, timed to the next leader's COMMAND start; the shape of the report (not a
/// speed), and no candidate or COMMAND left running after the bench.
#[test]
fn election_times_a_leader_kill_to_the_next_command_and_leaves_no_process() {
    let prefix = unique_prefix("election");
    let r = bench(&[
        "--cluster",
        "1",
        "--workload",
        "election",
        "--clients",
        "3",
        "--rounds",
        "2",
        "--ttl",
        "1s",
        "--prefix",
        &prefix,
    ]);
    assert_eq!(r["workload"], "election", "{r:#}");
    assert_eq!(r["op"], "failover", "{r:#}");
    assert_eq!(r["ops"], 2, "{r:#}");
    assert_eq!(r["token_violations"], 0, "{r:#}");
    let e = &r["election"];
    assert_eq!(e["candidates"], 3, "{r:#}");
    assert_eq!(e["rounds"], 2, "{r:#}");
    assert_eq!(e["ttl_ms"], 1000, "{r:#}");
    let times = e["kill_to_command_ms"].as_array().expect("times");
    assert_eq!(times.len(), 2, "{r:#}");
    assert!(times.iter().all(|t| t.as_f64().unwrap() > 0.0), "{r:#}");
    assert_eq!(f(&r, &["election", "kill_to_command", "count"]), 2.0);
    let (p50, p99, max) = (
        f(&r, &["election", "kill_to_command", "p50_ms"]),
        f(&r, &["election", "kill_to_command", "p99_ms"]),
        f(&r, &["election", "kill_to_command", "max_ms"]),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{r:#}");
    assert!(r["server"].is_object(), "server metrics missing: {r:#}");
    let left = processes_naming(&prefix);
    assert!(left.is_empty(), "still running after the bench: {left:?}");
}

/// Candidates and their COMMANDs die with an interrupted bench (its cleanup) and with a bench
/// killed -9 (the candidates by the parent-death signal, a COMMAND by watching the bench).
fn assert_candidates_die_with_the_bench(stop: nix::sys::signal::Signal) {
    let dir = tempfile::tempdir().expect("temp dir");
    let prefix = unique_prefix(&format!("election-{}", stop.as_str()));
    let argv: Vec<String> = [
        "bench",
        "--cluster",
        "1",
        "--workload",
        "election",
        "--rounds",
        "100",
        "--prefix",
        &prefix,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Its temporary directories go into ours: a bench killed -9 cannot remove them.
    let tmp = dir.path().to_owned();
    let mut bench = common::Proc::spawn_with(&argv, dir.path(), |c| {
        c.env("TMPDIR", tmp);
    });
    // The bench itself (its --prefix), three candidates, and the leader's COMMAND (a shell and
    // its sleep).
    common::wait_until("the candidates and a COMMAND", BENCH_TIMEOUT, || {
        processes_naming(&prefix).len() >= 6
    });
    common::signal(bench.pid(), stop);
    bench.wait(BENCH_TIMEOUT);
    common::wait_until("every candidate and COMMAND to exit", BENCH_TIMEOUT, || {
        processes_naming(&prefix).is_empty()
    });
}

#[test]
fn an_interrupted_election_bench_stops_its_candidates_and_their_commands() {
    assert_candidates_die_with_the_bench(nix::sys::signal::Signal::SIGINT);
}

#[test]
fn an_election_bench_killed_9_leaves_no_candidate_or_command_running() {
    assert_candidates_die_with_the_bench(nix::sys::signal::Signal::SIGKILL);
}

#[test]
fn an_election_of_one_candidate_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let argv: Vec<String> = ["bench", "--workload", "election", "--clients", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let out = common::run(&argv, dir.path(), BENCH_TIMEOUT);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("must be 2 to"), "{}", out.stderr);
}

/// The one identity of [`an_election_bench_gives_its_candidates_its_auth_token`]'s server.
const BENCH_AUTH_TOKEN: &str = "bench-token-0123456789";

/// The election bench against a server with access control (`serve --acl`), given
/// `--auth-token`: its candidates connect as the bench does. They once got none of the bench's
/// connection options and exited unauthenticated ("candidate 1 exited").
#[test]
fn an_election_bench_gives_its_candidates_its_auth_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    let acl = dir.path().join("acl.toml");
    let text = format!(
        "[roles.bench]\nlock = [\"\"]\nread = [\"\"]\nadmin = [\"\"]\n\n\
         [identities.bench]\ntoken_sha256 = \"{}\"\nroles = [\"bench\"]\n",
        common::sha256_hex(BENCH_AUTH_TOKEN)
    );
    std::fs::write(&acl, text).expect("acl file");
    let addr = format!("127.0.0.1:{}", common::free_port());
    let mut server = common::serve::ServeProcess::new(dir.path().join("server.log"));
    let data = dir.path().join("data");
    let args = [
        "--listen",
        &addr,
        "--data-dir",
        &data.display().to_string(),
        "--acl",
        &acl.display().to_string(),
    ]
    .map(str::to_owned);
    server.spawn("the ACL server", args);
    let with_token = |args: &[&str]| -> Vec<String> {
        let mut argv: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        argv.extend(["--endpoints", &addr, "--auth-token", BENCH_AUTH_TOKEN].map(str::to_owned));
        argv
    };
    common::wait_until("the ACL server to lead", BENCH_TIMEOUT, || {
        let out = common::run(
            &with_token(&["cluster", "status", "--json"]),
            dir.path(),
            common::CLI_TIMEOUT,
        );
        out.status.success()
            && serde_json::from_str::<Value>(&out.stdout).is_ok_and(|r| !r["leader"].is_null())
    });
    let prefix = unique_prefix("election-acl");
    let r = bench(
        &with_token(&[
            "--workload",
            "election",
            "--clients",
            "2",
            "--rounds",
            "1",
            "--ttl",
            "1s",
            "--prefix",
            &prefix,
        ])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>(),
    );
    assert_eq!(r["ops"], 1, "{r:#}");
    assert_eq!(
        r["election"]["kill_to_command_ms"].as_array().map(Vec::len),
        Some(1)
    );
    let left = processes_naming(&prefix);
    assert!(left.is_empty(), "still running after the bench: {left:?}");
    drop(server);
}
