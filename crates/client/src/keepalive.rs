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

use futures::stream::{FuturesUnordered, StreamExt};
use latchkey_core::limits;
use latchkey_proto::v1 as pb;
use tokio::sync::oneshot;

use crate::client::{Answered, CallOpts, Client};
use crate::error::Error;
use crate::retry::{Backoff, RetryPolicy};

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

/// Renews `batch` (sessions whose groups one member is believed to lead) and answers each
/// session. Groups the member refuses (it does not lead them now, or has not resumed their
/// leases yet) are re-sent within this renewal, to their new route after the refusal's hint,
/// with the renewal's backoff, as a one-group request's retries are inside its call: a refusal
/// is not this renewal's failure. Before, a refused group's sessions failed their renewal and
/// waited for the lease's retry step (TTL / 10) before each next try, so that an election
/// with a few refusals in a row (a stale hint, then "leases not resumed") outlasted the
/// lease's window after a missed renewal, where a one-group client, retrying at TTL / 20 and
/// following a fresh hint at once, rode it out (issue #34's nemesis with `--groups 3`).
/// Bounded: by the client's retry policy (attempts, elapsed), and each session stops waiting
/// at its deadline, after which its renewal is not re-sent.
async fn send(client: &Client, batch: Vec<Waiting>) {
    let policy = &client.config().retry;
    let clock = client.clock();
    let start = clock.now();
    let backoff_max = batch.iter().filter_map(|w| w.opts.backoff_max).min();
    let mut backoff = match backoff_max {
        Some(max) => Backoff::new(&RetryPolicy {
            backoff_initial: policy.backoff_initial.min(max),
            backoff_max: policy.backoff_max.min(max),
            ..policy.clone()
        }),
        None => Backoff::new(policy),
    };
    let mut rounds = 0u32;
    let mut pending = FuturesUnordered::new();
    pending.push(send_once(client, batch, Duration::ZERO, 0));
    while let Some(again) = pending.next().await {
        let Refused {
            waiting,
            hinted,
            failed,
        } = again;
        // Sessions that stopped waiting (deadline passed, closed) are not renewed again.
        let waiting: Vec<(Waiting, Error)> = waiting
            .into_iter()
            .filter(|(w, _)| !w.reply.is_closed())
            .collect();
        if waiting.is_empty() {
            continue;
        }
        rounds += 1;
        let elapsed = clock.now().saturating_duration_since(start);
        if rounds >= policy.attempts_max || elapsed >= policy.elapsed_max {
            for (w, e) in waiting {
                let _ = w.reply.send(Err(e));
            }
            continue;
        }
        // A fresh hint is tried at once, the first time only (as `Client::call_traced` does).
        let delay = if hinted && rounds == 1 {
            Duration::ZERO
        } else {
            client.backoff_delay(&mut backoff)
        };
        let waiting: Vec<Waiting> = waiting.into_iter().map(|(w, _)| w).collect();
        for batch in by_leader(client, waiting) {
            pending.push(send_once(client, batch, delay, failed));
        }
    }
}

/// The sessions of a request whose groups the member refused, with each one's error.
struct Refused {
    waiting: Vec<(Waiting, Error)>,
    /// Whether a refusal's hint named a member not tried yet (`Client::reroute`).
    hinted: bool,
    /// Attempts that failed so far for these sessions (the failover signal counts them).
    failed: u32,
}

/// One request of `batch` after `delay`: answers every session but those of refused groups,
/// which it gives back.
async fn send_once(client: &Client, batch: Vec<Waiting>, delay: Duration, failed: u32) -> Refused {
    if !delay.is_zero() {
        tokio::time::sleep(client.clock().timer_duration(delay)).await;
    }
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
    // error of that group would, and its sessions go back to `send`, which re-sends them to
    // the group's new route within this renewal (issue #16, #34).
    let mut hinted = false;
    let refused: Vec<(u32, Error)> = match &result {
        Ok((response, answered)) => response
            .refused
            .iter()
            // Only a group this batch carries: the route map stays within the groups the
            // client uses, whatever a server sends, and whether or not the count is known yet.
            .filter(|r| batch.iter().any(|w| w.opts.group == r.group))
            .map(|r| {
                let hint = (!r.leader_addr.is_empty()).then_some(r.leader_addr.as_str());
                hinted |= client.reroute(r.group, &answered.endpoint, hint);
                let error = Error::Unavailable {
                    attempts: failed + answered.failed_attempts + 1,
                    elapsed: Duration::ZERO,
                    last: format!("{}: {} ({})", answered.endpoint, r.message, r.reason),
                };
                (r.group, error)
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    let mut again = Refused {
        waiting: Vec::new(),
        hinted,
        failed: failed + result.as_ref().map_or(0, |(_, a)| a.failed_attempts + 1),
    };
    for w in batch {
        let refusal = refused.iter().find(|(g, _)| *g == w.opts.group);
        let answer = match (&result, refusal) {
            (Ok(_), Some((_, e))) => {
                again.waiting.push((w, e.clone()));
                continue;
            }
            (Ok((response, answered)), None) => Ok((
                response
                    .leases
                    .iter()
                    .find(|l| l.id == w.session.id)
                    .cloned(),
                Answered {
                    endpoint: answered.endpoint.clone(),
                    failed_attempts: failed + answered.failed_attempts,
                },
            )),
            (Err(e), _) => Err(e.clone()),
        };
        // The session may have stopped waiting (its deadline passed, it was closed).
        let _ = w.reply.send(answer);
    }
    again
}
