//! Raft between members: the `RaftPeer` gRPC service and the network client openraft uses to
//! call it. This file holds what both sides share, the wire format ([`Ballot`],
//! [`AppendFrame`], the snapshot's frames, [`encode`]) and the [`Succession`]; the sides are
//! its modules:
//!
//! - `peer/admission.rs`: the one door of every peer RPC (`Admitted`), where every refusal is
//!   answered, counted and logged;
//! - `peer/service.rs`: the receiving side, [`PeerRouter`] and each group's [`PeerService`],
//!   whose handlers check what a message says;
//! - `peer/network.rs`: the sending side, [`PeerNetwork`] and its `PeerClient`s, over a
//!   [`PeerConnector`].
//!
//! Payloads are openraft's own messages, serialized with postcard behind a one-byte format
//! version; protobuf only frames them. Every call has a deadline (openraft's `RPCOption`).
//!
//! Receiving: [`PeerRouter`] is the only `RaftPeer` the server runs. It admits every request
//! on the one path every peer RPC takes (`peer/admission.rs`) and hands it to its group's
//! [`PeerService`], whose handlers take only the `Admitted` request admission makes, so a new
//! RPC cannot skip a check. A handler then checks what a message *says* before openraft sees
//! it: a sender that is not a member by this member's Raft membership must be vouched for by
//! the message (a leader's append or snapshot with a committed vote at least this member's
//! own; a vote request whose last log index is above this member's), since a member that
//! missed the change adding a member must still follow it and vote for it (those claims are
//! the sender's own, so a sender that a membership change removed from the group, which keeps
//! its credentials, is refused whatever it claims: `RemovedMembers`, kept in the applied state;
//! a certificate issued for an id never added is trusted on them, docs/securing.md says how to
//! revoke); a vote that skips the leader lease (a leadership transfer) is granted only to the
//! successor the leader of this member's term named ([`Succession`],
//! `check_leadership_transfer`); an append must leave the entries this member committed as
//! they are (`check_committed`), and a snapshot must decode, match its meta, pass the table's
//! invariants and not lie above its vote (`check_snapshot`), since openraft asserts on the
//! first and the last, and stops its core on a failed install. A real pre-vote question rides
//! the `Vote` call ([`Ballot::PreVote`]), so a member that was cut off asks before it
//! campaigns.
//!
//! Replication: one pipelined `AppendStream` call per follower (openraft's `stream_append`):
//! the next append goes out before the last is answered, at most
//! `PEER_APPENDS_UNANSWERED_MAX` unanswered, each answered in order once durable at the
//! follower, each within openraft's `soft_ttl`; every append carries its own MAC over a
//! per-stream id and its number in the stream. The appends end with the answers, so a stream
//! openraft stopped reading (a conflict, a higher vote, a missed deadline) closes instead of
//! taking its next requests. A receiver keeps at most `PEER_APPEND_STREAMS_MAX` streams open
//! and closes one left without an append for `PEER_APPEND_STREAM_FIRST_TIMEOUT_MS`; HTTP/2
//! keepalive (`PEER_KEEPALIVE_INTERVAL_MS`) closes a connection whose peer died half open. A
//! member that answers `UNIMPLEMENTED` (an older latchkey) gets unary `Append`s from then on.
//!
//! Snapshots are streamed in chunks of `SNAPSHOT_CHUNK_BYTES` (client-streaming `Snapshot`: a
//! header chunk with the vote, the meta and the length, then the data, each chunk with its own
//! MAC over a per-transfer id and its offset), read into memory up to the receiver's table
//! budget plus `SNAPSHOT_OVERHEAD_BYTES_MAX`, one stream at a time, each chunk within
//! `SNAPSHOT_CHUNK_TIMEOUT_MS`, and checked as a whole before openraft sees it.
//!
//! Sending: [`PeerNetwork`] makes a `PeerClient` per target, dialed at its address in the
//! membership ([`AddressBook`], which `Node::follow_membership` keeps current), over one
//! channel per member address shared by every group ([`SharedChannels`]).

mod admission;
mod network;
mod service;

pub(crate) use network::peer_endpoint;
pub use network::{
    AddressBook, PeerConnector, PeerNetwork, SharedChannels, SharedPeerConnector, TcpPeerConnector,
};
pub use service::{PeerRouter, PeerService};

use std::sync::Arc;

use latchkey_core::limits;
use latchkey_core::versioned::{self, VersionedError};
use latchkey_proto::v1 as pb;
use latchkey_raft::TypeConfig;

use crate::cluster::peer_auth::PeerAuth;
use openraft::errors::Fatal;
use openraft::raft::{StreamAppendResult, TransferLeaderRequest, VoteRequest};
use openraft::storage::SnapshotMeta;
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::{Response, Status};

/// Version of the peer payload encoding. Members of one cluster must speak the same one: a
/// member refuses another version (the caller sees a network error: no vote, no grant, no
/// append). 2: a `Vote` call carries a [`Ballot`], no longer a bare `VoteRequest`. 3: a
/// snapshot is streamed in chunks ([`SnapshotFrame`]), no longer sent as one message.
const PEER_FORMAT_VERSION: u8 = 3;

type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
type Meta =
    SnapshotMeta<openraft::type_config::alias::CommittedLeaderIdOf<TypeConfig>, u64, BasicNode>;

