//! The client's error type and the one place where a gRPC `Status` becomes one.

use std::time::Duration;

use latchkey_proto::{ERROR_REASON_KEY, LEADER_ADDR_KEY};
use tonic::{Code, Status};

/// Everything a latchkey call can fail with, one variant per cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Bad input (empty or over-long name, TTL out of range, unusable endpoint). Retrying the
    /// same input gets the same answer.
    #[error("invalid argument: {message}")]
    InvalidArgument { message: String },
    /// The server does not know the session (expired, closed, or wrong secret).
    #[error("session not found: {message}")]
    SessionNotFound { message: String },
    /// The session's lease may have run out: its deadline on this client's clock passed without
    /// an acknowledged renewal, the server said it is gone, or it was closed. Its locks may
    /// already belong to someone else.
    #[error("session {id} lost: {why}")]
    SessionLost { id: u64, why: String },
    /// A release found that the grant was no longer current: the lock was lost before it.
    #[error("lock {name:?} with token {token} was not held any more")]
    NotHeld { name: String, token: u64 },
    /// A server limit was hit (sessions, locks per session, queue full, ...).
    #[error("limit reached ({reason}): {message}")]
    LimitReached { reason: String, message: String },
    /// The request conflicts with the session's state (already held, already waiting, ...).
    #[error("conflict ({reason}): {message}")]
    Conflict { reason: String, message: String },
    /// The wait for a lock ended without a grant (including a try-once that found it held).
    #[error("timed out waiting for lock {name:?}")]
    WaitTimedOut { name: String },
    /// A try-once (wait zero) found the lock held; `holder` is who held it when the server
    /// refused the request (it may have changed since).
    #[error("lock {name:?} is {}", holder.describe())]
    Held {
        name: String,
        holder: Box<crate::types::Holder>,
    },
    /// Servers answered, but none could serve the request (no leader, shutting down) within
    /// the retry budget.
    #[error("unavailable after {attempts} attempts in {elapsed:?}: {last}")]
    Unavailable {
        attempts: u32,
        elapsed: Duration,
        last: String,
    },
    /// No server could be reached (connection refused, reset, timed out) within the retry
    /// budget.
    #[error("{last} ({attempts} attempts in {:.1}s)", elapsed.as_secs_f64())]
    Transport {
        attempts: u32,
        elapsed: Duration,
        last: String,
    },
    /// The client and the server do not speak the same protocol (TLS to a plaintext port or the
    /// reverse) or do not trust each other's certificates. Not retried: only a change of
    /// configuration fixes it; the message says which.
    #[error("TLS: {message}")]
    Tls { message: String },
    /// Access control refused the call: the identity lacks the permission on the lock (or
    /// prefix), the session is another identity's (`permission-denied`), or the credentials
    /// are missing or unknown (`unauthenticated`). Not retried: only a change of the
    /// access-control list or of the credentials fixes it.
    #[error("permission denied ({reason}): {message}")]
    PermissionDenied { reason: String, message: String },
    /// The server answered something this client does not understand (a missing field, an
    /// unknown result).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server failed in a way that is not a client error (INTERNAL, UNIMPLEMENTED, ...).
    #[error("server error ({code}): {message}")]
    Server { code: String, message: String },
    /// A membership change of a cluster of several Raft groups went through in the groups
    /// `done` (the ones before `group` of those it was to change, in group order) and failed
    /// in `group` with `source` (the later groups were not changed). Every change is
    /// idempotent per group: the same call again finishes it.
    #[error(
        "the membership change failed in Raft group {group} of {groups} (done in group{s} {list}; \
         the later ones were not changed): {source}; the same command again finishes it",
        s = if done.len() == 1 { "" } else { "s" },
        list = if done.is_empty() {
            "none".to_owned()
        } else {
            done.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
        }
    )]
    MembershipIncomplete {
        group: u32,
        groups: u32,
        done: Vec<u32>,
        source: Box<Error>,
    },
}

/// What to do with one failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The server is up but cannot serve this now (not leader, no leader, shutting down).
    /// `leader_addr` is its hint of where to go instead.
    Unavailable {
        leader_addr: Option<String>,
        message: String,
    },
    /// The request may not have reached a server, or its answer was lost.
    Transport { message: String },
    /// Do not retry.
    Fatal(Error),
}

