//! `latchkey watch` (issue #14 item 8) against real `latchkey serve` processes: the events of a
//! scripted workload in order, a watch that survives the death of the leader it streams from
//! without repeating or skipping an event, and the `missed` notice for events a member no
//! longer keeps.

mod common;

use std::time::Duration;

use common::cluster::{Cluster, Timing};
use common::proxy::Mode;
use common::{wait_until, Proc, Server, Work, CLI_TIMEOUT};
use serde_json::Value;

/// How long a watch may take to print what the test waits for.
const WATCH_TIMEOUT: Duration = Duration::from_secs(30);

/// A `latchkey watch --json` process; a failing test prints what it wrote.
struct Watcher(Proc);

impl Drop for Watcher {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- watch {:?} stdout ---\n{}\n--- stderr ---\n{}",
                self.0.args,
                self.0.stdout(),
                self.0.stderr()
            );
        }
    }
}

/// `latchkey watch --json ARGS` in its own process.
fn spawn_watch(work: &Work, args: &[&str]) -> Watcher {
    let mut full = vec!["watch".to_string(), "--json".into()];
    full.extend(args.iter().map(|s| s.to_string()));
    Watcher(Proc::spawn(&full, work.dir.path()))
}

/// The JSON lines the watch printed so far (a last line still being written is left out).
fn lines(watch: &Watcher) -> Vec<Value> {
    let out = watch.0.stdout();
    let complete = match out.rfind('\n') {
        Some(end) => &out[..end],
        None => "",
    };
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

fn wait_lines(watch: &mut Watcher, n: usize, what: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    wait_until(what, WATCH_TIMEOUT, || {
        seen = lines(watch);
        seen.len() >= n || watch.0.try_status().is_some()
    });
    assert!(seen.len() >= n, "{what}: {} of {n} lines", seen.len());
    seen
}

fn summary(v: &Value) -> (String, String) {
    (
        v["kind"].as_str().unwrap().to_owned(),
        v["lock"].as_str().unwrap_or("").to_owned(),
    )
}

fn position(v: &Value) -> (u64, u64) {
    (v["index"].as_u64().unwrap(), v["ordinal"].as_u64().unwrap())
}

fn assert_positions_increase(events: &[Value]) {
    for pair in events.windows(2) {
        assert!(
            position(&pair[0]) < position(&pair[1]),
            "positions not strictly increasing: {} then {}",
            pair[0],
            pair[1]
        );
    }
}

#[test]
fn watch_shows_grant_queue_handoff_and_expiry_in_order() {
    let server = Server::start();
    let work = Work::new();
    // From index 0: a fresh member keeps every event, so nothing before the watch connects is
    // lost to a race.
    let mut watch = spawn_watch(
        &work,
        &["--endpoints", &server.addr, "--after", "0", "jobs/"],
    );

    let a_held = work.path("a.held");
    let a_go = work.path("a.go");
    let a = server.lock(
        "jobs/a",
        &[],
        &format!(
            "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
            a_held.display(),
            a_go.display()
        ),
        work.dir.path(),
    );
    wait_until("a holds jobs/a", WATCH_TIMEOUT, || a_held.exists());
    // Another prefix: not shown.
    assert!(server
        .cli(&["lock", "other/x", "--", "true"])
        .status
        .success());
    let b_held = work.path("b.held");
    let mut b = server.lock(
        "jobs/a",
        &["--ttl", "2s"],
        &format!("touch {}; sleep 1000", b_held.display()),
        work.dir.path(),
    );
    wait_lines(&mut watch, 2, "granted, queued");
    work.touch("a.go");
    wait_until("b holds jobs/a", WATCH_TIMEOUT, || b_held.exists());
    // b's holder dies without a word: its session expires after its 2 s TTL.
    b.signal_group(nix::sys::signal::Signal::SIGKILL);
    b.wait(CLI_TIMEOUT);
    let events = wait_lines(&mut watch, 5, "through the expiry");
    drop(a);

    let kinds: Vec<(String, String)> = events.iter().map(summary).collect();
    let want = ["granted", "queued", "released", "granted", "expired"]
        .map(|k| (k.to_owned(), "jobs/a".to_owned()));
    assert_eq!(kinds, want, "{events:#?}");
    assert_positions_increase(&events);
    let token = |i: usize| events[i]["token"].as_u64();
    let session = |i: usize| events[i]["session"].as_u64().unwrap();
    // a's grant: its token is its entry's index; the queue change has no token.
    assert_eq!(token(0), events[0]["index"].as_u64());
    assert_eq!(token(1), None);
    // The release and the handoff are one entry: a's token ends, b's begins at that index.
    assert_eq!(events[2]["index"], events[3]["index"]);
    assert_eq!((session(2), token(2)), (session(0), token(0)));
    assert_eq!(token(3), events[3]["index"].as_u64());
    assert_eq!(session(3), session(1));
    // The expiry ends b's grant.
    assert_eq!((session(4), token(4)), (session(3), token(3)));
    assert!(watch.0.try_status().is_none(), "the watch exited");
}

#[test]
fn watch_resumes_on_another_member_when_its_member_dies_without_gaps_or_repeats() {
    let mut cluster = Cluster::start(3);
    let work = Work::new();
    let (leader, _) = cluster.wait_leader(&[], Duration::from_secs(30));
    // The watch connects to its first endpoint: the leader, killed below.
    let mut endpoints = vec![cluster.addr(leader)];
    endpoints.extend(
        cluster
            .ids()
            .into_iter()
            .filter(|&id| id != leader)
            .map(|id| cluster.addr(id)),
    );
    let endpoints = endpoints.join(",");
    let mut watch = spawn_watch(&work, &["--endpoints", &endpoints, "--after", "0", "w/"]);

    let run = |cluster: &Cluster, i: usize, live: &str| {
        let name = format!("w/{i}");
        let out = cluster.cli(&["lock", "--endpoints", live, &name, "--", "true"]);
        assert!(out.status.success(), "lock {name}: {}", out.stderr);
    };
    let mut want = Vec::new();
    for i in 0..5 {
        run(&cluster, i, &cluster.endpoints());
        want.push(("granted".to_owned(), format!("w/{i}")));
        want.push(("released".to_owned(), format!("w/{i}")));
    }
    wait_lines(&mut watch, want.len(), "before the kill");

    cluster.kill9(leader);
    let (new_leader, _) = cluster.wait_leader(&[leader], Duration::from_secs(30));
    let live = cluster
        .ids()
        .into_iter()
        .filter(|&id| id != leader)
        .map(|id| cluster.addr(id))
        .collect::<Vec<_>>()
        .join(",");
    for i in 5..10 {
        run(&cluster, i, &live);
        want.push(("granted".to_owned(), format!("w/{i}")));
        want.push(("released".to_owned(), format!("w/{i}")));
    }
    let events = wait_lines(&mut watch, want.len(), "after the kill");
    let got: Vec<(String, String)> = events.iter().map(summary).collect();
    assert_eq!(got, want, "{events:#?}");
    assert_positions_increase(&events);
    assert!(
        events.iter().all(|e| e["kind"] != "missed"),
        "nothing may be missed: {events:#?}"
    );

    // Another member streams the same events at the same positions: positions are log
    // positions, the same on every member.
    let mut other = spawn_watch(
        &work,
        &[
            "--endpoints",
            &cluster.addr(new_leader),
            "--after",
            "0",
            "w/",
        ],
    );
    let replayed = wait_lines(&mut other, want.len(), "replay on the new leader");
    assert_eq!(replayed, events);
}

#[test]
fn a_watch_from_before_what_a_member_keeps_is_told_it_missed_events() {
    // Snapshots every 10 entries: after a restart the member starts from its snapshot, and the
    // events before it are not kept.
    let mut server = Server::start_with(&[
        "--snapshot-every-entries",
        "10",
        "--log-kept-after-snapshot",
        "0",
    ]);
    for i in 0..6 {
        let name = format!("m/{i}");
        let out = server.cli(&["lock", &name, "--", "true"]);
        assert!(out.status.success(), "lock {name}: {}", out.stderr);
    }
    server.kill9();
    server.restart();
    let work = Work::new();
    let mut watch = spawn_watch(&work, &["--endpoints", &server.addr, "--after", "0", "m/"]);
    let out = server.cli(&["lock", "m/after", "--", "true"]);
    assert!(out.status.success(), "{}", out.stderr);
    let mut seen = Vec::new();
    wait_until("the watch shows m/after released", WATCH_TIMEOUT, || {
        seen = lines(&watch);
        seen.iter()
            .any(|e| e["lock"] == "m/after" && e["kind"] == "released")
    });
    assert_eq!(seen[0]["kind"], "missed", "{seen:#?}");
    assert_eq!(seen[0]["after_index"], 0);
    let through = seen[0]["through_index"].as_u64().unwrap();
    assert!(through >= 10, "{seen:#?}");
    // Everything after the notice is after the gap, in order.
    assert!(seen[1..]
        .iter()
        .all(|e| e["index"].as_u64().unwrap() > through));
    assert_positions_increase(&seen[1..]);
    assert!(watch.0.try_status().is_none(), "the watch exited");
}

#[test]
fn watch_stops_on_ctrl_c_with_exit_130() {
    let server = Server::start();
    let work = Work::new();
    let mut watch = spawn_watch(&work, &["--endpoints", &server.addr, "--after", "0"]);
    // A line printed: the watch is streaming (its signal handlers were set before it started).
    let out = server.cli(&["lock", "x", "--", "true"]);
    assert!(out.status.success(), "{}", out.stderr);
    wait_lines(&mut watch, 1, "the watch prints the grant");
    watch.0.signal_group(nix::sys::signal::Signal::SIGINT);
    assert_eq!(watch.0.wait_code(CLI_TIMEOUT), 130);
}

/// The watch streams from a follower that is paused (SIGSTOP: its connections stay open, it
/// just says nothing): only the silence tells.
#[test]
fn watch_leaves_a_member_that_stops_answering() {
    let cluster = Cluster::start(3);
    let work = Work::new();
    let (leader, paused, mut watch) = watch_from_a_follower(&cluster, &work);
    cluster.pause(paused);
    lock_at(&cluster, leader, "w/after");
    wait_after(&mut watch);
    cluster.resume(paused);
}

/// A 3-member cluster with a `latchkey watch` of `w/` whose first endpoint, where it streams
/// from, is a follower; `w/before` granted and released, and seen. Returns the leader, the
/// follower and the watch.
fn watch_from_a_follower(cluster: &Cluster, work: &Work) -> (u64, u64, Watcher) {
    let (leader, _) = cluster.wait_leader(&[], Duration::from_secs(30));
    let follower = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
    (
        leader,
        follower,
        watch_from(cluster, work, leader, follower),
    )
}

/// A `latchkey watch` of `w/` whose first endpoint, where it streams from, is `from`;
/// `w/before` granted (through `leader`) and released, and seen.
fn watch_from(cluster: &Cluster, work: &Work, leader: u64, from: u64) -> Watcher {
    let mut endpoints = vec![cluster.addr(from)];
    endpoints.extend(
        cluster
            .ids()
            .into_iter()
            .filter(|&id| id != from)
            .map(|id| cluster.addr(id)),
    );
    let mut watch = spawn_watch(
        work,
        &["--endpoints", &endpoints.join(","), "--after", "0", "w/"],
    );
    lock_at(cluster, leader, "w/before");
    wait_lines(&mut watch, 2, "w/before");
    watch
}

fn lock_at(cluster: &Cluster, id: u64, name: &str) {
    let out = cluster.cli(&["lock", "--endpoints", &cluster.addr(id), name, "--", "true"]);
    assert!(out.status.success(), "lock {name}: {}", out.stderr);
}

/// `w/after`'s grant and release reach the watch, after `w/before`'s, in order.
fn wait_after(watch: &mut Watcher) {
    let events = wait_lines(watch, 4, "w/after");
    let got: Vec<(String, String)> = events.iter().map(summary).collect();
    let want = [
        ("granted", "w/before"),
        ("released", "w/before"),
        ("granted", "w/after"),
        ("released", "w/after"),
    ]
    .map(|(k, l)| (k.to_owned(), l.to_owned()));
    assert_eq!(got, want, "{events:#?}");
    assert_positions_increase(&events);
}

/// A member removed from the cluster while running is never told (Raft does not), and goes on
/// answering, its progress messages saying that nothing changed: the watch streaming from it
/// heard nothing of the grants after the removal. The member now ends a quiet stream once it
/// has heard from no leader for `WATCH_OUT_OF_TOUCH_FAILOVERS` failovers, and the watch resumes
/// on another member.
#[test]
fn a_watch_leaves_a_member_removed_from_the_cluster_while_it_ran() {
    let cluster = Cluster::start(3);
    let work = Work::new();
    let (leader, removed, mut watch) = watch_from_a_follower(&cluster, &work);
    let out = cluster.cli(&[
        "cluster",
        "remove",
        &removed.to_string(),
        "--endpoints",
        &cluster.addr(leader),
    ]);
    assert!(out.status.success(), "cluster remove: {}", out.stderr);
    let (leader, _) = cluster.wait_leader(&[removed], Duration::from_secs(30));
    lock_at(&cluster, leader, "w/after");
    wait_after(&mut watch);
    assert!(
        cluster.is_running(removed),
        "the removed member is left running"
    );
}

/// A follower cut off from the other members (its client port still answers) applies nothing
/// new, and a watch streaming from it moves to a member that does.
#[test]
fn a_watch_leaves_a_member_cut_off_from_the_others() {
    let cluster = Cluster::start(3);
    let work = Work::new();
    let (leader, cut, mut watch) = watch_from_a_follower(&cluster, &work);
    cluster.isolate(cut, Mode::Drop);
    lock_at(&cluster, leader, "w/after");
    wait_after(&mut watch);
    cluster.heal();
}

/// A leader cut off from the other members still believes it leads (openraft deposes no leader
/// for want of a quorum), but no quorum acknowledges it: a watch streaming from it moves to a
/// member that applies what the new leader commits.
#[test]
fn a_watch_leaves_a_leader_cut_off_from_the_others() {
    let cluster = Cluster::start(3);
    let work = Work::new();
    let (old, _) = cluster.wait_leader(&[], Duration::from_secs(30));
    let mut watch = watch_from(&cluster, &work, old, old);
    cluster.isolate(old, Mode::Drop);
    let (leader, _) = cluster.wait_leader(&[old], Duration::from_secs(30));
    lock_at(&cluster, leader, "w/after");
    wait_after(&mut watch);
    cluster.heal();
}

/// A cluster of two Raft groups: the watch shows every group's events, each line naming its
/// group, each group's positions strictly increasing (the groups' interleave as they come);
/// the kill -9 of the member leading group 0 repeats and skips nothing; and a watch resumed
/// with one index per group (`--after I0,I1`) replays exactly what came after them.
#[test]
fn a_watch_of_two_groups_names_each_events_group_and_resumes_per_group() {
    let mut cluster = Cluster::start_configured(3, Timing::default(), &["--groups", "2"]);
    let work = Work::new();
    // Group g of a new cluster is led by its (g mod 3)-th member: member 1 leads group 0.
    let leader0 = 1;
    wait_until("member 1 leads group 0", WATCH_TIMEOUT, || {
        cluster
            .cluster_status()
            .is_some_and(|s| s["groups"][0]["leader"] == leader0)
    });
    let endpoints = cluster.endpoints();
    let mut watch = spawn_watch(&work, &["--endpoints", &endpoints, "--after", "0,0", "g/"]);
    let run = |cluster: &Cluster, i: usize, live: &str| {
        let name = format!("g/{i}");
        let out = cluster.cli(&["lock", "--endpoints", live, &name, "--", "true"]);
        assert!(out.status.success(), "lock {name}: {}", out.stderr);
    };
    let group_of = |name: &str| u64::from(latchkey_core::group_of(name, 2));
    let mut want: Vec<Vec<(String, String)>> = vec![Vec::new(), Vec::new()];
    let add = |want: &mut Vec<Vec<(String, String)>>, i: usize| {
        let name = format!("g/{i}");
        let g = group_of(&name) as usize;
        want[g].push(("granted".to_owned(), name.clone()));
        want[g].push(("released".to_owned(), name));
    };
    for i in 0..6 {
        run(&cluster, i, &endpoints);
        add(&mut want, i);
    }
    assert!(!want[0].is_empty() && !want[1].is_empty(), "{want:?}");
    let before = wait_lines(&mut watch, 12, "before the kill");
    // Each group's last index before the kill: where the resumed watch starts.
    let last_index = |events: &[Value], g: u64| {
        events
            .iter()
            .filter(|e| e["group"] == g)
            .map(|e| e["index"].as_u64().unwrap())
            .max()
            .unwrap()
    };
    let resume_at = [last_index(&before, 0), last_index(&before, 1)];
    // Each group's events before the kill; the resumed watch must deliver exactly the rest.
    let split = [want[0].len(), want[1].len()];

    cluster.kill9(leader0);
    let live = cluster
        .ids()
        .into_iter()
        .filter(|&id| id != leader0)
        .map(|id| cluster.addr(id))
        .collect::<Vec<_>>()
        .join(",");
    for i in 6..12 {
        run(&cluster, i, &live);
        add(&mut want, i);
    }
    let events = wait_lines(&mut watch, 24, "after the kill");
    assert_eq!(events.len(), 24, "{events:#?}");
    for g in 0..2u64 {
        let of_group: Vec<Value> = events.iter().filter(|e| e["group"] == g).cloned().collect();
        for e in &of_group {
            assert_eq!(group_of(e["lock"].as_str().unwrap()), g, "{e}");
        }
        let got: Vec<(String, String)> = of_group.iter().map(summary).collect();
        assert_eq!(got, want[g as usize], "group {g}: {events:#?}");
        assert_positions_increase(&of_group);
    }

    let after = format!("{},{}", resume_at[0], resume_at[1]);
    let mut resumed = spawn_watch(&work, &["--endpoints", &live, "--after", &after, "g/"]);
    let replayed = wait_lines(&mut resumed, 12, "the resumed watch");
    for g in 0..2u64 {
        let got: Vec<(String, String)> = replayed
            .iter()
            .filter(|e| e["group"] == g)
            .map(summary)
            .collect();
        let expected = &want[g as usize][split[g as usize]..];
        assert_eq!(got, expected, "group {g}: {replayed:#?}");
        assert!(
            replayed
                .iter()
                .filter(|e| e["group"] == g)
                .all(|e| e["index"].as_u64().unwrap() > resume_at[g as usize]),
            "{replayed:#?}"
        );
    }
    assert_eq!(replayed.len(), 12, "{replayed:#?}");
    // One index with two groups is refused, with the count.
    let out = cluster.cli(&["watch", "--endpoints", &live, "--after", "3", "g/"]);
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("one log index per Raft group"),
        "{}",
        out.stderr
    );
}

