//! Leader election (issue #32) through the Rust client against a real node in process:
//! `Session::campaign`, `Leadership::proclaim`/`resign`/`lost`, `Client::leader` and
//! `Client::observe`.

use std::time::Duration;

use latchkey_client::{Client, Leader};
use latchkey_testkit::Node;

/// Bound for anything that should take a moment (a grant, an event).
const T: Duration = Duration::from_secs(20);

fn leader(l: &Leader) -> (u64, u64, &[u8]) {
    (l.session, l.token, &l.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_proclaim_resign_leader_and_observe() {
    let mut node = Node::start().await.expect("the node starts");
    node.ready_client(T).await.expect("the node leads");
    let client = Client::connect([node.endpoint()]).await.expect("connect");
    let one = client
        .session(Duration::from_secs(15))
        .await
        .expect("session");
    let two = client
        .session(Duration::from_secs(15))
        .await
        .expect("session");
    assert_eq!(client.leader("svc").await.expect("leader"), None);
    let mut observe = client.observe("svc").await.expect("observe");

    let first = tokio::time::timeout(T, one.campaign("svc", "one"))
        .await
        .expect("granted in time")
        .expect("one leads");
    let now = client
        .leader("svc")
        .await
        .expect("leader")
        .expect("a leader");
    assert_eq!(
        leader(&now),
        (first.guard().session_id(), first.token(), &b"one"[..])
    );
    assert!(now.held_for.is_some());
    let seen = tokio::time::timeout(T, observe.next())
        .await
        .expect("in time")
        .expect("next");
    assert_eq!(
        leader(&seen),
        (first.guard().session_id(), first.token(), &b"one"[..])
    );

    first.proclaim("one-b").await.expect("the leader proclaims");
    let seen = tokio::time::timeout(T, observe.next())
        .await
        .expect("in time")
        .expect("next");
    assert_eq!(seen.value, b"one-b");
    let value = client
        .leader("svc")
        .await
        .expect("leader")
        .expect("a leader")
        .value;
    assert_eq!(value, b"one-b");

    // Two campaigns while one leads; one resigns; two leads under a higher token, with its
    // own value, and the observer sees it once.
    let first_token = first.token();
    let (second, resigned) = tokio::join!(
        tokio::time::timeout(T, two.campaign("svc", "two")),
        first.resign()
    );
    resigned.expect("one resigns");
    let second = second.expect("granted in time").expect("two leads");
    assert!(second.token() > first_token);
    let seen = tokio::time::timeout(T, observe.next())
        .await
        .expect("in time")
        .expect("next");
    assert_eq!(
        leader(&seen),
        (second.guard().session_id(), second.token(), &b"two"[..])
    );

    // Its session ends: the leadership is lost, and nobody leads.
    let lost = second.lost();
    two.close().await.expect("close");
    tokio::time::timeout(T, lost)
        .await
        .expect("the leadership is lost");
    assert!(second.is_lost());
    assert_eq!(client.leader("svc").await.expect("leader"), None);
    drop(second);
    one.close().await.expect("close");
    node.stop().await.expect("the node stops");
}
