//! The client-facing `Locks` gRPC service.
//!
//! Mutations become Raft log entries stamped with the leader's time; reads and keepalives are
//! answered only after this node confirmed with a majority that it is still the leader.

use std::sync::Arc;
use std::time::Duration;

use latchkey_core::{limits, Command, Op, Outcome, Rejection, SessionId, SessionKey};
use latchkey_proto::v1 as pb;
use openraft::ReadPolicy;
use tonic::{Request, Response, Status};

use crate::error::ApiError;
use crate::leases::Renew;
use crate::node::Node;
use crate::node::RenewRequest;
use crate::waiters::{Slot, WaitEnd};
use tokio::sync::oneshot;

pub struct LocksService {
    node: Arc<Node>,
}

impl LocksService {
    pub fn new(node: Arc<Node>) -> LocksService {
        LocksService { node }
    }
}

fn session_key(s: Option<pb::Session>) -> Result<SessionKey, ApiError> {
    let s = s.ok_or_else(|| ApiError::Invalid("missing session".into()))?;
    Ok(SessionKey {
        id: SessionId(s.id),
        secret: s.secret,
    })
}

fn rejected(o: Outcome) -> ApiError {
    match o {
        Outcome::Rejected(r) => ApiError::Rejected(r),
        other => ApiError::Raft(format!("unexpected outcome {other:?}")),
    }
}

fn lock_info(info: Option<latchkey_core::LockInfo>, name: &str, now_ms: u64) -> pb::LockInfo {
    match info {
        None => pb::LockInfo {
            name: name.to_owned(),
            ..Default::default()
        },
        Some(i) => {
            let h = i.holder.expect("listed locks are held");
            pb::LockInfo {
                name: i.name,
                held: true,
                session: h.session.0,
                token: h.token,
                held_for_ms: now_ms.saturating_sub(h.granted_at_ms),
                waiters: i.waiters,
            }
        }
    }
}

impl LocksService {
    async fn acquire(&self, req: pb::AcquireRequest) -> Result<pb::AcquireResponse, ApiError> {
        let session = session_key(req.session)?;
        latchkey_core::validate_name(&req.name)?;
        let node = &self.node;
        let wait_ms = req.wait_timeout_ms.min(limits::WAIT_TIMEOUT_MS_MAX);
        let started = node.clock.now();
        // Register before proposing, so a grant applied between the proposal's answer and our
        // wait cannot be missed.
        let (slot, rx) = node
            .waiters
            .register(session.id, req.seq)
            .map_err(|_| ApiError::TooManyWaiting)?;
        let _slot = SlotGuard {
            node: node.clone(),
            slot,
        };
        let outcome = node
            .propose(Op::Acquire {
                session,
                seq: req.seq,
                name: req.name.clone(),
                wait_ms,
            })
            .await?;
        let position = match outcome {
            Outcome::Granted { token } => return Ok(granted(token)),
            Outcome::NotGranted => return Ok(not_granted()),
            Outcome::Queued { position } => position,
            other => return Err(rejected(other)),
        };
        let poll_ms = wait_ms.min(limits::ACQUIRE_POLL_MS_MAX);
        let cancel_at_end = wait_ms <= limits::ACQUIRE_POLL_MS_MAX;
        let poll_end = started + Duration::from_millis(poll_ms);
        tokio::select! {
            end = rx => match end {
                Ok(WaitEnd::Granted { token }) => return Ok(granted(token)),
                Ok(WaitEnd::SessionGone) => {
                    return Err(Rejection::SessionNotFound { id: session.id }.into())
                }
                Ok(WaitEnd::NotGranted) => return Ok(not_granted()),
                // Replaced by a newer call for the same request: that one listens now.
                Err(_) => return Ok(pending(position)),
            },
            _ = crate::clock::sleep_until(&*node.clock, poll_end) => {}
            _ = node.shutdown.cancelled() => return Err(ApiError::ShuttingDown),
        }
        if !cancel_at_end {
            return Ok(pending(position));
        }
        // The wait timed out: leave the queue through the log. If the grant was applied first,
        // the cancel answers with that grant, so a grant is never lost.
        match node
            .propose(Op::CancelWait {
                session,
                seq: req.seq,
            })
            .await?
        {
            Outcome::Granted { token } => Ok(granted(token)),
            Outcome::NotGranted => Ok(not_granted()),
            other => Err(rejected(other)),
        }
    }
}

