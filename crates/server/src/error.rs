//! The one place where server-side errors become gRPC statuses, and HTTP API responses: a
//! JSON body `{"code", "message", "leader_id", "leader_addr"}` whose `code` is the reason the
//! gRPC status carries in its `latchkey-error` metadata, under the HTTP status matching the
//! gRPC code.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use latchkey_core::Rejection;
use latchkey_proto::{ERROR_REASON_KEY, LEADER_ADDR_KEY, LEADER_ID_KEY};
use latchkey_raft::TypeConfig;
use openraft::errors::{ClientWriteError, ForwardToLeader, LinearizableReadError, RaftError};
use tonic::{Code, Status};

/// Everything a client request can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Rejected(#[from] Rejection),
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("not the leader")]
    NotLeader {
        leader_id: Option<u64>,
        leader_addr: Option<String>,
    },
    #[error("no quorum: cannot confirm leadership")]
    NoQuorum,
    #[error("too many acquire calls waiting on this node")]
    TooManyWaiting,
    #[error("node is shutting down")]
    ShuttingDown,
    /// A new leader has not resumed session leases yet; ask again in a moment. Carries this
    /// leader's own id and address as the leader hint, so a client retries here rather than
    /// wander to a follower that would only send it back.
    #[error("leader just elected: session leases not resumed yet, retry")]
    LeasesNotResumed { leader_id: u64, leader_addr: String },
    #[error("raft: {0}")]
    Raft(String),
    /// The caller is authenticated but its roles do not grant what the call needs (the message
    /// names the lock or prefix and the permission), or the session is another identity's.
    #[error("{0}")]
    PermissionDenied(String),
    /// Access control is on and the call carries no credentials this node knows.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller's identity already holds as many sessions or queued acquires as its quota.
    #[error("{0}")]
    QuotaExceeded(String),
    /// A membership change that conflicts with the membership (or one already under way).
    #[error("{0}")]
    Membership(String),
    /// The table encodes to more than a backup may hold (`BACKUP_TABLE_BYTES_MAX`).
    #[error("the table encodes to {bytes} bytes, over the backup limit of {max}")]
    BackupTooLarge { bytes: u64, max: u64 },
    #[error(transparent)]
    TooManyWatchers(#[from] crate::observe::watch::TooManyWatchers),
    /// A watch stream's end on a member out of touch with its group's leader
    /// (`Node::out_of_touch_for`): it may have stopped applying while the group goes on.
    #[error(
        "this member has heard from no leader of its Raft group for {silent_ms} ms (removed \
         from the group, or cut off from its other members): resume the watch on another member"
    )]
    OutOfTouch { silent_ms: u64 },
    /// A lock and a session of different Raft groups (issue #16): a client that does not
    /// know groups made its session in group 0.
    #[error(
        "lock {name:?} is in Raft group {lock} of {groups} and session {session} in group \
         {of_session}: a session of its group must take it (this client does not know a \
         cluster of several groups; see docs/protocol.md, section 2.4)"
    )]
    WrongGroup {
        name: String,
        lock: u32,
        session: u64,
        of_session: u32,
        groups: u32,
    },
    /// A call that must name its Raft group in a cluster of several (issue #16) and did not.
    #[error(
        "{what}: this cluster has {groups} Raft groups, name one (the group of a lock: \
         docs/protocol.md 2.4; the answers of GET /v1/lock and `latchkey status NAME`)"
    )]
    NotWithGroups { what: &'static str, groups: u32 },
    /// A call naming a Raft group this cluster does not have (a group up to
    /// `GROUPS_MAX - 1` is well formed; how many a cluster runs is its own fact).
    #[error("group {group}: this cluster has {groups} Raft groups")]
    NoSuchGroup { group: u32, groups: u32 },
}

