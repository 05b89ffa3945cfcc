//! Client-side coalescing (issue #35 item 2): with [`ClientConfig::batch`] on, the acquires,
//! releases and closes that a `Client`'s sessions send to one endpoint while an earlier batch
//! to it is in flight wait for that batch's answer and then go together, as one `Batch` call
//! (at most `BATCH_CALL_OPS_MAX` operations). A call that finds no batch in flight is sent at
//! once, alone: one call at a time waits for nothing.
//!
//! Each operation keeps its own call's retry loop (`Client::call_traced_at`): what comes back
//! for it is the answer its own call would have had, or that call's error status rebuilt from
//! the operation's `BatchError` (code, message, reason, leader hint, group), so the loop
//! classifies, reroutes and retries it as before. A batch that fails as a whole (transport, a
//! deadline) fails each of its operations with that status.
//!
//! The batch is sent by a task of its own, spawned by the call that found the endpoint idle: it
//! sends batches while operations wait and ends when none do, so a caller that gives up (its
//! attempt's deadline, a dropped future) does not take the others' answers with it. Each batch
//! is bounded by the client's `rpc_timeout`, so the task is too.
//!
//! [`ClientConfig::batch`]: crate::client::ClientConfig::batch

use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey_core::limits;
use latchkey_proto::v1 as pb;
use latchkey_proto::v1::locks_client::LocksClient;
use tokio::sync::oneshot;
use tonic::transport::Channel;

use crate::client::AuthToken;
use crate::env::BatchSent;

type Answer = Result<pb::batch_result::Result, tonic::Status>;

struct Queue {
    /// A task is sending a batch to this endpoint.
    sending: bool,
    waiting: Vec<(pb::batch_op::Op, oneshot::Sender<Answer>)>,
}

/// The operations waiting for the next `Batch` call to one endpoint.
pub(crate) struct Coalescer {
    client: LocksClient<Channel>,
    timeout: Duration,
    auth_token: Option<AuthToken>,
    /// Told each batch's size (`ClientEnv::batch_sent`).
    sent: Option<BatchSent>,
    queue: Mutex<Queue>,
}

impl Coalescer {
    pub(crate) fn new(
        client: LocksClient<Channel>,
        timeout: Duration,
        auth_token: Option<AuthToken>,
        sent: Option<BatchSent>,
    ) -> Coalescer {
        Coalescer {
            client,
            timeout,
            auth_token,
            sent,
            queue: Mutex::new(Queue {
                sending: false,
                waiting: Vec::new(),
            }),
        }
    }

    /// Sends `op` in the next batch to this endpoint; its answer, or its error status.
    pub(crate) async fn send(self: &Arc<Self>, op: pb::batch_op::Op) -> Answer {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut queue = self.queue.lock().expect("batch queue lock poisoned");
            queue.waiting.push((op, tx));
            !std::mem::replace(&mut queue.sending, true)
        };
        if start {
            let me = self.clone();
            tokio::spawn(async move { me.drive().await });
        }
        rx.await.unwrap_or_else(|_| {
            Err(tonic::Status::unavailable(
                "the batch carrying this operation ended without its answer",
            ))
        })
    }

    /// Sends batches while operations wait.
    async fn drive(&self) {
        loop {
            let taken: Vec<_> = {
                let mut queue = self.queue.lock().expect("batch queue lock poisoned");
                if queue.waiting.is_empty() {
                    queue.sending = false;
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
}
