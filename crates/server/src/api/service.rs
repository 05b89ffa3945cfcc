//! The client-facing `Locks` gRPC service: translates protobuf requests to the node's
//! operations (`ops.rs`) and their answers back. No lock or lease policy lives here; access
//! control (`acl.rs`) is checked before any operation by `Node::authorize` (`ops.rs`), the one
//! check the HTTP API (`http.rs`) runs too.
//!
//! What the operator's calls need: `AdminRelease` needs `admin` on the lock, `AdminRevoke`
//! `admin` on every lock (a session may hold locks anywhere), `Audit` `read` on every lock,
//! `Backup` `admin` on every lock (a server-streaming call: the header, then the encoded table
//! in `BACKUP_CHUNK_BYTES` chunks), and the membership calls `admin` on every lock. A request
//! about a lock or a session goes to its group's node through the member's `Groups`
//! (`groups.rs`); the calls that concern a whole group (`CreateSession`, `List`, `Audit`,
//! `Backup`, `Watch`, the membership calls) name it (`group`, required with several).

use std::sync::Arc;

use latchkey_core::{
    limits, Actor, AuditAction, AuditRecord, Mode, SessionId, SessionKey, SessionOwner,
};
use latchkey_proto::v1 as pb;
use rustls_pki_types::CertificateDer;
use tonic::{Request, Response, Status};

use super::calls::{self, Call, Outcome, Poll};
use crate::access::acl::{Caller, Need, Permission};
use crate::error::{ApiError, GroupError};
use crate::node::groups::{Groups, Renewal};
use crate::node::membership::NodeStatus;
use crate::node::ops::{Acquired, Credentials, Held, LockView};
use crate::node::Node;
use crate::observe::watch::WatchOut;

pub struct LocksService {
    groups: Arc<Groups>,
}

impl LocksService {
    pub fn new(groups: Arc<Groups>) -> LocksService {
        LocksService { groups }
    }

    /// Group 0's node: the member's settings and metrics, which its groups share.
    fn node(&self) -> &Arc<Node> {
        self.groups.first()
    }

    /// The group a call without a lock name names (`CreateSession`, `List`): one cluster of
    /// one group needs none; a cluster of several requires it.
    fn named_group(&self, group: Option<u32>, what: &'static str) -> Result<&Arc<Node>, Status> {
        self.groups.named(group, what).map_err(Status::from)
    }

    /// Checks the call with [`Node::authorize`], the one access check of both APIs, with the
    /// credentials the gRPC request carries (`authorization` metadata, the TLS client
    /// certificates).
    fn authorize<T>(
        &self,
        request: &Request<T>,
        need: Need<'_>,
        sessions: &[SessionId],
    ) -> Result<Option<Caller>, Status> {
        // Whose the sessions are is in their group's table (a member outside that group sends
        // the client to one of its replicas).
        let node = match sessions.first() {
            Some(id) => self.groups.of_session(*id)?,
            None => self.node(),
        };
        Ok(self.authorize_at(node, request, need, sessions)?)
    }

    /// [`LocksService::authorize`] at `node`, the node of the sessions' group.
    fn authorize_at<T>(
        &self,
        node: &Arc<Node>,
        request: &Request<T>,
        need: Need<'_>,
        sessions: &[SessionId],
    ) -> Result<Option<Caller>, GroupError> {
        if node.config.acl.is_none() {
            // No credentials to read: the common case costs nothing.
            return Ok(None);
        }
        let certs = request.peer_certs();
        node.authorize(credentials(request, certs.as_deref()), need, sessions)
            .map_err(GroupError::of_cluster)
    }

    /// Runs `call` (`calls.rs`, as HTTP runs it) with the credentials `ctx` carries.
    async fn run(&self, ctx: &Request<()>, call: Call, poll: Poll) -> Result<Outcome, Status> {
        let certs = ctx.peer_certs();
        Ok(calls::run(&self.groups, credentials(ctx, certs.as_deref()), call, poll).await?)
    }
}

