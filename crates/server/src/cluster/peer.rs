//! Raft between members: the `RaftPeer` gRPC service and the network client openraft uses to
//! call it.
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
//! Sending: [`PeerNetwork`] makes a [`PeerClient`] per target, dialed at its address in the
//! membership ([`AddressBook`], which `Node::follow_membership` keeps current), over one
//! channel per member address shared by every group ([`SharedChannels`]).
//!
//! Over 1,000 lines (about 1,860), the one such file of the crate: the service, its checks of
//! what a message says and the network client share the wire format and its MACs, and the
//! file was being changed for the attack matrix (issue #31) when the crate took its folders,
//! so it moved whole. The seam to split it at is the service against the client.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use latchkey_core::limits;
use latchkey_core::versioned::{self, VersionedError};
use latchkey_proto::v1 as pb;
use latchkey_proto::v1::raft_peer_client::RaftPeerClient;
use latchkey_raft::{LogId, Raft, StateHandle, TypeConfig};

mod admission;

use crate::cluster::leader_contact::LeaderContact;
use crate::cluster::member_addr::MemberAddr;
use crate::cluster::peer_auth::{PeerAuth, PeerMethod};
use admission::{Admitted, AdmittedChunks, ChunkError, Sender, VerifiedChunk};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use openraft::base::{BoxFuture, BoxStream as RaftBoxStream};
use openraft::errors::{
    Fatal, NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{stream_append_sequential, RPCOption, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendError,
    StreamAppendResult, TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::storage::{Snapshot, SnapshotMeta};
use openraft::{BasicNode, OptionalSend, RaftNetworkFactory};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

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

/// The server side: checks who sent each message and what it says (see `peer_auth.rs`), then
/// hands it to the local Raft node.
#[derive(Clone)]
pub struct PeerService {
    raft: Raft,
    /// The group's applied state: the members its membership changes removed.
    state: StateHandle,
    auth: Arc<PeerAuth>,
    /// A snapshot stream longer than this is refused: the table's budget and the snapshot's
    /// header (a snapshot is never larger, see `limits::TABLE_BYTES_MAX`).
    snapshot_bytes_max: u64,
    /// Snapshot streams being received (`limits::SNAPSHOTS_RECEIVING_MAX`).
    receiving: Arc<tokio::sync::Semaphore>,
    /// Streams of appends open (`limits::PEER_APPEND_STREAMS_MAX`).
    append_streams: Arc<tokio::sync::Semaphore>,
    /// Senders already reported as non-members: a removed member left running campaigns every
    /// election timeout, and is reported once at warn, then at debug (at most
    /// `PEER_NON_MEMBERS_REPORTED_MAX` remembered; beyond, every refusal is a warning).
    reported: Arc<std::sync::Mutex<std::collections::BTreeSet<u64>>>,
    /// The node is shutting down: streams of appends end (a leader's stream never ends on its
    /// own, and the server's graceful shutdown waits for every open stream).
    stop: CancellationToken,
    /// The successor this group's leader named, shared with the group's [`PeerNetwork`].
    succession: Arc<Succession>,
    /// Stamped whenever the Raft core accepts a leader's append or snapshot.
    leader_contact: Arc<LeaderContact>,
}

impl PeerService {
    pub fn new(
        raft: Raft,
        state: StateHandle,
        auth: Arc<PeerAuth>,
        table_bytes_max: usize,
        stop: CancellationToken,
        succession: Arc<Succession>,
        leader_contact: Arc<LeaderContact>,
    ) -> PeerService {
        PeerService {
            raft,
            state,
            auth,
            succession,
            leader_contact,
            snapshot_bytes_max: (table_bytes_max + limits::SNAPSHOT_OVERHEAD_BYTES_MAX) as u64,
            receiving: Arc::new(tokio::sync::Semaphore::new(limits::SNAPSHOTS_RECEIVING_MAX)),
            append_streams: Arc::new(tokio::sync::Semaphore::new(limits::PEER_APPEND_STREAMS_MAX)),
            reported: Default::default(),
            stop,
        }
    }

    /// One append of a stream from `sender`, the `seq`th of the stream (numbered from 0), its
    /// MAC checked on admission ([`AdmittedChunks`]), checked as a unary `Append` is: its place
    /// in the stream, then what it says. The stream's id, taken from its first append, is
    /// `stream`.
    fn open_append(
        &self,
        sender: Sender,
        seq: u64,
        stream: Option<u64>,
        item: VerifiedChunk,
    ) -> Result<(u64, AppendEntriesRequest<TypeConfig>), Status> {
        let header: AppendFrame = decode(&item.header).map_err(bad)?;
        check_place(&header, seq, stream)
            .map_err(|e| refuse(PeerMethod::AppendItem, Some(sender.claimed()), &e))?;
        let req: AppendEntriesRequest<TypeConfig> = decode(&item.data).map_err(bad)?;
        self.check_append(sender, &req)?;
        Ok((header.stream, req))
    }

    /// What an append from `sender` says, checked before openraft sees it, streamed or not: its
    /// sender is a member (or vouched for by the leader's vote) and the leader the append
    /// speaks for, and it leaves what this member committed as it is ([`check_committed`]).
    fn check_append(
        &self,
        sender: Sender,
        req: &AppendEntriesRequest<TypeConfig>,
    ) -> Result<(), Status> {
        use openraft::async_runtime::WatchReceiver;
        let from = self.vouch(sender, PeerMethod::Append, Vouch::Leader(&req.vote))?;
        check_vote_sender(from, &req.vote, "append")
            .map_err(|e| refuse(PeerMethod::Append, Some(from), &e))?;
        // The committed index and the log ids of one metrics report belong together: what was
        // committed then is never rewritten, so a report that lags only checks less.
        let checked = {
            let m = self.raft.metrics();
            let m = m.borrow_watched();
            check_committed(from, req, m.local_committed.as_ref(), |index| {
                m.log_id_list.get(index)
            })
        };
        checked.map_err(|e| refuse(PeerMethod::Append, Some(from), &e))
    }

    /// Reads a snapshot stream from `sender` into memory (each chunk's MAC checked by
    /// [`AdmittedChunks`]), checking each chunk's place and the running length against what the
    /// first chunk announced (itself within the budget). Each chunk must arrive within
    /// `SNAPSHOT_CHUNK_TIMEOUT_MS`. The slot for one snapshot in memory
    /// (`SNAPSHOTS_RECEIVING_MAX`) is taken only once the header checked out and its sender is
    /// a member or vouched for, so a stranger cannot hold it. The sender's id, the vote, the
    /// meta, the bytes and the slot (held until the install is done), or why the stream was
    /// refused.
    async fn receive_snapshot(
        &self,
        sender: Sender,
        stream: &mut AdmittedChunks,
    ) -> Result<(u64, Vote, Meta, Vec<u8>, tokio::sync::OwnedSemaphorePermit), Status> {
        let open = |chunk: VerifiedChunk| -> Result<(SnapshotFrame, Vec<u8>), Status> {
            let frame = decode(&chunk.header).map_err(bad)?;
            Ok((frame, chunk.data))
        };
        let Some(first) = next_chunk(stream).await? else {
            return Err(bad("an empty snapshot stream".into()));
        };
        let (
            SnapshotFrame::Begin {
                transfer,
                vote,
                meta,
                total_bytes,
            },
            _,
        ) = open(first)?
        else {
            return Err(bad(
                "a snapshot stream that does not begin with its header".into()
            ));
        };
        let from = self.vouch(sender, PeerMethod::Snapshot, Vouch::Leader(&vote))?;
        let refuse_ = |why: String| refuse(PeerMethod::Snapshot, Some(from), &why);
        check_snapshot_header(from, &vote, &meta).map_err(refuse_)?;
        if total_bytes > self.snapshot_bytes_max {
            return Err(refuse_(format!(
                "a snapshot of {total_bytes} bytes, above this member's limit of {} (its table \
                 budget and the snapshot's header)",
                self.snapshot_bytes_max
            )));
        }
        let receiving = self.receiving.clone().try_acquire_owned().map_err(|_| {
            Status::unavailable("this member is already receiving a snapshot; retry later")
        })?;
        // Grown as chunks arrive, never reserved up front from what the header claims.
        let mut data: Vec<u8> = Vec::new();
        while (data.len() as u64) < total_bytes {
            let Some(chunk) = next_chunk(stream).await? else {
                return Err(refuse_(format!(
                    "the snapshot stream ended after {} of its {total_bytes} bytes",
                    data.len()
                )));
            };
            let (frame, bytes) = open(chunk)?;
            match frame {
                SnapshotFrame::Data {
                    transfer: t,
                    offset,
                } if t == transfer && offset == data.len() as u64 => {}
                _ => {
                    return Err(refuse_(format!(
                        "a snapshot chunk out of place (expected transfer {transfer} at offset \
                         {})",
                        data.len()
                    )))
                }
            }
            if bytes.is_empty() || (data.len() + bytes.len()) as u64 > total_bytes {
                return Err(refuse_(format!(
                    "a snapshot chunk of {} bytes at offset {} of {total_bytes}",
                    bytes.len(),
                    data.len()
                )));
            }
            data.extend_from_slice(&bytes);
        }
        if next_chunk(stream).await?.is_some() {
            return Err(refuse_(format!(
                "chunks after the {total_bytes} bytes the snapshot announced"
            )));
        }
        Ok((from, vote, meta, data, receiving))
    }

    /// A leader names its successor: the sender must be the leader whose committed vote the
    /// request carries, at least this member's own. Recorded ([`Succession`]) before openraft
    /// sees it, since the successor's vote request may follow at once.
    async fn transfer_leader(
        &self,
        sender: Sender,
        req: TransferLeaderRequest<TypeConfig>,
    ) -> Result<Response<pb::PeerMessage>, Status> {
        let from = self.vouch(sender, PeerMethod::Vote, Vouch::Leader(req.from_leader()))?;
        check_vote_sender(from, req.from_leader(), "leader transfer")
            .map_err(|e| refuse(PeerMethod::Vote, Some(from), &e))?;
        let mine = self.vote_here();
        // Only the leader of this member's term names a successor here (openraft ignores the
        // request otherwise, too).
        if req.from_leader().leader_id != mine.leader_id {
            return Err(refuse(
                PeerMethod::Vote,
                Some(from),
                &format!(
                    "member {from} named a successor for term {}, which it does not lead here",
                    req.from_leader().leader_id.term
                ),
            ));
        }
        self.succession.name(req.from_leader(), *req.to_node_id());
        tracing::info!(
            leader = from,
            successor = req.to_node_id(),
            "the leader names its successor"
        );
        let res: Result<TransferLeaderResponse<TypeConfig>, RaftError<TypeConfig>> = self
            .raft
            .handle_transfer_leader(req)
            .await
            .map_err(RaftError::Fatal);
        reply(&res)
    }

    /// This member's vote now.
    fn vote_here(&self) -> Vote {
        use openraft::async_runtime::WatchReceiver;
        self.raft.metrics().borrow_watched().vote
    }

    /// Whether `from` is a member by this member's Raft membership, which changes (see
    /// [`PeerAuth::check_member`]). `vouch` is what the message offers for a sender this member
    /// does not know: a leader's vote, or a candidate's last log index. A sender that a
    /// membership change removed from this group is refused whatever its message offers
    /// (issue #31: it keeps its credentials, and could claim a higher committed vote), unless
    /// the membership has it again.
    ///
    /// A removal is found from the applied state ([`StateHandle::removed_at`]), while the
    /// membership takes effect when its entry is appended: between the two (this member
    /// appended the entry removing `from`, and has not yet learned that it is committed and
    /// applied it) `from` is outside the membership but not yet found removed, and a message
    /// of its that vouches for it is taken as before. This window is left open: until the
    /// removal is committed it may still be undone (a new leader may truncate it), so `from`
    /// is still a member that the group trusts as any other, and the window gives it nothing
    /// it did not have as one. Only the applied (committed) record is final, and it is kept:
    /// also after a restart (it is in the snapshot) and a snapshot install.
    fn check_member(&self, method: PeerMethod, from: u64, vouch: Vouch<'_>) -> Result<(), Status> {
        use openraft::async_runtime::WatchReceiver;
        let (known, vouched) = {
            let m = self.raft.metrics();
            let m = m.borrow_watched();
            let known: std::collections::BTreeSet<u64> = m
                .membership_config
                .membership()
                .nodes()
                .map(|(id, _)| *id)
                .collect();
            let vouched = match vouch {
                Vouch::Leader(v) => v.committed && *v >= m.vote,
                Vouch::Candidate { last_log_index } => last_log_index > m.last_log_index,
            };
            (known, vouched)
        };
        // Read only for a sender outside the membership (the rare case): it takes the lock
        // that applying takes.
        let removed_at = match known.contains(&from) {
            true => None,
            false => self.state.removed_at(from),
        };
        let checked = self.auth.check_member(from, &known, removed_at, vouched);
        checked.map_err(|e| {
            let first = {
                let mut reported = self.reported.lock().expect("reported lock");
                reported.len() >= limits::PEER_NON_MEMBERS_REPORTED_MAX || reported.insert(from)
            };
            if first {
                refuse(method, Some(from), &e.to_string())
            } else {
                tracing::debug!(?method, from, "refused a peer message: {e}");
                Status::permission_denied(format!("refused by this member: {e}"))
            }
        })
    }
}

/// Whether an append is where it must be: the `seq`th of its stream (numbered from 0), in the
/// stream `stream` that its first append named (any, for the first).
fn check_place(header: &AppendFrame, seq: u64, stream: Option<u64>) -> Result<(), String> {
    if header.seq != seq || stream.is_some_and(|s| s != header.stream) {
        return Err(format!(
            "append {} of stream {} out of place (expected append {seq} of stream {})",
            header.seq,
            header.stream,
            stream.map_or_else(|| "any".to_owned(), |s| s.to_string())
        ));
    }
    Ok(())
}

/// What a message from a sender this member does not know offers as proof that it may be a
/// member this member has not heard of yet (it missed the change that added it).
enum Vouch<'a> {
    /// A leader's append or snapshot: its vote, which must be committed (a quorum elected it)
    /// and at least this member's own.
    Leader(&'a Vote),
    /// A candidate's vote request: its log must reach further than this member's, or it could
    /// not hold entries this member missed. openraft then applies Raft's own vote rules.
    Candidate { last_log_index: Option<u64> },
}

/// A refused peer message: logged here, `PERMISSION_DENIED` to the sender, nothing changed.
fn refuse(method: PeerMethod, from: Option<u64>, why: &str) -> Status {
    tracing::warn!(?method, ?from, "refused a peer message: {why}");
    Status::permission_denied(format!("refused by this member: {why}"))
}

/// What openraft would assert on, or what would stop the node, checked before it sees the
/// message: the sender must be the candidate or leader the message speaks for.
fn check_vote_sender(from: u64, vote: &Vote, what: &str) -> Result<(), String> {
    if vote.leader_id.node_id != from {
        return Err(format!(
            "member {from} sent a {what} for member {}'s vote",
            vote.leader_id.node_id
        ));
    }
    Ok(())
}

/// What openraft asserts of an append (issue #31), checked before it sees one: the entry it
/// follows and each of its entries, at or below this member's committed index (`committed`),
/// is the entry this member has there (`mine_at`: this member's log id at an index; `None`
/// below its snapshot, where the entry must still be at most the committed one). A leader's
/// log holds every committed entry (Raft's leader completeness), so only a lie differs:
/// openraft asserts that such an entry is at most the committed one, stopping the member's
/// Raft core (in a debug build; a release build takes a committed entry as matching whatever
/// it is).
fn check_committed(
    from: u64,
    req: &AppendEntriesRequest<TypeConfig>,
    committed: Option<&LogId>,
    mine_at: impl Fn(u64) -> Option<LogId>,
) -> Result<(), String> {
    let Some(committed) = committed else {
        return Ok(());
    };
    let ids = req
        .prev_log_id
        .iter()
        .chain(req.entries.iter().map(|e| &e.log_id));
    for id in ids.take_while(|id| id.index <= committed.index) {
        let differs = match mine_at(id.index) {
            Some(mine) if mine != *id => Some(format!("where this member committed {mine}")),
            Some(_) => None,
            None => (id > committed)
                .then(|| format!("above the last entry this member committed, {committed}")),
        };
        if let Some(differs) = differs {
            return Err(format!(
                "member {from} sent an append that has {id} at index {}, {differs}",
                id.index
            ));
        }
    }
    Ok(())
}

/// Whether a vote request may skip the leader lease. openraft grants a `leadership_transfer`
/// vote even while this member's leader lease holds (`Engine::handle_vote_req`: the flag means
/// "the current leader asked for this election"), so any member could depose a healthy leader
/// by setting it. It is granted only to the successor the leader of this member's term named
/// ([`Succession`]); any other is refused here.
///
/// Skipping the lease does not weaken the session leases: a keepalive is acknowledged only
/// after a quorum confirmed its leader after the keepalive arrived (`ops.rs` `keep_alive`,
/// `ReadPolicy::ReadIndex`), and the successor is elected by a quorum that overlaps it, so
/// it takes office, and resumes each lease at a full TTL, after the arrival of every renewal
/// the old leader acknowledged, exactly as after an election by timeout.
fn check_leadership_transfer(
    from: u64,
    req: &VoteRequest<TypeConfig>,
    succession: &Succession,
    mine: &Vote,
) -> Result<(), String> {
    if req.leadership_transfer && !succession.allows(from, &req.vote, mine) {
        return Err(format!(
            "member {from} asked for a leadership-transfer vote, which would skip the leader \
             lease, but the leader of this member's term did not name it its successor"
        ));
    }
    Ok(())
}

/// The next chunk of a snapshot stream, which must come within `SNAPSHOT_CHUNK_TIMEOUT_MS`.
async fn next_chunk(stream: &mut AdmittedChunks) -> Result<Option<VerifiedChunk>, Status> {
    stream
        .next_within(
            Duration::from_millis(limits::SNAPSHOT_CHUNK_TIMEOUT_MS),
            "no snapshot chunk within the chunk timeout",
        )
        .await
}

/// A snapshot's header from member `from`, checked before its bytes are read: openraft asserts
/// that a snapshot's last log id does not lie above the vote it came with.
fn check_snapshot_header(from: u64, vote: &Vote, meta: &Meta) -> Result<(), String> {
    check_vote_sender(from, vote, "snapshot")?;
    if !vote.committed {
        return Err("a snapshot from a leader whose vote is not committed".into());
    }
    if let Some(last) = &meta.last_log_id {
        if last.leader_id > vote.leader_id {
            return Err(format!(
                "a snapshot up to {last} from leader {} of an older term",
                vote.leader_id
            ));
        }
    }
    Ok(())
}

/// A snapshot from member `from`, checked as its install would check it and more, before
/// openraft sees it: openraft stops the Raft core for good when an install fails.
fn check_snapshot(from: u64, vote: &Vote, meta: &Meta, data: &[u8]) -> Result<(), String> {
    check_snapshot_header(from, vote, meta)?;
    let contents = latchkey_raft::snapshot::decode(data).map_err(|e| e.to_string())?;
    if contents.last_applied != meta.last_log_id || contents.last_membership != meta.last_membership
    {
        return Err(format!(
            "snapshot data is at {:?} but its meta says {:?}",
            contents.last_applied, meta.last_log_id
        ));
    }
    let index = meta.last_log_id.as_ref().map_or(0, |l| l.index);
    if contents.table.last_index() != index {
        return Err(format!(
            "the snapshot's table was last applied at {} but the snapshot is at {index}",
            contents.table.last_index()
        ));
    }
    contents.table.check_invariants()
}

fn reply<T: Serialize>(v: &T) -> Result<Response<pb::PeerMessage>, Status> {
    Ok(Response::new(pb::PeerMessage { payload: encode(v) }))
}

fn bad(e: String) -> Status {
    Status::invalid_argument(e)
}

/// The peer service of a member: the only `RaftPeer` the server runs. One [`PeerService`] per
/// Raft group (issue #16), each request handed to the one its `GROUP_HEADER` names (group 0
/// without one, as every request of a one-group cluster), and only once admitted (see
/// `admission.rs`): a group's service has no RPC method that takes a request as it arrived.
#[derive(Clone)]
pub struct PeerRouter {
    groups: Arc<[PeerService]>,
}

impl PeerRouter {
    pub fn new(groups: Vec<PeerService>) -> PeerRouter {
        assert!(!groups.is_empty(), "a member runs at least one group");
        PeerRouter {
            groups: groups.into(),
        }
    }
}

#[tonic::async_trait]
impl pb::raft_peer_server::RaftPeer for PeerRouter {
    async fn vote(
        &self,
        request: Request<pb::PeerMessage>,
    ) -> Result<Response<pb::PeerMessage>, Status> {
        let (group, request) = self.admit(request, PeerMethod::Vote)?;
        group
            .vote(request)
            .await
            .map(|answer| group.stamped(answer))
    }

    async fn append(
        &self,
        request: Request<pb::PeerMessage>,
    ) -> Result<Response<pb::PeerMessage>, Status> {
        let http = crate::cluster::peer_auth::PeerAuth::http_addr_of(request.metadata());
        let (group, request) = self.admit(request, PeerMethod::Append)?;
        group
            .append(request, http)
            .await
            .map(|answer| group.stamped(answer))
    }

    type AppendStreamStream = BoxStream<'static, Result<pb::PeerMessage, Status>>;

    async fn append_stream(
        &self,
        request: Request<tonic::Streaming<pb::PeerChunk>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        let http = crate::cluster::peer_auth::PeerAuth::http_addr_of(request.metadata());
        let (group, request) =
            self.admit_stream(request, PeerMethod::AppendStream, PeerMethod::AppendItem)?;
        group
            .append_stream(request, http)
            .map(|answer| group.stamped(answer))
    }

    async fn snapshot(
        &self,
        request: Request<tonic::Streaming<pb::PeerChunk>>,
    ) -> Result<Response<pb::PeerMessage>, Status> {
        let (group, request) =
            self.admit_stream(request, PeerMethod::Snapshot, PeerMethod::SnapshotChunk)?;
        group.snapshot(request).await
    }
}

/// A group's handlers, each taking a request [`PeerRouter`] admitted.
impl PeerService {
    /// An answer saying where this member serves HTTP, for the other's cluster status.
    fn stamped<T>(&self, mut answer: Response<T>) -> Response<T> {
        self.auth.stamp_http(answer.metadata_mut());
        answer
    }

    async fn vote(&self, request: Admitted<Vec<u8>>) -> Result<Response<pb::PeerMessage>, Status> {
        let (sender, payload) = request.into_parts();
        let (req, pre_vote) = match decode(&payload).map_err(bad)? {
            Ballot::Vote(req) => (req, false),
            Ballot::PreVote(req) => (req, true),
            Ballot::TransferLeader(req) => return self.transfer_leader(sender, req).await,
        };
        let from = self.vouch(
            sender,
            PeerMethod::Vote,
            Vouch::Candidate {
                last_log_index: req.last_log_id.as_ref().map(|l| l.index),
            },
        )?;
        check_vote_sender(from, &req.vote, "vote request")
            .map_err(|e| refuse(PeerMethod::Vote, Some(from), &e))?;
        check_leadership_transfer(from, &req, &self.succession, &self.vote_here())
            .map_err(|e| refuse(PeerMethod::Vote, Some(from), &e))?;
        let res: Result<VoteResponse<TypeConfig>, RaftError<TypeConfig>> = if pre_vote {
            self.raft.pre_vote(req).await
        } else {
            self.raft.vote(req).await
        };
        reply(&res)
    }

    /// `http`: where the sender says it serves HTTP, kept once the append is accepted.
    async fn append(
        &self,
        request: Admitted<Vec<u8>>,
        http: Option<String>,
    ) -> Result<Response<pb::PeerMessage>, Status> {
        let (sender, payload) = request.into_parts();
        let req: AppendEntriesRequest<TypeConfig> = decode(&payload).map_err(bad)?;
        self.check_append(sender, &req)?;
        let leader = req.vote.leader_id.node_id;
        let res = self.raft.append_entries(req).await;
        if matches!(&res, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
            self.leader_contact.heard();
            self.auth.heard_http(leader, http.clone());
            self.leader_contact.heard_http(leader, http);
        }
        reply(&res)
    }

    /// A leader's appends, pipelined: each is checked as a unary `Append` is and handed to
    /// openraft's `Raft::stream_append`, which answers each, in order, once its entries are
    /// durable here. An append that fails its checks ends the stream: the answers to the
    /// appends before it, then the refusal.
    ///
    /// `http`: where the sender says it serves HTTP, kept once one of its appends is accepted
    /// (each was checked to be from the leader of its vote, the sender).
    fn append_stream(
        &self,
        request: Admitted<AdmittedChunks>,
        http: Option<String>,
    ) -> Result<Response<BoxStream<'static, Result<pb::PeerMessage, Status>>>, Status> {
        let (sender, inbound) = request.into_parts();
        let from = sender.claimed();
        // Held while the stream is open.
        let open = self
            .append_streams
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                Status::unavailable(format!(
                    "this member has {} streams of appends open already; retry later",
                    limits::PEER_APPEND_STREAMS_MAX
                ))
            })?;
        let refused: Arc<std::sync::Mutex<Option<Status>>> = Default::default();
        let checker = self.clone();
        let refusal = refused.clone();
        // Cancelled when the answers end (openraft stops answering after a conflict or a higher
        // vote) or are dropped (the leader went away): then no more appends are taken.
        let answered = CancellationToken::new();
        let done = answered.clone();
        let first_timeout = Duration::from_millis(limits::PEER_APPEND_STREAM_FIRST_TIMEOUT_MS);
        // (the inbound stream, the next append's number, the stream's id once known)
        let input = futures::stream::unfold(
            (inbound, 0u64, None::<u64>),
            move |(mut inbound, seq, stream)| {
                let checker = checker.clone();
                let refusal = refusal.clone();
                let done = done.clone();
                async move {
                    // The leader takes its first append before it opens the stream, so the
                    // first comes at once; later ones come when there is something to append.
                    let first = async {
                        if seq == 0 {
                            tokio::time::sleep(first_timeout).await;
                        } else {
                            std::future::pending::<()>().await;
                        }
                    };
                    let next = tokio::select! {
                        biased;
                        () = checker.stop.cancelled() => return None,
                        () = done.cancelled() => return None,
                        next = inbound.next() => next,
                        () = first => {
                            *refusal.lock().expect("refusal lock") = Some(Status::deadline_exceeded(
                                "a stream of appends without an append",
                            ));
                            return None;
                        }
                    };
                    match next {
                        Ok(None) => None,
                        // The leader went away or reset the stream: nothing more to answer.
                        Err(ChunkError::Reset(status)) => {
                            tracing::debug!(from, "a stream of appends ended: {status}");
                            None
                        }
                        Err(ChunkError::Refused(status)) => {
                            *refusal.lock().expect("refusal lock") = Some(status);
                            None
                        }
                        Ok(Some(item)) => match checker.open_append(sender, seq, stream, item) {
                            Ok((id, req)) => Some((req, (inbound, seq + 1, Some(id)))),
                            Err(status) => {
                                *refusal.lock().expect("refusal lock") = Some(status);
                                None
                            }
                        },
                    }
                }
            },
        );
        let contact = self.leader_contact.clone();
        let answers = self
            .raft
            .stream_append(input)
            .map(move |reply: StreamAppendReply| {
                if matches!(&reply, Ok(Ok(_) | Err(StreamAppendError::Conflict(_)))) {
                    contact.heard();
                    contact.heard_http(from, http.clone());
                }
                Ok(pb::PeerMessage {
                    payload: encode(&reply),
                })
            });
        let refusal =
            futures::stream::once(
                async move { refused.lock().expect("refusal lock").take().map(Err) },
            )
            .filter_map(futures::future::ready);
        let guard = (answered.drop_guard(), open);
        let answers = answers.chain(refusal).map(move |answer| {
            let _held = &guard;
            answer
        });
        Ok(Response::new(Box::pin(answers)))
    }

    async fn snapshot(
        &self,
        request: Admitted<AdmittedChunks>,
    ) -> Result<Response<pb::PeerMessage>, Status> {
        let (sender, mut stream) = request.into_parts();
        let started = std::time::Instant::now();
        // The slot is held until the install is done: one snapshot in memory at a time.
        let (from, vote, meta, data, _receiving) =
            self.receive_snapshot(sender, &mut stream).await?;
        let received_ms = started.elapsed().as_millis() as u64;
        let bytes = data.len();
        let (data, checked) = on_blocking_pool(move || {
            let checked = check_snapshot(from, &vote, &meta, &data).map(|()| (vote, meta));
            (data, checked)
        })
        .await;
        let (vote, meta) = checked.map_err(|e| refuse(PeerMethod::Snapshot, Some(from), &e))?;
        let checked_ms = started.elapsed().as_millis() as u64;
        let snapshot = Snapshot {
            meta,
            snapshot: Cursor::new(data),
        };
        let res = self
            .raft
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(RaftError::<TypeConfig>::Fatal);
        if matches!(&res, Ok(r) if r.vote == vote) {
            self.leader_contact.heard();
        }
        tracing::info!(
            from,
            bytes,
            received_ms,
            checked_ms,
            installed_ms = started.elapsed().as_millis() as u64,
            ok = res.is_ok(),
            "received a snapshot"
        );
        reply(&res)
    }
}