/// The stable reason a server put in the metadata, if any.
fn reason(status: &Status) -> Option<String> {
    status
        .metadata()
        .get(ERROR_REASON_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Classifies a failed attempt. The server sets `latchkey-error` on every status it returns, so
/// an UNAVAILABLE without it came from tonic's transport, not from a latchkey node.
pub(crate) fn classify(status: &Status) -> Failure {
    let reason = reason(status);
    let message = status.message().to_owned();
    match status.code() {
        Code::Unavailable if reason.is_some() => Failure::Unavailable {
            leader_addr: status
                .metadata()
                .get(LEADER_ADDR_KEY)
                .and_then(|v| v.to_str().ok())
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
            message: format!("{} ({})", message, reason.unwrap_or_default()),
        },
        Code::Unavailable | Code::Cancelled | Code::DeadlineExceeded => Failure::Transport {
            message: transport_message(status),
        },
        // Tonic reports some connection-level failures (h2 errors) as UNKNOWN.
        Code::Unknown if reason.is_none() => Failure::Transport {
            message: transport_message(status),
        },
        Code::InvalidArgument => Failure::Fatal(Error::InvalidArgument { message }),
        Code::NotFound => Failure::Fatal(Error::SessionNotFound { message }),
        Code::ResourceExhausted => Failure::Fatal(Error::LimitReached {
            reason: reason.unwrap_or_else(|| "resource-exhausted".into()),
            message,
        }),
        Code::PermissionDenied | Code::Unauthenticated => Failure::Fatal(Error::PermissionDenied {
            reason: reason.unwrap_or_else(|| format!("{:?}", status.code())),
            message,
        }),
        Code::FailedPrecondition => Failure::Fatal(Error::Conflict {
            reason: reason.unwrap_or_else(|| "failed-precondition".into()),
            message,
        }),
        code => Failure::Fatal(Error::Server {
            code: format!("{code:?}"),
            message: match reason {
                Some(r) => format!("{message} ({r})"),
                None => message,
            },
        }),
    }
}

pub(crate) fn transport_message(status: &Status) -> String {
    use std::error::Error as _;
    let mut out = format!("{:?}: {}", status.code(), status.message());
    let mut source = status.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    fn status(code: Code, meta: &[(&'static str, &'static str)]) -> Status {
        let mut s = Status::new(code, "msg");
        for (k, v) in meta {
            s.metadata_mut().insert(*k, MetadataValue::from_static(v));
        }
        s
    }

    #[test]
    fn not_leader_with_hint_is_retried_at_the_hint() {
        let s = status(
            Code::Unavailable,
            &[
                (ERROR_REASON_KEY, "not-leader"),
                (LEADER_ADDR_KEY, "127.0.0.1:7421"),
            ],
        );
        match classify(&s) {
            Failure::Unavailable { leader_addr, .. } => {
                assert_eq!(leader_addr.as_deref(), Some("127.0.0.1:7421"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unavailable_without_hint_has_no_leader() {
        let s = status(Code::Unavailable, &[(ERROR_REASON_KEY, "no-leader")]);
        assert!(matches!(
            classify(&s),
            Failure::Unavailable {
                leader_addr: None,
                ..
            }
        ));
        // An empty hint is no hint.
        let s = status(
            Code::Unavailable,
            &[(ERROR_REASON_KEY, "not-leader"), (LEADER_ADDR_KEY, "")],
        );
        assert!(matches!(
            classify(&s),
            Failure::Unavailable {
                leader_addr: None,
                ..
            }
        ));
    }

    #[test]
    fn unavailable_without_reason_is_transport() {
        for code in [
            Code::Unavailable,
            Code::Unknown,
            Code::DeadlineExceeded,
            Code::Cancelled,
        ] {
            assert!(
                matches!(classify(&status(code, &[])), Failure::Transport { .. }),
                "{code:?}"
            );
        }
    }

    #[test]
    fn api_errors_are_fatal_with_their_reason() {
        let cases = [
            (
                status(Code::InvalidArgument, &[(ERROR_REASON_KEY, "name-empty")]),
                Error::InvalidArgument {
                    message: "msg".into(),
                },
            ),
            (
                status(Code::NotFound, &[(ERROR_REASON_KEY, "session-not-found")]),
                Error::SessionNotFound {
                    message: "msg".into(),
                },
            ),
            (
                status(Code::ResourceExhausted, &[(ERROR_REASON_KEY, "queue-full")]),
                Error::LimitReached {
                    reason: "queue-full".into(),
                    message: "msg".into(),
                },
            ),
            (
                status(
                    Code::FailedPrecondition,
                    &[(ERROR_REASON_KEY, "already-held")],
                ),
                Error::Conflict {
                    reason: "already-held".into(),
                    message: "msg".into(),
                },
            ),
            (
                status(
                    Code::PermissionDenied,
                    &[(ERROR_REASON_KEY, "permission-denied")],
                ),
                Error::PermissionDenied {
                    reason: "permission-denied".into(),
                    message: "msg".into(),
                },
            ),
            (
                status(
                    Code::Unauthenticated,
                    &[(ERROR_REASON_KEY, "unauthenticated")],
                ),
                Error::PermissionDenied {
                    reason: "unauthenticated".into(),
                    message: "msg".into(),
                },
            ),
            (
                status(Code::Internal, &[(ERROR_REASON_KEY, "storage")]),
                Error::Server {
                    code: "Internal".into(),
                    message: "msg (storage)".into(),
                },
            ),
            (
                status(Code::Unknown, &[(ERROR_REASON_KEY, "bug")]),
                Error::Server {
                    code: "Unknown".into(),
                    message: "msg (bug)".into(),
                },
            ),
        ];
        for (s, want) in cases {
            assert_eq!(classify(&s), Failure::Fatal(want));
        }
    }
}