/// A library watch of two groups knows where each group would resume although nothing under
/// its prefix changes in them (each group's `Progress` moves its position), and a watch
/// resumed from those indexes delivers the next event of either group and nothing before.
#[test]
fn a_watch_of_two_groups_has_resume_indexes_while_its_groups_are_quiet() {
    let cluster = Cluster::start_configured(1, Timing::default(), &["--groups", "2"]);
    let rt = common::rpc::runtime();
    rt.block_on(async {
        let client = latchkey_client::Client::connect([cluster.addr(1)])
            .await
            .expect("client");
        let mut watch = client.watch("quiet/", None).await.expect("watch");
        assert_eq!(watch.groups(), 2);
        // Take what comes within a few progress intervals: nothing under the prefix changes.
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while watch.resume_indexes().is_none() && tokio::time::Instant::now() < until {
            let step = tokio::time::timeout(Duration::from_millis(500), watch.next()).await;
            assert!(step.is_err(), "an item under a quiet prefix: {step:?}");
        }
        let resume = watch
            .resume_indexes()
            .expect("every group's position is known");
        drop(watch);

        let name = (0..)
            .map(|i| format!("quiet/{i}"))
            .find(|n| latchkey_core::group_of(n, 2) == 1)
            .unwrap();
        let session = client
            .session(Duration::from_secs(10))
            .await
            .expect("session");
        let guard = session
            .lock(name.as_str())
            .wait(Some(Duration::from_secs(10)))
            .await
            .expect("lock");
        let mut resumed = client
            .watch_from("quiet/", Some(&resume))
            .await
            .expect("resumed watch");
        let (group, item) = tokio::time::timeout(Duration::from_secs(10), resumed.next_in_group())
            .await
            .expect("the grant comes")
            .expect("watch");
        assert_eq!(group, 1);
        match item {
            latchkey_client::WatchItem::Event(e) => {
                assert_eq!(
                    (e.lock.as_str(), e.token),
                    (name.as_str(), Some(guard.token()))
                );
                assert!(e.index > resume[1], "{e:?} after {resume:?}");
            }
            other => panic!("{other:?}"),
        }
        drop(guard);
    });
}