/// Runs CPU-heavy work (decoding a snapshot) on tokio's blocking pool, or inline on a
/// current-thread runtime (the simulation), where it must run in order to replay.
async fn on_blocking_pool<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::current().runtime_flavor() == RuntimeFlavor::CurrentThread {
        return f();
    }
    tokio::task::spawn_blocking(f)
        .await
        .expect("the snapshot check does not panic")
}

/// The seam through which a node reaches its peers: given a member's address, a gRPC channel
/// to it. The real one dials TCP; a simulation dials its simulated network.
pub trait PeerConnector: Send + Sync + 'static {
    fn channel(&self, addr: &str) -> Result<Channel, String>;
}

pub type SharedPeerConnector = Arc<dyn PeerConnector>;

/// One channel per member address, shared by the networks of every Raft group of a member
/// (issue #16): the groups' heartbeats, appends and votes to a member travel on one HTTP/2
/// connection instead of one per group. At most `limits::PEER_SHARED_CHANNELS_MAX` addresses
/// are kept (members that moved leave stale ones); past it the cache starts over.
pub struct SharedChannels {
    dial: SharedPeerConnector,
    channels: std::sync::Mutex<BTreeMap<String, Channel>>,
}

impl SharedChannels {
    pub fn new(dial: SharedPeerConnector) -> SharedChannels {
        SharedChannels {
            dial,
            channels: Default::default(),
        }
    }
}

