//! Client-side coalescing (issue #35 item 2): with [`ClientConfig::batch`] on, the acquires,
//! releases and closes that a `Client`'s sessions send to one endpoint while
//! [`ClientConfig::batch_calls_in_flight`] batches to it are in flight wait for one of them to
//! be answered and then go together, as one `Batch` call (at most `BATCH_CALL_OPS_MAX`
//! operations). A call that finds fewer in flight is sent at once (alone, unless others wait
//! with it): one call at a time waits for nothing. Batches in flight at once carry operations
//! that were waiting at once, concurrent calls, so no order between them is owed.
//!
//! Each operation keeps its own call's retry loop (`Client::call_traced_at`): what comes back
//! for it is the answer its own call would have had, or that call's error status rebuilt from
//! the operation's `BatchError` (code, message, reason, leader hint, group), so the loop
//! classifies, reroutes and retries it as before. A batch that fails as a whole (transport, a
//! deadline) fails each of its operations with that status.
//!
//! Each batch in flight is sent by a task of its own, started by the call that found room: it
//! sends batches while operations wait and ends when none do, so a caller that gives up (its
//! attempt's deadline, a dropped future) does not take the others' answers with it. Each batch
//! is bounded by the client's `rpc_timeout`, so the tasks are too. The coalescer owns the tasks
//! (a `JoinSet`) and the `Client` owns the coalescer: a client dropped with a batch in flight
//! aborts it and lets its connection close, where a detached task held it open until
//! `rpc_timeout`.
//!
//! [`ClientConfig::batch`]: crate::client::ClientConfig::batch
//! [`ClientConfig::batch_calls_in_flight`]: crate::client::ClientConfig::batch_calls_in_flight

use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey_core::limits;
use latchkey_proto::v1 as pb;
use latchkey_proto::v1::locks_client::LocksClient;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tonic::transport::Channel;

use crate::client::AuthToken;
use crate::env::BatchSent;

type Answer = Result<pb::batch_result::Result, tonic::Status>;

struct Queue {
    /// Tasks sending a batch to this endpoint: at most `Shared::in_flight`.
    sending: usize,
    waiting: Vec<(pb::batch_op::Op, oneshot::Sender<Answer>)>,
}

/// What the sending task shares with the callers.
struct Shared {
    client: LocksClient<Channel>,
    timeout: Duration,
    auth_token: Option<AuthToken>,
    /// Batches in flight at once, 1 to `CLIENT_BATCH_CALLS_IN_FLIGHT_MAX`.
    in_flight: usize,
    /// Told each batch's size (`ClientEnv::batch_sent`).
    sent: Option<BatchSent>,
    queue: Mutex<Queue>,
}

/// The operations waiting for the next `Batch` call to one endpoint, and the task sending
/// them (see the module comment).
pub(crate) struct Coalescer {
    shared: Arc<Shared>,
    /// The sending tasks: dropped (aborted) with the coalescer, that is with its `Client`.
    /// Finished ones are reaped when the next starts, so it holds at most `in_flight` running
    /// and that many finished.
    tasks: Mutex<JoinSet<()>>,
}

impl Coalescer {
    pub(crate) fn new(
        client: LocksClient<Channel>,
        timeout: Duration,
        auth_token: Option<AuthToken>,
        in_flight: usize,
        sent: Option<BatchSent>,
    ) -> Coalescer {
        assert!(
            (1..=limits::CLIENT_BATCH_CALLS_IN_FLIGHT_MAX).contains(&in_flight),
            "batches in flight: {in_flight}"
        );
        Coalescer {
            shared: Arc::new(Shared {
                client,
                timeout,
                auth_token,
                in_flight,
                sent,
                queue: Mutex::new(Queue {
                    sending: 0,
                    waiting: Vec::new(),
                }),
            }),
            tasks: Mutex::new(JoinSet::new()),
        }
    }

    /// Sends `op` in the next batch to this endpoint; its answer, or its error status.
    pub(crate) async fn send(&self, op: pb::batch_op::Op) -> Answer {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut queue = self.shared.queue.lock().expect("batch queue lock poisoned");
            queue.waiting.push((op, tx));
            let room = queue.sending < self.shared.in_flight;
            queue.sending += usize::from(room);
            room
        };
        if start {
            let shared = self.shared.clone();
            let mut tasks = self.tasks.lock().expect("batch tasks lock poisoned");
            while tasks.try_join_next().is_some() {}
            tasks.spawn(async move { shared.drive().await });
        }
        rx.await.unwrap_or_else(|_| {
            Err(tonic::Status::unavailable(
                "the batch carrying this operation ended without its answer",
            ))
        })
    }
}

