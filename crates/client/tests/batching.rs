//! Client-side coalescing (issue #35 item 2, `ClientConfig::batch`) against a real node in
//! process: many sessions of one `Client` taking and releasing their own locks at once go in
//! `Batch` calls (fewer calls than operations), each getting its own answer; a wait that must
//! queue answers in its batch and then long-polls on its own until granted; closes ride too.

use std::net::SocketAddr;
use std::time::Duration;

use latchkey_client::{Client, ClientConfig};
use latchkey_testkit::{counter, scrape_metrics, Node};

/// Bound for anything that should take a moment (a grant, a round of operations).
const T: Duration = Duration::from_secs(20);

const SESSIONS: usize = 32;
const ROUNDS: usize = 4;

async fn requests(metrics: SocketAddr, method: &str) -> u64 {
    let text = scrape_metrics(metrics).await.expect("metrics");
    counter(
        &text,
        &format!("latchkey_requests_total{{method=\"{method}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_concurrent_operations_ride_batches_and_each_gets_its_own_answer() {
    let metrics: SocketAddr = ([127, 0, 0, 1], latchkey_testkit::free_port()).into();
    let mut node = Node::start_with(|c| c.metrics_listen = Some(metrics))
        .await
        .expect("the node starts");
    node.ready_client(T).await.expect("the node leads");
    // The default configuration batches (issue #35: clients coalesce automatically).
    let client = Client::with_config([node.endpoint()], ClientConfig::default()).expect("client");
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(
            client
                .session(Duration::from_secs(15))
                .await
                .expect("session"),
        );
    }
    let before = (
        requests(metrics, "acquire").await,
        requests(metrics, "release").await,
        requests(metrics, "batch").await,
    );
    for round in 0..ROUNDS {
        let work = sessions.iter().enumerate().map(|(i, s)| async move {
            let name = format!("own/{i}");
            let guard = s
                .lock(&name)
                .wait(Some(T))
                .await
                .unwrap_or_else(|e| panic!("round {round}, {name}: {e}"));
            let token = guard.token();
            guard
                .release()
                .await
                .unwrap_or_else(|e| panic!("round {round}, {name}: release: {e}"));
            token
        });
        let tokens = tokio::time::timeout(T, futures::future::join_all(work))
            .await
            .expect("a round in time");
        // Each session its own grant: tokens rise per lock, round after round.
        assert_eq!(tokens.len(), SESSIONS);
    }
    let after = (
        requests(metrics, "acquire").await,
        requests(metrics, "release").await,
        requests(metrics, "batch").await,
    );
    let ops = (SESSIONS * ROUNDS * 2) as u64;
    let (unary, batches) = (after.0 - before.0 + after.1 - before.1, after.2 - before.2);
    assert_eq!(unary, 0, "an uncontended acquire or release went alone");
    // Each operation counted under the method it would be alone, once.
    let text = scrape_metrics(metrics).await.expect("metrics");
    for method in ["acquire", "release"] {
        let batched = counter(
            &text,
            &format!("latchkey_batched_operations_total{{method=\"{method}\"}}"),
        );
        assert_eq!(batched, (SESSIONS * ROUNDS) as u64, "batched {method}s");
    }
    assert!(
        batches > 0 && batches * 2 <= ops,
        "{ops} operations took {batches} Batch calls: not gathered"
    );

    // Contended: b's wait answers PENDING in its batch, then long-polls alone, and is granted
    // once a releases.
    let (a, b) = (&sessions[0], &sessions[1]);
    let held = a.lock("shared").wait(Some(T)).await.expect("a takes it");
    let first = held.token();
    let acquires = requests(metrics, "acquire").await;
    let release_once_waiting = async {
        latchkey_testkit::wait_until_async("b's wait in a call of its own", T, || async {
            requests(metrics, "acquire").await > acquires
        })
        .await
        .expect("b's wait goes on in a call of its own");
        held.release().await.expect("a releases");
    };
    let (granted, ()) = tokio::join!(b.lock("shared").wait(Some(T)), release_once_waiting);
    let granted = granted.expect("b granted");
    assert!(granted.token() > first);
    granted.release().await.expect("b releases");

    let closes_before = requests(metrics, "close_session").await;
    for s in sessions {
        s.close().await.expect("closed");
    }
    assert_eq!(requests(metrics, "close_session").await, closes_before);
    node.stop().await.expect("the node stops cleanly");
}
