//! The client calls a batch may carry (acquire, release, close, keepalive), run once for both
//! APIs, and the batch call made of them (issue #35 item 1). `service.rs` (gRPC `Acquire`,
//! `Release`, `CloseSession`, `KeepAlive`, `Batch`) and `http.rs` (`POST /v1/locks/acquire`,
//! ..., `POST /v1/batch`) only translate their request to a [`Call`] and the [`Outcome`] back:
//! an operation of a batch, of either API, is checked and run by the code its own call runs.
//! That is the access check (`Node::authorize`, with the batch's credentials, per operation),
//! the caller's quotas and the exactly-once (session, seq) of the node's operations; and a
//! batch of either API waits for room among the member's batch operations in flight
//! ([`Groups::batch_room`], `BATCH_OPS_IN_FLIGHT_MAX`).

use latchkey_core::{limits, Mode, SessionId, SessionKey};

use crate::access::acl::{Caller, Need, Permission};
use crate::error::{ApiError, GroupError};
use crate::node::groups::{Groups, Renewal};
use crate::node::ops::{Acquired, Credentials};
use crate::node::Node;

/// One call, as both APIs' requests say it once translated.
#[derive(Debug)]
pub(crate) enum Call {
    Acquire(Acquire),
    Release {
        session: SessionKey,
        seq: u64,
        name: String,
        token: u64,
    },
    CloseSession(SessionKey),
    KeepAlive(Vec<SessionKey>),
}

#[derive(Debug)]
pub(crate) struct Acquire {
    pub session: SessionKey,
    pub seq: u64,
    pub name: String,
    pub wait_timeout_ms: u64,
    pub mode: Mode,
    pub value: Option<Vec<u8>>,
    pub lock_delay_ms: u64,
}

/// A call's answer, for its API to translate.
#[derive(Debug)]
pub(crate) enum Outcome {
    Acquired(Acquired),
    Released(bool),
    Closed,
    Renewed(Renewal),
}

/// How long an acquire that queued waits in its call before it answers pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Poll {
    /// A call of its own: long-polls up to `ACQUIRE_POLL_MS_MAX` of its wait.
    Long,
    /// In a batch: answers pending at once, so that a wait never holds up the batch's other
    /// operations (the client sends it again, same seq, to go on waiting).
    None,
}

/// Checks the call with [`Node::authorize`], the one access check of both APIs, at the node
/// of the sessions' group (whose they are is in its table; a member outside that group sends
/// the client to one of its replicas), or the member's first node when it names none.
pub(crate) fn authorize(
    groups: &Groups,
    credentials: Credentials<'_>,
    need: Need<'_>,
    sessions: &[SessionId],
) -> Result<Option<Caller>, GroupError> {
    let node = match sessions.first() {
        Some(id) => groups.of_session(*id)?,
        None => groups.first(),
    };
    node.authorize(credentials, need, sessions)
        .map_err(GroupError::of_cluster)
}

/// An operation's error at `node`: of its group.
fn in_group(node: &Node) -> impl FnOnce(ApiError) -> GroupError + '_ {
    move |e| GroupError::of(node.shape, e)
}

/// Runs `call` as its own call does, checked with `credentials`.
pub(crate) async fn run(
    groups: &Groups,
    credentials: Credentials<'_>,
    call: Call,
    poll: Poll,
) -> Result<Outcome, GroupError> {
    match call {
        Call::Acquire(a) => {
            let who = authorize(
                groups,
                credentials,
                Need::Lock(&a.name, Permission::Lock),
                &[a.session.id],
            )?;
            let node = groups.of_lock_in(&a.name, a.session.id)?;
            let poll_ms = match poll {
                Poll::Long => limits::ACQUIRE_POLL_MS_MAX,
                Poll::None => 0,
            };
            let acquired = node
                .acquire(
                    a.session,
                    a.seq,
                    a.name,
                    a.wait_timeout_ms,
                    a.mode,
                    a.value,
                    a.lock_delay_ms,
                    who.as_ref(),
                    poll_ms,
                )
                .await
                .map_err(in_group(node))?;
            Ok(Outcome::Acquired(acquired))
        }
        Call::Release {
            session,
            seq,
            name,
            token,
        } => {
            authorize(
                groups,
                credentials,
                Need::Lock(&name, Permission::Lock),
                &[session.id],
            )?;
            let node = groups.of_lock_in(&name, session.id)?;
            let released = node
                .release(session, seq, name, token)
                .await
                .map_err(in_group(node))?;
            Ok(Outcome::Released(released))
        }
        Call::CloseSession(session) => {
            authorize(
                groups,
                credentials,
                Need::Anywhere(Permission::Lock),
                &[session.id],
            )?;
            let node = groups.of_session(session.id)?;
            node.close_session(session).await.map_err(in_group(node))?;
            Ok(Outcome::Closed)
        }
        Call::KeepAlive(keys) => {
            let renewal = groups
                .keep_alive(&keys, |node, ids| {
                    node.authorize(credentials, Need::Anywhere(Permission::Lock), ids)
                        .map(|_| ())
                        .map_err(GroupError::of_cluster)
                })
                .await?;
            Ok(Outcome::Renewed(renewal))
        }
    }
}