impl PeerConnector for SharedChannels {
    fn channel(&self, addr: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().expect("channels lock");
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let c = self.dial.channel(addr)?;
        if channels.len() >= limits::PEER_SHARED_CHANNELS_MAX {
            channels.clear();
        }
        channels.insert(addr.to_owned(), c.clone());
        Ok(c)
    }
}

/// Dials peers over TCP, lazily: a member that is down costs nothing until it is needed.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpPeerConnector;

impl PeerConnector for TcpPeerConnector {
    fn channel(&self, addr: &str) -> Result<Channel, String> {
        Endpoint::from_shared(format!("http://{addr}"))
            .map(|e| peer_endpoint(e).connect_lazy())
            .map_err(|e| e.to_string())
    }
}

/// What every connection to a peer gets, plain or TLS: a bounded connect, no Nagle delay, and
/// an HTTP/2 keepalive that finds a peer whose host died with the connection half open.
pub(crate) fn peer_endpoint(e: Endpoint) -> Endpoint {
    e.connect_timeout(Duration::from_millis(limits::PEER_CONNECT_TIMEOUT_MS))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_millis(limits::PEER_KEEPALIVE_INTERVAL_MS))
        .keep_alive_timeout(Duration::from_millis(limits::PEER_KEEPALIVE_TIMEOUT_MS))
        .keep_alive_while_idle(true)
}