impl ApiError {
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::Rejected(r) => match r {
                Rejection::NameEmpty => "name-empty",
                Rejection::NameTooLong { .. } => "name-too-long",
                Rejection::TtlOutOfRange { .. } => "ttl-out-of-range",
                Rejection::SessionNotFound { .. } => "session-not-found",
                Rejection::TooManySessions { .. } => "too-many-sessions",
                Rejection::TooManyLocksForSession { .. } => "too-many-locks-for-session",
                Rejection::TooManyLocks { .. } => "too-many-locks",
                Rejection::QueueFull { .. } => "queue-full",
                Rejection::AlreadyHeld { .. } => "already-held",
                Rejection::AlreadyWaiting { .. } => "already-waiting",
                Rejection::RequestTooOld { .. } => "request-too-old",
                Rejection::UnknownRequest { .. } => "unknown-request",
                Rejection::SequenceReused { .. } => "sequence-reused",
                Rejection::NameControlCharacter { .. } => "name-control-character",
                Rejection::FieldTooLong { .. } => "field-too-long",
                Rejection::ReasonEmpty => "reason-empty",
                Rejection::LockNotHeld { .. } => "lock-not-held",
                Rejection::TokenMismatch { .. } => "token-mismatch",
                Rejection::TableFull { .. } => "table-full",
                Rejection::KindConflict { .. } => "kind-conflict",
                Rejection::PermitsConflict { .. } => "permits-conflict",
                Rejection::PermitsOutOfRange { .. } => "permits-out-of-range",
                Rejection::NotElectionLeader { .. } => "not-election-leader",
                Rejection::LockDelayOutOfRange { .. } => "lock-delay-out-of-range",
                Rejection::LockDelayConflict { .. } => "lock-delay-conflict",
                Rejection::TooManyDelays { .. } => "too-many-delays",
                Rejection::BatchTooLarge { .. } => "batch-too-large",
                Rejection::NotBatchable => "not-batchable",
                Rejection::BatchConflict { .. } => "batch-conflict",
                Rejection::NoLockDelay { .. } => "no-lock-delay",
            },
            ApiError::Invalid(_) => "invalid-request",
            ApiError::NotLeader { .. } => "not-leader",
            ApiError::NoQuorum => "no-quorum",
            ApiError::TooManyWaiting => "too-many-waiting",
            ApiError::ShuttingDown => "shutting-down",
            ApiError::LeasesNotResumed { .. } => "leases-not-resumed",
            ApiError::Raft(_) => "raft",
            ApiError::PermissionDenied(_) => "permission-denied",
            ApiError::Unauthenticated(_) => "unauthenticated",
            ApiError::QuotaExceeded(_) => "quota-exceeded",
            ApiError::Membership(_) => "membership",
            ApiError::BackupTooLarge { .. } => "backup-too-large",
            ApiError::TooManyWatchers(_) => "too-many-watchers",
            ApiError::OutOfTouch { .. } => "out-of-touch",
            ApiError::WrongGroup { .. } => "wrong-group",
            ApiError::NotWithGroups { .. } => "not-with-groups",
            ApiError::NoSuchGroup { .. } => "no-such-group",
        }
    }

    fn code(&self) -> Code {
        match self {
            ApiError::Rejected(r) => match r {
                Rejection::NameEmpty
                | Rejection::NameTooLong { .. }
                | Rejection::NameControlCharacter { .. }
                | Rejection::TtlOutOfRange { .. }
                | Rejection::FieldTooLong { .. }
                | Rejection::ReasonEmpty
                | Rejection::PermitsOutOfRange { .. }
                | Rejection::LockDelayOutOfRange { .. }
                | Rejection::BatchTooLarge { .. }
                | Rejection::NotBatchable => Code::InvalidArgument,
                // Not NOT_FOUND: clients read that as "no such session".
                Rejection::LockNotHeld { .. } | Rejection::TokenMismatch { .. } => {
                    Code::FailedPrecondition
                }
                Rejection::SessionNotFound { .. } => Code::NotFound,
                Rejection::TooManySessions { .. }
                | Rejection::TooManyLocksForSession { .. }
                | Rejection::TooManyLocks { .. }
                | Rejection::QueueFull { .. }
                | Rejection::TableFull { .. }
                | Rejection::TooManyDelays { .. } => Code::ResourceExhausted,
                Rejection::AlreadyHeld { .. }
                | Rejection::AlreadyWaiting { .. }
                | Rejection::RequestTooOld { .. }
                | Rejection::UnknownRequest { .. }
                | Rejection::SequenceReused { .. }
                | Rejection::KindConflict { .. }
                | Rejection::PermitsConflict { .. }
                | Rejection::NotElectionLeader { .. }
                | Rejection::LockDelayConflict { .. }
                | Rejection::BatchConflict { .. }
                | Rejection::NoLockDelay { .. } => Code::FailedPrecondition,
            },
            ApiError::Invalid(_) => Code::InvalidArgument,
            ApiError::Membership(_)
            | ApiError::WrongGroup { .. }
            | ApiError::NotWithGroups { .. }
            | ApiError::NoSuchGroup { .. } => Code::FailedPrecondition,
            ApiError::TooManyWaiting
            | ApiError::QuotaExceeded(_)
            | ApiError::BackupTooLarge { .. }
            | ApiError::TooManyWatchers(_) => Code::ResourceExhausted,
            ApiError::PermissionDenied(_) => Code::PermissionDenied,
            ApiError::Unauthenticated(_) => Code::Unauthenticated,
            ApiError::NotLeader { .. }
            | ApiError::NoQuorum
            | ApiError::ShuttingDown
            | ApiError::LeasesNotResumed { .. }
            | ApiError::OutOfTouch { .. }
            | ApiError::Raft(_) => Code::Unavailable,
        }
    }

    /// The leader the client should ask instead, when this error names one: id and address
    /// (the member's address in the Raft membership, where it serves gRPC).
    pub fn leader_hint(&self) -> (Option<u64>, Option<&str>) {
        match self {
            ApiError::NotLeader {
                leader_id,
                leader_addr,
            } => (*leader_id, leader_addr.as_deref()),
            ApiError::LeasesNotResumed {
                leader_id,
                leader_addr,
            } => (Some(*leader_id), Some(leader_addr.as_str())),
            _ => (None, None),
        }
    }

    /// The HTTP status of this error on the HTTP API: the counterpart of its gRPC code, so that
    /// the two APIs classify every error alike.
    pub fn http_status(&self) -> StatusCode {
        match self.code() {
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            // Busy, conflicting with the session's state, or a membership conflict.
            Code::FailedPrecondition => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn forward(f: &ForwardToLeader<TypeConfig>) -> ApiError {
        ApiError::NotLeader {
            leader_id: f.leader_id,
            // Clients are sent to the leader's client address, never its peer one.
            leader_addr: f.leader_node.as_ref().map(|n| {
                crate::cluster::member_addr::MemberAddr::split(&n.addr)
                    .client
                    .to_owned()
            }),
        }
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        let mut status = Status::new(e.code(), e.to_string());
        let md = status.metadata_mut();
        md.insert(ERROR_REASON_KEY, e.reason().parse().expect("ascii reason"));
        let hint = e.leader_hint();
        if let Some(id) = hint.0 {
            md.insert(LEADER_ID_KEY, id.to_string().parse().expect("ascii id"));
        }
        if let Some(addr) = hint.1.and_then(|a| a.parse().ok()) {
            md.insert(LEADER_ADDR_KEY, addr);
        }
        status
    }
}

impl ApiError {
    /// Whether a client should ask again, elsewhere or later (gRPC UNAVAILABLE): this member
    /// does not lead, has no quorum, is stopping, or has not resumed its leases.
    pub fn is_unavailable(&self) -> bool {
        self.code() == Code::Unavailable
    }

    /// This error as a status that names the Raft group it came from (`GROUP_KEY`), in a
    /// cluster of more than one: a leader hint is the leader of that group only.
    pub fn in_group(self, group: u32, groups: u32) -> Status {
        let mut status = Status::from(self);
        if groups > 1 {
            status.metadata_mut().insert(
                latchkey_proto::GROUP_KEY,
                group.to_string().parse().expect("ascii group"),
            );
        }
        status
    }
}

/// An error of routing a request to a Raft group's node (`groups.rs`): of one group (its
/// status names the group, [`ApiError::in_group`]), or of the request as a whole.
#[derive(Debug, Clone)]
pub struct GroupError {
    pub error: ApiError,
    /// The group and the cluster's group count, for an error of one group.
    group: Option<(u32, u32)>,
}

impl GroupError {
    /// `error` of the group `shape` (a node's `Node::shape`).
    pub fn of(shape: latchkey_core::GroupShape, error: ApiError) -> GroupError {
        GroupError {
            error,
            group: Some((shape.group, shape.groups)),
        }
    }

    /// `error` of the request as a whole (a group the cluster lacks, a call it does not serve).
    pub fn of_cluster(error: ApiError) -> GroupError {
        GroupError { error, group: None }
    }

    /// `error` of group `group` of a cluster of `groups`.
    pub fn of_group(group: u32, groups: u32, error: ApiError) -> GroupError {
        GroupError {
            error,
            group: Some((group, groups)),
        }
    }

    /// The group the error is of, in a cluster of several groups (as the gRPC status names it
    /// in `latchkey-group`, [`ApiError::in_group`], and the HTTP API's error body in `group`).
    pub fn group(&self) -> Option<u32> {
        self.group
            .and_then(|(group, groups)| (groups > 1).then_some(group))
    }
}

impl From<GroupError> for Status {
    fn from(e: GroupError) -> Status {
        match e.group {
            Some((group, groups)) => e.error.in_group(group, groups),
            None => Status::from(e.error),
        }
    }
}

/// The body of every error of the HTTP API.
#[derive(Debug, serde::Serialize)]
pub struct ErrorBody<'a> {
    /// Stable, kebab-case: the same reasons as gRPC's `latchkey-error` metadata, plus the
    /// HTTP API's own (`no-such-route`, `method-not-allowed`, `body-too-large`, and
    /// `cross-origin`, `unsupported-media-type` from `cross_site`).
    pub code: &'a str,
    pub message: String,
    /// Set when this node is not the leader and knows which member is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_addr: Option<&'a str>,
    /// The Raft group the error is of, in a cluster of several groups (as gRPC's
    /// `latchkey-group`): send the next request for that group to `leader_addr`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
}