/// The credentials a gRPC request carries: the `authorization` metadata, the TLS client
/// certificates (`certs`, the request's `peer_certs`), its peer's address.
fn credentials<'a, T>(
    request: &'a Request<T>,
    certs: Option<&'a Vec<CertificateDer<'static>>>,
) -> Credentials<'a> {
    Credentials {
        authorization: request
            .metadata()
            .get(AUTHORIZATION_KEY)
            .map(|v| v.as_bytes()),
        certs: certs.map(Vec::as_slice),
        from: request.remote_addr(),
    }
}

/// A membership change concerns every lock: it needs `admin` on the empty prefix.
const MEMBERSHIP_NEED: Need<'static> = Need::Prefix("", Permission::Admin);

/// The gRPC metadata key of the client's bearer token (`authorization: Bearer TOKEN`).
const AUTHORIZATION_KEY: &str = "authorization";

/// The session a request names, as the access check wants it (none or one).
fn session_ids(session: &Option<pb::Session>) -> Vec<SessionId> {
    session.iter().map(|s| SessionId(s.id)).collect()
}

fn session_key(s: Option<pb::Session>) -> Result<SessionKey, ApiError> {
    let s = s.ok_or_else(|| ApiError::Invalid("missing session".into()))?;
    Ok(key(s))
}

fn key(s: pb::Session) -> SessionKey {
    SessionKey {
        id: SessionId(s.id),
        secret: s.secret,
    }
}

fn owner_pb(o: SessionOwner) -> pb::Owner {
    pb::Owner {
        host: o.host,
        pid: o.pid,
        user: o.user,
        text: o.text,
    }
}

fn owner_domain(o: pb::Owner) -> SessionOwner {
    SessionOwner {
        host: o.host,
        pid: o.pid,
        user: o.user,
        text: o.text,
    }
}

/// The mode an acquire asks for: `permits` only with `LOCK_MODE_PERMITS` (absent mode:
/// exclusive, as before issue #32).
pub(crate) fn mode_domain(mode: i32, permits: u32) -> Result<Mode, ApiError> {
    match pb::LockMode::try_from(mode) {
        Ok(pb::LockMode::Permits) => Ok(Mode::Permits(permits)),
        Ok(m) if permits != 0 => Err(ApiError::Invalid(format!(
            "permits is {permits} with mode {}: permits go with LOCK_MODE_PERMITS only",
            m.as_str_name()
        ))),
        Ok(pb::LockMode::Exclusive) => Ok(Mode::Exclusive),
        Ok(pb::LockMode::Shared) => Ok(Mode::Shared),
        Err(_) => Err(ApiError::Invalid(format!("unknown lock mode {mode}"))),
    }
}

/// A mode as the wire says it: the enum and the semaphore's permits (0 for a lock).
fn mode_pb(mode: Mode) -> (pb::LockMode, u32) {
    match mode {
        Mode::Exclusive => (pb::LockMode::Exclusive, 0),
        Mode::Shared => (pb::LockMode::Shared, 0),
        Mode::Permits(n) => (pb::LockMode::Permits, n),
    }
}

fn held_info(name: String, h: Held, waiters: u32) -> pb::LockInfo {
    pb::LockInfo {
        name,
        held: true,
        session: h.session.0,
        token: h.token,
        held_for_ms: h.held_for_ms,
        waiters,
        owner: h.owner.clone().map(owner_pb),
        queue: Vec::new(),
        mode: pb::LockMode::Exclusive as i32,
        permits: 0,
        value: h.value.clone(),
        holders: vec![holder_pb(h)],
        lock_delay_ms: 0,
        delay_remaining_ms: None,
        delay_token: None,
    }
}

fn holder_pb(h: Held) -> pb::Holder {
    pb::Holder {
        session: h.session.0,
        token: h.token,
        held_for_ms: h.held_for_ms,
        owner: h.owner.map(owner_pb),
        value: h.value,
    }
}

