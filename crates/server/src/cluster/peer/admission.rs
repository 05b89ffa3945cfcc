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
//! A stream is admitted from its headers, before its first item is read. Each refusal is
//! `PERMISSION_DENIED` to the sender and a log line here; nothing reaches openraft. What a
//! message then *says* (the vote it speaks for, its place in its stream, a snapshot's data) is
//! the handlers' to check, in `peer.rs`.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use latchkey_proto::v1 as pb;
use tonic::{Request, Status};

use super::{refuse, PeerRouter, PeerService, Vouch};
use crate::cluster::peer_auth::{group_of_request, PeerAuth, PeerMethod};

/// A peer request that passed admission. Only this module makes one.
pub(crate) struct Admitted<T> {
    sender: Sender,
    body: T,
}

impl<T> Admitted<T> {
    pub(crate) fn into_parts(self) -> (Sender, T) {
        (self.sender, self.body)
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
    /// The item does not check out (logged): the stream is refused.
    Refused(Status),
}

impl From<ChunkError> for Status {
    fn from(e: ChunkError) -> Status {
        match e {
            ChunkError::Reset(s) | ChunkError::Refused(s) => s,
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
            .map_err(|e| ChunkError::Refused(refuse(self.item, Some(self.from), &e.to_string())))?;
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
    ) -> Result<Option<VerifiedChunk>, Status> {
        match tokio::time::timeout(timeout, self.next()).await {
            Err(_) => Err(Status::deadline_exceeded(what)),
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
        let (group, sender, message) =
            self.authenticate(request, method, |m: &pb::PeerMessage| &m.payload)?;
        Ok((
            group,
            Admitted {
                sender,
                body: message.payload,
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
        let (group, sender, inner) = self.authenticate(request, method, |_| &[])?;
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
            },
        ))
    }

    /// Every request's checks, unary or streamed: its group, then its headers (sender,
    /// fingerprint, and the MAC over `payload`: a unary call's message, nothing for a stream)
    /// and the connection's certificate.
    fn authenticate<T>(
        &self,
        request: Request<T>,
        method: PeerMethod,
        payload: impl FnOnce(&T) -> &[u8],
    ) -> Result<(&PeerService, Sender, T), Status> {
        let group = self.route(&request, method)?;
        let certs = request.peer_certs();
        let (meta, _, body) = request.into_parts();
        let from = group
            .auth
            .verify(&meta, method, payload(&body))
            .map_err(|e| refuse(method, None, &e.to_string()))?;
        group
            .auth
            .verify_certificate(from, certs.as_deref().map(Vec::as_slice))
            .map_err(|e| refuse(method, Some(from), &e.to_string()))?;
        Ok((group, Sender(from), body))
    }

    /// The group a request is for: the one its `GROUP_HEADER` names, group 0 without one.
    fn route<T>(&self, request: &Request<T>, method: PeerMethod) -> Result<&PeerService, Status> {
        let group = group_of_request(request.metadata()).map_err(|e| refuse(method, None, &e))?;
        self.groups.get(group as usize).ok_or_else(|| {
            refuse(
                method,
                None,
                &format!(
                    "no Raft group {group} here: this member runs {} (another --groups?)",
                    self.groups.len()
                ),
            )
        })
    }
}

impl PeerService {
    /// The sender's id, if it is a member by this member's membership now (checked for every
    /// message: the membership may have changed since the stream was admitted), or vouched for
    /// by what its message offers (`vouch`).
    pub(super) fn vouch(
        &self,
        sender: Sender,
        method: PeerMethod,
        vouch: Vouch<'_>,
    ) -> Result<u64, Status> {
        self.check_member(method, sender.0, vouch)
            .map(|()| sender.0)
    }
}
