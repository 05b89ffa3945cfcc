//! Issue #13, authenticated members: three real members (`run()` on loopback, in process) share
//! a cluster secret; a stranger and a member that sends nonsense try what the issue found
//! possible before (a forged snapshot replacing the table, a garbage one stopping the Raft core,
//! one "above its vote" tripping openraft's assertion, a `leadership_transfer` vote deposing
//! the leader, from a stranger or from a member). Each is refused with `PERMISSION_DENIED`;
//! the leader keeps leading in the same term, a held lock keeps its holder and token, and the
//! cluster still grants.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use latchkey_core::LockTable;
use latchkey_proto::v1 as pb;
use latchkey_proto::v1::locks_client::LocksClient;
use latchkey_proto::v1::raft_peer_client::RaftPeerClient;
use latchkey_raft::{TypeConfig, Vote, VoteRequest};
use latchkey_server::peer_auth::{ClusterId, ClusterSecret, PeerAuth, PeerMethod};
use latchkey_server::ServerConfig;
use serde::Serialize;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::Code;

/// The peer payload version and the `Vote` call's ballot, as `peer.rs` encodes them (a mirror:
/// postcard encodes an enum by variant index).
const PEER_FORMAT_VERSION: u8 = 3;
#[derive(Serialize)]
#[allow(dead_code)]
enum Ballot {
    Vote(VoteRequest),
    PreVote(VoteRequest),
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    latchkey_core::versioned::encode(PEER_FORMAT_VERSION, v).unwrap()
}

const SECRET: &[u8] = b"a-test-cluster-secret-0123456789";

struct Member {
    addr: std::net::SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start_cluster(dir: &std::path::Path) -> (BTreeMap<u64, String>, Vec<Member>) {
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let members: BTreeMap<u64, String> = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| (i as u64 + 1, l.local_addr().unwrap().to_string()))
        .collect();
    let mut out = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let addr = listener.local_addr().unwrap();
        let mut config = ServerConfig::cluster(
            i as u64 + 1,
            addr,
            dir.join(format!("n{}", i + 1)),
            members.clone(),
        );
        config.cluster_secret = Some(ClusterSecret::new(SECRET.to_vec()));
        let config = config.validate().expect("a valid configuration");
        let (stop, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(latchkey_server::run(listener, config, async move {
            let _ = rx.await;
        }));
        out.push(Member { addr, stop, task });
    }
    (members, out)
}

fn channel(addr: std::net::SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy()
}

async fn status(addr: std::net::SocketAddr) -> Option<pb::NodeStatusResponse> {
    LocksClient::new(channel(addr))
        .node_status(pb::NodeStatusRequest {})
        .await
        .ok()
        .map(|r| r.into_inner())
}

