//! Keepalives of all the sessions of one [`Client`] travel together.
//!
//! Each session's renewal task decides *when* to renew (its own lease arithmetic), but the RPC
//! is shared: a renewal joins the batch that is being gathered, and one `KeepAlive` request
//! carries every session waiting at that moment (up to `KEEPALIVE_SESSIONS_MAX`). A process
//! with thousands of sessions then costs the leader one read-index round per batch instead of
//! one per session, and after a failover its marked sessions reach the new leader's logged
//! renewal together. Like group commit: the first renewal to join an empty batch starts a
//! short task that lets the others join (one scheduler turn), takes the batch, and sends it.
//! The task is detached on purpose: the session that started it may reach its deadline and
//! stop waiting, and the others' renewal must not be cancelled with it. It ends once the batch
//! is taken; each batch's call (on a task of its own) ends within the client's retry budget.

use std::sync::Mutex;
use std::time::Duration;

use latchkey_core::limits;
use latchkey_proto::v1 as pb;
use tokio::sync::oneshot;

use crate::client::{Answered, CallOpts, Client};
use crate::error::Error;

/// One session's answer: its lease (None: the server left it out) and who answered.
pub(crate) type Renewed = Result<(Option<pb::SessionLease>, Answered), Error>;

struct Waiting {
    session: pb::Session,
    opts: CallOpts,
    reply: oneshot::Sender<Renewed>,
}

/// The sessions waiting to be renewed in the next batch.
#[derive(Default)]
pub(crate) struct Batcher {
    waiting: Mutex<Vec<Waiting>>,
}

impl Batcher {
    fn take(&self) -> Vec<Waiting> {
        let mut waiting = self.waiting.lock().expect("keepalive batch lock poisoned");
        let n = waiting.len().min(limits::KEEPALIVE_SESSIONS_MAX);
        waiting.drain(..n).collect()
    }
}

/// Renew `session` with the next batch of this client's keepalives. `opts` bounds this
/// session's attempts; a batch uses the longest attempt and the shortest backoff of its
/// members' (see `send`).
pub(crate) async fn keep_alive(client: &Client, session: pb::Session, opts: CallOpts) -> Renewed {
    // Checked before joining: a renewal that joined and then found no runtime to send the
    // batch would leave it unsent, and every later renewal would wait behind it.
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return Err(Error::Server {
            code: "internal".into(),
            message: "keepalive outside a tokio runtime".into(),
        });
    };
    let (reply, answer) = oneshot::channel();
    let first = {
        let mut waiting = client
            .keepalives()
            .waiting
            .lock()
            .expect("keepalive batch lock poisoned");
        waiting.push(Waiting {
            session,
            opts,
            reply,
        });
        waiting.len() == 1
    };
    if first {
        let client = client.clone();
        handle.spawn(async move {
            // Let every renewal that is due now join before the batch is taken. The group
            // sessions of a cluster of several groups are due at the same instant (one
            // schedule, `ClientLease::on_grid`) but wake on any worker thread within a timer
            // tick: a scheduler turn does not gather them, a short wait does (issue #16).
            match client.known_groups() {
                Some(groups) if groups > 1 => {
                    tokio::time::sleep(Duration::from_millis(limits::KEEPALIVE_GATHER_MS)).await
                }
                _ => tokio::task::yield_now().await,
            }
            // Each full batch goes out on its own task: a batch must not wait behind another's
            // retries while its sessions' deadlines run. In a cluster of several Raft groups,
            // one request per member that leads any of the batch's groups (issue #16).
            loop {
                let batch = client.keepalives().take();
                if batch.is_empty() {
                    return;
                }
                for batch in by_leader(&client, batch) {
                    let client = client.clone();
                    tokio::spawn(async move { send(&client, batch).await });
                }
            }
        });
    }
    answer.await.unwrap_or_else(|_| {
        Err(Error::Server {
            code: "internal".into(),
            message: "keepalive batch dropped".into(),
        })
    })
}

/// The batch split by the member each session's group is routed to: one request each.
fn by_leader(client: &Client, batch: Vec<Waiting>) -> Vec<Vec<Waiting>> {
    let mut by: std::collections::BTreeMap<String, Vec<Waiting>> = Default::default();
    for w in batch {
        by.entry(client.pick(w.opts.group)).or_default().push(w);
    }
    by.into_values().collect()
}

async fn send(client: &Client, batch: Vec<Waiting>) {
    // The longest attempt any member allows: each session stops waiting at its own deadline
    // anyway, and the shortest (a session a few ms from its deadline) would cut every attempt
    // of the whole batch below one read-index round, failing a thousand healthy renewals.
    let opts = CallOpts {
        attempt_timeout: batch
            .iter()
            .map(|w| w.opts.attempt_timeout)
            .max()
            .unwrap_or(Duration::from_secs(1)),
        backoff_max: batch.iter().filter_map(|w| w.opts.backoff_max).min(),
        // Every group of the batch is led by the member this group's route names (`by_leader`);
        // an error names its group, whose route it then moves.
        group: batch.first().map(|w| w.opts.group).unwrap_or(0),
    };
    let request = pb::KeepAliveRequest {
        sessions: batch.iter().map(|w| w.session).collect(),
    };
    let result = client
        .call_traced(
            opts,
            request,
            |mut c, r| async move { c.keep_alive(r).await },
        )
        .await;
    // The groups the member refused (it does not lead them now): each moves its route, as an
    // error of that group would, and its sessions' renewals fail this time, to be retried at
    // their renewal schedule's next step, to the group's leader (issue #16).
    let refused: Vec<(u32, Error)> = match &result {
        Ok((response, answered)) => response
            .refused
            .iter()
            // Only a group this batch carries: the route map stays within the groups the
            // client uses, whatever a server sends, and whether or not the count is known yet.
            .filter(|r| batch.iter().any(|w| w.opts.group == r.group))
            .map(|r| {
                let hint = (!r.leader_addr.is_empty()).then_some(r.leader_addr.as_str());
                client.reroute(r.group, &answered.endpoint, hint);
                let error = Error::Unavailable {
                    attempts: answered.failed_attempts + 1,
                    elapsed: Duration::ZERO,
                    last: format!("{}: {} ({})", answered.endpoint, r.message, r.reason),
                };
                (r.group, error)
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    for w in batch {
        let refusal = refused.iter().find(|(g, _)| *g == w.opts.group);
        let answer = match (&result, refusal) {
            (Ok(_), Some((_, e))) => Err(e.clone()),
            (Ok((response, answered)), None) => Ok((
                response
                    .leases
                    .iter()
                    .find(|l| l.id == w.session.id)
                    .cloned(),
                answered.clone(),
            )),
            (Err(e), _) => Err(e.clone()),
        };
        // The session may have stopped waiting (its deadline passed, it was closed).
        let _ = w.reply.send(answer);
    }
}