/// What a `Vote` call asks. A pre-vote asks whether the member *would* grant a vote for the
/// next term, and changes nothing there (openraft's `Raft::pre_vote`); only a real vote may
/// raise the member's term. The two share one RPC so that the service stays as it is.
///
/// openraft's default `RaftNetworkV2::pre_vote` answers "granted" without asking anyone, which
/// would make pre-vote a no-op: a member that cannot win would still raise its term and, back
/// in touch, depose a healthy leader (see `raft_config`).
///
/// A leader's `TransferLeader` (it names its successor, see [`Succession`]) rides the same
/// call, as the last variant: a member of an older latchkey fails to decode it, so the transfer
/// fails and the group elects as it would after a leader's death.
#[derive(Serialize, Deserialize)]
pub enum Ballot {
    Vote(VoteRequest<TypeConfig>),
    PreVote(VoteRequest<TypeConfig>),
    TransferLeader(TransferLeaderRequest<TypeConfig>),
}

/// The successor a leader named in one Raft group (`Raft::trigger().transfer_leader`, issue
/// #16's leader rebalance), as this member last heard it: the leader's vote and the member it
/// named. Shared by the group's network client (a leader records whom it names as it sends
/// the request) and its peer service (a follower records it as the request arrives), so that
/// [`check_leadership_transfer`] grants a vote that skips the leader lease only to that member,
/// and only while this member is still in that leader's term.
#[derive(Debug, Default)]
pub struct Succession {
    named: std::sync::Mutex<Option<(Vote, u64)>>,
}

impl Succession {
    fn name(&self, leader: &Vote, to: u64) {
        *self.named.lock().expect("succession lock") = Some((*leader, to));
    }

    /// Whether `candidate`'s vote request may skip the leader lease, this member's vote being
    /// `mine`: the leader whose vote this member holds named it, or this member already
    /// granted this very vote (a resent request).
    fn allows(&self, candidate: u64, asked: &Vote, mine: &Vote) -> bool {
        if asked.leader_id == mine.leader_id {
            return true;
        }
        self.named
            .lock()
            .expect("succession lock")
            .as_ref()
            .is_some_and(|(leader, to)| {
                *to == candidate
                    && leader.leader_id == mine.leader_id
                    && asked.leader_id.term > leader.leader_id.term
            })
    }
}

/// The header of one chunk of a snapshot stream. `transfer` is drawn by the sender for each
/// stream and, covered by every chunk's MAC with the offset, keeps chunks of one transfer out
/// of another.
#[derive(Serialize, Deserialize)]
enum SnapshotFrame {
    /// The first chunk: the leader's vote, the snapshot's meta, and how many bytes follow.
    Begin {
        transfer: u64,
        vote: Vote,
        meta: Meta,
        total_bytes: u64,
    },
    /// The chunk's data are the snapshot's bytes from `offset` on.
    Data { transfer: u64, offset: u64 },
}

/// The header of one append of an `AppendStream`: which stream (drawn by the sender for each)
/// and its place in it. Covered by the append's MAC with the request, it keeps an append from
/// being moved into another open stream, dropped, or reordered within its own. A recorded
/// stream (or a prefix of it) can still be replayed whole as a new call, as a recorded unary
/// `Append` can (see `peer_auth.rs`: TLS between members is the answer to an on-path attacker).
#[derive(Serialize, Deserialize)]
pub struct AppendFrame {
    pub stream: u64,
    pub seq: u64,
}

/// What the member answers to each append of a stream: openraft's answer, or the reason its
/// Raft core stopped.
type StreamAppendReply = Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>>;

/// The chunks of one snapshot transfer to member `to`, made (and signed) one at a time as the
/// stream is read, so that sending a snapshot never holds a second copy of it. Public for the
/// peer-authentication tests, which stream forged snapshots with it.
pub fn snapshot_chunks(
    auth: Option<Arc<PeerAuth>>,
    to: u64,
    transfer: u64,
    vote: Vote,
    meta: Meta,
    data: Vec<u8>,
) -> impl Iterator<Item = pb::PeerChunk> + Send + 'static {
    let begin = encode(&SnapshotFrame::Begin {
        transfer,
        vote,
        meta,
        total_bytes: data.len() as u64,
    });
    let data = Arc::new(data);
    let sign = move |header: Vec<u8>, bytes: Vec<u8>| {
        let mac = auth
            .as_ref()
            .map_or_else(Vec::new, |a| a.sign_chunk(to, &header, &bytes));
        pb::PeerChunk {
            payload: header,
            data: bytes,
            mac,
        }
    };
    let first = std::iter::once(begin).map({
        let sign = sign.clone();
        move |header| sign(header, Vec::new())
    });
    let rest = (0..data.len())
        .step_by(limits::SNAPSHOT_CHUNK_BYTES)
        .map(move |offset| {
            let end = (offset + limits::SNAPSHOT_CHUNK_BYTES).min(data.len());
            let header = encode(&SnapshotFrame::Data {
                transfer,
                offset: offset as u64,
            });
            sign(header, data[offset..end].to_vec())
        });
    first.chain(rest)
}

/// A peer payload or chunk header as members send it: the format version, then postcard.
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    versioned::encode(PEER_FORMAT_VERSION, v).expect("serializing to memory cannot fail")
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    match versioned::decode(PEER_FORMAT_VERSION, bytes) {
        Ok((value, _)) => Ok(value),
        Err(VersionedError::Empty) => Err("empty peer payload".into()),
        Err(VersionedError::UnknownVersion { found, .. }) => Err(format!(
            "peer payload version {found} is not {PEER_FORMAT_VERSION}"
        )),
        Err(VersionedError::Corrupt(e)) => Err(format!("bad peer payload: {e}")),
    }
}

/// An answer as members send it: a peer payload framed in a `PeerMessage`.
fn reply<T: Serialize>(v: &T) -> Result<Response<pb::PeerMessage>, Status> {
    Ok(Response::new(pb::PeerMessage { payload: encode(v) }))
}