fn lock_info(lock: LockView) -> pb::LockInfo {
    let queue = lock
        .queue
        .into_iter()
        .map(|w| pb::Waiter {
            session: w.session.0,
            waited_ms: w.waited_ms,
            owner: w.owner.map(owner_pb),
            mode: mode_pb(w.mode).0 as i32,
        })
        .collect();
    let (mode, permits) = mode_pb(lock.mode);
    let holders = lock.holders.into_iter().map(holder_pb).collect();
    let info = match lock.held {
        None => pb::LockInfo {
            name: lock.name,
            waiters: lock.waiters,
            ..Default::default()
        },
        Some(h) => held_info(lock.name, h, lock.waiters),
    };
    pb::LockInfo {
        queue,
        mode: mode as i32,
        permits,
        holders,
        lock_delay_ms: lock.lock_delay_ms.unwrap_or(0),
        delay_remaining_ms: lock.delay_remaining_ms,
        delay_token: lock.delay_token,
        ..info
    }
}

fn acquire_response(a: Acquired, name: &str) -> pb::AcquireResponse {
    let (result, token, position, held_by) = match a {
        Acquired::Granted { token } => (pb::AcquireResult::Granted, token, 0, None),
        Acquired::NotGranted { held_by } => (
            pb::AcquireResult::NotGranted,
            0,
            0,
            held_by.map(|(h, mode)| {
                let (mode, permits) = mode_pb(mode);
                pb::LockInfo {
                    mode: mode as i32,
                    permits,
                    ..held_info(name.to_owned(), h, 0)
                }
            }),
        ),
        Acquired::Pending { position } => (pb::AcquireResult::Pending, 0, position, None),
    };
    pb::AcquireResponse {
        result: result as i32,
        token,
        position,
        held_by,
    }
}

fn audit_record(r: AuditRecord) -> pb::AuditRecord {
    let mut out = pb::AuditRecord {
        index: r.index,
        at_ms: r.at_ms,
        identity: r.by.identity.unwrap_or_default(),
        operator: r.by.claimed,
        reason: r.reason,
        ..Default::default()
    };
    match r.action {
        AuditAction::ForceRelease {
            name,
            session,
            token,
            next_token,
        } => {
            out.action = "force-release".into();
            out.lock = name;
            out.session = session.0;
            out.token = token;
            out.next_token = next_token.unwrap_or(0);
        }
        AuditAction::RevokeSession { session, locks } => {
            out.action = "revoke".into();
            out.session = session.0;
            out.locks = locks;
        }
    }
    out
}

/// One item of a watch stream as its message; an `OutOfTouch`, the stream's last item, as the
/// error status that ends it.
fn watch_message(out: WatchOut) -> Result<pb::WatchMessage, ApiError> {
    use pb::watch_message::Item;
    let item = match out {
        WatchOut::Event(e) => {
            // The last stream to send an event takes it; the others copy what they send.
            let e = Arc::unwrap_or_clone(e);
            let (mode, permits) = e.mode.map_or((None, 0), |m| {
                let (mode, permits) = mode_pb(m);
                (Some(mode as i32), permits)
            });
            Item::Event(pb::WatchEvent {
                index: e.index,
                ordinal: e.ordinal,
                kind: e.kind.as_str().to_owned(),
                lock: e.lock,
                session: e.session.0,
                token: e.token.unwrap_or(0),
                mode,
                permits,
                value: e.value,
            })
        }
        WatchOut::Missed { after, through } => Item::Missed(pb::WatchMissed {
            after_index: after,
            through_index: through,
        }),
        WatchOut::Progress(index) => Item::Progress(pb::WatchProgress { index }),
        WatchOut::OutOfTouch(silent) => {
            return Err(ApiError::OutOfTouch {
                silent_ms: silent.as_millis() as u64,
            })
        }
    };
    Ok(pb::WatchMessage { item: Some(item) })
}

