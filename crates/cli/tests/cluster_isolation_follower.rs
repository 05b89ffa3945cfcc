//! A follower cut off from its peers (a minority of one) while a client is pinned to it.
//!
//! What the client library does: it sends every request to the node it believes leads, at
//! first one of its endpoints; a follower answers UNAVAILABLE with `latchkey-leader-addr`, and
//! the library goes there and stays there (`Route::leader`), also when that address is not
//! among its endpoints, until that node fails; then it starts again from its endpoints.
//!
//! The isolated follower never raises its term: its election timer runs a pre-vote, which
//! nobody answers (see `raft_config`), so its vote for the leader it last heard from stands
//! and it keeps naming that leader. A client whose only endpoint is the isolated follower
//! therefore follows the hint to the leader (client addresses are not cut here) and gets
//! grants; the follower itself acknowledges nothing.
//!
//! The test checks: the isolated follower answers every grant, keepalive and session request
//! with UNAVAILABLE (`not-leader` or `no-quorum`) within a bounded time, also long after its
//! election timer fired; the majority keeps granting, also to the pinned client; after
//! healing, the same leader leads at the same term and the follower catches up with its
//! applied index.

mod common;

use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::proxy::Mode;
use common::rpc::{pinned, reason, request, runtime, Observer};
use common::wait_until;
use latchkey_client::{Client, ClientConfig, RetryPolicy};
use latchkey_proto::v1 as pb;

/// Bound for anything that should take a few seconds (an election, catching up).
const T: Duration = Duration::from_secs(20);
/// How long the isolated follower may take to refuse a request. A follower refuses at once
/// (it forwards); a candidate too; this leaves room for a loaded machine.
const REFUSE_WITHIN: Duration = Duration::from_secs(3);
/// How long the isolated follower is probed: until well after its election timer fired
/// (the lease of the leader ends at most an election timeout, 2 s, after the cut; the timer
/// fires within one more).
const PROBE_FOR: Duration = Duration::from_secs(6);