/// Refuses each sequenced operation (acquire, release) of a batch whose `seq` is
/// `SESSION_SEQ_WINDOW_MAX` or more past the lowest of its session's in the batch: they would
/// all be unanswered at once, which a client never does (protocol 5.2), and the server's
/// memory of outcomes could not answer a retry of the whole batch exactly once (an attacker's
/// review of issue #35, F3: a batch of 256 acquires of one session, retried after one more
/// request, was answered `request-too-old`). The refused operations are `invalid-request`
/// results of their own; the others run, and a retry of the batch is answered the same.
fn within_seq_windows(calls: &mut [Result<Call, GroupError>]) {
    let seq_of = |call: &Call| match call {
        Call::Acquire(a) => Some((a.session.id, a.seq)),
        Call::Release { session, seq, .. } => Some((session.id, *seq)),
        Call::CloseSession(_) | Call::KeepAlive(_) => None,
    };
    let mut lowest: std::collections::BTreeMap<SessionId, u64> = Default::default();
    for (id, seq) in calls.iter().flatten().filter_map(seq_of) {
        let low = lowest.entry(id).or_insert(seq);
        *low = (*low).min(seq);
    }
    let window = limits::SESSION_SEQ_WINDOW_MAX as u64;
    for call in calls.iter_mut() {
        let Some((id, seq, low)) = call
            .as_ref()
            .ok()
            .and_then(seq_of)
            .map(|(id, seq)| (id, seq, lowest[&id]))
        else {
            continue;
        };
        if seq - low >= window {
            *call = Err(GroupError::of_cluster(ApiError::Invalid(format!(
                "sequence number {seq} is {window} or more past {low}, another of session \
                 {id}'s in this batch: more than a session keeps unanswered at once (its \
                 sequence window, SESSION_SEQ_WINDOW_MAX)"
            ))));
        }
    }
}

/// The batch call: 1 to `BATCH_CALL_OPS_MAX` operations (each already translated, or the
/// error its translation gave, which is its answer), at most one of them a keepalive, run at
/// once once the member has room for them; one answer per operation, in order. A refused
/// operation neither fails nor holds up the others; an acquire that must wait answers pending
/// ([`Poll::None`]).
pub(crate) async fn batch(
    groups: &Groups,
    credentials: Credentials<'_>,
    calls: Vec<Result<Call, GroupError>>,
) -> Result<Vec<Result<Outcome, GroupError>>, ApiError> {
    let n = calls.len();
    if n == 0 || n > limits::BATCH_CALL_OPS_MAX {
        return Err(ApiError::Invalid(format!(
            "a batch has 1 to {} operations, not {n}",
            limits::BATCH_CALL_OPS_MAX
        )));
    }
    let keepalives = calls
        .iter()
        .filter(|c| matches!(c, Ok(Call::KeepAlive(_))))
        .count();
    if keepalives > 1 {
        // Its answer's size is bounded by one keepalive's (`BATCH_RESULT_BYTES_SMALL_MAX`).
        return Err(ApiError::Invalid(format!(
            "a batch carries at most one keepalive, not {keepalives}: one renews any number \
             of sessions"
        )));
    }
    let mut calls = calls;
    within_seq_windows(&mut calls);
    // Room for its operations among the member's batches (waits, bounded by the call's
    // deadline, while other batches run).
    let _room = groups
        .batch_room()
        .acquire_many(n as u32)
        .await
        .map_err(|_| ApiError::ShuttingDown)?;
    // Each counted under the method it would be alone (the batch itself counts once in the
    // API's request count).
    let metrics = &groups.first().metrics;
    for call in calls.iter().flatten() {
        metrics.batched(match call {
            Call::Acquire(_) => "acquire",
            Call::Release { .. } => "release",
            Call::CloseSession(_) => "close_session",
            Call::KeepAlive(_) => "keep_alive",
        });
    }
    // Every operation through its own call's path (its checks, access control included),
    // all at once: as many calls sent together, which the leader may write as one entry.
    Ok(futures::future::join_all(
        calls
            .into_iter()
            .map(|call| async move { run(groups, credentials, call?, Poll::None).await }),
    )
    .await)
}