impl Shared {
    /// Sends batches while operations wait.
    async fn drive(&self) {
        loop {
            let taken: Vec<_> = {
                let mut queue = self.queue.lock().expect("batch queue lock poisoned");
                if queue.waiting.is_empty() {
                    queue.sending -= 1;
                    return;
                }
                let n = queue.waiting.len().min(limits::BATCH_CALL_OPS_MAX);
                queue.waiting.drain(..n).collect()
            };
            let (ops, answers): (Vec<_>, Vec<_>) = taken
                .into_iter()
                .map(|(op, tx)| (pb::BatchOp { op: Some(op) }, tx))
                .unzip();
            if let Some(sent) = &self.sent {
                sent(ops.len());
            }
            let mut request = tonic::Request::new(pb::BatchRequest { ops });
            request.set_timeout(self.timeout);
            if let Some(token) = &self.auth_token {
                token.apply(&mut request);
            }
            let mut client = self.client.clone();
            let sent = tokio::time::timeout(self.timeout, client.batch(request)).await;
            let results = match sent {
                Ok(Ok(response)) => {
                    let results = response.into_inner().results;
                    if results.len() == answers.len() {
                        Ok(results)
                    } else {
                        Err(tonic::Status::internal(format!(
                            "a Batch call of {} operations was answered with {} results",
                            answers.len(),
                            results.len()
                        )))
                    }
                }
                Ok(Err(status)) => Err(status),
                Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                    "the Batch call was not answered within {:?}",
                    self.timeout
                ))),
            };
            match results {
                Ok(results) => {
                    for (tx, result) in answers.into_iter().zip(results) {
                        let answer = match result.result {
                            Some(pb::batch_result::Result::Error(e)) => Err(status_of(e)),
                            Some(r) => Ok(r),
                            None => Err(tonic::Status::internal(
                                "a Batch call answered an operation with no result",
                            )),
                        };
                        // A caller that gave up has dropped its receiver: nothing to do.
                        let _ = tx.send(answer);
                    }
                }
                Err(status) => {
                    for tx in answers {
                        let _ = tx.send(Err(status.clone()));
                    }
                }
            }
        }
    }
}