impl ErrorBody<'_> {
    /// The response carrying this body under `status`.
    /// The body as JSON under `status`. A 401 names the scheme to authenticate with
    /// (`WWW-Authenticate: Bearer`), which HTTP requires of every 401 (RFC 9110, 11.6.1);
    /// browsers show no password dialog for it.
    pub fn into_response_with(self, status: StatusCode) -> Response {
        let body = serde_json::to_vec(&self).expect("an error body always encodes");
        let mut response =
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static(WWW_AUTHENTICATE_BEARER),
            );
        }
        response
    }
}

/// What a 401 answers in `WWW-Authenticate`.
pub const WWW_AUTHENTICATE_BEARER: &str = "Bearer realm=\"latchkey\"";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (leader_id, leader_addr) = self.leader_hint();
        ErrorBody {
            code: self.reason(),
            message: self.to_string(),
            leader_id,
            leader_addr,
            group: None,
        }
        .into_response_with(self.http_status())
    }
}

impl From<RaftError<TypeConfig, ClientWriteError<TypeConfig>>> for ApiError {
    fn from(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> ApiError {
        match &e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f))
            | RaftError::APIError(ClientWriteError::LogEntryDiscarded(f)) => ApiError::forward(f),
            RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
                ApiError::Membership(c.to_string())
            }
            RaftError::Fatal(_) => ApiError::ShuttingDown,
            _ => ApiError::Raft(e.to_string()),
        }
    }
}

impl From<RaftError<TypeConfig, LinearizableReadError<TypeConfig>>> for ApiError {
    fn from(e: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>) -> ApiError {
        match &e {
            RaftError::APIError(LinearizableReadError::ForwardToLeader(f)) => ApiError::forward(f),
            RaftError::APIError(LinearizableReadError::QuorumNotEnough(_)) => ApiError::NoQuorum,
            RaftError::Fatal(_) => ApiError::ShuttingDown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A keepalive reaching a leader that has not resumed its leases yet is told to retry
    /// there, not sent wandering to a follower that would only send it back (issue #9).
    #[test]
    fn leases_not_resumed_names_this_leader_as_the_hint() {
        let status = Status::from(ApiError::LeasesNotResumed {
            leader_id: 2,
            leader_addr: "127.0.0.1:7422".into(),
        });
        assert_eq!(status.code(), Code::Unavailable);
        let md = status.metadata();
        assert_eq!(md.get(ERROR_REASON_KEY).unwrap(), "leases-not-resumed");
        assert_eq!(md.get(LEADER_ID_KEY).unwrap(), "2");
        assert_eq!(md.get(LEADER_ADDR_KEY).unwrap(), "127.0.0.1:7422");
    }
}