#[test]
fn an_isolated_follower_acknowledges_nothing_and_the_majority_carries_on() {
    let cluster = Cluster::start(3);
    let (leader, term) = cluster.wait_leader(&[], T);
    let follower = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
    let other = cluster
        .ids()
        .into_iter()
        .find(|&id| id != leader && id != follower)
        .unwrap();
    let rt = runtime();
    let observer = Observer::new(&cluster.addr(follower), Duration::from_secs(2));

    // P's only endpoint is the follower: it learns the leader's address from the follower's
    // hint on its first request and talks to the leader from then on.
    let p_client = rt
        .block_on(Client::connect([cluster.addr(follower)]))
        .unwrap();
    let p = rt
        .block_on(p_client.session(Duration::from_secs(10)))
        .unwrap();
    let before = rt.block_on(p.lock("iso/before").wait(Some(T))).unwrap();

    // A session for the raw probes (created on the leader: the follower would refuse).
    let mut raw_leader = pinned(&rt, &cluster.addr(leader));
    let probe_session = rt
        .block_on(raw_leader.create_session(request(
            pb::CreateSessionRequest {
                ttl_ms: 30_000,
                ..Default::default()
            },
            T,
        )))
        .expect("session on the leader")
        .into_inner()
        .session
        .expect("a session");
    let mut raw = pinned(&rt, &cluster.addr(follower));
    // Before the cut the follower already refuses, and names the leader.
    let status = rt
        .block_on(raw.keep_alive(request(
            pb::KeepAliveRequest {
                sessions: vec![probe_session],
            },
            T,
        )))
        .expect_err("a follower acknowledged a keepalive");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(
        status
            .metadata()
            .get(latchkey_proto::LEADER_ADDR_KEY)
            .and_then(|v| v.to_str().ok()),
        Some(cluster.addr(leader).as_str())
    );

    let cut_at = Instant::now();
    cluster.isolate(follower, Mode::Drop);

    // The isolated follower acknowledges nothing: every probe is refused, promptly, with a
    // reason, before and after its election timer fired.
    let mut seq = 0;
    let mut probes = 0;
    let mut hinted = 0;
    while cut_at.elapsed() < PROBE_FOR {
        seq += 1;
        let sent = Instant::now();
        let answers = rt.block_on(async {
            let (mut a, mut b, mut c) = (raw.clone(), raw.clone(), raw.clone());
            let acquire = a.acquire(request(
                pb::AcquireRequest {
                    session: Some(probe_session),
                    seq,
                    name: "iso/probe".into(),
                    wait_timeout_ms: 0,
                    ..Default::default()
                },
                REFUSE_WITHIN,
            ));
            let keepalive = b.keep_alive(request(
                pb::KeepAliveRequest {
                    sessions: vec![probe_session],
                },
                REFUSE_WITHIN,
            ));
            let create = c.create_session(request(
                pb::CreateSessionRequest {
                    ttl_ms: 10_000,
                    ..Default::default()
                },
                REFUSE_WITHIN,
            ));
            let (x, y, z) = tokio::join!(acquire, keepalive, create);
            [
                ("acquire", x.map(|_| ())),
                ("keepalive", y.map(|_| ())),
                ("create session", z.map(|_| ())),
            ]
        });
        let took = sent.elapsed();
        for (what, answer) in answers {
            let status = match answer {
                Ok(()) => panic!("the isolated follower acknowledged a {what}"),
                Err(s) => s,
            };
            assert_eq!(
                status.code(),
                tonic::Code::Unavailable,
                "{what} after {:?}: {status:?}",
                cut_at.elapsed()
            );
            let why = reason(&status);
            assert!(
                matches!(why.as_deref(), Some("not-leader" | "no-quorum")),
                "{what}: reason {why:?} ({status:?})"
            );
            if status
                .metadata()
                .get(latchkey_proto::LEADER_ADDR_KEY)
                .is_some()
            {
                hinted += 1;
            }
        }
        assert!(took <= REFUSE_WITHIN, "the probes took {took:?}");
        probes += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "{probes} rounds of 3 probes of the isolated follower {follower} over {:?}: all \
         refused ({hinted} of {} named the leader)",
        cut_at.elapsed(),
        3 * probes
    );
    // It never campaigned: same term, and it still names the leader it last heard from.
    let view = observer.statuses(&rt, &[cluster.addr(follower)])[0]
        .clone()
        .expect("the isolated follower answers status");
    assert_eq!(
        (view.term, view.leader_id),
        (term, Some(leader)),
        "{view:?}"
    );

    // So a client that must go through it follows the hint to the leader.
    let fresh = Client::with_config(
        [cluster.addr(follower)],
        ClientConfig {
            retry: RetryPolicy {
                attempts_max: 4,
                elapsed_max: Duration::from_secs(2),
                ..RetryPolicy::default()
            },
            ..ClientConfig::default()
        },
    )
    .unwrap();
    let fresh_session = rt
        .block_on(fresh.session(Duration::from_secs(10)))
        .expect("a session through the isolated follower's hint");

    // The majority carries on: the same leader, which P keeps following, grants to P; and a
    // client of the majority gets grants with increasing tokens.
    let during = rt.block_on(p.lock("iso/during").wait(Some(T))).unwrap();
    assert!(during.token() > before.token());
    let majority = rt
        .block_on(Client::connect([cluster.addr(leader), cluster.addr(other)]))
        .unwrap();
    let m = rt
        .block_on(majority.session(Duration::from_secs(10)))
        .unwrap();
    let mut last = during.token();
    for i in 0..5 {
        let g = rt
            .block_on(m.lock(format!("iso/majority/{i}")).wait(Some(T)))
            .unwrap();
        assert!(g.token() > last, "{} <= {last}", g.token());
        last = g.token();
        rt.block_on(g.release()).unwrap();
    }
    assert!(!p.is_lost(), "P's session rode on the leader");
    let isolated_for = cut_at.elapsed();

    // Heal: the follower rejoins under the same leader and term (it never raised its term,
    // see `cluster_rejoin`) and catches up to the leader's applied index.
    cluster.heal();
    let (leader_now, term_now) = cluster.wait_leader(&[], T);
    assert_eq!((leader_now, term_now), (leader, term));
    // One more entry after the heal, so that catching up means receiving new entries.
    let after = rt.block_on(m.lock("iso/after-heal").wait(Some(T))).unwrap();
    let target = observer.statuses(&rt, &[cluster.addr(leader_now)])[0]
        .as_ref()
        .expect("the leader answers")
        .applied_index;
    let healed_at = Instant::now();
    wait_until("the follower catches up", T, || {
        observer.statuses(&rt, &[cluster.addr(follower)])[0]
            .as_ref()
            .is_some_and(|s| s.applied_index >= target)
    });
    println!(
        "follower {follower} isolated for {isolated_for:?}; after the heal it applied index \
         {target} (the leader's, {leader_now}) within {:?}",
        healed_at.elapsed()
    );
    // The lock taken during the isolation is still P's.
    let info = rt.block_on(p_client.describe("iso/during")).unwrap();
    assert_eq!(info.holder.map(|h| h.token), Some(during.token()));

    rt.block_on(after.release()).unwrap();
    rt.block_on(during.release()).unwrap();
    rt.block_on(before.release()).unwrap();
    rt.block_on(fresh_session.close()).unwrap();
    rt.block_on(m.close()).unwrap();
    rt.block_on(p.close()).unwrap();
}
