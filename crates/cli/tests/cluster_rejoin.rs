//! A member that comes back after a pause or a partition must not depose a healthy leader
//! (issue #9 item 9: it used to campaign at once with a higher term, and the working leader
//! stepped down when it saw that term in a reply: an election, and a pause in grants, for
//! nothing).
//!
//! Each test: 3 members, a leader; one follower is away for [`AWAY_TIMEOUTS`] election
//! timeouts (SIGSTOP, or every link cut), then back; for [`WATCH_TIMEOUTS`] election timeouts
//! every member's own status is polled. Leader id and term must not change anywhere, and the
//! returning follower must rejoin under the same leader and term.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, Timing};
use common::proxy::Mode;
use common::rpc::{runtime, Observer};

/// Bound for anything that should take a few seconds (an election, a status answer).
const T: Duration = Duration::from_secs(20);
/// How long the follower is away, in (maximal) election timeouts: long enough that its
/// election timer fires several times.
const AWAY_TIMEOUTS: u32 = 4;
/// How long the cluster is watched after the follower is back, in election timeouts.
const WATCH_TIMEOUTS: u32 = 3;
/// Pause between two rounds of status polls.
const POLL: Duration = Duration::from_millis(50);

fn election_timeout_max() -> Duration {
    Duration::from_millis(Timing::default().election_timeout_ms.1)
}

/// What the watch saw: every (leader, term) a member claimed as leader, every term any member
/// reported, and whether the returning follower was seen following the leader at its term.
#[derive(Debug, Default)]
struct Seen {
    leaders: BTreeSet<(u64, u64)>,
    terms: BTreeSet<u64>,
    rejoined: bool,
    rounds: u32,
}

/// Polls every member for `window` (bounded in rounds as well as time).
fn watch(
    cluster: &Cluster,
    observer: &Observer,
    returning: u64,
    leader: u64,
    window: Duration,
) -> Seen {
    let rt = runtime();
    let addrs: Vec<String> = cluster
        .ids()
        .into_iter()
        .map(|id| cluster.addr(id))
        .collect();
    let rounds_max = (window.as_millis() / POLL.as_millis()) as u32 + 1;
    let start = Instant::now();
    let mut seen = Seen::default();
    while start.elapsed() < window && seen.rounds < rounds_max {
        for status in observer.statuses(&rt, &addrs).into_iter().flatten() {
            seen.terms.insert(status.term);
            if status.role == "leader" {
                seen.leaders.insert((status.id, status.term));
            }
            if status.id == returning
                && status.role == "follower"
                && status.leader_id == Some(leader)
            {
                seen.rejoined = true;
            }
        }
        seen.rounds += 1;
        std::thread::sleep(POLL);
    }
    seen
}

/// Starts 3 members and returns the cluster, the leader and its term, and a follower.
fn cluster_with_leader() -> (Cluster, u64, u64, u64) {
    let cluster = Cluster::start(3);
    let (leader, term) = cluster.wait_leader(&[], T);
    let follower = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
    (cluster, leader, term, follower)
}

/// The watch after the follower is back: no leader change and no higher term anywhere.
fn assert_undisturbed(cluster: &Cluster, follower: u64, leader: u64, term: u64, what: &str) {
    let observer = Observer::new(&cluster.addr(leader), Duration::from_secs(1));
    let seen = watch(
        cluster,
        &observer,
        follower,
        leader,
        election_timeout_max() * WATCH_TIMEOUTS,
    );
    println!(
        "after {what} of follower {follower}: {seen:?} (leader {leader} at term {term} before)"
    );
    let changes = seen
        .leaders
        .iter()
        .filter(|l| **l != (leader, term))
        .count();
    assert_eq!(
        changes,
        0,
        "after {what} of follower {follower}, leaders {:?} besides {leader} at term {term}\n{}",
        seen.leaders,
        cluster.logs()
    );
    assert_eq!(
        seen.terms,
        BTreeSet::from([term]),
        "after {what} of follower {follower}, a member left term {term}\n{}",
        cluster.logs()
    );
    assert!(
        seen.rejoined,
        "after {what}, follower {follower} never followed leader {leader} again\n{}",
        cluster.logs()
    );
}

#[test]
fn a_follower_resumed_after_sigstop_does_not_depose_the_leader() {
    let (cluster, leader, term, follower) = cluster_with_leader();
    cluster.pause(follower);
    // The time away is the point of the test, not a wait for an event.
    std::thread::sleep(election_timeout_max() * AWAY_TIMEOUTS);
    cluster.resume(follower);
    assert_undisturbed(&cluster, follower, leader, term, "a SIGSTOP");
}

#[test]
fn a_follower_healed_after_isolation_does_not_depose_the_leader() {
    let (cluster, leader, term, follower) = cluster_with_leader();
    let rt = runtime();
    let observer = Observer::new(&cluster.addr(follower), Duration::from_secs(1));
    cluster.isolate(follower, Mode::Drop);
    // Client links are not proxied: the isolated follower still answers status. The time
    // away is the point of the test, not a wait for an event.
    std::thread::sleep(election_timeout_max() * AWAY_TIMEOUTS);
    let away = observer.statuses(&rt, &[cluster.addr(follower)])[0].clone();
    println!("isolated follower {follower} before the heal: {away:?}");
    cluster.heal();
    assert_undisturbed(&cluster, follower, leader, term, "an isolation");
}
