//! A cluster of several Raft groups (`serve --groups`, issue #16), on real `serve` processes:
//! a paused group leader stalls only its own group, kill -9 of a member leading several groups
//! moves each of them, a member that returns is handed back the group it founded (a leader
//! transfer, its locks' holders renewing through it), tokens stay increasing per lock, one
//! client holding locks in every group
//! renews with at most one request per member per renewal interval, and the expiry of its
//! session releases its locks in every group.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::cluster::{Cluster, Timing};
use common::wait_until;
use latchkey_client::{Client, LockGuard, Session};
use serde_json::Value;

/// Bound for anything that should take a few seconds (elections, catching up).
const T: Duration = Duration::from_secs(20);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A session of a client of `endpoints` with TTL `ttl`, holding a lock on each of `names`
/// (taken in turn, `apart` after the one before, each within `T`).
fn session_holding(
    rt: &tokio::runtime::Runtime,
    endpoints: Vec<String>,
    ttl: Duration,
    names: &[String],
    apart: Duration,
) -> (Session, Vec<LockGuard>) {
    rt.block_on(async {
        let client = Client::connect(endpoints).await.expect("client");
        let session = client.session(ttl).await.expect("session");
        let mut guards = Vec::new();
        for name in names {
            tokio::time::sleep(apart).await;
            guards.push(
                session
                    .lock(name.as_str())
                    .wait(Some(T))
                    .await
                    .expect("lock"),
            );
        }
        (session, guards)
    })
}

/// Each group's (leader, term), as `cluster status --json` reports it.
fn group_leaders(cluster: &Cluster) -> Option<Vec<(Option<u64>, Option<u64>)>> {
    let status = cluster.cluster_status()?;
    Some(
        status["groups"]
            .as_array()?
            .iter()
            .map(|g: &Value| (g["leader"].as_u64(), g["term"].as_u64()))
            .collect(),
    )
}

/// Polls until every one of `groups` groups has a leader that is running and not in
/// `except`; their (leader, term).
fn wait_group_leaders(cluster: &Cluster, groups: usize, except: &[u64]) -> Vec<(u64, u64)> {
    let mut found = Vec::new();
    wait_until("every group has a leader", T, || {
        let Some(leaders) = group_leaders(cluster) else {
            return false;
        };
        found = leaders
            .iter()
            .filter_map(|(l, t)| Some(((*l)?, (*t)?)))
            .filter(|(l, _)| !except.contains(l) && cluster.is_running(*l))
            .collect();
        leaders.len() == groups && found.len() == groups
    });
    found
}

/// Takes `name` with `latchkey lock` and answers the token COMMAND saw.
fn token_of(cluster: &Cluster, name: &str) -> u64 {
    token_via(cluster, name, &cluster.endpoints())
}

/// [`token_of`], with a client given `endpoints` only.
fn token_via(cluster: &Cluster, name: &str, endpoints: &str) -> u64 {
    let out = cluster.cli(&[
        "lock",
        name,
        "--endpoints",
        endpoints,
        "--",
        "sh",
        "-c",
        "echo $LATCHKEY_TOKEN",
    ]);
    assert!(
        out.status.success(),
        "lock {name} via {endpoints}: {}",
        out.stderr
    );
    out.stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("lock {name} printed {:?}", out.stdout))
}

/// Group g of a new cluster is led by its (g mod N)-th member: three members lead a cluster of
/// three groups one each. Pausing the leader of group 1 stalls group 1 only: groups 0 and 2
/// keep their leaders and terms (no election there) and grant at once, and group 1 grants
/// again under a new leader.
#[test]
fn a_paused_group_leader_stalls_only_its_own_group() {
    let cluster = Cluster::start_configured(3, Timing::default(), &["--groups", "3"]);
    let before = wait_group_leaders(&cluster, 3, &[]);
    let leaders: Vec<u64> = before.iter().map(|(l, _)| *l).collect();
    assert_eq!(leaders, vec![1, 2, 3], "the founders lead one group each");
    let names = common::names_by_group(3);
    let first: Vec<u64> = names.iter().map(|n| token_of(&cluster, n)).collect();

    cluster.pause(2);
    let mut during = Vec::new();
    for g in [0, 2] {
        let token = token_of(&cluster, &names[g]);
        assert!(
            token > first[g],
            "group {g}: token {token} after {}",
            first[g]
        );
        during.push(token);
    }
    let token = token_of(&cluster, &names[1]);
    assert!(
        token > first[1],
        "group 1: token {token} after {}",
        first[1]
    );
    let after = wait_group_leaders(&cluster, 3, &[2]);
    assert_eq!(after[0], before[0], "group 0 kept its leader and term");
    assert_eq!(after[2], before[2], "group 2 kept its leader and term");
    assert_ne!(after[1].0, 2, "group 1 has a new leader");
    assert!(after[1].1 > before[1].1, "in a new term");

    cluster.resume(2);
    // The resumed member follows; every group grants, tokens still increasing.
    for (g, name) in names.iter().enumerate() {
        let token = token_of(&cluster, name);
        let last = if g == 1 { first[1] } else { during[g / 2] };
        assert!(token > last, "group {g}: token {token} after {last}");
    }
}