fn members_pb(members: Vec<(u64, String)>) -> Vec<pb::Member> {
    members
        .into_iter()
        .map(|(id, addr)| pb::Member { id, addr })
        .collect()
}

/// The status of `node`'s group from an error of it: the error names the group, so that a
/// client takes its leader hint for that group only.
fn in_group(node: &Node) -> impl FnOnce(ApiError) -> Status + '_ {
    move |e| e.in_group(node.shape.group, node.shape.groups)
}

/// A keepalive's answer for `group`, whose sessions this member could not renew (`error`).
fn group_refusal(group: u32, error: &ApiError) -> pb::GroupRefusal {
    let (leader_id, leader_addr) = error.leader_hint();
    pb::GroupRefusal {
        group,
        reason: error.reason().to_owned(),
        message: error.to_string(),
        leader_id: leader_id.unwrap_or(0),
        leader_addr: leader_addr.unwrap_or_default().to_owned(),
    }
}

fn group_status(group: u32, s: NodeStatus) -> pb::GroupStatus {
    pb::GroupStatus {
        group,
        role: s.role.as_str().to_owned(),
        term: s.term,
        last_log_index: s.last_log_index,
        applied_index: s.applied_index,
        leader_id: s.leader_id.unwrap_or(0),
        sessions: s.sessions,
        locks: s.locks,
        voters: members_pb(s.members),
    }
}

fn status_response(s: NodeStatus) -> pb::NodeStatusResponse {
    pb::NodeStatusResponse {
        id: s.id,
        role: s.role.as_str().to_owned(),
        term: s.term,
        last_log_index: s.last_log_index,
        applied_index: s.applied_index,
        leader_id: s.leader_id.unwrap_or(0),
        members: members_pb(s.members),
        sessions: s.sessions,
        locks: s.locks,
        cluster_id: s.cluster_id,
        learners: members_pb(s.learners),
        groups: 1,
        group_status: Vec::new(),
    }
}

/// A request's credentials (metadata, TLS peer certificates) apart from its message: the one
/// context every operation of a `Batch` call is checked with, as its own call would be.
fn split<T>(request: Request<T>) -> (Request<()>, T) {
    let (metadata, extensions, message) = request.into_parts();
    (Request::from_parts(metadata, extensions, ()), message)
}

/// A `Batch` operation's error: what its own call's status carries.
fn batch_error(status: Status) -> pb::BatchError {
    let md = status.metadata();
    let text = |key: &str| md.get(key).and_then(|v| v.to_str().ok()).map(str::to_owned);
    pb::BatchError {
        code: status.code() as i32,
        message: status.message().to_owned(),
        reason: text(latchkey_proto::ERROR_REASON_KEY).unwrap_or_default(),
        leader_id: text(latchkey_proto::LEADER_ID_KEY).and_then(|v| v.parse().ok()),
        leader_addr: text(latchkey_proto::LEADER_ADDR_KEY).unwrap_or_default(),
        group: text(latchkey_proto::GROUP_KEY).and_then(|v| v.parse().ok()),
    }
}

/// The calls a `Batch` call carries, from protobuf to `calls.rs` and back: each runs there as
/// its own call does, and as the HTTP API's.
impl LocksService {
    async fn keep_alive_op(
        &self,
        ctx: &Request<()>,
        req: pb::KeepAliveRequest,
    ) -> Result<pb::KeepAliveResponse, Status> {
        let keys = req.sessions.into_iter().map(key).collect();
        let Outcome::Renewed(renewal) = self.run(ctx, Call::KeepAlive(keys), Poll::Long).await?
        else {
            unreachable!("a keepalive is answered with a renewal")
        };
        Ok(keep_alive_response(renewal))
    }