/// Frees the waiter slot however the call ends (including when the client goes away).
struct SlotGuard {
    node: Arc<Node>,
    slot: Slot,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.node.waiters.unregister(self.slot);
    }
}

fn granted(token: u64) -> pb::AcquireResponse {
    pb::AcquireResponse {
        result: pb::AcquireResult::Granted as i32,
        token,
        position: 0,
    }
}

fn not_granted() -> pb::AcquireResponse {
    pb::AcquireResponse {
        result: pb::AcquireResult::NotGranted as i32,
        token: 0,
        position: 0,
    }
}

fn pending(position: u32) -> pb::AcquireResponse {
    pb::AcquireResponse {
        result: pb::AcquireResult::Pending as i32,
        token: 0,
        position,
    }
}

#[tonic::async_trait]
impl pb::locks_server::Locks for LocksService {
    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        self.node.metrics.request("create_session");
        let req = request.into_inner();
        latchkey_core::validate_ttl_ms(req.ttl_ms).map_err(ApiError::from)?;
        let secret = self.node.entropy.next_u64();
        match self
            .node
            .propose(Op::CreateSession {
                ttl_ms: req.ttl_ms,
                secret,
            })
            .await?
        {
            Outcome::SessionCreated { id, ttl_ms } => {
                Ok(Response::new(pb::CreateSessionResponse {
                    session: Some(pb::Session { id: id.0, secret }),
                    ttl_ms,
                }))
            }
            other => Err(rejected(other).into()),
        }
    }

    async fn keep_alive(
        &self,
        request: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::KeepAliveResponse>, Status> {
        self.node.metrics.request("keep_alive");
        let arrived = self.node.clock.now();
        let req = request.into_inner();
        if req.sessions.len() > limits::KEEPALIVE_SESSIONS_MAX {
            return Err(ApiError::Invalid(format!(
                "{} sessions in one keepalive, the limit is {}",
                req.sessions.len(),
                limits::KEEPALIVE_SESSIONS_MAX
            ))
            .into());
        }
        // Confirm leadership with a majority *after* the request arrived: a deposed leader
        // fails here and never extends a lease.
        let term = self
            .node
            .raft
            .ensure_linearizable(ReadPolicy::ReadIndex)
            .await
            .map_err(ApiError::from)?
            .committed_leader_id()
            .term;
        // Decide each session: renewed in memory, needs a logged renewal, or gone.
        let mut decisions: Vec<(pb::Session, u64, Renew)> = Vec::with_capacity(req.sessions.len());
        for s in &req.sessions {
            let key = SessionKey {
                id: SessionId(s.id),
                secret: s.secret,
            };
            let ttl_ms = self.node.state.read(|t| {
                t.session_valid(&key)
                    .then(|| t.session(key.id).map(|i| i.ttl_ms))
                    .flatten()
            });
            let decision = match ttl_ms {
                None => Renew::Gone,
                Some(_) => self
                    .node
                    .leases
                    .lock()
                    .expect("leases lock")
                    .renew(key.id, arrived, term),
            };
            decisions.push((*s, ttl_ms.unwrap_or(0), decision));
        }
        // Elected, but the leases of this term are not resumed yet (the old leader's tail is
        // still being applied): no session may be renewed or declared gone on this table yet.
        if decisions.iter().any(|(_, _, d)| *d == Renew::NotResumed) {
            return Err(ApiError::LeasesNotResumed.into());
        }
        let marked: Vec<(SessionId, tokio::time::Instant)> = decisions
            .iter()
            .filter(|(_, _, d)| *d == Renew::NeedsLog)
            .map(|(s, _, _)| (SessionId(s.id), arrived))
            .collect();
        let renewed_through_log = if marked.is_empty() {
            Vec::new()
        } else {
            let (reply, answer) = oneshot::channel();
            self.node
                .renewals
                .send(RenewRequest {
                    sessions: marked,
                    reply,
                })
                .await
                .map_err(|_| ApiError::ShuttingDown)?;
            answer.await.map_err(|_| ApiError::ShuttingDown)??
        };
        let renewed = decisions
            .iter()
            .filter(|(_, _, d)| *d == Renew::Renewed)
            .count()
            + renewed_through_log.len();
        self.node.metrics.keepalive_sessions.inc_by(renewed as u64);
        let leases = decisions
            .into_iter()
            .map(|(s, ttl_ms, d)| pb::SessionLease {
                id: s.id,
                alive: match d {
                    Renew::Renewed => true,
                    Renew::NeedsLog => renewed_through_log.contains(&SessionId(s.id)),
                    Renew::Gone => false,
                    Renew::NotResumed => unreachable!("answered above"),
                },
                ttl_ms,
            })
            .collect();
        Ok(Response::new(pb::KeepAliveResponse { leases }))
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        self.node.metrics.request("close_session");
        let session = session_key(request.into_inner().session)?;
        match self.node.propose(Op::CloseSession { session }).await? {
            Outcome::SessionClosed => Ok(Response::new(pb::CloseSessionResponse {})),
            other => Err(rejected(other).into()),
        }
    }

    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        self.node.metrics.request("acquire");
        Ok(Response::new(self.acquire(request.into_inner()).await?))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        self.node.metrics.request("release");
        let req = request.into_inner();
        let session = session_key(req.session)?;
        latchkey_core::validate_name(&req.name).map_err(ApiError::from)?;
        match self
            .node
            .propose(Op::Release {
                session,
                seq: req.seq,
                name: req.name,
                token: req.token,
            })
            .await?
        {
            Outcome::Released => Ok(Response::new(pb::ReleaseResponse { released: true })),
            Outcome::NotHolder => Ok(Response::new(pb::ReleaseResponse { released: false })),
            other => Err(rejected(other).into()),
        }
    }

    async fn describe(
        &self,
        request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        self.node.metrics.request("describe");
        let req = request.into_inner();
        latchkey_core::validate_name(&req.name).map_err(ApiError::from)?;
        self.node.linearizable_read().await?;
        let now_ms = self.node.clock.wall_ms();
        let info = self.node.state.read(|t| t.describe(&req.name));
        Ok(Response::new(pb::DescribeResponse {
            lock: Some(lock_info(info, &req.name, now_ms)),
        }))
    }

    async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        self.node.metrics.request("list");
        let req = request.into_inner();
        if req.prefix.len() > limits::LOCK_NAME_BYTES_MAX {
            return Err(ApiError::from(Rejection::NameTooLong {
                len: req.prefix.len(),
                max: limits::LOCK_NAME_BYTES_MAX,
            })
            .into());
        }
        let limit = match req.limit as usize {
            0 => limits::LIST_RESULTS_MAX,
            n => n.min(limits::LIST_RESULTS_MAX),
        };
        self.node.linearizable_read().await?;
        let now_ms = self.node.clock.wall_ms();
        // One more than asked, to tell whether the answer was cut.
        let mut found = self.node.state.read(|t| t.list(&req.prefix, limit + 1));
        let truncated = found.len() > limit;
        found.truncate(limit);
        let locks = found
            .into_iter()
            .map(|i| {
                let name = i.name.clone();
                lock_info(Some(i), &name, now_ms)
            })
            .collect();
        Ok(Response::new(pb::ListResponse { locks, truncated }))
    }

    async fn node_status(
        &self,
        _request: Request<pb::NodeStatusRequest>,
    ) -> Result<Response<pb::NodeStatusResponse>, Status> {
        self.node.metrics.request("node_status");
        Ok(Response::new(self.node.status()))
    }
}

impl Node {
    /// Stamp and propose one command; answer with its outcome once a majority has it on disk
    /// and it is applied.
    pub async fn propose(&self, op: Op) -> Result<Outcome, ApiError> {
        if self.shutdown.is_cancelled() {
            return Err(ApiError::ShuttingDown);
        }
        let cmd = Command {
            now_ms: self.clock.wall_ms(),
            op,
        };
        let resp = tokio::time::timeout(
            crate::node::PROPOSE_TIMEOUT,
            self.raft.client_write(cmd.into()),
        )
        .await
        .map_err(|_| ApiError::NoQuorum)??;
        Ok(resp.data.outcome)
    }

    async fn linearizable_read(&self) -> Result<(), ApiError> {
        self.raft
            .ensure_linearizable(ReadPolicy::ReadIndex)
            .await
            .map(|_| ())
            .map_err(ApiError::from)
    }
}