/// The status the operation's own call would have failed with.
pub(crate) fn status_of(e: pb::BatchError) -> tonic::Status {
    let mut status = tonic::Status::new(tonic::Code::from_i32(e.code), e.message);
    let md = status.metadata_mut();
    let mut put = |key: &'static str, value: String| {
        if let Ok(v) = value.parse() {
            md.insert(key, v);
        }
    };
    if !e.reason.is_empty() {
        put(latchkey_proto::ERROR_REASON_KEY, e.reason);
    }
    if let Some(id) = e.leader_id {
        put(latchkey_proto::LEADER_ID_KEY, id.to_string());
    }
    if !e.leader_addr.is_empty() {
        put(latchkey_proto::LEADER_ADDR_KEY, e.leader_addr);
    }
    if let Some(group) = e.group {
        put(latchkey_proto::GROUP_KEY, group.to_string());
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operations_error_becomes_its_calls_status() {
        let status = status_of(pb::BatchError {
            code: tonic::Code::Unavailable as i32,
            message: "not the leader".into(),
            reason: "not-leader".into(),
            leader_id: Some(2),
            leader_addr: "127.0.0.1:7421".into(),
            group: Some(3),
        });
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(status.message(), "not the leader");
        let md = status.metadata();
        let text = |k| md.get(k).unwrap().to_str().unwrap();
        assert_eq!(text(latchkey_proto::ERROR_REASON_KEY), "not-leader");
        assert_eq!(text(latchkey_proto::LEADER_ID_KEY), "2");
        assert_eq!(text(latchkey_proto::LEADER_ADDR_KEY), "127.0.0.1:7421");
        assert_eq!(text(latchkey_proto::GROUP_KEY), "3");
        // No reason, no hint: none invented (the client then checks the transport's cause).
        let bare = status_of(pb::BatchError {
            code: tonic::Code::Internal as i32,
            message: "x".into(),
            ..Default::default()
        });
        assert!(bare
            .metadata()
            .get(latchkey_proto::ERROR_REASON_KEY)
            .is_none());
        assert!(bare.metadata().get(latchkey_proto::LEADER_ID_KEY).is_none());
    }

    /// A member that speaks just enough HTTP/2 to keep a connection up (its settings, and
    /// the acknowledgements of the client's settings and keepalive pings) and never answers a
    /// call. Says on `called` when a call's HEADERS arrive, and returns once the client has
    /// closed the connection.
    async fn silent_member(
        mut conn: tokio::net::TcpStream,
        called: tokio::sync::mpsc::Sender<()>,
    ) -> std::io::Result<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const SETTINGS: u8 = 4;
        const PING: u8 = 6;
        const HEADERS: u8 = 1;
        const ACK: u8 = 1;
        let mut preface = [0u8; 24];
        conn.read_exact(&mut preface).await?;
        conn.write_all(&[0, 0, 0, SETTINGS, 0, 0, 0, 0, 0]).await?;
        loop {
            let mut head = [0u8; 9];
            if conn.read_exact(&mut head).await.is_err() {
                return Ok(()); // closed by the client
            }
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            if conn.read_exact(&mut payload).await.is_err() {
                return Ok(());
            }
            let (kind, flags) = (head[3], head[4]);
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    conn.write_all(&[0, 0, 0, SETTINGS, ACK, 0, 0, 0, 0])
                        .await?;
                }
                PING if flags & ACK == 0 => {
                    conn.write_all(&[0, 0, 8, PING, ACK, 0, 0, 0, 0]).await?;
                    conn.write_all(&payload).await?;
                }
                HEADERS => {
                    let _ = called.send(()).await;
                }
                _ => {}
            }
        }
    }

    /// Regression (issue #35): the task sending a client's batches was detached, so a client
    /// dropped with a batch in flight left it running, holding the member's connection open,
    /// until the batch's `rpc_timeout`. The task is the client's: dropping the client ends it
    /// and closes the connection at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_clients_batch_task_ends_and_closes_its_connection() {
        const T: Duration = Duration::from_secs(5);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = crate::Client::with_config(
            [addr.to_string()],
            crate::ClientConfig {
                batch: true,
                rpc_timeout: Duration::from_secs(60),
                ..crate::ClientConfig::default()
            },
        )
        .expect("client");
        let batcher = client.batcher(&format!("http://{addr}"));
        let call = tokio::spawn(async move {
            batcher
                .send(pb::batch_op::Op::Release(pb::ReleaseRequest::default()))
                .await
        });
        let (conn, _) = tokio::time::timeout(T, listener.accept())
            .await
            .expect("the batch connects in time")
            .unwrap();
        let (called, mut call_seen) = tokio::sync::mpsc::channel(16);
        let mut member = tokio::spawn(silent_member(conn, called));
        tokio::time::timeout(T, call_seen.recv())
            .await
            .expect("the Batch call is sent in time");
        // Its caller gives up, and the client is dropped.
        call.abort();
        let _ = call.await;
        assert!(
            !member.is_finished(),
            "the connection closed before the client was dropped"
        );
        drop(client);
        let closed = tokio::time::timeout(T, &mut member).await;
        member.abort();
        assert!(
            closed.is_ok(),
            "the client's connection still open {T:?} after it was dropped: its batch task runs on"
        );
    }

    /// Issue #35: with `batch_calls_in_flight` 2, a second call leaves while the first batch
    /// is unanswered, and a third waits for one of them (the member here never answers).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_leaves_at_once_while_fewer_than_the_batches_in_flight_are_unanswered() {
        const T: Duration = Duration::from_secs(5);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = crate::Client::with_config(
            [addr.to_string()],
            crate::ClientConfig {
                batch: true,
                batch_calls_in_flight: 2,
                rpc_timeout: Duration::from_secs(60),
                ..crate::ClientConfig::default()
            },
        )
        .expect("client");
        let batcher = client.batcher(&format!("http://{addr}"));
        let send = || {
            let batcher = batcher.clone();
            tokio::spawn(async move {
                batcher
                    .send(pb::batch_op::Op::Release(pb::ReleaseRequest::default()))
                    .await
            })
        };
        let first = send();
        let (conn, _) = tokio::time::timeout(T, listener.accept())
            .await
            .expect("the batch connects in time")
            .unwrap();
        let (called, mut call_seen) = tokio::sync::mpsc::channel(16);
        let member = tokio::spawn(silent_member(conn, called));
        tokio::time::timeout(T, call_seen.recv())
            .await
            .expect("the first Batch call is sent in time");
        let second = send();
        tokio::time::timeout(T, call_seen.recv())
            .await
            .expect("a second Batch call is sent while the first is unanswered");
        let third = send();
        assert!(
            tokio::time::timeout(Duration::from_millis(300), call_seen.recv())
                .await
                .is_err(),
            "a third Batch call was sent with two unanswered"
        );
        for call in [first, second, third] {
            call.abort();
        }
        member.abort();
    }
}