/// Every member's peer address by the Raft membership this node knows, kept up to date by
/// `Node::follow_membership`. openraft hands a new client the member's address when it starts
/// replicating to it, but keeps that client when a membership change gives the member a new
/// address (`cluster move`); each call looks the address up here, so a moved member is dialed
/// at its new address from the moment this node knows it.
pub type AddressBook = Arc<std::sync::RwLock<BTreeMap<u64, String>>>;

/// Creates one client per target member; openraft calls it.
#[derive(Clone)]
pub struct PeerNetwork {
    pub connector: SharedPeerConnector,
    /// Whether each member answered the last call made to it, shared by all the clients of a
    /// member (heartbeat, replication, votes), so that a member going down and coming back is
    /// logged once each way instead of once per retry.
    pub reachable: Arc<std::sync::Mutex<BTreeMap<u64, bool>>>,
    /// Signs every request (this member's id, the cluster, the MAC under its secret).
    pub auth: Arc<PeerAuth>,
    /// Per-member dial addresses that override the member's recorded address (a proxy, NAT).
    pub dial: BTreeMap<u64, String>,
    /// The members' addresses as the membership says now.
    pub book: AddressBook,
    /// The successor this group's leader names, shared with the group's [`PeerService`].
    pub succession: Arc<Succession>,
}

