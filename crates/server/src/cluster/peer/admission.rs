//! The one door of the peer service (issue #31): every `RaftPeer` RPC, unary or streamed, is
//! admitted here before any handler runs, and a handler cannot run without what admission
//! makes.
//!
//! Before, each RPC ran its own checks, and the snapshot stream, added later, skipped the
//! certificate check: a client certificate of the cluster's CA installed a snapshot on a
//! follower. Now [`PeerRouter`] is the only `RaftPeer` implementation the server runs, and a
//! group's [`PeerService`] has no RPC method of its own: its handlers take an [`Admitted`]
//! request, which only [`PeerRouter::admit`] and [`PeerRouter::admit_stream`] make, after:
//!
//! 1. routing: the group the request names (`GROUP_HEADER`) runs here;
//! 2. the sender: a member id (`FROM_HEADER`) other than this member's own;
//! 3. the cluster: the fingerprint of this cluster and group (`CLUSTER_HEADER`);
//! 4. the certificate: with mTLS between members, the connection's client certificate names
//!    the sender (`member-ID`);
//! 5. the MAC, with a cluster secret: over the whole message for a unary call, over the
//!    headers for a stream, whose every item is then checked as it is read
//!    ([`AdmittedChunks`]: a handler only ever sees items whose MAC verified);
//! 6. membership: the authenticated [`Sender`]'s id is handed out only by
//!    [`PeerService::vouch`], which checks it against this group's Raft membership as it is
//!    when each message is read (a member removed while its stream is open is refused from its
//!    next message on), and asks a sender outside it what the message offers for it (a
//!    leader's committed vote, a candidate's longer log; see `PeerAuth::check_member`).
//!
//! A stream is admitted from its headers, before its first item is read. What a message then
//! *says* (the vote it speaks for, its place in its stream, a snapshot's data) is the
//! handlers' to check, in `service.rs`; nothing refused reaches openraft.
//!
//! Every refusal, admission's or a handler's (a [`PeerRefusal`]: its reason and why), is
//! answered through the request's [`Door`], made here before any check: `PERMISSION_DENIED`
//! (`INVALID_ARGUMENT` for a malformed message) to the sender, one more
//! `latchkey_peer_refused_total{reason}`, and a log line with the sender's address, the member
//! it claims to be and the group, rate-limited (`observe/refusals.rs`). A sender outside the
//! membership is logged once at warn, then at debug: a removed member left running campaigns
//! every election timeout.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use latchkey_core::limits;
use latchkey_proto::v1 as pb;
use tonic::{Request, Status};

use super::service::{PeerRouter, PeerService, Vouch};
use crate::cluster::peer_auth::{
    group_of_request, PeerAuth, PeerAuthError, PeerMethod, FROM_HEADER,
};
use crate::observe::refusals::{cut, PeerReason, RefusalReason, Refusals};

/// A peer request that passed admission. Only this module makes one.
pub(crate) struct Admitted<T> {
    sender: Sender,
    body: T,
    door: Door,
}

impl<T> Admitted<T> {
    pub(crate) fn into_parts(self) -> (Sender, T) {
        (self.sender, self.body)
    }

    /// Where the request's refusals are answered.
    pub(crate) fn door(&self) -> &Door {
        &self.door
    }
}

/// Why a peer request is refused, before it is answered: the reason it is counted under and
/// the explanation. Only [`Door::answer`] turns one into the sender's answer, counting and
/// logging it on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerRefusal {
    reason: PeerReason,
    why: String,
}

impl PeerRefusal {
    pub(crate) fn new(reason: PeerReason, why: impl Into<String>) -> PeerRefusal {
        PeerRefusal {
            reason,
            why: why.into(),
        }
    }

    /// A message that does not decode, or a stream that does not begin as one must.
    pub(crate) fn malformed(why: impl Into<String>) -> PeerRefusal {
        PeerRefusal::new(PeerReason::Malformed, why)
    }

    /// What the sender is told.
    fn status(&self) -> Status {
        match self.reason {
            PeerReason::Malformed => Status::invalid_argument(&self.why),
            _ => Status::permission_denied(format!("refused by this member: {}", self.why)),
        }
    }
}

impl From<PeerAuthError> for PeerRefusal {
    fn from(e: PeerAuthError) -> PeerRefusal {
        PeerRefusal::new(e.reason(), e.to_string())
    }
}

/// How a handler fails: refused (answered at the [`Door`]), or a status passed on as it is (a
/// busy member, a deadline, a stream the sender reset, a refusal already answered).
#[derive(Debug)]
pub(crate) enum PeerError {
    Refused(PeerRefusal),
    Status(Status),
}