/// The leader's index among `members` and its status, once one leads (bounded).
async fn leader(members: &[Member]) -> (usize, pb::NodeStatusResponse) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        for (i, m) in members.iter().enumerate() {
            assert!(!m.task.is_finished(), "member {} stopped on its own", i + 1);
            if let Some(s) = status(m.addr).await {
                if s.role == "leader" && s.applied_index > 0 {
                    return (i, s);
                }
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no leader within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `payload` to `addr`'s peer service as `method`, stamped by `auth` (or by nobody).
async fn send(
    addr: std::net::SocketAddr,
    to: u64,
    auth: Option<&PeerAuth>,
    method: PeerMethod,
    payload: Vec<u8>,
) -> Result<pb::PeerMessage, tonic::Status> {
    let mut meta = tonic::metadata::MetadataMap::new();
    if let Some(auth) = auth {
        auth.sign(&mut meta, method, to, &payload);
    }
    let request = tonic::Request::from_parts(
        meta,
        tonic::Extensions::default(),
        pb::PeerMessage { payload },
    );
    let mut c = RaftPeerClient::new(channel(addr));
    match method {
        PeerMethod::Vote => c.vote(request).await,
        PeerMethod::Append => c.append(request).await,
        PeerMethod::Snapshot | PeerMethod::SnapshotChunk => unreachable!("see send_snapshot"),
        PeerMethod::AppendStream | PeerMethod::AppendItem => unreachable!("see send_appends"),
    }
    .map(|r| r.into_inner())
}

/// The header of one append of an `AppendStream`, as `peer.rs` encodes it (a mirror).
#[derive(Serialize)]
struct AppendFrame {
    stream: u64,
    seq: u64,
}

/// Append `seq` of stream `stream` carrying `req`, signed by `auth` for member `to`.
fn append_item(
    auth: &PeerAuth,
    to: u64,
    stream: u64,
    seq: u64,
    req: &openraft::raft::AppendEntriesRequest<TypeConfig>,
) -> pb::PeerChunk {
    let header = encode(&AppendFrame { stream, seq });
    let data = encode(req);
    let mac = auth.sign_item(PeerMethod::AppendItem, to, &header, &data);
    pb::PeerChunk {
        payload: header,
        data,
        mac,
    }
}

/// Streams `items` to `addr`'s peer service as appends, the stream's headers stamped by
/// `auth`; every answer, or the status the stream ended with. (A successful result is
/// returned as one empty message: the tests here expect refusals.)
async fn send_appends(
    addr: std::net::SocketAddr,
    to: u64,
    auth: Option<&PeerAuth>,
    items: Vec<pb::PeerChunk>,
) -> Result<pb::PeerMessage, tonic::Status> {
    let mut meta = tonic::metadata::MetadataMap::new();
    if let Some(auth) = auth {
        auth.sign(&mut meta, PeerMethod::AppendStream, to, &[]);
    }
    send_append_stream(addr, meta, futures::stream::iter(items)).await
}

/// Streams `items` as a stream of appends with the headers `meta`; as [`send_appends`].
async fn send_append_stream(
    addr: std::net::SocketAddr,
    meta: tonic::metadata::MetadataMap,
    items: impl futures::Stream<Item = pb::PeerChunk> + Send + 'static,
) -> Result<pb::PeerMessage, tonic::Status> {
    let request = tonic::Request::from_parts(meta, tonic::Extensions::default(), items);
    let mut answers = RaftPeerClient::new(channel(addr))
        .append_stream(request)
        .await?
        .into_inner();
    while answers.message().await?.is_some() {}
    Ok(pb::PeerMessage::default())
}

/// A snapshot as its sender would stream it.
type Forged = (Vote, latchkey_raft::SnapshotMeta, Vec<u8>);

/// The chunks of `snapshot` as `auth` would stream them to member `to`.
fn chunks(auth: Option<&PeerAuth>, to: u64, snapshot: Forged) -> Vec<pb::PeerChunk> {
    let (vote, meta, data) = snapshot;
    latchkey_server::snapshot_chunks(auth.cloned().map(Arc::new), to, 7, vote, meta, data).collect()
}

/// Streams `chunks` to `addr`'s peer service as a snapshot, its headers stamped by `auth`.
async fn send_snapshot(
    addr: std::net::SocketAddr,
    to: u64,
    auth: Option<&PeerAuth>,
    chunks: Vec<pb::PeerChunk>,
) -> Result<pb::PeerMessage, tonic::Status> {
    let mut meta = tonic::metadata::MetadataMap::new();
    if let Some(auth) = auth {
        auth.sign(&mut meta, PeerMethod::Snapshot, to, &[]);
    }
    let request = tonic::Request::from_parts(
        meta,
        tonic::Extensions::default(),
        futures::stream::iter(chunks),
    );
    RaftPeerClient::new(channel(addr))
        .snapshot(request)
        .await
        .map(|r| r.into_inner())
}

fn assert_refused(what: &str, r: Result<pb::PeerMessage, tonic::Status>, says: &str) {
    match r {
        Err(s) if s.code() == Code::PermissionDenied && s.message().contains(says) => {}
        other => panic!("{what}: expected PERMISSION_DENIED saying {says:?}, got {other:?}"),
    }
}

/// A snapshot that claims to be at `index` of `last_term` (its table is empty: refused before
/// anyone looks at it, it would replace a table with a held lock).
fn forged_snapshot(vote: Vote, last_term: u64, index: u64) -> Forged {
    let table = LockTable::default();
    let last = latchkey_raft::LogId::new(
        openraft::type_config::alias::CommittedLeaderIdOf::<TypeConfig> {
            term: last_term,
            node_id: 2,
        },
        index,
    );
    let data = latchkey_raft::snapshot::encode(
        &Some(last),
        &Default::default(),
        &Default::default(),
        &table,
    );
    let meta = latchkey_raft::SnapshotMeta {
        last_log_id: Some(last),
        last_membership: Default::default(),
    };
    (vote, meta, data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_and_nonsense_from_members_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (list, members) = start_cluster(dir.path()).await;
    let (li, before) = leader(&members).await;
    let leader_id = before.id;
    let addr = members[li].addr;
    let a_follower = list.keys().copied().find(|&id| id != leader_id).unwrap();

    // A lock held before the attempts.
    let mut c = LocksClient::new(channel(addr));
    let s = c
        .create_session(pb::CreateSessionRequest {
            ttl_ms: 30_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let granted = c
        .acquire(pb::AcquireRequest {
            session: Some(s),
            seq: 1,
            name: "x".into(),
            wait_timeout_ms: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let describe = |mut c: LocksClient<Channel>| async move {
        c.describe(pb::DescribeRequest { name: "x".into() })
            .await
            .unwrap()
            .into_inner()
            .lock
            .unwrap()
    };
    let held = describe(c.clone()).await;
    assert!(held.held && held.token > 0, "{held:?} after {granted:?}");

    let high = before.term + 100;
    let transfer = encode(&Ballot::Vote(VoteRequest {
        vote: Vote::new(high, a_follower),
        last_log_id: None,
        leadership_transfer: true,
    }));
    let forged = forged_snapshot(Vote::new_committed(high, a_follower), high, 1_000_000);

    // A stranger: no credentials at all.
    assert_refused(
        "a leadership-transfer vote from a stranger",
        send(addr, leader_id, None, PeerMethod::Vote, transfer.clone()).await,
        "latchkey-peer-from",
    );
    // Claiming to be a member, without the secret.
    let no_secret = PeerAuth::new(a_follower, ClusterId::founded_by(&list), None);
    assert_refused(
        "a forged snapshot without the secret",
        send_snapshot(
            addr,
            leader_id,
            Some(&no_secret),
            chunks(Some(&no_secret), leader_id, forged.clone()),
        )
        .await,
        "cluster secret",
    );
    // Another cluster's secret.
    let other = PeerAuth::new(
        a_follower,
        ClusterId::founded_by(&list),
        Some(ClusterSecret::new(
            b"another-cluster-secret-012345678".to_vec(),
        )),
    );
    assert_refused(
        "a leadership-transfer vote under another secret",
        send(
            addr,
            leader_id,
            Some(&other),
            PeerMethod::Vote,
            transfer.clone(),
        )
        .await,
        "does not verify",
    );
    // A non-member that knows the secret.
    let outsider = PeerAuth::new(
        9,
        ClusterId::founded_by(&list),
        Some(ClusterSecret::new(SECRET.to_vec())),
    );
    assert_refused(
        "a vote from a non-member",
        send(
            addr,
            leader_id,
            Some(&outsider),
            PeerMethod::Vote,
            transfer.clone(),
        )
        .await,
        "not a member",
    );

    // A member (with the secret) sending nonsense: a snapshot that does not decode, one whose
    // last log id lies above its vote, and a vote for someone else.
    let member = PeerAuth::new(
        a_follower,
        ClusterId::founded_by(&list),
        Some(ClusterSecret::new(SECRET.to_vec())),
    );
    let garbage = (
        Vote::new_committed(high, a_follower),
        latchkey_raft::SnapshotMeta {
            last_log_id: None,
            last_membership: Default::default(),
        },
        vec![0xde, 0xad, 0xbe, 0xef],
    );
    assert_refused(
        "a garbage snapshot from a member",
        send_snapshot(
            addr,
            leader_id,
            Some(&member),
            chunks(Some(&member), leader_id, garbage),
        )
        .await,
        "snapshot",
    );
    // A snapshot stream altered on the way: a chunk's data changed, a chunk left out, a chunk
    // moved to another transfer's stream. Each chunk is checked on its own.
    // (Its header passes every check: its last log id is of an older term than its vote.)
    let valid = chunks(
        Some(&member),
        leader_id,
        forged_snapshot(Vote::new_committed(high, a_follower), high - 1, 1_000_000),
    );
    assert!(valid.len() == 2, "a header and one data chunk");
    let mut altered = valid.clone();
    altered[1].data[0] ^= 1;
    assert_refused(
        "a snapshot chunk altered on the way",
        send_snapshot(addr, leader_id, Some(&member), altered).await,
        "does not verify",
    );
    assert_refused(
        "a snapshot stream missing its data",
        send_snapshot(addr, leader_id, Some(&member), valid[..1].to_vec()).await,
        "stream ended",
    );
    let (vote, meta, data) =
        forged_snapshot(Vote::new_committed(high, a_follower), high - 1, 1_000_000);
    let mut spliced = latchkey_server::snapshot_chunks(
        Some(Arc::new(member.clone())),
        leader_id,
        8,
        vote,
        meta,
        data,
    )
    .collect::<Vec<_>>();
    spliced[1] = valid[1].clone();
    assert_refused(
        "a snapshot chunk of another transfer",
        send_snapshot(addr, leader_id, Some(&member), spliced).await,
        "out of place",
    );
    // A stream of appends from a stranger, and appends altered, out of place, or for another
    // member's vote. Every append is checked on its own, before openraft sees it.
    assert_refused(
        "a stream of appends without the secret",
        send_appends(addr, leader_id, Some(&no_secret), Vec::new()).await,
        "cluster secret",
    );
    let for_member_9 = openraft::raft::AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(high, 9),
        prev_log_id: None,
        leader_commit: None,
        entries: Vec::new(),
    };
    assert_refused(
        "a member's append for another member's vote",
        send_appends(
            addr,
            leader_id,
            Some(&member),
            vec![append_item(&member, leader_id, 1, 0, &for_member_9)],
        )
        .await,
        "for member 9",
    );
    let mut altered = append_item(&member, leader_id, 1, 0, &for_member_9);
    altered.data[0] ^= 1;
    assert_refused(
        "an append altered on the way",
        send_appends(addr, leader_id, Some(&member), vec![altered]).await,
        "does not verify",
    );
    assert_refused(
        "an append out of its place (the second of its stream, sent first)",
        send_appends(
            addr,
            leader_id,
            Some(&member),
            vec![append_item(&member, leader_id, 1, 1, &for_member_9)],
        )
        .await,
        "out of place",
    );
    // A stream of appends opened by a member and left empty is closed (it would hold one of
    // the member's few open streams).
    let mut meta = tonic::metadata::MetadataMap::new();
    member.sign(&mut meta, PeerMethod::AppendStream, leader_id, &[]);
    match tokio::time::timeout(
        Duration::from_secs(20),
        send_append_stream(addr, meta, futures::stream::pending()),
    )
    .await
    {
        Ok(Err(s))
            if s.code() == Code::DeadlineExceeded && s.message().contains("without an append") => {}
        other => panic!("an empty stream of appends: expected DEADLINE_EXCEEDED, got {other:?}"),
    }
    // At most `PEER_APPEND_STREAMS_MAX` streams of appends are open at once; the next is
    // refused UNAVAILABLE (the leader would retry after its backoff), and a slot is free again
    // once a stream is over.
    let open_one = || {
        let mut meta = tonic::metadata::MetadataMap::new();
        member.sign(&mut meta, PeerMethod::AppendStream, leader_id, &[]);
        let request = tonic::Request::from_parts(
            meta,
            tonic::Extensions::default(),
            futures::stream::pending::<pb::PeerChunk>(),
        );
        let mut c = RaftPeerClient::new(channel(addr));
        async move { c.append_stream(request).await }
    };
    let mut open = Vec::new();
    for _ in 0..latchkey_core::limits::PEER_APPEND_STREAMS_MAX {
        open.push(open_one().await.expect("a stream within the limit opens"));
    }
    match open_one().await {
        Err(s) if s.code() == Code::Unavailable && s.message().contains("streams of appends") => {}
        other => panic!(
            "one stream over the limit: expected UNAVAILABLE, got {:?}",
            other.map(|_| ())
        ),
    }
    drop(open);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let reopened = loop {
        match open_one().await {
            Ok(stream) => break stream,
            Err(s) if s.code() == Code::Unavailable => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no stream slot free 20 s after the streams were dropped"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(s) => panic!("reopening a stream: {s:?}"),
        }
    };
    drop(reopened);
    let mut append_as_chunk = valid.clone();
    append_as_chunk[1] = append_item(&member, leader_id, 7, 0, &for_member_9);
    assert_refused(
        "an append passed off as a snapshot chunk",
        send_snapshot(addr, leader_id, Some(&member), append_as_chunk).await,
        "does not verify",
    );

    let impossible = forged_snapshot(Vote::new_committed(high, a_follower), high + 5, 10);
    assert_refused(
        "a snapshot above its vote from a member",
        send_snapshot(
            addr,
            leader_id,
            Some(&member),
            chunks(Some(&member), leader_id, impossible),
        )
        .await,
        "older term",
    );
    let for_another = encode(&Ballot::Vote(VoteRequest {
        vote: Vote::new(high, 9),
        last_log_id: None,
        leadership_transfer: true,
    }));
    assert_refused(
        "a member's vote request for another candidate",
        send(
            addr,
            leader_id,
            Some(&member),
            PeerMethod::Vote,
            for_another,
        )
        .await,
        "for member 9",
    );
    // A member's own leadership-transfer vote, with a log that reaches past the leader's:
    // openraft would grant it despite the leader lease, and the leader would step down.
    let member_transfer = encode(&Ballot::Vote(VoteRequest {
        vote: Vote::new(high, a_follower),
        last_log_id: Some(latchkey_raft::LogId::new(
            openraft::type_config::alias::CommittedLeaderIdOf::<TypeConfig> {
                term: before.term,
                node_id: leader_id,
            },
            1_000_000,
        )),
        leadership_transfer: true,
    }));
    assert_refused(
        "a member's leadership-transfer vote",
        send(
            addr,
            leader_id,
            Some(&member),
            PeerMethod::Vote,
            member_transfer,
        )
        .await,
        "leadership-transfer",
    );

    // Nothing changed: the same leader in the same term, the lock with the same holder and
    // token, and the cluster still grants.
    let (li2, after) = leader(&members).await;
    assert_eq!(
        (members[li2].addr, after.id, after.term),
        (addr, leader_id, before.term),
        "the leader changed"
    );
    let still = describe(c.clone()).await;
    assert_eq!((still.session, still.token), (held.session, held.token));
    let next = c
        .acquire(pb::AcquireRequest {
            session: Some(s),
            seq: 2,
            name: "y".into(),
            wait_timeout_ms: 0,
            ..Default::default()
        })
        .await
        .expect("the cluster still grants")
        .into_inner();
    assert!(
        next.token > held.token && next.token < 1_000_000,
        "{next:?}"
    );

    for m in members {
        let _ = m.stop.send(());
        tokio::time::timeout(Duration::from_secs(20), m.task)
            .await
            .expect("a member stops within 20 s")
            .expect("join")
            .expect("the member ran cleanly");
    }
}