impl PeerNetwork {
    /// Where to dial `target`: its `--peer-dial` override, else its address in the membership.
    fn addr_of(&self, target: u64, recorded: &str) -> String {
        if let Some(dial) = self.dial.get(&target) {
            return dial.clone();
        }
        self.book
            .read()
            .expect("address book lock")
            .get(&target)
            .cloned()
            .unwrap_or_else(|| recorded.to_owned())
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerClient {
        let addr = self.addr_of(target, MemberAddr::split(&node.addr).peer());
        PeerClient {
            target,
            reachable: self.reachable.clone(),
            auth: self.auth.clone(),
            channel: self.connector.channel(&addr),
            addr,
            network: self.clone(),
            streams: true,
        }
    }
}

pub struct PeerClient {
    target: u64,
    reachable: Arc<std::sync::Mutex<BTreeMap<u64, bool>>>,
    auth: Arc<PeerAuth>,
    channel: Result<Channel, String>,
    /// The address `channel` dials.
    addr: String,
    network: PeerNetwork,
    /// Whether the member takes `AppendStream`; false once it answered that it does not (an
    /// older latchkey), and appends go one `Append` call at a time.
    streams: bool,
}

impl PeerClient {
    /// Dial again if the member moved since the channel was made.
    fn follow_address(&mut self) {
        let addr = self.network.addr_of(self.target, &self.addr);
        if addr != self.addr {
            tracing::info!(
                member = self.target,
                "member {} moved from {} to {addr}",
                self.target,
                self.addr
            );
            self.channel = self.network.connector.channel(&addr);
            self.addr = addr;
        }
    }

    fn client(&self) -> Result<RaftPeerClient<Channel>, Unreachable<TypeConfig>> {
        match &self.channel {
            Ok(c) => Ok(RaftPeerClient::new(c.clone())
                .max_decoding_message_size(limits::PEER_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(limits::PEER_MESSAGE_BYTES_MAX)),
            Err(e) => Err(Unreachable::from_string(format!(
                "bad address of member {}: {e}",
                self.target
            ))),
        }
    }

    fn request(
        &self,
        method: PeerMethod,
        payload: Vec<u8>,
        option: &RPCOption,
    ) -> Request<pb::PeerMessage> {
        let mut meta = tonic::metadata::MetadataMap::new();
        self.auth.sign(&mut meta, method, self.target, &payload);
        let mut r = Request::from_parts(
            meta,
            tonic::Extensions::default(),
            pb::PeerMessage { payload },
        );
        r.set_timeout(option.hard_ttl());
        r
    }

    /// Logs the member going down or coming back (see [`note_reachable`]).
    fn note_reachable(&self, failed: Option<&Status>) {
        note_reachable(&self.reachable, self.target, failed);
    }

    /// Call, decode, and turn a remote `Fatal` into "unreachable": the member is shutting down.
    async fn call<T, F, Fut>(
        &self,
        method: PeerMethod,
        payload: Vec<u8>,
        option: &RPCOption,
        f: F,
    ) -> Result<T, RPCError<TypeConfig>>
    where
        T: DeserializeOwned,
        F: FnOnce(RaftPeerClient<Channel>, Request<pb::PeerMessage>) -> Fut,
        Fut: Future<Output = Result<Response<pb::PeerMessage>, Status>>,
    {
        let client = self.client()?;
        let resp = f(client, self.request(method, payload, option)).await;
        self.note_reachable(resp.as_ref().err());
        let resp = resp.map_err(|s| rpc_error(&s))?;
        self.auth
            .heard_http(self.target, PeerAuth::http_addr_of(resp.metadata()));
        let res: Result<T, RaftError<TypeConfig>> = decode(&resp.into_inner().payload)
            .map_err(|e| RPCError::Network(NetworkError::from_string(e)))?;
        res.map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }
}

/// Logs member `target` going down (the first failed call after a success, or the first call)
/// and coming back, once each.
fn note_reachable(
    reachable: &std::sync::Mutex<BTreeMap<u64, bool>>,
    target: u64,
    failed: Option<&Status>,
) {
    let now = failed.is_none();
    let before = reachable
        .lock()
        .expect("reachable lock")
        .insert(target, now);
    match (before, failed) {
        (Some(true) | None, Some(e)) => tracing::warn!(
            member = target,
            "member {target} is unreachable: {}",
            e.message()
        ),
        (Some(false), None) => {
            tracing::info!(member = target, "member {target} is reachable again")
        }
        _ => {}
    }
}

/// An RPC failure as openraft sees it: a member that is down or refuses to serve
/// (`UNAVAILABLE`) is unreachable, and openraft backs off; anything else is a network error.
fn rpc_error(status: &Status) -> RPCError<TypeConfig> {
    if status.code() == tonic::Code::Unavailable {
        RPCError::Unreachable(Unreachable::new(status))
    } else {
        RPCError::Network(NetworkError::new(status))
    }
}

/// The appends of one `AppendStream` sent and not yet answered, oldest first: when each was
/// sent, for the per-append deadline, and a permit each, so that at most
/// `limits::PEER_APPENDS_UNANSWERED_MAX` are in flight.
struct Unanswered {
    sent: std::sync::Mutex<std::collections::VecDeque<tokio::time::Instant>>,
    /// Woken when an append is sent, so that a reader waiting without a deadline takes one.
    more: tokio::sync::Notify,
    permits: tokio::sync::Semaphore,
}

impl Unanswered {
    fn new() -> Unanswered {
        Unanswered {
            sent: Default::default(),
            more: tokio::sync::Notify::new(),
            permits: tokio::sync::Semaphore::new(limits::PEER_APPENDS_UNANSWERED_MAX),
        }
    }

    /// Waits for room, then notes an append as sent.
    async fn send(&self) {
        self.permits
            .acquire()
            .await
            .expect("the semaphore is never closed")
            .forget();
        self.sent
            .lock()
            .expect("unanswered lock")
            .push_back(tokio::time::Instant::now());
        self.more.notify_one();
    }

    /// Notes the oldest append answered; false if none was waiting for an answer.
    fn answered(&self) -> bool {
        let answered = self
            .sent
            .lock()
            .expect("unanswered lock")
            .pop_front()
            .is_some();
        if answered {
            self.permits.add_permits(1);
        }
        answered
    }