    async fn close_session_op(
        &self,
        ctx: &Request<()>,
        req: pb::CloseSessionRequest,
    ) -> Result<pb::CloseSessionResponse, Status> {
        let call = Call::CloseSession(session_key(req.session)?);
        self.run(ctx, call, Poll::Long).await?;
        Ok(pb::CloseSessionResponse {})
    }

    async fn acquire_op(
        &self,
        ctx: &Request<()>,
        req: pb::AcquireRequest,
        poll: Poll,
    ) -> Result<pb::AcquireResponse, Status> {
        let name = req.name.clone();
        let call = acquire_call(req)?;
        let Outcome::Acquired(acquired) = self.run(ctx, call, poll).await? else {
            unreachable!("an acquire is answered with its outcome")
        };
        Ok(acquire_response(acquired, &name))
    }

    async fn release_op(
        &self,
        ctx: &Request<()>,
        req: pb::ReleaseRequest,
    ) -> Result<pb::ReleaseResponse, Status> {
        let call = Call::Release {
            session: session_key(req.session)?,
            seq: req.seq,
            name: req.name,
            token: req.token,
        };
        let Outcome::Released(released) = self.run(ctx, call, Poll::Long).await? else {
            unreachable!("a release is answered with whether it released")
        };
        Ok(pb::ReleaseResponse { released })
    }
}

fn acquire_call(req: pb::AcquireRequest) -> Result<Call, ApiError> {
    Ok(Call::Acquire(calls::Acquire {
        session: session_key(req.session)?,
        seq: req.seq,
        mode: mode_domain(req.mode, req.permits)?,
        name: req.name,
        wait_timeout_ms: req.wait_timeout_ms,
        value: req.value,
        lock_delay_ms: req.lock_delay_ms,
    }))
}

/// A `Batch` operation as a call, or the error that is its answer.
fn batch_call(op: pb::BatchOp) -> Result<Call, ApiError> {
    use pb::batch_op::Op;
    match op.op {
        Some(Op::Acquire(req)) => acquire_call(req),
        Some(Op::Release(req)) => Ok(Call::Release {
            session: session_key(req.session)?,
            seq: req.seq,
            name: req.name,
            token: req.token,
        }),
        Some(Op::CloseSession(req)) => Ok(Call::CloseSession(session_key(req.session)?)),
        Some(Op::KeepAlive(req)) => {
            Ok(Call::KeepAlive(req.sessions.into_iter().map(key).collect()))
        }
        None => Err(ApiError::Invalid(
            "a batch operation names no call (acquire, release, close_session, keep_alive)".into(),
        )),
    }
}

/// A `Batch` operation's answer: what its own call answers, or its status as a `BatchError`.
fn batch_result(name: Option<String>, result: Result<Outcome, GroupError>) -> pb::BatchResult {
    use pb::batch_result::Result as R;
    let result = match result {
        Ok(Outcome::Acquired(a)) => R::Acquire(acquire_response(a, name.as_deref().unwrap_or(""))),
        Ok(Outcome::Released(released)) => R::Release(pb::ReleaseResponse { released }),
        Ok(Outcome::Closed) => R::CloseSession(pb::CloseSessionResponse {}),
        Ok(Outcome::Renewed(renewal)) => R::KeepAlive(keep_alive_response(renewal)),
        Err(e) => R::Error(batch_error(Status::from(e))),
    };
    pb::BatchResult {
        result: Some(result),
    }
}

fn keep_alive_response(renewal: Renewal) -> pb::KeepAliveResponse {
    let leases = renewal
        .leases
        .into_iter()
        .map(|l| pb::SessionLease {
            id: l.id.0,
            alive: l.alive,
            ttl_ms: l.ttl_ms,
            revoked_tokens: l.revoked_tokens,
            revoked_through: l.revoked_through.unwrap_or(0),
            contended: l.contended,
            contended_truncated: l.contended_truncated,
        })
        .collect();
    let refused = renewal
        .refused
        .iter()
        .map(|(group, e)| group_refusal(*group, e))
        .collect();
    pb::KeepAliveResponse { leases, refused }
}