impl From<PeerRefusal> for PeerError {
    fn from(r: PeerRefusal) -> PeerError {
        PeerError::Refused(r)
    }
}

impl From<Status> for PeerError {
    fn from(s: Status) -> PeerError {
        PeerError::Status(s)
    }
}

/// Where a peer request came from, as its connection and headers say (unchecked: for the log
/// line of its refusal only), and the one place its refusals are answered, counted and logged.
#[derive(Clone)]
pub(crate) struct Door {
    method: PeerMethod,
    addr: Option<SocketAddr>,
    /// The member id the request claims (`FROM_HEADER`), if it is one.
    claimed: Option<u64>,
    /// The group its `GROUP_HEADER` names (0 without one), if it is one.
    group: Option<u32>,
    refusals: Arc<Refusals<PeerReason>>,
    /// (group, member) of the senders outside a membership already logged at warn (at most
    /// `PEER_NON_MEMBERS_REPORTED_MAX`; beyond, every such refusal is a warning again).
    reported: Arc<Mutex<BTreeSet<(u32, u64)>>>,
}

impl Door {
    /// The answer to a failed request: a refusal is counted and logged, a status passes.
    pub(crate) fn answer(&self, e: PeerError) -> Status {
        match e {
            PeerError::Refused(r) => self.refuse(r),
            PeerError::Status(s) => s,
        }
    }

    /// Counts and logs a refusal (rate-limited), and says what the sender is told.
    pub(crate) fn refuse(&self, refusal: PeerRefusal) -> Status {
        let status = refusal.status();
        let reason = refusal.reason;
        let outsider = matches!(reason, PeerReason::NotAMember | PeerReason::RemovedMember);
        let again = outsider && !self.first_report();
        // An outsider's repeats take nothing from the log's bucket: they are debug lines.
        let admitted = match again {
            true => {
                self.refusals.count_unlogged(reason);
                None
            }
            false => self.refusals.count(reason),
        };
        let from = self
            .addr
            .map_or_else(|| "an unknown address".to_owned(), |a| a.to_string());
        let member = self
            .claimed
            .map_or_else(|| "no member id".to_owned(), |m| format!("member {m}"));
        let group = self.group.map_or_else(|| "?".to_owned(), |g| g.to_string());
        let why = cut(refusal.why, limits::REFUSAL_LOG_DETAIL_BYTES_MAX);
        let (method, reason) = (self.method, reason.as_str());
        match admitted {
            // Logged at warn already: a debug line (off by default).
            None if again => tracing::debug!(
                %from, ?method, reason, "refused a peer message ({reason}) from {from}, \
                 claiming {member}, group {group}: {why}"
            ),
            None => {}
            Some(left_out) if left_out.total() == 0 => tracing::warn!(
                %from, ?method, reason, "refused a peer message ({reason}) from {from}, \
                 claiming {member}, group {group}: {why}"
            ),
            Some(left_out) => tracing::warn!(
                %from,
                ?method,
                reason,
                suppressed = left_out.total(),
                "refused a peer message ({reason}) from {from}, claiming {member}, group \
                 {group}: {why} ({} refusals not logged since the last line: {left_out})",
                left_out.total()
            ),
        }
        status
    }

    /// Whether this is the first refusal of its sender as an outsider of its group.
    fn first_report(&self) -> bool {
        let (Some(member), Some(group)) = (self.claimed, self.group) else {
            return true;
        };
        let mut reported = self.reported.lock().expect("reported lock");
        reported.len() >= limits::PEER_NON_MEMBERS_REPORTED_MAX || reported.insert((group, member))
    }
}

/// Who sent an admitted request: authenticated (its certificate, fingerprint and MAC checked),
/// not yet found a member. Its id is the handlers' only through [`PeerService::vouch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sender(u64);

impl Sender {
    /// The claimed id, for log lines only.
    pub(crate) fn claimed(self) -> u64 {
        self.0
    }
}

/// The items of an admitted stream, each handed out only once its MAC verified. Each must come
/// within `timeout` of the previous one (or of the call), or the stream is refused.
pub(crate) struct AdmittedChunks {
    from: u64,
    item: PeerMethod,
    auth: Arc<PeerAuth>,
    inner: tonic::Streaming<pb::PeerChunk>,
}

/// One item of an admitted stream, its MAC checked: its header and data.
pub(crate) struct VerifiedChunk {
    pub(crate) header: Vec<u8>,
    pub(crate) data: Vec<u8>,
}