    fn oldest(&self) -> Option<tokio::time::Instant> {
        self.sent.lock().expect("unanswered lock").front().copied()
    }
}

/// The answers of an `AppendStream`, each checked against the appends sent: an answer must
/// come within `ttl` of its append, and no answer may come unasked.
async fn next_answer(
    inbound: &mut tonic::Streaming<pb::PeerMessage>,
    unanswered: &Unanswered,
    ttl: Duration,
    target: u64,
) -> Option<Result<StreamAppendResult<TypeConfig>, Status>> {
    loop {
        let next = match unanswered.oldest() {
            // An answer already here is taken even if its deadline passed while no one read:
            // the deadline is for the member, not for openraft's reading.
            Some(sent) => tokio::select! {
                biased;
                next = inbound.next() => next,
                () = tokio::time::sleep_until(sent + ttl) => {
                    return Some(Err(Status::deadline_exceeded(format!(
                        "member {target} did not answer an append within {ttl:?}"
                    ))));
                }
            },
            None => tokio::select! {
                biased;
                next = inbound.next() => next,
                // An append was sent: wait again, now with its deadline.
                () = unanswered.more.notified() => continue,
            },
        };
        return match next {
            None if unanswered.oldest().is_some() => Some(Err(Status::unavailable(format!(
                "member {target} ended the stream of appends before answering them all"
            )))),
            None => None,
            Some(Err(status)) => Some(Err(status)),
            Some(Ok(message)) => {
                if !unanswered.answered() {
                    return Some(Err(Status::internal(format!(
                        "member {target} answered an append that was not sent"
                    ))));
                }
                match decode::<StreamAppendReply>(&message.payload) {
                    Err(e) => Some(Err(Status::internal(e))),
                    // Its Raft core stopped: it is shutting down.
                    Ok(Err(fatal)) => Some(Err(Status::unavailable(fatal.to_string()))),
                    Ok(Ok(answer)) => Some(Ok(answer)),
                }
            }
        };
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = Cursor<Vec<u8>>;

    /// Appends pipelined over one `AppendStream` call: openraft sends the next append without
    /// waiting for the answer to the last (`limits::PEER_APPENDS_UNANSWERED_MAX` at most), and
    /// each is answered in order once durable at the member. Each append has until openraft's
    /// `soft_ttl` for its answer; an idle stream waits for the next append as long as it takes.
    /// A member that does not know the call (an older latchkey) is sent `Append`s instead from
    /// the next stream on.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            RaftBoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        if !self.streams {
            return stream_append_sequential(self, input, option);
        }
        Box::pin(async move {
            // openraft waits out its backoff inside the request stream, before it yields the
            // next request; a call that fails before it polls the stream (the member is down)
            // would skip it, and openraft would redial in a tight loop. So the first request
            // is taken before the call is made.
            let mut input = input;
            let Some(first) = input.next().await else {
                let none: RaftBoxStream<'s, _> = Box::pin(futures::stream::empty());
                return Ok(none);
            };
            let input = futures::stream::once(futures::future::ready(first)).chain(input);
            self.follow_address();
            let mut client = self.client()?;
            let ttl = option.soft_ttl();
            let target = self.target;
            let stream: u64 = rand::random();
            let unanswered = Arc::new(Unanswered::new());
            // Cancelled when the answers end, fail, or are dropped (openraft stops reading them
            // after a conflict, a higher vote or an error): the appends end with them, so the
            // call closes and no later request of openraft's goes down a call no one reads.
            let answers_gone = CancellationToken::new();
            let appends = {
                let auth = self.auth.clone();
                let unanswered = unanswered.clone();
                input
                    .enumerate()
                    .then(move |(seq, req)| {
                        let auth = auth.clone();
                        let unanswered = unanswered.clone();
                        async move {
                            unanswered.send().await;
                            let header = encode(&AppendFrame {
                                stream,
                                seq: seq as u64,
                            });
                            let data = encode(&req);
                            let mac =
                                auth.sign_item(PeerMethod::AppendItem, target, &header, &data);
                            pb::PeerChunk {
                                payload: header,
                                data,
                                mac,
                            }
                        }
                    })
                    .take_until(answers_gone.clone().cancelled_owned())
            };
            let mut headers = tonic::metadata::MetadataMap::new();
            self.auth
                .sign(&mut headers, PeerMethod::AppendStream, target, &[]);
            let request = Request::from_parts(headers, tonic::Extensions::default(), appends);
            let opened = match tokio::time::timeout(ttl, client.append_stream(request)).await {
                Ok(opened) => opened,
                Err(_) => Err(Status::deadline_exceeded(format!(
                    "member {target} did not take a stream of appends within {ttl:?}"
                ))),
            };
            let inbound = match opened {
                Ok(response) => {
                    self.auth
                        .heard_http(target, PeerAuth::http_addr_of(response.metadata()));
                    response.into_inner()
                }
                Err(status) if status.code() == tonic::Code::Unimplemented => {
                    tracing::warn!(
                        member = target,
                        "member {target} does not take streams of appends (an older latchkey?); \
                         sending it one append per call"
                    );
                    self.streams = false;
                    return Err(rpc_error(&status));
                }
                Err(status) => {
                    self.note_reachable(Some(&status));
                    return Err(rpc_error(&status));
                }
            };
            self.note_reachable(None);
            let reachable = self.reachable.clone();
            let gone = answers_gone.drop_guard();
            let answers =
                futures::stream::unfold(Some((inbound, unanswered, gone)), move |state| {
                    let reachable = reachable.clone();
                    async move {
                        // Dropping the state (at the end, at the first failure, or with the stream)
                        // drops the guard, which ends the appends.
                        let (mut inbound, unanswered, gone) = state?;
                        match next_answer(&mut inbound, &unanswered, ttl, target).await? {
                            Ok(answer) => Some((Ok(answer), Some((inbound, unanswered, gone)))),
                            // The stream ends with its first failure.
                            Err(status) => {
                                note_reachable(&reachable, target, Some(&status));
                                Some((Err(rpc_error(&status)), None))
                            }
                        }
                    }
                });
            let answers: RaftBoxStream<'s, _> = Box::pin(answers);
            Ok(answers)
        })
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.follow_address();
        self.call(
            PeerMethod::Append,
            encode(&rpc),
            &option,
            |mut c, r| async move { c.append(r).await },
        )
        .await
    }

    /// Names this leader's successor to one voter (openraft sends it to every voter). Recorded
    /// here first: the successor's vote request then reaches this leader too.
    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.network
            .succession
            .name(req.from_leader(), *req.to_node_id());
        self.follow_address();
        self.call(
            PeerMethod::Vote,
            encode(&Ballot::TransferLeader(req)),
            &option,
            |mut c, r| async move { c.vote(r).await },
        )
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.follow_address();
        self.call(
            PeerMethod::Vote,
            encode(&Ballot::Vote(rpc)),
            &option,
            |mut c, r| async move { c.vote(r).await },
        )
        .await
    }

    /// A real question to the member. A transport failure comes back as an error, which
    /// openraft does not count as a grant, so an isolated member never gathers a quorum.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.follow_address();
        self.call(
            PeerMethod::Vote,
            encode(&Ballot::PreVote(rpc)),
            &option,
            |mut c, r| async move { c.vote(r).await },
        )
        .await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::type_config::alias::SnapshotOf<TypeConfig, Cursor<Vec<u8>>>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        self.follow_address();
        let mut client = self.client().map_err(StreamingError::Unreachable)?;
        let transfer: u64 = rand::random();
        // Progress: when the transport last took a chunk, and whether it took the last one.
        let progress = Arc::new(std::sync::Mutex::new((tokio::time::Instant::now(), false)));
        let chunks = snapshot_chunks(
            Some(self.auth.clone()),
            self.target,
            transfer,
            vote,
            snapshot.meta,
            snapshot.snapshot.into_inner(),
        );
        let stream = futures::stream::iter(Tracked {
            chunks,
            progress: progress.clone(),
        });
        let mut headers = tonic::metadata::MetadataMap::new();
        self.auth
            .sign(&mut headers, PeerMethod::Snapshot, self.target, &[]);
        let request = Request::from_parts(headers, tonic::Extensions::default(), stream);
        let call = async move { client.snapshot(request).await };
        tokio::pin!(call, cancel);
        // openraft's RPC timeout (`install_snapshot_timeout`) applies to each chunk; once all
        // are sent, the member has `SNAPSHOT_INSTALL_TIMEOUT_MS` to check and install it.
        let chunk_timeout = option.hard_ttl();
        let install_timeout = Duration::from_millis(limits::SNAPSHOT_INSTALL_TIMEOUT_MS);
        let resp = loop {
            let (last, all_sent) = *progress.lock().expect("progress lock");
            let deadline = last
                + if all_sent {
                    install_timeout
                } else {
                    chunk_timeout
                };
            tokio::select! {
                resp = &mut call => break resp,
                closed = &mut cancel => return Err(StreamingError::Closed(closed)),
                _ = tokio::time::sleep_until(deadline) => {
                    if *progress.lock().expect("progress lock") == (last, all_sent) {
                        let what = if all_sent {
                            "install the snapshot"
                        } else {
                            "take a snapshot chunk"
                        };
                        let status = Status::deadline_exceeded(format!(
                            "member {} did not {what} in time",
                            self.target
                        ));
                        self.note_reachable(Some(&status));
                        return Err(StreamingError::Unreachable(Unreachable::new(&status)));
                    }
                }
            }
        };
        self.note_reachable(resp.as_ref().err());
        let resp = resp.map_err(|s| {
            if s.code() == tonic::Code::Unavailable {
                StreamingError::Unreachable(Unreachable::new(&s))
            } else {
                StreamingError::Network(NetworkError::new(&s))
            }
        })?;
        let res: Result<SnapshotResponse<TypeConfig>, RaftError<TypeConfig>> =
            decode(&resp.into_inner().payload)
                .map_err(|e| StreamingError::Network(NetworkError::from_string(e)))?;
        res.map_err(|e| StreamingError::Unreachable(Unreachable::new(&e)))
    }
}

