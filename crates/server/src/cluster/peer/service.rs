//! The receiving side of the peer protocol: [`PeerRouter`], the only `RaftPeer` the server
//! runs, hands each request, once admitted (`admission.rs`), to its group's [`PeerService`],
//! whose handlers check what the message says before openraft sees it (see `peer.rs`).

use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use latchkey_core::limits;
use latchkey_proto::v1 as pb;
use latchkey_raft::{LogId, Raft, StateHandle, TypeConfig};

use super::admission::{
    Admitted, AdmittedChunks, ChunkError, PeerError, PeerRefusal, Sender, VerifiedChunk,
};
use crate::cluster::leader_contact::LeaderContact;
use crate::cluster::peer_auth::{HttpClaim, PeerAuth, PeerMethod};
use crate::observe::refusals::{PeerReason, Refusals};
use futures::stream::BoxStream;
use futures::StreamExt;
use openraft::errors::RaftError;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, StreamAppendError, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::storage::Snapshot;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::*;

/// The server side: checks who sent each message and what it says (see `peer_auth.rs`), then
/// hands it to the local Raft node.
#[derive(Clone)]
pub struct PeerService {
    raft: Raft,
    /// The group's applied state: the members its membership changes removed.
    state: StateHandle,
    pub(super) auth: Arc<PeerAuth>,
    /// A snapshot stream longer than this is refused: the table's budget and the snapshot's
    /// header (a snapshot is never larger, see `limits::TABLE_BYTES_MAX`).
    snapshot_bytes_max: u64,
    /// Snapshot streams being received (`limits::SNAPSHOTS_RECEIVING_MAX`).
    receiving: Arc<tokio::sync::Semaphore>,
    /// Streams of appends open (`limits::PEER_APPEND_STREAMS_MAX`).
    append_streams: Arc<tokio::sync::Semaphore>,
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
    ) -> Result<(u64, AppendEntriesRequest<TypeConfig>), PeerRefusal> {
        let header: AppendFrame = decode(&item.header).map_err(PeerRefusal::malformed)?;
        check_place(&header, seq, stream)
            .map_err(|e| PeerRefusal::new(PeerReason::OutOfPlace, e))?;
        let req: AppendEntriesRequest<TypeConfig> =
            decode(&item.data).map_err(PeerRefusal::malformed)?;
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
    ) -> Result<(), PeerRefusal> {
        use openraft::async_runtime::WatchReceiver;
        let from = self.vouch(sender, Vouch::Leader(&req.vote))?;
        check_vote_sender(from, &req.vote, "append")
            .map_err(|e| PeerRefusal::new(PeerReason::NotItsVote, e))?;
        // The committed index and the log ids of one metrics report belong together: what was
        // committed then is never rewritten, so a report that lags only checks less.
        let checked = {
            let m = self.raft.metrics();
            let m = m.borrow_watched();
            check_committed(from, req, &m.vote, m.local_committed.as_ref(), |index| {
                m.log_id_list.get(index)
            })
        };
        checked.map_err(|e| PeerRefusal::new(PeerReason::RewritesCommitted, e))
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
    ) -> Result<(u64, Vote, Meta, Vec<u8>, tokio::sync::OwnedSemaphorePermit), PeerError> {
        let open = |chunk: VerifiedChunk| -> Result<(SnapshotFrame, Vec<u8>), PeerRefusal> {
            let frame = decode(&chunk.header).map_err(PeerRefusal::malformed)?;
            Ok((frame, chunk.data))
        };
        let Some(first) = next_chunk(stream).await? else {
            return Err(PeerRefusal::malformed("an empty snapshot stream").into());
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
            return Err(PeerRefusal::malformed(
                "a snapshot stream that does not begin with its header",
            )
            .into());
        };
        let from = self.vouch(sender, Vouch::Leader(&vote))?;
        let bad_snapshot = |why: String| PeerRefusal::new(PeerReason::BadSnapshot, why);
        check_snapshot_header(from, &vote, &meta).map_err(bad_snapshot)?;
        if total_bytes > self.snapshot_bytes_max {
            return Err(PeerRefusal::new(
                PeerReason::SnapshotTooLarge,
                format!(
                "a snapshot of {total_bytes} bytes, above this member's limit of {} (its table \
                 budget and the snapshot's header)",
                self.snapshot_bytes_max
            ),
            )
            .into());
        }
        let receiving = self.receiving.clone().try_acquire_owned().map_err(|_| {
            Status::unavailable("this member is already receiving a snapshot; retry later")
        })?;
        // Grown as chunks arrive, never reserved up front from what the header claims.
        let mut data: Vec<u8> = Vec::new();
        while (data.len() as u64) < total_bytes {
            let Some(chunk) = next_chunk(stream).await? else {
                return Err(bad_snapshot(format!(
                    "the snapshot stream ended after {} of its {total_bytes} bytes",
                    data.len()
                ))
                .into());
            };
            let (frame, bytes) = open(chunk)?;
            match frame {
                SnapshotFrame::Data {
                    transfer: t,
                    offset,
                } if t == transfer && offset == data.len() as u64 => {}
                _ => {
                    return Err(PeerRefusal::new(
                        PeerReason::OutOfPlace,
                        format!(
                            "a snapshot chunk out of place (expected transfer {transfer} at \
                             offset {})",
                            data.len()
                        ),
                    )
                    .into())
                }
            }
            if bytes.is_empty() || (data.len() + bytes.len()) as u64 > total_bytes {
                return Err(bad_snapshot(format!(
                    "a snapshot chunk of {} bytes at offset {} of {total_bytes}",
                    bytes.len(),
                    data.len()
                ))
                .into());
            }
            data.extend_from_slice(&bytes);
        }
        if next_chunk(stream).await?.is_some() {
            return Err(bad_snapshot(format!(
                "chunks after the {total_bytes} bytes the snapshot announced"
            ))
            .into());
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
    ) -> Result<Response<pb::PeerMessage>, PeerError> {
        let from = self.vouch(sender, Vouch::Leader(req.from_leader()))?;
        check_vote_sender(from, req.from_leader(), "leader transfer")
            .map_err(|e| PeerRefusal::new(PeerReason::NotItsVote, e))?;
        let mine = self.vote_here();
        // Only the leader of this member's term names a successor here (openraft ignores the
        // request otherwise, too).
        if req.from_leader().leader_id != mine.leader_id {
            return Err(PeerRefusal::new(
                PeerReason::Succession,
                format!(
                    "member {from} named a successor for term {}, which it does not lead here",
                    req.from_leader().leader_id.term
                ),
            )
            .into());
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
        Ok(reply(&res)?)
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
    pub(super) fn check_member(&self, from: u64, vouch: Vouch<'_>) -> Result<(), PeerRefusal> {
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
        Ok(self.auth.check_member(from, &known, removed_at, vouched)?)
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
pub(super) enum Vouch<'a> {
    /// A leader's append or snapshot: its vote, which must be committed (a quorum elected it)
    /// and at least this member's own.
    Leader(&'a Vote),
    /// A candidate's vote request: its log must reach further than this member's, or it could
    /// not hold entries this member missed. openraft then applies Raft's own vote rules.
    Candidate { last_log_index: Option<u64> },
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
/// it is). An append from a vote below this member's (`mine`) is left to openraft, which
/// refuses it by the vote.
fn check_committed(
    from: u64,
    req: &AppendEntriesRequest<TypeConfig>,
    mine: &Vote,
    committed: Option<&LogId>,
    mine_at: impl Fn(u64) -> Option<LogId>,
) -> Result<(), String> {
    // openraft accepts an append only from a vote at least this member's; a lower (or
    // incomparable) one is refused by the vote alone, before any entry is looked at, with an
    // answer naming the higher vote that deposes the stale leader.
    if !matches!(
        req.vote.partial_cmp(mine),
        Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)
    ) {
        return Ok(());
    }
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
async fn next_chunk(stream: &mut AdmittedChunks) -> Result<Option<VerifiedChunk>, PeerError> {
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

/// The peer service of a member: the only `RaftPeer` the server runs. One [`PeerService`] per
/// Raft group (issue #16), each request handed to the one its `GROUP_HEADER` names (group 0
/// without one, as every request of a one-group cluster), and only once admitted (see
/// `admission.rs`): a group's service has no RPC method that takes a request as it arrived.
#[derive(Clone)]
pub struct PeerRouter {
    pub(super) groups: Arc<[PeerService]>,
    /// Refused peer RPCs, counted and logged at each request's door (`admission.rs`).
    pub(super) refusals: Arc<Refusals<PeerReason>>,
    /// The (group, member) pairs of senders outside a membership already logged at warn: a
    /// removed member left running campaigns every election timeout, and is logged once at
    /// warn, then at debug (at most `PEER_NON_MEMBERS_REPORTED_MAX` remembered).
    pub(super) reported: Arc<std::sync::Mutex<std::collections::BTreeSet<(u32, u64)>>>,
}

impl PeerRouter {
    pub fn new(groups: Vec<PeerService>, refusals: Arc<Refusals<PeerReason>>) -> PeerRouter {
        assert!(!groups.is_empty(), "a member runs at least one group");
        PeerRouter {
            groups: groups.into(),
            refusals,
            reported: Default::default(),
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
        let door = request.door().clone();
        group
            .vote(request)
            .await
            .map(|answer| group.stamped(answer))
            .map_err(|e| door.answer(e))
    }

    async fn append(
        &self,
        request: Request<pb::PeerMessage>,
    ) -> Result<Response<pb::PeerMessage>, Status> {
        let http = crate::cluster::peer_auth::PeerAuth::http_claim_of(request.metadata());
        let (group, request) = self.admit(request, PeerMethod::Append)?;
        let door = request.door().clone();
        group
            .append(request, http)
            .await
            .map(|answer| group.stamped(answer))
            .map_err(|e| door.answer(e))
    }

    type AppendStreamStream = BoxStream<'static, Result<pb::PeerMessage, Status>>;

    async fn append_stream(
        &self,
        request: Request<tonic::Streaming<pb::PeerChunk>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        let http = crate::cluster::peer_auth::PeerAuth::http_claim_of(request.metadata());
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
        let door = request.door().clone();
        group.snapshot(request).await.map_err(|e| door.answer(e))
    }
}

/// A group's handlers, each taking a request [`PeerRouter`] admitted.
impl PeerService {
    /// An answer saying where this member serves HTTP, for the other's cluster status.
    fn stamped<T>(&self, mut answer: Response<T>) -> Response<T> {
        self.auth.stamp_http(answer.metadata_mut());
        answer
    }

    async fn vote(
        &self,
        request: Admitted<Vec<u8>>,
    ) -> Result<Response<pb::PeerMessage>, PeerError> {
        let (sender, payload) = request.into_parts();
        let (req, pre_vote) = match decode(&payload).map_err(PeerRefusal::malformed)? {
            Ballot::Vote(req) => (req, false),
            Ballot::PreVote(req) => (req, true),
            Ballot::TransferLeader(req) => return self.transfer_leader(sender, req).await,
        };
        let from = self.vouch(
            sender,
            Vouch::Candidate {
                last_log_index: req.last_log_id.as_ref().map(|l| l.index),
            },
        )?;
        check_vote_sender(from, &req.vote, "vote request")
            .map_err(|e| PeerRefusal::new(PeerReason::NotItsVote, e))?;
        check_leadership_transfer(from, &req, &self.succession, &self.vote_here())
            .map_err(|e| PeerRefusal::new(PeerReason::Succession, e))?;
        let res: Result<VoteResponse<TypeConfig>, RaftError<TypeConfig>> = if pre_vote {
            self.raft.pre_vote(req).await
        } else {
            self.raft.vote(req).await
        };
        Ok(reply(&res)?)
    }

    /// `http`: where the sender says it serves HTTP, kept once the append is accepted.
    async fn append(
        &self,
        request: Admitted<Vec<u8>>,
        http: Option<HttpClaim>,
    ) -> Result<Response<pb::PeerMessage>, PeerError> {
        let (sender, payload) = request.into_parts();
        let req: AppendEntriesRequest<TypeConfig> =
            decode(&payload).map_err(PeerRefusal::malformed)?;
        self.check_append(sender, &req)?;
        let leader = req.vote.leader_id.node_id;
        let http = self.auth.verified_http(leader, http);
        let res = self.raft.append_entries(req).await;
        if matches!(&res, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
            self.leader_contact.heard();
            self.auth.heard_http(leader, http.clone());
            self.leader_contact.heard_http(leader, http);
        }
        Ok(reply(&res)?)
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
        http: Option<HttpClaim>,
    ) -> Result<Response<BoxStream<'static, Result<pb::PeerMessage, Status>>>, Status> {
        let door = request.door().clone();
        let (sender, inbound) = request.into_parts();
        let from = sender.claimed();
        let http = self.auth.verified_http(from, http);
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
                let door = door.clone();
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
                        // Answered at the door at once: the sender may never read its answer.
                        Err(ChunkError::Refused(refused)) => {
                            *refusal.lock().expect("refusal lock") = Some(door.refuse(refused));
                            None
                        }
                        Ok(Some(item)) => match checker.open_append(sender, seq, stream, item) {
                            Ok((id, req)) => Some((req, (inbound, seq + 1, Some(id)))),
                            Err(refused) => {
                                *refusal.lock().expect("refusal lock") = Some(door.refuse(refused));
                                None
                            }
                        },
                    }
                }
            },
        );
        let contact = self.leader_contact.clone();
        let auth = self.auth.clone();
        let answers = self
            .raft
            .stream_append(input)
            .map(move |reply: StreamAppendReply| {
                if matches!(&reply, Ok(Ok(_) | Err(StreamAppendError::Conflict(_)))) {
                    contact.heard();
                    auth.heard_http(from, http.clone());
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
    ) -> Result<Response<pb::PeerMessage>, PeerError> {
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
        let (vote, meta) = checked.map_err(|e| PeerRefusal::new(PeerReason::BadSnapshot, e))?;
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
        Ok(reply(&res)?)
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

/// Hostile input (issue #13): peer payloads come off the network. Decoding noise or a mutated
/// message gives a message or an error, and a snapshot with mutated data is refused or passes
/// every check; nothing panics before openraft would see it.
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
mod append_checks {
    use super::*;

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
            check_committed(
                1,
                req,
                &Vote::new_committed(3, 1),
                Some(&committed),
                mine_at,
            )
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
            check_committed(
                1,
                &append(Some(id(9, 9)), &[]),
                &Vote::new_committed(3, 1),
                None,
                mine_at
            ),
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
        // A deposed leader's append (its vote below this member's) that still carries its
        // uncommitted entries: openraft refuses it by the vote alone and answers with the
        // higher one, which makes that leader step down. Refusing it here instead logged a
        // "refused a peer message" warning on every healthy failover (seen by the nemesis,
        // issue #34) and withheld the answer that deposes the old leader.
        let stale = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(2, 2),
            ..append(Some(id(2, 9)), &[id(2, 10)])
        };
        assert_eq!(
            check_committed(
                2,
                &stale,
                &Vote::new_committed(3, 1),
                Some(&id(3, 10)),
                |i| { (5..=12).contains(&i).then(|| id(3, i)) }
            ),
            Ok(())
        );
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