/// kill -9 of the member that leads two of four groups: each of its groups elects a leader
/// among the others and grants with higher tokens; after its restart every group grants again.
#[test]
fn killing_a_member_that_leads_several_groups_moves_each_of_them() {
    let mut cluster = Cluster::start_configured(3, Timing::default(), &["--groups", "4"]);
    let before = wait_group_leaders(&cluster, 4, &[]);
    assert_eq!(before[0].0, 1);
    assert_eq!(before[3].0, 1, "member 1 leads groups 0 and 3");
    let names = common::names_by_group(4);
    let first: Vec<u64> = names.iter().map(|n| token_of(&cluster, n)).collect();

    cluster.kill9(1);
    let second: Vec<u64> = names.iter().map(|n| token_of(&cluster, n)).collect();
    let after = wait_group_leaders(&cluster, 4, &[1]);
    for g in 0..4 {
        assert!(
            second[g] > first[g],
            "group {g}: {} after {}",
            second[g],
            first[g]
        );
    }
    assert_eq!(after[1], before[1], "group 1's leader was not member 1");
    assert_eq!(after[2], before[2], "group 2's leader was not member 1");
    assert!(after[0].1 > before[0].1 && after[3].1 > before[3].1);

    cluster.restart(1);
    cluster.wait_healthy(T).expect("member 1 back");
    wait_group_leaders(&cluster, 4, &[]);
    for g in 0..4 {
        let third = token_of(&cluster, &names[g]);
        assert!(third > second[g], "group {g}: {third} after {}", second[g]);
    }
}

/// Leader rebalance: member 2 founded group 1 of three and leads it. kill -9 of member 2 moves
/// group 1 to another member; when member 2 is back and caught up for the rebalance delay,
/// group 1's leader hands the group back to it (a leader transfer), and the other groups keep
/// their leaders. A client session holding a lock in group 1 and one in group 0 renews through
/// both leader changes: neither guard is lost, the lock keeps its holder and token, and the
/// next grant in group 1 has a higher token.
#[test]
fn a_returning_member_is_handed_back_the_group_it_founded() {
    let mut cluster = Cluster::start_configured(
        3,
        Timing::default(),
        &[
            "--groups",
            "3",
            "--rebalance-after-ms",
            "2000",
            "--metrics-listen",
        ],
    );
    let before = wait_group_leaders(&cluster, 3, &[]);
    let leaders: Vec<u64> = before.iter().map(|(l, _)| *l).collect();
    assert_eq!(leaders, vec![1, 2, 3], "the founders lead one group each");
    let names = common::names_by_group(3);
    let rt = runtime();
    let endpoints: Vec<String> = cluster.ids().iter().map(|&id| cluster.addr(id)).collect();
    let (session, guards) = session_holding(
        &rt,
        endpoints,
        Duration::from_secs(5),
        &names[..2],
        Duration::ZERO,
    );
    let held: Vec<u64> = guards.iter().map(|g| g.token()).collect();
    let transfers = |cluster: &Cluster| -> u64 {
        cluster
            .ids()
            .iter()
            .filter(|&&id| cluster.is_running(id))
            .map(|&id| {
                metric(cluster, id, |l| {
                    l.starts_with("latchkey_leader_transfers_total ")
                })
            })
            .sum()
    };
    assert_eq!(
        transfers(&cluster),
        0,
        "no transfer while the founders lead"
    );

    cluster.kill9(2);
    let moved = wait_group_leaders(&cluster, 3, &[2]);
    assert_ne!(moved[1].0, 2);
    assert!(moved[1].1 > before[1].1, "group 1 elected in a new term");
    let interim = moved[1].0;

    cluster.restart(2);
    cluster.wait_healthy(T).expect("member 2 back");
    let mut back = Vec::new();
    wait_until("group 1 is handed back to member 2", T, || {
        back = group_leaders(&cluster).unwrap_or_default();
        back.get(1).is_some_and(|(l, _)| *l == Some(2))
    });
    assert!(
        back[1].1 > Some(moved[1].1),
        "by an election in a later term"
    );
    assert_eq!(
        (back[0], back[2]),
        (
            (Some(before[0].0), Some(before[0].1)),
            (Some(before[2].0), Some(before[2].1))
        ),
        "groups 0 and 2 kept their leaders and terms"
    );
    assert!(
        metric(&cluster, interim, |l| l
            .starts_with("latchkey_leader_transfers_total "))
            >= 1,
        "member {interim}, group 1's interim leader, counted its transfer"
    );
    // Renewals go on through the new leader for a few TTLs; nothing was lost.
    std::thread::sleep(Duration::from_secs(6));
    for (guard, token) in guards.iter().zip(&held) {
        assert!(!guard.is_lost(), "a guard was lost across the transfer");
        assert_eq!(guard.token(), *token);
    }
    let status = cluster.cli(&[
        "status",
        &names[1],
        "--json",
        "--endpoints",
        &cluster.endpoints(),
    ]);
    let status: Value = serde_json::from_str(&status.stdout).expect("status json");
    assert_eq!(status["token"].as_u64(), Some(held[1]), "{status}");
    assert_eq!(status["group"].as_u64(), Some(1));
    rt.block_on(async {
        for guard in guards {
            guard.release().await.expect("release");
        }
        session.close().await.expect("close");
    });
    let next = token_of(&cluster, &names[1]);
    assert!(next > held[1], "group 1: token {next} after {}", held[1]);
}