/// Snapshot chunks that note when the transport takes each (and the end), for the sender's
/// per-chunk timeout.
struct Tracked<I> {
    chunks: I,
    progress: Arc<std::sync::Mutex<(tokio::time::Instant, bool)>>,
}

impl<I: Iterator<Item = pb::PeerChunk>> Iterator for Tracked<I> {
    type Item = pb::PeerChunk;

    fn next(&mut self) -> Option<pb::PeerChunk> {
        let chunk = self.chunks.next();
        *self.progress.lock().expect("progress lock") =
            (tokio::time::Instant::now(), chunk.is_none());
        chunk
    }
}

/// Hostile input (issue #13): peer payloads come off the network. Decoding noise or a mutated
/// message gives a message or an error, and a snapshot with mutated data is refused or passes
/// every check; nothing panics before openraft would see it.
#[cfg(test)]
mod succession_tests {
    use super::*;

    fn transfer_vote(term: u64, candidate: u64) -> VoteRequest<TypeConfig> {
        VoteRequest {
            vote: Vote::new(term, candidate),
            last_log_id: None,
            leadership_transfer: true,
        }
    }

    #[test]
    fn a_transfer_vote_is_granted_only_to_the_successor_the_leader_of_this_term_named() {
        let leader = Vote::new_committed(4, 1);
        let s = Succession::default();
        // Nobody named: refused, as before leader transfer existed.
        assert!(check_leadership_transfer(2, &transfer_vote(5, 2), &s, &leader).is_err());
        s.name(&leader, 2);
        assert!(check_leadership_transfer(2, &transfer_vote(5, 2), &s, &leader).is_ok());
        // Another member, even in a higher term: refused.
        let e = check_leadership_transfer(3, &transfer_vote(9, 3), &s, &leader).unwrap_err();
        assert!(e.contains("did not name it"), "{e}");
        // The successor, for a term not above the naming leader's: refused.
        assert!(check_leadership_transfer(2, &transfer_vote(4, 2), &s, &leader).is_err());
        // This member moved on to another leader's term: the old naming no longer counts...
        let later = Vote::new_committed(7, 3);
        assert!(check_leadership_transfer(2, &transfer_vote(8, 2), &s, &later).is_err());
        // ...but a resent request for the vote it already granted is let through.
        let granted = Vote::new(5, 2);
        assert!(check_leadership_transfer(2, &transfer_vote(5, 2), &s, &granted).is_ok());
        // A vote without the flag never needs naming.
        let plain = VoteRequest {
            leadership_transfer: false,
            ..transfer_vote(9, 3)
        };
        assert!(check_leadership_transfer(3, &plain, &s, &leader).is_ok());
    }
}

#[cfg(test)]
mod hostile_input {
    use super::*;
    use latchkey_core::LockTable;
    use proptest::prelude::*;

    fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8)], cut: usize) -> Vec<u8> {
        for &(at, v) in edits {
            if bytes.is_empty() {
                bytes.push(v);
            } else {
                let at = at % bytes.len();
                bytes[at] = v;
            }
        }
        bytes.truncate(cut % (bytes.len() + 1));
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        #[test]
        fn noise_and_mutated_messages_decode_or_are_refused(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            cut in any::<usize>(),
            noise in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let ballot = encode(&Ballot::Vote(VoteRequest {
                vote: Vote::new(4, 2),
                last_log_id: None,
                leadership_transfer: false,
            }));
            for bytes in [mutate(ballot, &edits, cut), noise] {
                let _ = decode::<Ballot>(&bytes);
                let _ = decode::<AppendEntriesRequest<TypeConfig>>(&bytes);
                let _ = decode::<SnapshotFrame>(&bytes);
            }
        }

        #[test]
        fn a_snapshot_with_mutated_data_is_refused_or_checks_out(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            cut in any::<usize>(),
        ) {
            let meta = Meta { last_log_id: None, last_membership: Default::default() };
            let data = latchkey_raft::snapshot::encode(&None, &meta.last_membership, &Default::default(), &LockTable::new());
            let data = mutate(data, &edits, cut);
            let _ = check_snapshot(2, &Vote::new_committed(4, 2), &meta, &data);
        }
    }
}

/// The leader's side of `AppendStream` against fake members: one that answers, one that does
/// not know the call (an older latchkey), one that never answers. Appends are pipelined over
/// one call, or, after one failed attempt, sent one `Append` at a time; a failed stream's
/// appends end with it.
#[cfg(test)]
mod append_streams {
    use super::*;
    use crate::cluster::peer_auth::ClusterId;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    #[derive(Clone, Copy)]
    enum Mode {
        /// Answers every append at once with success.
        Answers,
        /// Does not know `AppendStream`; answers unary `Append`s.
        Unknown,
        /// Takes appends and never answers.
        Silent,
    }

    /// How the appends reached a fake member.
    #[derive(Default)]
    struct Seen {
        unary: AtomicUsize,
        streamed: AtomicUsize,
        /// A silent member's stream is over (the leader ended or reset it).
        ended: AtomicBool,
    }

