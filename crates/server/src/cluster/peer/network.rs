//! The sending side of the peer protocol: [`PeerNetwork`], openraft's network factory, makes a
//! [`PeerClient`] per target member, over channels a [`PeerConnector`] dials (see `peer.rs`).

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use latchkey_core::limits;
use latchkey_proto::v1 as pb;
use latchkey_proto::v1::raft_peer_client::RaftPeerClient;
use latchkey_raft::TypeConfig;

use crate::cluster::member_addr::MemberAddr;
use crate::cluster::peer_auth::{PeerAuth, PeerMethod};
use futures::{Stream, StreamExt};
use openraft::base::{BoxFuture, BoxStream as RaftBoxStream};
use openraft::errors::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{stream_append_sequential, RPCOption, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, OptionalSend, RaftNetworkFactory};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use super::*;

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

    /// Sends a [`Ballot`] (the three questions of the `Vote` call) to the member, where it is
    /// now.
    async fn ballot<T: DeserializeOwned>(
        &mut self,
        ballot: Ballot,
        option: &RPCOption,
    ) -> Result<T, RPCError<TypeConfig>> {
        self.follow_address();
        self.call(
            PeerMethod::Vote,
            encode(&ballot),
            option,
            |mut c, r| async move { c.vote(r).await },
        )
        .await
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
        self.ballot(Ballot::TransferLeader(req), &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.ballot(Ballot::Vote(rpc), &option).await
    }

    /// A real question to the member. A transport failure comes back as an error, which
    /// openraft does not count as a grant, so an isolated member never gathers a quorum.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.ballot(Ballot::PreVote(rpc), &option).await
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

/// The leader's side of `AppendStream` against fake members: one that answers, one that does
/// not know the call (an older latchkey), one that never answers. Appends are pipelined over
/// one call, or, after one failed attempt, sent one `Append` at a time; a failed stream's
/// appends end with it.
#[cfg(test)]
mod append_streams {
    use super::*;
    use crate::cluster::peer_auth::ClusterId;
    use futures::stream::BoxStream;
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
                        let header: AppendFrame =
                            decode(&item.payload).map_err(Status::invalid_argument)?;
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
}