/// Why an admitted stream gave no next item.
#[derive(Debug)]
pub(crate) enum ChunkError {
    /// The sender reset the stream, or its connection broke.
    Reset(Status),
    /// The item does not check out: the stream is refused.
    Refused(PeerRefusal),
}

impl From<ChunkError> for PeerError {
    fn from(e: ChunkError) -> PeerError {
        match e {
            ChunkError::Reset(s) => PeerError::Status(s),
            ChunkError::Refused(r) => PeerError::Refused(r),
        }
    }
}

impl AdmittedChunks {
    /// The next item: `Ok(None)` at the end of the stream.
    pub(crate) async fn next(&mut self) -> Result<Option<VerifiedChunk>, ChunkError> {
        let Some(chunk) = self
            .inner
            .next()
            .await
            .transpose()
            .map_err(ChunkError::Reset)?
        else {
            return Ok(None);
        };
        self.auth
            .verify_item(
                self.item,
                self.from,
                &chunk.payload,
                &chunk.data,
                &chunk.mac,
            )
            .map_err(|e| ChunkError::Refused(e.into()))?;
        Ok(Some(VerifiedChunk {
            header: chunk.payload,
            data: chunk.data,
        }))
    }

    /// [`AdmittedChunks::next`] within `timeout`.
    pub(crate) async fn next_within(
        &mut self,
        timeout: Duration,
        what: &'static str,
    ) -> Result<Option<VerifiedChunk>, PeerError> {
        match tokio::time::timeout(timeout, self.next()).await {
            Err(_) => Err(Status::deadline_exceeded(what).into()),
            Ok(r) => Ok(r?),
        }
    }
}

impl PeerRouter {
    /// Admits a unary call: the group it is for, and the request with its authenticated sender.
    pub(super) fn admit(
        &self,
        request: Request<pb::PeerMessage>,
        method: PeerMethod,
    ) -> Result<(&PeerService, Admitted<Vec<u8>>), Status> {
        let door = self.door(&request, method);
        let (group, sender, message) = self
            .authenticate(request, method, |m: &pb::PeerMessage| &m.payload)
            .map_err(|r| door.refuse(r))?;
        Ok((
            group,
            Admitted {
                sender,
                body: message.payload,
                door,
            },
        ))
    }

    /// Admits a streamed call from its headers, before any item is read; `item` is the kind of
    /// its items, whose MACs [`AdmittedChunks`] checks as they are read.
    pub(super) fn admit_stream(
        &self,
        request: Request<tonic::Streaming<pb::PeerChunk>>,
        method: PeerMethod,
        item: PeerMethod,
    ) -> Result<(&PeerService, Admitted<AdmittedChunks>), Status> {
        let door = self.door(&request, method);
        let (group, sender, inner) = self
            .authenticate(request, method, |_| &[])
            .map_err(|r| door.refuse(r))?;
        Ok((
            group,
            Admitted {
                sender,
                body: AdmittedChunks {
                    from: sender.0,
                    item,
                    auth: group.auth.clone(),
                    inner,
                },
                door,
            },
        ))
    }

    /// The door of a request, before any check: where it says it comes from.
    fn door<T>(&self, request: &Request<T>, method: PeerMethod) -> Door {
        let meta = request.metadata();
        Door {
            method,
            addr: request.remote_addr(),
            claimed: meta
                .get(FROM_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok()),
            group: group_of_request(meta).ok(),
            refusals: self.refusals.clone(),
            reported: self.reported.clone(),
        }
    }

    /// Every request's checks, unary or streamed: its group, then its headers (sender,
    /// fingerprint, and the MAC over `payload`: a unary call's message, nothing for a stream)
    /// and the connection's certificate.
    fn authenticate<T>(
        &self,
        request: Request<T>,
        method: PeerMethod,
        payload: impl FnOnce(&T) -> &[u8],
    ) -> Result<(&PeerService, Sender, T), PeerRefusal> {
        let group = self.route(&request)?;
        let certs = request.peer_certs();
        let (meta, _, body) = request.into_parts();
        let from = group.auth.verify(&meta, method, payload(&body))?;
        group
            .auth
            .verify_certificate(from, certs.as_deref().map(Vec::as_slice))?;
        Ok((group, Sender(from), body))
    }

    /// The group a request is for: the one its `GROUP_HEADER` names, group 0 without one.
    fn route<T>(&self, request: &Request<T>) -> Result<&PeerService, PeerRefusal> {
        let unknown = |why| PeerRefusal::new(PeerReason::UnknownGroup, why);
        let group = group_of_request(request.metadata()).map_err(unknown)?;
        self.groups.get(group as usize).ok_or_else(|| {
            unknown(format!(
                "no Raft group {group} here: this member runs {} (another --groups?)",
                self.groups.len()
            ))
        })
    }
}

