//! Issue #9 item 3: after a failover every session is marked, so each one's next keepalive needs
//! a logged renewal. Written one per commit, thousands of sessions queued behind each other
//! past their clients' deadlines and were reported lost although the server would have renewed
//! them. Renewals are now batched into one entry; this kills the leader of a real 3-node cluster
//! under 5,000 sessions with the default 15 s TTL and checks that none is lost.

mod common;

use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::wait_until;
use latchkey_client::{Client, Session};

const SESSIONS: usize = 5_000;
const TTL: Duration = Duration::from_secs(15);
/// Bound for elections and catching up.
const T: Duration = Duration::from_secs(30);

#[test]
fn five_thousand_sessions_survive_a_leader_kill() {
    let mut cluster = Cluster::start(3);
    let (leader, _) = cluster.wait_leader(&[], T);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let client = rt
        .block_on(Client::connect(
            cluster.endpoints().split(',').map(str::to_owned),
        ))
        .expect("connect");
    // Open the sessions 64 at a time (group commit makes each wave a few fsyncs).
    let sessions: Vec<Session> = rt.block_on(async {
        let mut all = Vec::with_capacity(SESSIONS);
        while all.len() < SESSIONS {
            let wave = (SESSIONS - all.len()).min(64);
            let mut opening = tokio::task::JoinSet::new();
            for _ in 0..wave {
                let client = client.clone();
                opening.spawn(async move { client.session(TTL).await });
            }
            while let Some(s) = opening.join_next().await {
                match s.expect("join") {
                    Ok(s) => all.push(s),
                    Err(e) => panic!("opening session {} of {SESSIONS}: {e:?}", all.len() + 1),
                }
            }
        }
        all
    });
    let lost = |sessions: &[Session]| sessions.iter().filter(|s| s.is_lost()).count();
    assert_eq!(lost(&sessions), 0, "a session was lost before any fault");

    cluster.kill9(leader);
    let killed = Instant::now();
    let (new_leader, _) = cluster.wait_leader(&[leader], T);
    assert_ne!(new_leader, leader);
    // Two full TTLs after the kill: every session has had to renew through the new leader (its
    // marks make each renewal a logged one) at least once, most of them twice.
    let watch_until = killed + 2 * TTL;
    let mut worst = 0;
    wait_until("two TTLs after the kill", 2 * TTL + T, || {
        worst = worst.max(lost(&sessions));
        worst > 0 || Instant::now() >= watch_until
    });
    assert_eq!(
        worst, 0,
        "sessions reported lost across the failover (of {SESSIONS})"
    );
    // And the cluster still has every one of them.
    let status = rt
        .block_on(client.node_status(&cluster.addr(new_leader)))
        .expect("status of the new leader");
    assert_eq!(status.sessions, SESSIONS as u64, "{status:?}");
    // Batched: the marks and logged renewals of 5,000 sessions took some entries per renewal
    // round, not one per session (creates are one entry each). Unbatched, the rounds after the
    // kill alone would add at least 5,000. Batched, a round costs about one entry per keepalive
    // batch of the client (up to 1,024 sessions each) and per retry while the new leader
    // resumes, plus the marks: 112 with the 100 ms heartbeat and 250 ms client backoff cap of
    // issue #11 (under 100 with the older, slower settings).
    assert!(
        status.last_log_index < (SESSIONS as u64) + (SESSIONS as u64) / 10,
        "{} entries for {SESSIONS} sessions: renewals were not batched",
        status.last_log_index
    );
    drop(sessions);
    drop(client);
    drop(rt);
}