    /// Marks a stream's end in [`Seen::ended`] when dropped.
    struct SetOnDrop(Arc<Seen>);

    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.ended.store(true, Ordering::SeqCst);
        }
    }

    struct FakeMember {
        mode: Mode,
        seen: Arc<Seen>,
    }

    type Answer = Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>>;

    #[tonic::async_trait]
    impl pb::raft_peer_server::RaftPeer for FakeMember {
        async fn vote(
            &self,
            _: Request<pb::PeerMessage>,
        ) -> Result<Response<pb::PeerMessage>, Status> {
            Err(Status::unimplemented("not in this test"))
        }

        async fn append(
            &self,
            _: Request<pb::PeerMessage>,
        ) -> Result<Response<pb::PeerMessage>, Status> {
            self.seen.unary.fetch_add(1, Ordering::SeqCst);
            reply(&Answer::Ok(AppendEntriesResponse::Success))
        }

        type AppendStreamStream = BoxStream<'static, Result<pb::PeerMessage, Status>>;

        async fn append_stream(
            &self,
            request: Request<tonic::Streaming<pb::PeerChunk>>,
        ) -> Result<Response<Self::AppendStreamStream>, Status> {
            let seen = self.seen.clone();
            let inbound = request.into_inner();
            let answers: Self::AppendStreamStream = match self.mode {
                Mode::Unknown => return Err(Status::unimplemented("unknown method AppendStream")),
                Mode::Answers => {
                    let mut seq = 0;
                    Box::pin(inbound.map(move |item| {
                        let item = item?;
                        let header: AppendFrame = decode(&item.payload).map_err(bad)?;
                        assert_eq!(header.seq, seq, "appends in order, numbered per stream");
                        seq += 1;
                        seen.streamed.fetch_add(1, Ordering::SeqCst);
                        let answer: StreamAppendReply = Ok(Ok(None));
                        Ok(pb::PeerMessage {
                            payload: encode(&answer),
                        })
                    }))
                }
                Mode::Silent => {
                    // hyper drops the answers when the call is over (ended, or reset by the
                    // leader): that is when the member stops holding the stream.
                    let open = SetOnDrop(seen);
                    Box::pin(inbound.filter_map(move |_| {
                        open.0.streamed.fetch_add(1, Ordering::SeqCst);
                        futures::future::ready(None)
                    }))
                }
            };
            Ok(Response::new(answers))
        }

        async fn snapshot(
            &self,
            _: Request<tonic::Streaming<pb::PeerChunk>>,
        ) -> Result<Response<pb::PeerMessage>, Status> {
            Err(Status::unimplemented("not in this test"))
        }
    }

    /// A leader's client (member 1) for a fake member 2, and what the fake saw.
    async fn client_for(mode: Mode) -> (PeerClient, Arc<Seen>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Seen::default());
        let fake = FakeMember {
            mode,
            seen: seen.clone(),
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(pb::raft_peer_server::RaftPeerServer::new(fake))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let members = BTreeMap::from([(1, "127.0.0.1:1".to_owned()), (2, addr.clone())]);
        let mut network = PeerNetwork {
            connector: Arc::new(TcpPeerConnector),
            reachable: Default::default(),
            auth: Arc::new(PeerAuth::new(1, ClusterId::founded_by(&members), None)),
            dial: BTreeMap::new(),
            book: Default::default(),
            succession: Default::default(),
        };
        let client = network.new_client(2, &BasicNode { addr }).await;
        (client, seen)
    }

    fn heartbeat() -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: Vec::new(),
        }
    }

    /// One append, then none for as long as the stream lives (openraft's request stream
    /// waits for the next entry like this).
    fn one_then_idle() -> impl Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin {
        futures::stream::iter(vec![heartbeat()]).chain(futures::stream::pending())
    }

    /// Sends three appends in one stream; the answers.
    async fn send_three(
        client: &mut PeerClient,
    ) -> Result<
        Vec<Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
        RPCError<TypeConfig>,
    > {
        let input = futures::stream::iter(vec![heartbeat(), heartbeat(), heartbeat()]);
        let option = RPCOption::new(Duration::from_secs(10));
        let answers = client.stream_append(input, option).await?;
        Ok(answers.collect().await)
    }

    /// Sends three appends in one stream and checks that all three were answered with
    /// success, and how they reached the member: `(unary calls, streamed appends)`.
    async fn three_answered(client: &mut PeerClient, seen: &Seen, arrived: (usize, usize)) {
        let answers = send_three(client).await.expect("the appends are sent");
        assert_eq!(answers.len(), 3, "{answers:?}");
        assert!(
            answers.iter().all(|a| matches!(a, Ok(Ok(None)))),
            "{answers:?}"
        );
        assert_eq!(
            (
                seen.unary.load(Ordering::SeqCst),
                seen.streamed.load(Ordering::SeqCst)
            ),
            arrived
        );
    }

    #[tokio::test]
    async fn appends_go_down_one_stream_to_a_member_that_takes_it() {
        let (mut client, seen) = client_for(Mode::Answers).await;
        three_answered(&mut client, &seen, (0, 3)).await;
    }

    #[tokio::test]
    async fn a_member_that_does_not_know_the_stream_gets_one_append_per_call() {
        let (mut client, seen) = client_for(Mode::Unknown).await;
        // The first attempt fails (openraft retries it); from then on, one call per append.
        assert!(send_three(&mut client).await.is_err());
        three_answered(&mut client, &seen, (3, 0)).await;
    }

    #[tokio::test]
    async fn an_unanswered_append_fails_the_stream_and_its_appends_end_with_it() {
        let (mut client, seen) = client_for(Mode::Silent).await;
        // Deadline: `soft_ttl`, 3/4 of this.
        let option = RPCOption::new(Duration::from_millis(200));
        let mut answers = client
            .stream_append(one_then_idle(), option)
            .await
            .expect("the stream opens");
        let first = tokio::time::timeout(Duration::from_secs(10), answers.next())
            .await
            .expect("the deadline fires within 10 s");
        assert!(
            matches!(first, Some(Err(RPCError::Network(_)))),
            "{first:?}"
        );
        assert!(
            answers.next().await.is_none(),
            "the stream ends with its failure"
        );
        // openraft stops reading after a failure, but its request stream would go on: the
        // appends must end with the answers, or later requests go down a call no one reads.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !seen.ended.load(Ordering::SeqCst) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the member still had the stream open 10 s after it failed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(seen.streamed.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_that_came_in_time_is_not_late_for_being_read_late() {
        let (mut client, _) = client_for(Mode::Answers).await;
        // Ten streams: a coin toss between the answer and its passed deadline would lose one
        // of them with probability 1 - 2^-10.
        for round in 0..10 {
            let option = RPCOption::new(Duration::from_millis(100));
            let mut answers = client
                .stream_append(one_then_idle(), option)
                .await
                .expect("the stream opens");
            // The answer comes within milliseconds; openraft reads it after its deadline.
            tokio::time::sleep(Duration::from_millis(150)).await;
            let answer = answers.next().await;
            assert!(
                matches!(answer, Some(Ok(Ok(None)))),
                "round {round}: {answer:?}"
            );
        }
    }

    /// Issue #31: an append that rewrites what this member committed is refused before
    /// openraft, which asserts on it, sees it; one that follows the committed log, or only
    /// reaches past it, is not.
    #[test]
    fn an_append_that_rewrites_a_committed_entry_is_refused() {
        use openraft::vote::RaftLeaderId;
        let id = |term: u64, index: u64| {
            let leader = <TypeConfig as openraft::RaftTypeConfig>::LeaderId::new(term, 1);
            LogId::new(leader.to_committed(), index)
        };
        // This member's log: term 2 from index 5 (its snapshot before), committed up to 10.
        let committed = id(2, 10);
        let mine_at = |index: u64| (5..=12).contains(&index).then(|| id(2, index));
        let append = |prev: Option<LogId>, entries: &[LogId]| AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 1),
            prev_log_id: prev,
            entries: entries
                .iter()
                .map(|log_id| latchkey_raft::Entry {
                    log_id: *log_id,
                    payload: openraft::EntryPayload::Blank,
                })
                .collect(),
            leader_commit: None,
        };
        let check = |req: &AppendEntriesRequest<TypeConfig>| {
            check_committed(1, req, Some(&committed), mine_at)
        };
        // Follows the committed log (a heartbeat; entries overlapping it; past it).
        assert_eq!(check(&append(Some(id(2, 12)), &[])), Ok(()));
        assert_eq!(
            check(&append(Some(id(2, 9)), &[id(2, 10), id(3, 11)])),
            Ok(())
        );
        assert_eq!(
            check(&append(Some(id(1, 3)), &[])),
            Ok(()),
            "below the snapshot"
        );
        assert_eq!(
            check_committed(1, &append(Some(id(9, 9)), &[]), None, mine_at),
            Ok(()),
            "nothing committed"
        );
        // Rewrites it: an entry, or the one it follows, at or below index 10.
        for (prev, entries) in [
            (Some(id(2, 9)), vec![id(3, 10)]),
            (Some(id(1, 9)), vec![]),
            (Some(id(3, 4)), vec![]),
        ] {
            let refused = check(&append(prev, &entries));
            assert!(refused.is_err(), "{prev:?} {entries:?}");
        }
        let refused = check(&append(Some(id(2, 9)), &[id(3, 10)])).unwrap_err();
        assert!(refused.contains("where this member committed"), "{refused}");
    }

    #[test]
    fn an_append_must_come_in_its_place_in_its_stream() {
        let at = |stream, seq| AppendFrame { stream, seq };
        assert!(check_place(&at(7, 0), 0, None).is_ok(), "any stream, first");
        assert!(check_place(&at(7, 1), 1, Some(7)).is_ok());
        assert!(
            check_place(&at(7, 1), 0, None).is_err(),
            "the second, first"
        );
        assert!(check_place(&at(7, 2), 1, Some(7)).is_err(), "one skipped");
        assert!(
            check_place(&at(8, 1), 1, Some(7)).is_err(),
            "another stream's"
        );
    }
}