impl PeerService {
    /// The sender's id, if it is a member by this member's membership now (checked for every
    /// message: the membership may have changed since the stream was admitted), or vouched for
    /// by what its message offers (`vouch`).
    pub(super) fn vouch(&self, sender: Sender, vouch: Vouch<'_>) -> Result<u64, PeerRefusal> {
        self.check_member(sender.0, vouch).map(|()| sender.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #31: each check of a peer's credentials is counted under its own reason, and a
    /// malformed message is told `INVALID_ARGUMENT`, every other refusal `PERMISSION_DENIED`.
    #[test]
    fn each_refusal_counts_under_its_reason_and_answers_its_code() {
        let cases = [
            (PeerAuthError::NoSender, PeerReason::NoSender),
            (PeerAuthError::NotAMember(4), PeerReason::NotAMember),
            (
                PeerAuthError::Removed { from: 4, index: 9 },
                PeerReason::RemovedMember,
            ),
            (PeerAuthError::FromSelf, PeerReason::FromSelf),
            (
                PeerAuthError::OtherCluster {
                    got: None,
                    want: "f".into(),
                },
                PeerReason::OtherCluster,
            ),
            (PeerAuthError::NoMac, PeerReason::NoMac),
            (PeerAuthError::BadMac, PeerReason::BadMac),
            (
                PeerAuthError::NotMemberCertificate {
                    from: 1,
                    want: "member-1".into(),
                    names: vec![],
                },
                PeerReason::NotMemberCertificate,
            ),
        ];
        for (e, reason) in cases {
            let why = e.to_string();
            let refusal = PeerRefusal::from(e);
            assert_eq!(refusal, PeerRefusal::new(reason, why.clone()));
            let status = refusal.status();
            assert_eq!(status.code(), tonic::Code::PermissionDenied, "{reason:?}");
            assert!(status.message().ends_with(&why), "{status:?}");
        }
        let status = PeerRefusal::malformed("bad peer payload").status();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "bad peer payload");
    }

    fn door(claimed: Option<u64>, group: Option<u32>) -> Door {
        Door {
            method: PeerMethod::Vote,
            addr: None,
            claimed,
            group,
            refusals: Default::default(),
            reported: Default::default(),
        }
    }

    /// Every refusal answered at a door is counted once under its reason, the outsiders' too
    /// (logged once at warn each, then at debug), and a status passes uncounted.
    #[test]
    fn every_refusal_at_the_door_is_counted_once() {
        let d = door(Some(4), Some(0));
        for _ in 0..3 {
            let s = d.answer(PeerRefusal::new(PeerReason::RemovedMember, "removed").into());
            assert_eq!(s.code(), tonic::Code::PermissionDenied);
        }
        d.answer(PeerRefusal::malformed("x").into());
        let s = d.answer(Status::unavailable("busy").into());
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert_eq!(d.refusals.counted(PeerReason::RemovedMember), 3);
        assert_eq!(d.refusals.counted(PeerReason::Malformed), 1);
        let counted: u64 = PeerReason::ALL.iter().map(|&r| d.refusals.counted(r)).sum();
        assert_eq!(counted, 4);
        // One warning per outsider and group, then debug lines; bounded.
        assert!(!d.first_report(), "member 4 of group 0 was reported");
        assert!(door(Some(4), Some(1)).first_report());
        let shared = door(None, None);
        for member in 0..limits::PEER_NON_MEMBERS_REPORTED_MAX as u64 + 10 {
            let d = Door {
                claimed: Some(member),
                group: Some(0),
                ..shared.clone()
            };
            assert!(
                d.first_report(),
                "past the bound, every refusal is a warning"
            );
        }
        assert!(shared.reported.lock().unwrap().len() <= limits::PEER_NON_MEMBERS_REPORTED_MAX);
    }

    /// A removed member left running is refused every election timeout, and logged once: its
    /// repeats (debug lines) must not take the log's burst from every other refusal.
    #[test]
    fn an_outsiders_repeats_leave_the_log_to_other_refusals() {
        let removed = door(Some(4), Some(0));
        for _ in 0..1_000 {
            removed.answer(PeerRefusal::new(PeerReason::RemovedMember, "removed").into());
        }
        assert_eq!(removed.refusals.counted(PeerReason::RemovedMember), 1_000);
        let said = removed.refusals.count(PeerReason::BadMac);
        assert_eq!(said.map(|left_out| left_out.total()), Some(0));
    }
}