/// The value of the first line of member `id`'s `/metrics` that `line` picks (0 if none).
fn metric(cluster: &Cluster, id: u64, line: impl Fn(&str) -> bool) -> u64 {
    let addr = cluster.members[id as usize - 1]
        .metrics_addr
        .clone()
        .expect("started with --metrics-listen");
    let (status, body) = common::http_get(&addr, "/metrics").expect("metrics answer");
    assert_eq!(status, 200);
    body.lines()
        .find(|l| line(l))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// The `keep_alive` requests member `id` has answered, from its `/metrics`.
fn keepalives_served(cluster: &Cluster, id: u64) -> u64 {
    metric(cluster, id, |l| {
        l.starts_with("latchkey_requests_total{") && l.contains("method=\"keep_alive\"")
    })
}

/// One client holding a lock in each of four groups (led by three members) renews its logical
/// session with at most one `KeepAlive` per member per renewal interval; when its process is
/// gone, its session expires in every group and every lock goes free.
#[test]
fn one_client_renews_its_groups_with_one_request_per_member_and_expires_in_every_group() {
    let cluster =
        Cluster::start_configured(3, Timing::default(), &["--groups", "4", "--metrics-listen"]);
    let leaders = wait_group_leaders(&cluster, 4, &[]);
    let rt = runtime();
    let ttl = Duration::from_secs(3);
    let interval = ttl / latchkey_core::limits::CLIENT_RENEWAL_TTL_DIVISOR;
    let names = common::names_by_group(4);
    let endpoints: Vec<String> = cluster.ids().iter().map(|&id| cluster.addr(id)).collect();
    // Most of a second apart, so that the group sessions are made out of step.
    let (session, guards) =
        session_holding(&rt, endpoints, ttl, &names, Duration::from_millis(700));
    // Let the renewals settle on their common schedule, then count over whole intervals.
    std::thread::sleep(2 * interval);
    let ids = cluster.ids();
    let start: BTreeMap<u64, u64> = ids
        .iter()
        .map(|&id| (id, keepalives_served(&cluster, id)))
        .collect();
    let intervals = 6u32;
    std::thread::sleep(intervals * interval);
    let served: BTreeMap<u64, u64> = ids
        .iter()
        .map(|&id| (id, keepalives_served(&cluster, id) - start[&id]))
        .collect();
    let leading: Vec<u64> = leaders.iter().map(|(l, _)| *l).collect();
    eprintln!("renewal interval {interval:?}, leaders {leading:?}, keepalives served over {intervals} intervals: {served:?}");
    for &id in &ids {
        // One request per interval, plus one for an interval boundary the count straddles.
        assert!(
            served[&id] <= u64::from(intervals) + 1,
            "member {id} served {} keepalives in {intervals} intervals",
            served[&id]
        );
        if leading.contains(&id) {
            assert!(
                served[&id] >= u64::from(intervals) - 1,
                "member {id} leads a group of the client but served {} keepalives",
                served[&id]
            );
        }
    }
    for guard in &guards {
        assert!(!guard.is_lost());
    }
    // The client dies without closing: its runtime, and with it every renewal, stops, and
    // nothing is sent on drop (no runtime to send it on). Every group expires its session.
    drop(rt);
    drop(guards);
    drop(session);
    wait_until("every lock is free after the session's TTL", T, || {
        names.iter().all(|name| {
            let out = cluster.cli(&[
                "status",
                name,
                "--json",
                "--endpoints",
                &cluster.endpoints(),
            ]);
            out.status.success()
                && serde_json::from_str::<Value>(&out.stdout).is_ok_and(|v| v["held"] == false)
        })
    });
}

/// `latchkey cluster ARGS`, which must succeed; its stdout.
fn cluster_cmd(cluster: &Cluster, args: &[&str]) -> String {
    let out = cluster_cli(cluster, args);
    assert!(
        out.status.success(),
        "cluster {args:?}: {}\n{}",
        out.stderr,
        cluster.logs()
    );
    out.stdout
}

/// `latchkey cluster ARGS`, which must be refused with a message containing `why`.
fn cluster_cmd_refused(cluster: &Cluster, args: &[&str], why: &str) {
    let out = cluster_cli(cluster, args);
    assert!(!out.status.success(), "cluster {args:?} succeeded");
    assert!(out.stderr.contains(why), "cluster {args:?}: {}", out.stderr);
}

/// `latchkey cluster ARGS --endpoints` every member.
fn cluster_cli(cluster: &Cluster, args: &[&str]) -> common::Output {
    let mut full = vec!["cluster"];
    full.extend_from_slice(args);
    let endpoints = cluster.endpoints();
    full.extend(["--endpoints", &endpoints]);
    cluster.cli(&full)
}

/// Membership changes reach every group: a `serve --join --groups 2` member added with one
/// `cluster add` becomes a voter of both groups, and one `cluster remove` takes a founder out of
/// both. The proof is quorum: after member 1 is removed and member 2 killed, a group grants
/// only if members 3 and 4 are both its voters (a group that never added 4 would be left with
/// voters 2 and 3, one of them dead).
#[test]
fn a_member_added_and_one_removed_change_every_group() {
    let mut cluster = Cluster::start_configured(3, Timing::default(), &["--groups", "2"]);
    wait_group_leaders(&cluster, 2, &[]);
    let names = common::names_by_group(2);
    let first: Vec<u64> = names.iter().map(|n| token_of(&cluster, n)).collect();

    let addr = cluster.spawn_joining(4);
    let out = cluster_cmd(&cluster, &["add", &format!("4={addr}")]);
    assert!(out.contains(&format!("member 4 at {addr} added")), "{out}");
    let out = cluster_cmd(&cluster, &["remove", "1"]);
    assert!(out.contains("member 1 removed"), "{out}");
    cluster.sigterm(1);
    cluster.kill9(2);

    let leaders = wait_group_leaders(&cluster, 2, &[1, 2]);
    for (g, (leader, _)) in leaders.iter().enumerate() {
        assert!([3, 4].contains(leader), "group {g} is led by {leader}");
    }
    for (g, name) in names.iter().enumerate() {
        let token = token_of(&cluster, name);
        assert!(
            token > first[g],
            "group {g}: token {token} after {}",
            first[g]
        );
    }
}

/// `latchkey audit` reads every group's audit log: a force-release in each of three groups is
/// listed once, with its group, oldest first.
#[test]
fn audit_lists_the_force_releases_of_every_group() {
    let cluster = Cluster::start_configured(1, Timing::default(), &["--groups", "3"]);
    wait_group_leaders(&cluster, 3, &[]);
    let names = common::names_by_group(3);
    let rt = runtime();
    let (_session, guards) = session_holding(
        &rt,
        vec![cluster.addr(1)],
        Duration::from_secs(30),
        &names,
        Duration::ZERO,
    );
    for name in &names {
        let out = cluster.cli(&[
            "admin",
            "release",
            name,
            "--reason",
            "audit test",
            "--endpoints",
            &cluster.endpoints(),
        ]);
        assert!(out.status.success(), "admin release {name}: {}", out.stderr);
    }
    let out = cluster.cli(&["audit", "--json", "--endpoints", &cluster.endpoints()]);
    assert!(out.status.success(), "audit: {}", out.stderr);
    let records: Vec<Value> = serde_json::from_str(&out.stdout).expect("audit JSON");
    let seen: Vec<(String, u64)> = records
        .iter()
        .map(|r| {
            (
                r["lock"].as_str().unwrap_or_default().to_owned(),
                r["group"].as_u64().expect("a group"),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = names.iter().cloned().zip(0..).collect();
    assert_eq!(seen, want, "{}", out.stdout);
    let times: Vec<u64> = records
        .iter()
        .map(|r| r["at_ms"].as_u64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // Held until the releases were read back (dropping a guard would release it itself).
    drop(guards);
}

/// Each group's voters, as `cluster status --json` reports them (its leader's view).
fn group_voters(cluster: &Cluster) -> Vec<Vec<u64>> {
    let status = cluster.cluster_status().expect("cluster status");
    status["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| {
            let mut voters: Vec<u64> = g["voters"]
                .as_array()
                .expect("voters")
                .iter()
                .filter_map(Value::as_u64)
                .collect();
            voters.sort_unstable();
            voters
        })
        .collect()
}

/// Groups across machines (issue #16 item 5): six members run six groups of three replicas
/// (`--replicas 3`). Group g is founded on its founder, member g+1, and the next two by id, so
/// each member leads one group and replicates three. A client that knows one member only
/// reaches every group, sent by hints from the members outside a group to its replicas, and a
/// session holding a lock in every group through that one member renews them all. kill -9 of
/// member 2 moves only the leadership it held (group 1, to one of group 1's replicas); the
/// other five groups keep their leaders and terms, and every group grants with higher tokens.
/// Member 2 back, group 1 is handed back to it (its preferred leader is its founder, not the
/// every-member rule's choice among its voters).
#[test]
fn six_members_place_six_groups_of_three_and_a_kill_moves_only_its_leadership() {
    let (members, groups, replicas) = (6u64, 6u32, 3u32);
    let mut cluster = Cluster::start_configured(
        members,
        Timing::default(),
        &[
            "--groups",
            "6",
            "--replicas",
            "3",
            "--rebalance-after-ms",
            "2000",
        ],
    );
    let before = wait_group_leaders(&cluster, groups as usize, &[]);
    let leaders: Vec<u64> = before.iter().map(|(l, _)| *l).collect();
    assert_eq!(
        leaders,
        vec![1, 2, 3, 4, 5, 6],
        "the founders lead one group each"
    );
    let placed: Vec<Vec<u64>> = (0..groups)
        .map(|g| {
            let mut r = latchkey_core::groups::replicas_of(g, 1..=members, replicas);
            r.sort_unstable();
            r
        })
        .collect();
    assert_eq!(placed[4], vec![1, 5, 6], "group 4 wraps around");
    assert_eq!(
        group_voters(&cluster),
        placed,
        "each group has its 3 replicas"
    );
    let names = common::names_by_group(groups);
    // Through member 1 alone: groups 1, 2 and 3 are reached by its hints.
    let first: Vec<u64> = names
        .iter()
        .map(|n| token_via(&cluster, n, &cluster.addr(1)))
        .collect();

    let rt = runtime();
    let (session, guards) = session_holding(
        &rt,
        vec![cluster.addr(1)],
        Duration::from_secs(4),
        &names,
        Duration::ZERO,
    );
    let held: Vec<u64> = guards.iter().map(|g| g.token()).collect();
    for (g, token) in held.iter().enumerate() {
        assert!(
            *token > first[g],
            "group {g}: token {token} after {}",
            first[g]
        );
    }

    cluster.kill9(2);
    let after = wait_group_leaders(&cluster, groups as usize, &[2]);
    assert!(
        placed[1].contains(&after[1].0) && after[1].0 != 2,
        "group 1 moved to one of its replicas: {:?}",
        after[1]
    );
    assert!(after[1].1 > before[1].1, "group 1 elected in a new term");
    for g in [0, 2, 3, 4, 5] {
        assert_eq!(after[g], before[g], "group {g} kept its leader and term");
    }
    // Two TTLs: the session, renewed through member 1 and its hints, lost nothing.
    std::thread::sleep(Duration::from_secs(8));
    for (g, guard) in guards.iter().enumerate() {
        assert!(!guard.is_lost(), "group {g}'s guard was lost");
        assert_eq!(guard.token(), held[g]);
    }
    rt.block_on(async {
        for guard in guards {
            guard.release().await.expect("release");
        }
        session.close().await.expect("close");
    });
    let second: Vec<u64> = names.iter().map(|n| token_of(&cluster, n)).collect();
    for g in 0..groups as usize {
        assert!(
            second[g] > held[g],
            "group {g}: {} after {}",
            second[g],
            held[g]
        );
    }

    cluster.restart(2);
    cluster.wait_healthy(T).expect("member 2 back");
    wait_until("group 1 is handed back to member 2", T, || {
        group_leaders(&cluster)
            .unwrap_or_default()
            .get(1)
            .is_some_and(|(l, _)| *l == Some(2))
    });
    let back = wait_group_leaders(&cluster, groups as usize, &[]);
    let leaders: Vec<u64> = back.iter().map(|(l, _)| *l).collect();
    assert_eq!(
        leaders,
        vec![1, 2, 3, 4, 5, 6],
        "every founder leads its group again"
    );
    assert_eq!(
        group_voters(&cluster),
        placed,
        "no group's replicas changed"
    );
    for g in 0..groups as usize {
        let third = token_of(&cluster, &names[g]);
        assert!(third > second[g], "group {g}: {third} after {}", second[g]);
    }
}

/// Replacing a dead member of a cluster of replica subsets: four members, four groups of three
/// (member 4 in groups 1, 2 and 3). After kill -9 of member 4, a `--join` member 5 is added to
/// those three groups only (`cluster add --group 1,2,3`) and member 4 is removed from every
/// group that has it. Group 0 keeps its voters 1, 2, 3; the others have 5 for 4. The proof is
/// quorum: with member 1 killed too, groups 2 and 3 (voters 1, 3, 5 and 1, 2, 5) grant only
/// because member 5 votes in them, and every group grants with higher tokens.
#[test]
fn a_dead_member_of_replica_subsets_is_replaced_in_its_groups_only() {
    let mut cluster =
        Cluster::start_configured(4, Timing::default(), &["--groups", "4", "--replicas", "3"]);
    wait_group_leaders(&cluster, 4, &[]);
    assert_eq!(
        group_voters(&cluster),
        vec![vec![1, 2, 3], vec![2, 3, 4], vec![1, 3, 4], vec![1, 2, 4]]
    );
    let names = common::names_by_group(4);
    let first: Vec<u64> = names.iter().map(|n| token_of(&cluster, n)).collect();

    cluster.kill9(4);
    let addr = cluster.spawn_joining(5);
    let out = cluster_cmd(&cluster, &["add", &format!("5={addr}"), "--group", "1,2,3"]);
    assert!(out.contains(&format!("member 5 at {addr} added")), "{out}");
    // Each changed group's voters, each with member 5.
    for g in 1..=3 {
        let voters = out
            .split(&format!("group {g}: "))
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .unwrap_or_else(|| panic!("no voters of group {g}: {out}"));
        assert!(voters.contains(&format!("5={addr}")), "group {g}: {out}");
    }
    assert!(!out.contains("group 0: "), "{out}");
    let out = cluster_cmd(&cluster, &["remove", "4"]);
    assert!(out.contains("member 4 removed"), "{out}");
    wait_group_leaders(&cluster, 4, &[4]);
    assert_eq!(
        group_voters(&cluster),
        vec![vec![1, 2, 3], vec![2, 3, 5], vec![1, 3, 5], vec![1, 2, 5]]
    );
    // Member 5 joined (it was given no founding list) and is outside group 0: it says so, and
    // a client that knows only member 5 is sent on by it to a member of its own groups, and
    // from there to group 0's leader.
    let five = cluster.node_status(5).expect("member 5 answers");
    assert_eq!(five["role"], "outside", "member 5 in group 0: {five}");
    token_via(&cluster, &names[0], &addr);
    // Moving an id that no group has is refused (with replica subsets each group without the
    // member answers its voters unchanged).
    cluster_cmd_refused(
        &cluster,
        &["move", "9=127.0.0.1:1"],
        "member 9 is in no Raft group",
    );
    // A group the cluster lacks is refused before any change.
    cluster_cmd_refused(
        &cluster,
        &["add", &format!("5={addr}"), "--group", "7"],
        "this cluster has 4 Raft groups",
    );

    cluster.kill9(1);
    wait_group_leaders(&cluster, 4, &[1, 4]);
    for (g, name) in names.iter().enumerate() {
        let token = token_of(&cluster, name);
        assert!(
            token > first[g],
            "group {g}: token {token} after {}",
            first[g]
        );
    }
}