#[tonic::async_trait]
impl pb::locks_server::Locks for LocksService {
    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        self.node().metrics.request("create_session");
        let who = self.authorize(&request, Need::Anywhere(Permission::Lock), &[])?;
        let req = request.into_inner();
        let node = self.named_group(req.group, "CreateSession without a group")?;
        let created = node
            .create_session(req.ttl_ms, who.as_ref(), req.owner.map(owner_domain))
            .await
            .map_err(in_group(node))?;
        Ok(Response::new(pb::CreateSessionResponse {
            session: Some(pb::Session {
                id: created.key.id.0,
                secret: created.key.secret,
            }),
            ttl_ms: created.ttl_ms,
            groups: self.groups.count(),
        }))
    }

    async fn keep_alive(
        &self,
        request: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::KeepAliveResponse>, Status> {
        self.node().metrics.request("keep_alive");
        let (ctx, req) = split(request);
        Ok(Response::new(self.keep_alive_op(&ctx, req).await?))
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        self.node().metrics.request("close_session");
        let (ctx, req) = split(request);
        Ok(Response::new(self.close_session_op(&ctx, req).await?))
    }

    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        self.node().metrics.request("acquire");
        let (ctx, req) = split(request);
        Ok(Response::new(self.acquire_op(&ctx, req, Poll::Long).await?))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        self.node().metrics.request("release");
        let (ctx, req) = split(request);
        Ok(Response::new(self.release_op(&ctx, req).await?))
    }

    async fn batch(
        &self,
        request: Request<pb::BatchRequest>,
    ) -> Result<Response<pb::BatchResponse>, Status> {
        self.node().metrics.request("batch");
        let (ctx, req) = split(request);
        // An acquire's name, for a refused acquire's `held_by`.
        let names: Vec<Option<String>> = req
            .ops
            .iter()
            .map(|op| match &op.op {
                Some(pb::batch_op::Op::Acquire(a)) => Some(a.name.clone()),
                _ => None,
            })
            .collect();
        let calls = req
            .ops
            .into_iter()
            .map(|op| batch_call(op).map_err(GroupError::of_cluster))
            .collect();
        let certs = ctx.peer_certs();
        let outcomes =
            calls::batch(&self.groups, credentials(&ctx, certs.as_deref()), calls).await?;
        let results = names
            .into_iter()
            .zip(outcomes)
            .map(|(name, result)| batch_result(name, result))
            .collect();
        let mut answer = pb::BatchResponse { results };
        if prost::Message::encoded_len(&answer) > limits::CLIENT_MESSAGE_BYTES_MAX {
            // Their operations applied: answered without the holders a refused acquire
            // names (as a retry's remembered answer is), never refused for their size.
            for r in &mut answer.results {
                if let Some(pb::batch_result::Result::Acquire(a)) = &mut r.result {
                    a.held_by = None;
                }
            }
        }
        debug_assert!(prost::Message::encoded_len(&answer) <= limits::CLIENT_MESSAGE_BYTES_MAX);
        Ok(Response::new(answer))
    }

    async fn proclaim(
        &self,
        request: Request<pb::ProclaimRequest>,
    ) -> Result<Response<pb::ProclaimResponse>, Status> {
        self.node().metrics.request("proclaim");
        let ids = session_ids(&request.get_ref().session);
        self.authorize(
            &request,
            Need::Lock(&request.get_ref().name, Permission::Lock),
            &ids,
        )?;
        let req = request.into_inner();
        let session = session_key(req.session)?;
        let node = self.groups.of_lock_in(&req.name, session.id)?;
        node.proclaim(session, req.seq, req.name, req.token, req.value)
            .await
            .map_err(in_group(node))?;
        Ok(Response::new(pb::ProclaimResponse {}))
    }

    async fn describe(
        &self,
        request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        self.node().metrics.request("describe");
        self.authorize(
            &request,
            Need::Lock(&request.get_ref().name, Permission::Read),
            &[],
        )?;
        let name = request.into_inner().name;
        let node = self.groups.of_lock(&name)?;
        let (lock, read_index) = node.describe(&name).await.map_err(in_group(node))?;
        Ok(Response::new(pb::DescribeResponse {
            lock: Some(lock_info(lock)),
            read_index,
        }))
    }

    async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        self.node().metrics.request("list");
        self.authorize(
            &request,
            Need::Prefix(&request.get_ref().prefix, Permission::Read),
            &[],
        )?;
        let req = request.into_inner();
        let node = self.named_group(req.group, "List without a group")?;
        let (locks, truncated) = node
            .list(&req.prefix, req.limit as usize)
            .await
            .map_err(in_group(node))?;
        Ok(Response::new(pb::ListResponse {
            locks: locks.into_iter().map(lock_info).collect(),
            truncated,
        }))
    }

    async fn node_status(
        &self,
        request: Request<pb::NodeStatusRequest>,
    ) -> Result<Response<pb::NodeStatusResponse>, Status> {
        self.node().metrics.request("node_status");
        // A client that may only lock learns the Raft groups from `CreateSession` instead.
        self.authorize(&request, Need::Anywhere(Permission::Read), &[])?;
        let mut status = status_response(self.node().status());
        status.groups = self.groups.count();
        status.group_status = self
            .groups
            .all()
            .iter()
            .map(|node| group_status(node.shape.group, node.status()))
            .collect();
        Ok(Response::new(status))
    }

    async fn admin_release(
        &self,
        request: Request<pb::AdminReleaseRequest>,
    ) -> Result<Response<pb::AdminReleaseResponse>, Status> {
        self.node().metrics.request("admin_release");
        let who = self.authorize(
            &request,
            Need::Lock(&request.get_ref().name, Permission::Admin),
            &[],
        )?;
        let req = request.into_inner();
        let by = Actor {
            identity: who.map(|w| w.name.clone()),
            claimed: req.operator,
        };
        let node = self.groups.of_lock(&req.name)?;
        let (session, token) = node
            .force_release(req.name, req.token, req.end_delay, by, req.reason)
            .await
            .map_err(in_group(node))?;
        Ok(Response::new(pb::AdminReleaseResponse {
            session: session.0,
            token,
        }))
    }

    async fn admin_revoke(
        &self,
        request: Request<pb::AdminRevokeRequest>,
    ) -> Result<Response<pb::AdminRevokeResponse>, Status> {
        self.node().metrics.request("admin_revoke");
        // A session may hold locks anywhere: ending it needs admin on every lock.
        let who = self.authorize(&request, Need::Prefix("", Permission::Admin), &[])?;
        let req = request.into_inner();
        let by = Actor {
            identity: who.map(|w| w.name.clone()),
            claimed: req.operator,
        };
        let node = self.groups.of_session(SessionId(req.session))?;
        let locks = node
            .revoke_session(SessionId(req.session), by, req.reason)
            .await
            .map_err(in_group(node))?;
        Ok(Response::new(pb::AdminRevokeResponse { locks }))
    }

    type BackupStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<pb::BackupChunk, Status>> + Send + 'static>,
    >;

    async fn backup(
        &self,
        request: Request<pb::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        self.node().metrics.request("backup");
        // The copy holds every lock and session: it needs admin on every lock.
        self.authorize(&request, Need::Prefix("", Permission::Admin), &[])?;
        let node = self.named_group(request.get_ref().group, "Backup without a group")?;
        let image = node.backup().await.map_err(in_group(node))?;
        let header = pb::BackupHeader {
            applied_index: image.applied_index,
            members: image.members,
            fingerprint: image.fingerprint,
            table_bytes: image.table.len() as u64,
            table_sha256: crate::node::backup::sha256(&image.table).to_vec(),
        };
        // The header rides with the first chunk; an empty table still sends one message. Each
        // chunk is copied out only when the stream is polled.
        let table = image.table;
        let mut header = Some(header);
        let ranges = crate::node::backup::chunk_ranges(table.len(), limits::BACKUP_CHUNK_BYTES);
        let stream = futures::stream::iter(ranges.map(move |range| {
            Ok(pb::BackupChunk {
                header: header.take(),
                data: table[range].to_vec(),
            })
        }));
        Ok(Response::new(Box::pin(stream)))
    }

    type WatchStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<pb::WatchMessage, Status>> + Send + 'static>,
    >;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.node().metrics.request("watch");
        self.authorize(
            &request,
            Need::Prefix(&request.get_ref().prefix, Permission::Read),
            &[],
        )?;
        let req = request.into_inner();
        let node = self.named_group(req.group, "Watch without a group")?;
        let in_touch = node.clone();
        let stream = node
            .watch
            .watch(
                req.prefix,
                req.after_index,
                node.shutdown.clone(),
                Box::new(move || in_touch.out_of_touch_for()),
            )
            .map_err(|e| in_group(node)(ApiError::from(e)))?;
        let node = node.clone();
        Ok(Response::new(Box::pin(futures::StreamExt::map(
            stream,
            move |out| watch_message(out).map_err(in_group(&node)),
        ))))
    }

    async fn audit(
        &self,
        request: Request<pb::AuditRequest>,
    ) -> Result<Response<pb::AuditResponse>, Status> {
        self.node().metrics.request("audit");
        // Records name locks anywhere: reading them needs read on every lock.
        self.authorize(&request, Need::Prefix("", Permission::Read), &[])?;
        let node = self.named_group(request.get_ref().group, "Audit without a group")?;
        let records = node.audit().await.map_err(in_group(node))?;
        Ok(Response::new(pb::AuditResponse {
            records: records
                .into_iter()
                .map(|r| pb::AuditRecord {
                    group: node.shape.group,
                    ..audit_record(r)
                })
                .collect(),
        }))
    }

    async fn add_member(
        &self,
        request: Request<pb::AddMemberRequest>,
    ) -> Result<Response<pb::MembersResponse>, Status> {
        self.node().metrics.request("add_member");
        self.authorize(&request, MEMBERSHIP_NEED, &[])?;
        let req = request.into_inner();
        let node = self.named_group(req.group, "AddMember without a group")?;
        let members = node
            .add_member(req.id, req.addr)
            .await
            .map_err(in_group(node))?;
        Ok(Response::new(pb::MembersResponse {
            members: members_pb(members),
            learners: members_pb(node.membership().learners),
        }))
    }

    async fn remove_member(
        &self,
        request: Request<pb::RemoveMemberRequest>,
    ) -> Result<Response<pb::MembersResponse>, Status> {
        self.node().metrics.request("remove_member");
        self.authorize(&request, MEMBERSHIP_NEED, &[])?;
        let req = request.into_inner();
        let node = self.named_group(req.group, "RemoveMember without a group")?;
        let members = node.remove_member(req.id).await.map_err(in_group(node))?;
        Ok(Response::new(pb::MembersResponse {
            members: members_pb(members),
            learners: members_pb(node.membership().learners),
        }))
    }

    async fn move_member(
        &self,
        request: Request<pb::MoveMemberRequest>,
    ) -> Result<Response<pb::MembersResponse>, Status> {
        self.node().metrics.request("move_member");
        self.authorize(&request, MEMBERSHIP_NEED, &[])?;
        let req = request.into_inner();
        let node = self.named_group(req.group, "MoveMember without a group")?;
        let members = node
            .move_member(req.id, req.addr)
            .await
            .map_err(in_group(node))?;
        Ok(Response::new(pb::MembersResponse {
            members: members_pb(members),
            learners: members_pb(node.membership().learners),
        }))
    }
}
