//! Issue #31 item 2: the attack matrix of the peer (Raft) protocol, on real `latchkey serve`
//! processes. Every `RaftPeer` RPC and message kind × every kind of sender that is not the
//! member it claims to be, × three setups, one 3-member cluster per setup:
//!
//! | setup           | members speak          | `--cluster-secret-file` | `--groups` |
//! |-----------------|------------------------|-------------------------|------------|
//! | `mtls`          | mTLS (`--tls-ca`)      | no                      | 1          |
//! | `mtls+secret`   | mTLS (`--tls-ca`)      | yes                     | 1          |
//! | `plain+secret`  | plaintext              | yes                     | 2          |
//!
//! RPCs (the message kinds): `vote`, `pre-vote` and `transfer-leader` (three `Ballot`s of the
//! `Vote` RPC), `append` (unary), `append-stream`, `snapshot` (a stream of chunks).
//!
//! The attacker targets a follower `T` of group 0 and claims to be that group's leader `L`
//! (`M` is the third member). Each sender holds **every credential but the one its row is
//! about**, so that each check is shown to refuse on its own (a row passes only if that one
//! check holds, whatever the others do):
//!
//! - `no-cert`: L's id, the cluster's fingerprint and the secret, but no client certificate.
//!   The TLS handshake refuses it (`--tls-ca` makes a certificate mandatory), before any RPC:
//!   the client must read the server's `certificate_required` alert (rustls: "received fatal
//!   alert: CertificateRequired") or, when hyper had queued the request before the alert
//!   closed the connection (a race in the client), that request cancelled by the close; T must
//!   count one more `latchkey_auth_refused_total{reason="no-certificate"}` and log "refused a
//!   client (no-certificate) ... peer sent no certificates". The count and the line pin the
//!   cause that the client's error alone cannot.
//! - `client-cert`: a certificate of the members' CA that names no member (CN `intruder`, as a
//!   client's would), L's id, the fingerprint and the secret.
//! - `member-cert`: M's own certificate (`member-M`), messages claiming to be L's (`from` = L).
//! - `other-cluster`: L's certificate and the secret, but another cluster's id (the same member
//!   ids on other ports), so another fingerprint: a member of another cluster signed by the same
//!   CA, or a member started with other `--peers`.
//! - `wrong-mac`, `no-mac`: L's certificate and the fingerprint, a MAC under another secret, or
//!   none.
//! - `replay-member`: L's certificate and a message L signed for M (under the secret: what an
//!   on-path recorder holds), sent to T.
//! - `replay-group`: a message L signed for T in group 0, sent to T as group 1's
//!   (`latchkey-peer-group: 1`).
//!
//! The rows about a stream's items (of `append-stream` and `snapshot` only: a unary RPC has
//! none) send a stream whose headers are L's own and valid (L's certificate, the fingerprint,
//! the headers' MAC), so that admission takes the stream and only what is checked as each item
//! is read can refuse it:
//!
//! - `item-for-other-member`, `item-wrong-mac`, `item-no-mac`: the item signed by L for M,
//!   under another secret, or without a MAC.
//! - `item-other-kind`: the item's MAC made for the other kind of item (an append's in a
//!   snapshot stream, a snapshot chunk's in a stream of appends).
//! - `item-other-transfer` (snapshot): the first chunk of transfer 9, then the data chunks of
//!   transfer 10 of the same snapshot, each signed as its own transfer's.
//! - `item-out-of-place`: the snapshot's first chunk twice (its header where its data must
//!   come), or an append that says it is its stream's second, alone; each signed as it is.
//!
//! The first four are the per-item MAC check's own rows (with it disabled they are taken and
//! change T; the last two are the handlers' place checks, and refused either way).
//!
//! The rows about malformed metadata send L's message signed as L signs it, then one value
//! replaced: `group-abc` and `group-99` (`latchkey-peer-group`: not a number; a group the
//! member does not run), `from-oversized` (`latchkey-peer-from`: 4 KiB of digits, beyond a
//! `u64`), `cluster-oversized` (`latchkey-peer-cluster`: 4 KiB), `mac-malformed`
//! (`latchkey-peer-mac`: 4 KiB, not hex). Admission refuses each `PERMISSION_DENIED` (not
//! `INVALID_ARGUMENT`: `admission.rs` refuses every header it cannot read as who sent the
//! message, through the same `refuse`).
//!
//! The `rewrite-committed` row (append and append-stream) is L's own, with every credential:
//! an append a term above L's that puts another entry at T's last index, which T committed.
//! Not a stranger but a member's lie, which openraft asserts against (the follower's core
//! stops); `check_append` refuses it.
//!
//! Then, after every row above, the `removed-member` row: M is removed (`latchkey cluster
//! remove M`, its process stopped; the members left are L and T, and with `--groups` M may
//! have led a group, which elects another first), and the attacker is M itself, with every
//! credential it had (its certificate `member-M`, the fingerprint, the secret), speaking for
//! itself with a committed vote one term above L's: a vote and a pre-vote for M, a
//! transfer-leader from M naming T, an append and a stream of appends that expire the
//! holder's session, a snapshot where the attacker holds the lock. A member outside T's
//! membership is taken when its message vouches for it (so that a member that missed an
//! addition can follow the new one); a removed member must not be (issue #31): before
//! `RemovedMembers`, T took the append and its Raft core panicked.
//!
//! Cells that cannot apply are skipped with their reason (no certificate in plaintext; no MAC
//! without a secret, on a message or an item; a replay to another member without a secret is
//! the leader speaking, since nothing else binds a message to its receiver; one group only; a
//! stream of appends has no transfer of its own but its first append's).
//!
//! The messages are real and well formed (`latchkey_server::peer_wire`), built from the
//! target's state: a vote and a pre-vote for L at term + 100 with a log far ahead, a
//! transfer-leader with L's vote naming T (T would campaign at once), an append with L's vote
//! that expires the lock holder's session and commits it, the same as one append of a stream,
//! and a snapshot claiming L's vote at a high index, in which the attacker's session holds the
//! held lock (the `removed-member` row's speak for M instead, a term above). Each cell
//! asserts: the RPC is refused `PERMISSION_DENIED` naming the check (or
//! at the handshake, for `no-cert`); T logs the refusal and counts it, once, under the row's
//! reason (`latchkey_peer_refused_total{reason}` on its `/metrics`; the refusal log is
//! rate-limited, so cells are paced at its refill); T's state is unchanged (its own
//! `NodeStatus` of every group: role, term, leader, last log index, applied index, sessions,
//! locks; its `/metrics` gauges, `latchkey_snapshots_installed` included; and the held lock and
//! the lock list as the leader serves them, what `latchkey status` and `latchkey list` show).
//! T's vote is its term and leader here: within a term it cannot change otherwise. After all
//! cells the group's leader and term are the same, and a client locks and gets a token.
//!
//! Then, last, the positive control ([`control`]): the crafted append and snapshot, sent to T
//! with L's own credentials, are taken and change T as they say (the holder's session expired;
//! the attacker's session holding the lock at the snapshot's index), so that "nothing changed"
//! cannot pass because a craft went stale. It wrecks T, hence last.
//!
//! Every cell runs, then the test fails listing the cells that failed (one line per cell of
//! the matrix is printed: run with `--nocapture` to see them all):
//!
//! ```sh
//! cargo test -p latchkey --test peer_attacks -- --nocapture
//! ```

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use latchkey_core::{GroupShape, LockTable, Op, Outcome, SessionKey};
use latchkey_proto::v1 as pb;
use latchkey_proto::v1::locks_client::LocksClient;
use latchkey_proto::v1::raft_peer_client::RaftPeerClient;
use latchkey_raft::{
    AppendEntriesRequest, Entry, EntryPayload, LogCommand, LogId, Membership, Node, SnapshotMeta,
    StoredMembership, TypeConfig, Vote, VoteRequest,
};
use latchkey_server::peer_auth::{
    ClusterId, ClusterSecret, PeerAuth, PeerMethod, CLUSTER_HEADER, FROM_HEADER, GROUP_HEADER,
    MAC_HEADER,
};
use latchkey_server::peer_wire::{self, AppendFrame, Ballot};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use tonic::codegen::tokio_stream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use common::{free_port, http_get, wait_until};

/// How long one attack, or one observation, may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a member may take to answer `NodeStatus`.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a member may take to log the refusal of a call that has returned.
const LOG_TIMEOUT: Duration = Duration::from_secs(10);
/// The cluster secret of the setups with one.
const SECRET: &[u8] = b"attack-matrix-cluster-secret-0123456789";
/// A session that never expires during the test (the TTL's maximum), so that nothing is
/// proposed while the cells run (a lease mark comes at half the TTL).
const HOLDER_TTL_MS: u64 = latchkey_core::limits::SESSION_TTL_MS_MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    Mtls,
    MtlsSecret,
    PlainSecret,
}

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::Mtls => "mtls",
            Setup::MtlsSecret => "mtls+secret",
            Setup::PlainSecret => "plain+secret",
        }
    }

    fn tls(self) -> bool {
        self != Setup::PlainSecret
    }

    fn secret(self) -> bool {
        self != Setup::Mtls
    }

    fn groups(self) -> u32 {
        match self {
            Setup::PlainSecret => 2,
            _ => 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rpc {
    Vote,
    PreVote,
    TransferLeader,
    Append,
    AppendStream,
    Snapshot,
}

/// The snapshot rows last: on today's code they change the target, and the other rows should
/// be judged on a target the attacks have not touched.
const RPCS: [Rpc; 6] = [
    Rpc::Vote,
    Rpc::PreVote,
    Rpc::TransferLeader,
    Rpc::Append,
    Rpc::AppendStream,
    Rpc::Snapshot,
];

impl Rpc {
    fn name(self) -> &'static str {
        match self {
            Rpc::Vote => "vote",
            Rpc::PreVote => "pre-vote",
            Rpc::TransferLeader => "transfer-leader",
            Rpc::Append => "append",
            Rpc::AppendStream => "append-stream",
            Rpc::Snapshot => "snapshot",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sender {
    NoCert,
    ClientCert,
    MemberCert,
    OtherCluster,
    WrongMac,
    NoMac,
    ReplayMember,
    ReplayGroup,
    ItemForOther,
    ItemWrongMac,
    ItemNoMac,
    ItemOtherKind,
    ItemOtherTransfer,
    ItemOutOfPlace,
    GroupNotANumber,
    GroupNotHere,
    FromOversized,
    ClusterOversized,
    MacMalformed,
    RewriteCommitted,
    /// Not in [`SENDERS`]: its cells run after the others, once M was removed ([`removed`]).
    Removed,
}

const SENDERS: [Sender; 20] = [
    Sender::NoCert,
    Sender::ClientCert,
    Sender::MemberCert,
    Sender::OtherCluster,
    Sender::WrongMac,
    Sender::NoMac,
    Sender::ReplayMember,
    Sender::ReplayGroup,
    Sender::ItemForOther,
    Sender::ItemWrongMac,
    Sender::ItemNoMac,
    Sender::ItemOtherKind,
    Sender::ItemOtherTransfer,
    Sender::ItemOutOfPlace,
    Sender::GroupNotANumber,
    Sender::GroupNotHere,
    Sender::FromOversized,
    Sender::ClusterOversized,
    Sender::MacMalformed,
    Sender::RewriteCommitted,
];

/// The size of the oversized metadata values the `*-oversized` and `mac-malformed` rows send:
/// far beyond any value a member sends, within what HTTP/2 carries (so that it reaches the
/// member's checks rather than the transport's).
const OVERSIZED: usize = 4096;

impl Sender {
    fn name(self) -> &'static str {
        match self {
            Sender::NoCert => "no-cert",
            Sender::ClientCert => "client-cert",
            Sender::MemberCert => "member-cert",
            Sender::OtherCluster => "other-cluster",
            Sender::WrongMac => "wrong-mac",
            Sender::NoMac => "no-mac",
            Sender::ReplayMember => "replay-member",
            Sender::ReplayGroup => "replay-group",
            Sender::ItemForOther => "item-for-other-member",
            Sender::ItemWrongMac => "item-wrong-mac",
            Sender::ItemNoMac => "item-no-mac",
            Sender::ItemOtherKind => "item-other-kind",
            Sender::ItemOtherTransfer => "item-other-transfer",
            Sender::ItemOutOfPlace => "item-out-of-place",
            Sender::GroupNotANumber => "group-abc",
            Sender::GroupNotHere => "group-99",
            Sender::FromOversized => "from-oversized",
            Sender::ClusterOversized => "cluster-oversized",
            Sender::MacMalformed => "mac-malformed",
            Sender::RewriteCommitted => "rewrite-committed",
            Sender::Removed => "removed-member",
        }
    }

    /// The `reason` label of `latchkey_peer_refused_total` that this row's refusal counts
    /// under on T (`None`: refused at the TLS handshake, a client refusal, not a peer RPC's).
    fn counted_as(self) -> Option<&'static str> {
        Some(match self {
            Sender::NoCert => return None,
            Sender::ClientCert | Sender::MemberCert => "not-member-certificate",
            Sender::OtherCluster | Sender::ReplayGroup | Sender::ClusterOversized => {
                "other-cluster"
            }
            Sender::WrongMac
            | Sender::ReplayMember
            | Sender::ItemForOther
            | Sender::ItemWrongMac
            | Sender::ItemOtherKind
            | Sender::MacMalformed => "bad-mac",
            Sender::NoMac | Sender::ItemNoMac => "no-mac",
            Sender::ItemOtherTransfer | Sender::ItemOutOfPlace => "out-of-place",
            Sender::GroupNotANumber | Sender::GroupNotHere => "unknown-group",
            Sender::FromOversized => "no-sender",
            Sender::RewriteCommitted => "rewrites-committed",
            Sender::Removed => "removed-member",
        })
    }

    /// Whether this row is about the items of a stream (its headers are L's own, valid).
    fn about_items(self) -> bool {
        matches!(
            self,
            Sender::ItemForOther
                | Sender::ItemWrongMac
                | Sender::ItemNoMac
                | Sender::ItemOtherKind
                | Sender::ItemOtherTransfer
                | Sender::ItemOutOfPlace
        )
    }

    /// Whether the cell of this row and `rpc` exists: the item rows are the stream RPCs' only
    /// (a unary RPC has no items; they are not listed for it), `rewrite-committed` is about
    /// appends.
    fn applies_to(self, rpc: Rpc) -> bool {
        match self {
            Sender::RewriteCommitted => matches!(rpc, Rpc::Append | Rpc::AppendStream),
            _ => !self.about_items() || matches!(rpc, Rpc::AppendStream | Rpc::Snapshot),
        }
    }

    /// Why this sender's row does not apply to `setup` and `rpc`, if it does not.
    fn skipped_in(self, setup: Setup, rpc: Rpc) -> Option<&'static str> {
        match self {
            Sender::NoCert | Sender::ClientCert | Sender::MemberCert if !setup.tls() => {
                Some("plaintext: no certificate to leave out or misuse")
            }
            Sender::WrongMac | Sender::NoMac if !setup.secret() => {
                Some("no cluster secret: no MAC to get wrong")
            }
            Sender::ReplayMember if !setup.secret() => Some(
                "no cluster secret: nothing binds a message to its receiver, and a sender with \
                 L's certificate is L",
            ),
            Sender::ReplayGroup if setup.groups() == 1 => {
                Some("one Raft group: the group replay runs in plain+secret (--groups 2)")
            }
            Sender::ItemForOther
            | Sender::ItemWrongMac
            | Sender::ItemNoMac
            | Sender::ItemOtherKind
                if !setup.secret() =>
            {
                Some("no cluster secret: a stream's items carry no MAC")
            }
            Sender::ItemOtherTransfer if rpc == Rpc::AppendStream => Some(
                "a stream of appends is the one its first append names: item-out-of-place \
                 covers an append's place",
            ),
            Sender::MacMalformed if !setup.secret() => {
                Some("no cluster secret: no MAC header is read")
            }
            _ => None,
        }
    }
}

/// How a cell must be refused.
#[derive(Debug, Clone)]
enum Refusal {
    /// `PERMISSION_DENIED` whose message contains this, and a line of T's log saying "refused
    /// a peer message" and this.
    Denied(String),
    /// The TLS handshake fails for want of a client certificate (no RPC is served): the client
    /// reads the server's `certificate_required` alert, T counts a `no-certificate` refusal on
    /// `/metrics` and logs it.
    Handshake,
}

/// What an attacker sends, and how.
struct Plan {
    /// The client certificate the connection presents (its CN), with mTLS.
    cert: Option<String>,
    /// How the message (a stream: its headers) is signed: the member it claims, the
    /// fingerprint, the secret.
    auth: PeerAuth,
    /// The receiver its signature names.
    signed_for: u64,
    /// Metadata set after signing, over what the signer put: (key, value).
    metadata: Vec<(&'static str, String)>,
    /// How a stream's items are made.
    items: Items,
    refusal: Refusal,
}

/// How the items of a stream are signed and placed.
struct Items {
    /// Signed by (a sender whose secret is another, or none: no MAC).
    auth: PeerAuth,
    /// For this receiver.
    to: u64,
    /// MAC'd as the other kind of item (an append's in a snapshot stream, and vice versa).
    other_kind: bool,
    place: Place,
}

/// Where the items of a stream are, each signed as it is (its MAC verifies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In order: the snapshot's chunks of one transfer, or an append that is the stream's
    /// first.
    InOrder,
    /// The snapshot's data chunks taken from another transfer of the same snapshot.
    OtherTransfer,
    /// A snapshot's first chunk (its header) again where its data must come; an append that
    /// says it is the stream's second, alone.
    Misplaced,
}

/// A CA and the means to sign certificates with it (as `tls.rs`'s).
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
    pem: PathBuf,
}

impl Ca {
    fn new(dir: &Path) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "attack-matrix CA");
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let pem = dir.join("ca.pem");
        std::fs::write(&pem, cert.pem()).unwrap();
        Ca { cert, key, pem }
    }

    /// A certificate for 127.0.0.1 naming `name` (CN), written as `NAME.pem` and `NAME.key`.
    fn issue(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let paths = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&paths.0, cert.pem()).unwrap();
        std::fs::write(&paths.1, key.serialize_pem()).unwrap();
        paths
    }
}

/// One `latchkey serve` member, killed when dropped; its stderr goes to `log`.
struct Member {
    id: u64,
    port: u16,
    metrics_port: u16,
    child: Child,
    log: PathBuf,
}

impl Member {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The target's own view of one Raft group (its `NodeStatus`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct GroupSeen {
    group: u32,
    role: String,
    term: u64,
    leader: u64,
    last_log_index: u64,
    applied_index: u64,
    sessions: u64,
    locks: u64,
}

/// What an observer sees of the target and the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    /// The target's own view of each group.
    groups: Vec<GroupSeen>,
    /// The target's `/metrics` gauges of its Raft state and table.
    metrics: Vec<String>,
    /// The held lock as its group's leader describes it: (held, session, token).
    lock: (bool, u64, u64),
    /// `list` at that leader: (name, session, token).
    listed: Vec<(String, u64, u64)>,
}

struct Cluster {
    setup: Setup,
    dir: tempfile::TempDir,
    ca: Option<Ca>,
    members: Vec<Member>,
    /// `--peers` as a map: the cluster's id is derived from it.
    peers: BTreeMap<u64, String>,
    rt: tokio::runtime::Runtime,
}

/// Metric lines kept in [`Seen::metrics`] (by name prefix).
const GAUGES: [&str; 9] = [
    "latchkey_raft_term ",
    "latchkey_raft_is_leader ",
    "latchkey_raft_last_log_index ",
    "latchkey_raft_applied_index ",
    "latchkey_sessions ",
    "latchkey_locks ",
    "latchkey_snapshots_installed",
    "latchkey_group_last_log_index",
    "latchkey_group_is_leader",
];

impl Cluster {
    /// Starts the setup's cluster and waits until its groups are led. A port found free can be
    /// taken by another process before a member binds it: then it starts over on new ports.
    fn start(setup: Setup) -> Cluster {
        let mut last = String::new();
        for _ in 0..3 {
            let mut cluster = Cluster::spawn(setup);
            match cluster.wait_for_leaders() {
                Ok(()) => return cluster,
                Err(e) => last = format!("{e}\n{}", cluster.logs()),
            }
        }
        panic!("{}: the cluster did not start: {last}", setup.name());
    }

    fn spawn(setup: Setup) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let ca = setup.tls().then(|| Ca::new(dir.path()));
        let secret = dir.path().join("cluster.secret");
        std::fs::write(&secret, SECRET).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let peers: BTreeMap<u64, String> = (1..=3u64)
            .zip(&ports)
            .map(|(id, port)| (id, format!("127.0.0.1:{port}")))
            .collect();
        let peers_flag = peers
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect::<Vec<_>>()
            .join(",");
        let members = (1..=3u64)
            .zip(ports)
            .map(|(id, port)| {
                let metrics_port = free_port();
                let log = dir.path().join(format!("member-{id}.log"));
                let mut cmd = Command::new(common::bin());
                cmd.arg("serve")
                    .args(["--id", &id.to_string()])
                    .args(["--listen", &format!("127.0.0.1:{port}")])
                    .args(["--peers", &peers_flag])
                    .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
                    .args(["--groups", &setup.groups().to_string()])
                    // Longer than the default, so that a member slowed down by a busy machine
                    // does not start an election that a cell would count as a change.
                    .args([
                        "--heartbeat-ms",
                        "200",
                        "--election-timeout-ms",
                        "1500..3000",
                    ])
                    .arg("--data-dir")
                    .arg(dir.path().join(format!("data-{id}")));
                if let Some(ca) = &ca {
                    let (cert, key) = ca.issue(dir.path(), &format!("member-{id}"));
                    cmd.arg("--tls-cert")
                        .arg(cert)
                        .arg("--tls-key")
                        .arg(key)
                        .arg("--tls-ca")
                        .arg(&ca.pem);
                }
                if setup.secret() {
                    cmd.arg("--cluster-secret-file").arg(&secret);
                }
                let child = cmd
                    // A refused handshake is logged at debug, and so is a non-member's refusal
                    // after its first (the `removed-member` cells are six of member M's).
                    .env(
                        "RUST_LOG",
                        "info,latchkey_server::access::tls=debug,latchkey_server::cluster::peer=debug",
                    )
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).unwrap())
                    .spawn()
                    .unwrap();
                Member {
                    id,
                    port,
                    metrics_port,
                    child,
                    log,
                }
            })
            .collect();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        if let Some(ca) = &ca {
            ca.issue(dir.path(), "observer");
            ca.issue(dir.path(), "intruder");
        }
        Cluster {
            setup,
            dir,
            ca,
            members,
            peers,
            rt,
        }
    }

    fn member(&self, id: u64) -> &Member {
        &self.members[(id - 1) as usize]
    }

    /// The last lines of every member's log, for a failure message.
    fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let log = m.log();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                format!("--- member {} ---\n{tail}\n", m.id)
            })
            .collect()
    }

    /// A gRPC channel to member `id`, presenting the certificate named `cert` (with TLS).
    fn channel(&self, id: u64, cert: Option<&str>) -> Channel {
        let _in_runtime = self.rt.enter();
        let port = self.member(id).port;
        match &self.ca {
            None => Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
                .unwrap()
                .connect_timeout(Duration::from_secs(5))
                .connect_lazy(),
            Some(ca) => {
                let mut tls = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(std::fs::read(&ca.pem).unwrap()));
                if let Some(name) = cert {
                    let read = |ext: &str| {
                        std::fs::read(self.dir.path().join(format!("{name}.{ext}"))).unwrap()
                    };
                    tls = tls.identity(Identity::from_pem(read("pem"), read("key")));
                }
                Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
                    .unwrap()
                    .connect_timeout(Duration::from_secs(5))
                    .tls_config(tls)
                    .unwrap()
                    .connect_lazy()
            }
        }
    }

    fn client(&self, id: u64) -> LocksClient<Channel> {
        LocksClient::new(self.channel(id, Some("observer")))
    }

    fn node_status(&self, id: u64) -> Option<pb::NodeStatusResponse> {
        let mut c = self.client(id);
        self.rt
            .block_on(async {
                tokio::time::timeout(STATUS_TIMEOUT, c.node_status(pb::NodeStatusRequest {})).await
            })
            .ok()?
            .ok()
            .map(|r| r.into_inner())
    }

    /// Each group's status in a member's `NodeStatus`, in group order.
    fn groups_of(status: &pb::NodeStatusResponse) -> Vec<pb::GroupStatus> {
        status.group_status.clone()
    }

    /// Waits (bounded) until every member knows the same leader for every group and has
    /// applied that leader's entries; `Err` if that does not come, or a member exits.
    fn wait_for_leaders(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            for m in &mut self.members {
                if let Ok(Some(status)) = m.child.try_wait() {
                    return Err(format!("member {} exited ({status})", m.id));
                }
            }
            if self.led() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("no leader known to every member of every group within 60 s".into());
            }
            std::thread::sleep(common::POLL);
        }
    }

    /// Whether every member knows the same leader for every group, none is a candidate, and
    /// each has applied entries.
    fn led(&self) -> bool {
        let all: Option<Vec<_>> = (1..=3).map(|id| self.node_status(id)).collect();
        let Some(all) = all else { return false };
        let groups: Vec<Vec<(u64, u64)>> = all
            .iter()
            .map(|s| {
                Cluster::groups_of(s)
                    .iter()
                    .map(|g| (g.leader_id, g.term))
                    .collect()
            })
            .collect();
        groups[0].len() == self.setup.groups() as usize
            && groups.iter().all(|g| *g == groups[0])
            && groups[0].iter().all(|(leader, _)| *leader != 0)
            && all.iter().all(|s| {
                Cluster::groups_of(s)
                    .iter()
                    .all(|g| g.applied_index > 0 && g.role != "candidate")
            })
    }

    /// Group 0's leader and term, as member 1 sees them.
    fn leader0(&self) -> (u64, u64) {
        let s = self.node_status(1).expect("member 1 answers");
        let g = &Cluster::groups_of(&s)[0];
        (g.leader_id, g.term)
    }

    /// A lock name of group 0.
    fn name_in_group0(&self) -> String {
        (0..)
            .map(|i| format!("deploy/x{i}"))
            .find(|n| latchkey_core::group_of(n, self.setup.groups()) == 0)
            .unwrap()
    }

    /// A session with the longest TTL holding `name`, made at group 0's leader: (session, token).
    fn hold(&self, leader: u64, name: &str) -> (pb::Session, u64) {
        let mut c = self.client(leader);
        let group = (self.setup.groups() > 1).then_some(0);
        self.rt.block_on(async {
            let session = c
                .create_session(pb::CreateSessionRequest {
                    ttl_ms: HOLDER_TTL_MS,
                    owner: None,
                    group,
                })
                .await
                .expect("a session")
                .into_inner()
                .session
                .unwrap();
            let granted = c
                .acquire(pb::AcquireRequest {
                    session: Some(session),
                    seq: 1,
                    name: name.to_owned(),
                    wait_timeout_ms: 0,
                    ..Default::default()
                })
                .await
                .expect("the lock")
                .into_inner();
            assert!(granted.token > 0, "{granted:?}");
            (session, granted.token)
        })
    }

    /// What is seen of target `t`, and of the lock `name` at its group's leader (`leader`
    /// first, then any member that answers as leader), or why it could not be seen.
    fn seen(&self, t: u64, leader: u64, name: &str) -> Result<Seen, String> {
        let status = self
            .node_status(t)
            .ok_or_else(|| format!("member {t} does not answer NodeStatus"))?;
        let groups = Cluster::groups_of(&status)
            .into_iter()
            .map(|g| GroupSeen {
                group: g.group,
                role: g.role,
                term: g.term,
                leader: g.leader_id,
                last_log_index: g.last_log_index,
                applied_index: g.applied_index,
                sessions: g.sessions,
                locks: g.locks,
            })
            .collect();
        let metrics_addr = format!("127.0.0.1:{}", self.member(t).metrics_port);
        let body = match http_get(&metrics_addr, "/metrics") {
            Some((200, body)) => body,
            other => return Err(format!("member {t}'s /metrics answered {other:?}")),
        };
        let metrics = body
            .lines()
            .filter(|l| GAUGES.iter().any(|g| l.starts_with(g)))
            .map(str::to_owned)
            .collect();
        let group = (self.setup.groups() > 1).then_some(0);
        let mut last = String::new();
        for at in std::iter::once(leader).chain((1..=3).filter(|&id| id != leader)) {
            let mut c = self.client(at);
            let read = self.rt.block_on(async {
                let lock = c
                    .describe(pb::DescribeRequest {
                        name: name.to_owned(),
                    })
                    .await?
                    .into_inner()
                    .lock
                    .unwrap_or_default();
                let listed = c
                    .list(pb::ListRequest {
                        prefix: String::new(),
                        limit: 0,
                        group,
                    })
                    .await?
                    .into_inner()
                    .locks
                    .into_iter()
                    .map(|l| (l.name, l.session, l.token))
                    .collect();
                Ok::<_, Status>(((lock.held, lock.session, lock.token), listed))
            });
            match read {
                Ok((lock, listed)) => {
                    return Ok(Seen {
                        groups,
                        metrics,
                        lock,
                        listed,
                    })
                }
                Err(s) => last = format!("member {at}: {:?}: {}", s.code(), s.message()),
            }
        }
        Err(format!("no member serves a read of {name}: {last}"))
    }

    /// How many handshakes without a client certificate member `id` refused, by its
    /// `/metrics` (`latchkey_auth_refused_total{reason="no-certificate"}`).
    fn no_certificate_refusals(&self, id: u64) -> Option<u64> {
        let addr = format!("127.0.0.1:{}", self.member(id).metrics_port);
        let (200, body) = http_get(&addr, "/metrics")? else {
            return None;
        };
        let counted = body.lines().find_map(|l| {
            l.strip_prefix(r#"latchkey_auth_refused_total{reason="no-certificate"} "#)
        });
        // No line: nothing counted yet.
        counted.map_or(Ok(0), str::parse).ok()
    }

    /// The peer RPCs member `id` refused, by reason, by its `/metrics`
    /// (`latchkey_peer_refused_total{reason}`); `None` if it could not be read.
    fn peer_refusals(&self, id: u64) -> Option<BTreeMap<String, u64>> {
        let addr = format!("127.0.0.1:{}", self.member(id).metrics_port);
        let (200, body) = http_get(&addr, "/metrics")? else {
            return None;
        };
        body.lines()
            .filter_map(|l| l.strip_prefix(r#"latchkey_peer_refused_total{reason=""#))
            .map(|l| {
                let (reason, n) = l.split_once(r#""} "#)?;
                Some((reason.to_owned(), n.parse().ok()?))
            })
            .collect()
    }

    /// The sender's plan for `rpc` against target `t` of leader `l` (`m`: the third member).
    fn plan(&self, sender: Sender, rpc: Rpc, l: u64, t: u64, m: u64) -> Plan {
        let shape = GroupShape::new(0, self.setup.groups()).unwrap();
        let cluster = ClusterId::founded_by(&self.peers);
        let secret = || {
            self.setup
                .secret()
                .then(|| ClusterSecret::new(SECRET.to_vec()))
        };
        let as_leader = |cluster: ClusterId, secret: Option<ClusterSecret>| {
            PeerAuth::new(l, cluster, secret).with_group(shape, 0)
        };
        let leader_cert = self.setup.tls().then(|| format!("member-{l}"));
        let names_leader = Refusal::Denied(format!("certificate naming `member-{l}`"));
        let other_secret = || {
            Some(ClusterSecret::new(
                b"another-cluster-secret-0123456789".to_vec(),
            ))
        };
        // A stream of L's, whose headers are L's own and whose items are made as `items` says.
        let items = |auth: PeerAuth, to: u64, other_kind: bool, place: Place, says: &str| Plan {
            items: Items {
                auth,
                to,
                other_kind,
                place,
            },
            refusal: Refusal::Denied(says.to_owned()),
            ..self.plan_real(l, t)
        };
        let out_of_place = match rpc {
            Rpc::Snapshot => "a snapshot chunk out of place",
            _ => "out of place (expected append 0",
        };
        // L's message with one metadata value replaced.
        let with = |key: &'static str, value: String, says: &str| Plan {
            metadata: vec![(key, value)],
            refusal: Refusal::Denied(says.to_owned()),
            ..self.plan_real(l, t)
        };
        let credentials = |cert: Option<String>, auth: PeerAuth, signed_for: u64| Plan {
            cert,
            items: Items {
                auth: auth.clone(),
                to: signed_for,
                other_kind: false,
                place: Place::InOrder,
            },
            auth,
            signed_for,
            ..self.plan_real(l, t)
        };
        let refused = |plan: Plan, refusal: Refusal| Plan { refusal, ..plan };
        match sender {
            Sender::NoCert => refused(
                credentials(None, as_leader(cluster, secret()), t),
                Refusal::Handshake,
            ),
            Sender::ClientCert => refused(
                credentials(Some("intruder".to_owned()), as_leader(cluster, secret()), t),
                names_leader,
            ),
            Sender::MemberCert => refused(
                credentials(Some(format!("member-{m}")), as_leader(cluster, secret()), t),
                names_leader,
            ),
            Sender::OtherCluster => {
                let other: BTreeMap<u64, String> = (1..=3u64)
                    .map(|id| (id, format!("127.0.0.1:{}", 1 + id)))
                    .collect();
                refused(
                    credentials(
                        leader_cert,
                        as_leader(ClusterId::founded_by(&other), secret()),
                        t,
                    ),
                    Refusal::Denied("cluster fingerprint".to_owned()),
                )
            }
            Sender::WrongMac => refused(
                credentials(leader_cert, as_leader(cluster, other_secret()), t),
                Refusal::Denied("does not verify".to_owned()),
            ),
            Sender::NoMac => refused(
                credentials(leader_cert, as_leader(cluster, None), t),
                Refusal::Denied("requires its cluster secret".to_owned()),
            ),
            Sender::ReplayMember => refused(
                credentials(leader_cert, as_leader(cluster, secret()), m),
                Refusal::Denied("does not verify".to_owned()),
            ),
            Sender::ReplayGroup => Plan {
                metadata: vec![(GROUP_HEADER, "1".to_owned())],
                refusal: Refusal::Denied("cluster fingerprint".to_owned()),
                ..self.plan_real(l, t)
            },
            Sender::ItemForOther => items(
                as_leader(cluster, secret()),
                m,
                false,
                Place::InOrder,
                "does not verify",
            ),
            Sender::ItemWrongMac => items(
                as_leader(cluster, other_secret()),
                t,
                false,
                Place::InOrder,
                "does not verify",
            ),
            Sender::ItemNoMac => items(
                as_leader(cluster, None),
                t,
                false,
                Place::InOrder,
                "requires its cluster secret",
            ),
            Sender::ItemOtherKind => items(
                as_leader(cluster, secret()),
                t,
                true,
                Place::InOrder,
                "does not verify",
            ),
            Sender::ItemOtherTransfer => items(
                as_leader(cluster, secret()),
                t,
                false,
                Place::OtherTransfer,
                out_of_place,
            ),
            Sender::ItemOutOfPlace => items(
                as_leader(cluster, secret()),
                t,
                false,
                Place::Misplaced,
                out_of_place,
            ),
            Sender::GroupNotANumber => {
                with(GROUP_HEADER, "abc".to_owned(), "bad `latchkey-peer-group`")
            }
            Sender::GroupNotHere => with(GROUP_HEADER, "99".to_owned(), "no Raft group 99 here"),
            Sender::FromOversized => with(
                FROM_HEADER,
                "1".repeat(OVERSIZED),
                "no `latchkey-peer-from` member id",
            ),
            Sender::ClusterOversized => {
                with(CLUSTER_HEADER, "a".repeat(OVERSIZED), "cluster fingerprint")
            }
            Sender::MacMalformed => with(MAC_HEADER, "z".repeat(OVERSIZED), "does not verify"),
            Sender::RewriteCommitted => Plan {
                refusal: Refusal::Denied("where this member committed".to_owned()),
                ..self.plan_real(l, t)
            },
            Sender::Removed => {
                let as_m = || PeerAuth::new(m, cluster.clone(), secret()).with_group(shape, 0);
                Plan {
                    cert: self.setup.tls().then(|| format!("member-{m}")),
                    auth: as_m(),
                    signed_for: t,
                    metadata: Vec::new(),
                    items: Items {
                        auth: as_m(),
                        to: t,
                        other_kind: false,
                        place: Place::InOrder,
                    },
                    refusal: Refusal::Denied(format!(
                        "member {m} was removed from this group at log index"
                    )),
                }
            }
        }
    }

    /// L's own credentials, as L signs for `t`: the positive control's plan, and what every
    /// row but its own uses.
    fn plan_real(&self, l: u64, t: u64) -> Plan {
        let shape = GroupShape::new(0, self.setup.groups()).unwrap();
        let auth = || {
            let secret = self
                .setup
                .secret()
                .then(|| ClusterSecret::new(SECRET.to_vec()));
            PeerAuth::new(l, ClusterId::founded_by(&self.peers), secret).with_group(shape, 0)
        };
        Plan {
            cert: self.setup.tls().then(|| format!("member-{l}")),
            auth: auth(),
            signed_for: t,
            metadata: Vec::new(),
            items: Items {
                auth: auth(),
                to: t,
                other_kind: false,
                place: Place::InOrder,
            },
            refusal: Refusal::Denied(String::new()),
        }
    }

    /// Sends `rpc`'s crafted message to target `t` as `plan` says: `Ok` if it was taken.
    fn send(&self, rpc: Rpc, plan: &Plan, t: u64, craft: &Craft) -> Result<(), Status> {
        let mut client = RaftPeerClient::new(self.channel(t, plan.cert.as_deref()));
        let headers = |method: PeerMethod, payload: &[u8]| {
            let mut meta = tonic::metadata::MetadataMap::new();
            plan.auth.sign(&mut meta, method, plan.signed_for, payload);
            for (key, value) in &plan.metadata {
                meta.insert(*key, value.parse().expect("ASCII metadata"));
            }
            meta
        };
        // An item's MAC, as `plan.items` says: `kind` is the stream's own item kind.
        let sign_item = |kind: PeerMethod, header: &[u8], data: &[u8]| {
            let items = &plan.items;
            let kind = match (kind, items.other_kind) {
                (kind, false) => kind,
                (PeerMethod::AppendItem, true) => PeerMethod::SnapshotChunk,
                (_, true) => PeerMethod::AppendItem,
            };
            items.auth.sign_item(kind, items.to, header, data)
        };
        let unary = |payload: Vec<u8>, method: PeerMethod| {
            tonic::Request::from_parts(
                headers(method, &payload),
                tonic::Extensions::default(),
                pb::PeerMessage { payload },
            )
        };
        let call = async {
            match rpc {
                Rpc::Vote | Rpc::PreVote | Rpc::TransferLeader => {
                    let ballot = match rpc {
                        Rpc::Vote => Ballot::Vote(craft.vote.clone()),
                        Rpc::PreVote => Ballot::PreVote(craft.vote.clone()),
                        _ => Ballot::TransferLeader(craft.transfer.clone()),
                    };
                    let payload = peer_wire::encode(&ballot);
                    client
                        .vote(unary(payload, PeerMethod::Vote))
                        .await
                        .map(drop)
                }
                Rpc::Append => {
                    let payload = peer_wire::encode(&craft.append);
                    client
                        .append(unary(payload, PeerMethod::Append))
                        .await
                        .map(drop)
                }
                Rpc::AppendStream => {
                    let seq = match plan.items.place {
                        Place::Misplaced => 1,
                        _ => 0,
                    };
                    let header = peer_wire::encode(&AppendFrame { stream: 7, seq });
                    let data = peer_wire::encode(&craft.append);
                    let mac = sign_item(PeerMethod::AppendItem, &header, &data);
                    let item = pb::PeerChunk {
                        payload: header,
                        data,
                        mac,
                    };
                    let request = tonic::Request::from_parts(
                        headers(PeerMethod::AppendStream, &[]),
                        tonic::Extensions::default(),
                        tokio_stream::iter(vec![item]),
                    );
                    let mut answers = client.append_stream(request).await?.into_inner();
                    while answers.message().await?.is_some() {}
                    Ok(())
                }
                Rpc::Snapshot => {
                    // Unsigned (each is signed below, as the plan says), of transfer `transfer`.
                    let chunks = |transfer: u64| {
                        let (vote, meta, data) = craft.snapshot.clone();
                        peer_wire::snapshot_chunks(None, t, transfer, vote, meta, data)
                            .collect::<Vec<_>>()
                    };
                    let mine = chunks(9);
                    let chunks: Vec<pb::PeerChunk> = match plan.items.place {
                        Place::InOrder => mine,
                        Place::OtherTransfer => {
                            mine[..1].iter().chain(&chunks(10)[1..]).cloned().collect()
                        }
                        Place::Misplaced => mine[..1].iter().chain(&mine).cloned().collect(),
                    };
                    let chunks = chunks
                        .into_iter()
                        .map(|c| pb::PeerChunk {
                            mac: sign_item(PeerMethod::SnapshotChunk, &c.payload, &c.data),
                            ..c
                        })
                        .collect::<Vec<_>>();
                    let request = tonic::Request::from_parts(
                        headers(PeerMethod::Snapshot, &[]),
                        tonic::Extensions::default(),
                        tokio_stream::iter(chunks),
                    );
                    client.snapshot(request).await.map(drop)
                }
            }
        };
        self.rt.block_on(async {
            tokio::time::timeout(CALL_TIMEOUT, call)
                .await
                .unwrap_or_else(|_| Err(Status::deadline_exceeded("the attack call hung")))
        })
    }

    /// Removes member `m` with `latchkey cluster remove` and stops its process, then waits
    /// (bounded) until the members left, `l` and `t`, agree on every group's leader and `t` has
    /// applied all of its leaders' log (with `--groups`, M may have led a group, which then
    /// elects another leader): the state the `removed-member` cells start from.
    fn remove(&mut self, m: u64, (l, t): (u64, u64)) {
        let mut args = vec!["cluster".to_owned(), "remove".to_owned(), m.to_string()];
        args.extend(self.client_flags());
        let out = common::run(&args, self.dir.path(), common::CLI_TIMEOUT);
        assert!(
            out.status.success(),
            "cluster remove {m}: {}{}\n{}",
            out.stdout,
            out.stderr,
            self.logs()
        );
        let member = &mut self.members[(m - 1) as usize];
        let _ = member.child.kill();
        let _ = member.child.wait();
        let settled = || {
            let (Some(at_l), Some(at_t)) = (self.node_status(l), self.node_status(t)) else {
                return false;
            };
            let (gl, gt) = (Cluster::groups_of(&at_l), Cluster::groups_of(&at_t));
            gl.len() == gt.len()
                && gl.iter().zip(&gt).all(|(a, b)| {
                    let leader = if a.leader_id == l { a } else { b };
                    a.leader_id != 0
                        && a.leader_id == b.leader_id
                        && a.term == b.term
                        && b.last_log_index == leader.last_log_index
                        && b.applied_index == leader.applied_index
                        && a.applied_index == leader.applied_index
                })
        };
        wait_until(
            &format!("members {l} and {t} settle after member {m}'s removal"),
            Duration::from_secs(60),
            settled,
        );
    }

    /// The client flags of a real client of this cluster.
    fn client_flags(&self) -> Vec<String> {
        let endpoints = self
            .members
            .iter()
            .map(|m| match self.setup.tls() {
                true => format!("https://127.0.0.1:{}", m.port),
                false => format!("127.0.0.1:{}", m.port),
            })
            .collect::<Vec<_>>()
            .join(",");
        let mut flags = vec!["--endpoints".to_owned(), endpoints];
        if let Some(ca) = &self.ca {
            let file = |ext: &str| self.dir.path().join(format!("observer.{ext}"));
            flags.extend([
                "--ca".to_owned(),
                ca.pem.display().to_string(),
                "--cert".to_owned(),
                file("pem").display().to_string(),
                "--key".to_owned(),
                file("key").display().to_string(),
            ]);
        }
        flags
    }
}

/// The attacker's messages, built from the target's state (term `term`, last log index `last`,
/// leader `l`, target `t`).
struct Craft {
    /// For L at term + 100, with a log far ahead of everyone's.
    vote: VoteRequest,
    /// L's vote, naming T its successor: T would campaign at once, deposing L.
    transfer: openraft::raft::TransferLeaderRequest<TypeConfig>,
    /// L's vote, one entry after T's last that expires the holder's session, committed.
    append: AppendEntriesRequest,
    /// L's vote, a snapshot at a high index where the attacker's session holds the lock.
    snapshot: (Vote, SnapshotMeta, Vec<u8>),
}

fn leader_log_id(term: u64, leader: u64, index: u64) -> LogId {
    LogId::new(
        openraft::type_config::alias::CommittedLeaderIdOf::<TypeConfig> {
            term,
            node_id: leader,
        },
        index,
    )
}

/// The sender a craft speaks for: the member it claims to be (L, or the removed member) and
/// the term of the committed vote it claims (L's term, or one above it: a forged vote).
#[derive(Debug, Clone, Copy)]
struct Claim {
    leader: u64,
    term: u64,
}

#[allow(clippy::too_many_arguments)]
fn craft(
    l: u64,
    claim: Claim,
    t: u64,
    term: u64,
    last: u64,
    holder: u64,
    name: &str,
    shape: GroupShape,
    members: &BTreeMap<u64, String>,
    snapshot_index: u64,
) -> Craft {
    // T's log is L's: its last entry is L's (`term`, L), which an append must follow.
    let Claim {
        leader: claimed,
        term: claimed_term,
    } = claim;
    let vote = VoteRequest {
        vote: Vote::new(claimed_term + 100, claimed),
        last_log_id: Some(leader_log_id(term, l, last + 1_000_000)),
        leadership_transfer: false,
    };
    let transfer = openraft::raft::TransferLeaderRequest::new(
        Vote::new_committed(claimed_term, claimed),
        t,
        Some(leader_log_id(term, l, last)),
    );
    let expire = latchkey_core::Command {
        now_ms: 0,
        op: Op::ExpireSessions {
            ids: vec![latchkey_core::SessionId(holder)],
        },
    };
    let next = leader_log_id(claimed_term, claimed, last + 1);
    let append = AppendEntriesRequest {
        vote: Vote::new_committed(claimed_term, claimed),
        prev_log_id: Some(leader_log_id(term, l, last)),
        entries: vec![Entry {
            log_id: next,
            payload: EntryPayload::Normal(LogCommand(expire)),
        }],
        leader_commit: Some(next),
    };
    // The attacker's session opens one entry before the snapshot's index and takes the lock at
    // it (a token the real holder's is far below).
    let mut table = LockTable::new();
    table.set_shape(shape);
    let opened = table.apply(
        snapshot_index - 1,
        &latchkey_core::Command {
            now_ms: 0,
            op: Op::OpenSession {
                ttl_ms: HOLDER_TTL_MS,
                secret: 99,
                identity: Some("intruder".to_owned()),
                owner: None,
            },
        },
    );
    let Outcome::SessionCreated { id, .. } = opened.outcome else {
        panic!("the attacker's session: {:?}", opened.outcome);
    };
    let taken = table.apply(
        snapshot_index,
        &latchkey_core::Command {
            now_ms: 0,
            op: Op::Acquire {
                session: SessionKey { id, secret: 99 },
                seq: 1,
                name: name.to_owned(),
                wait_ms: 0,
            },
        },
    );
    assert!(
        matches!(taken.outcome, Outcome::Granted { .. }),
        "{:?}",
        taken.outcome
    );
    let nodes: BTreeMap<u64, Node> = members
        .iter()
        .map(|(id, addr)| (*id, Node { addr: addr.clone() }))
        .collect();
    let membership = StoredMembership::new(
        Some(leader_log_id(0, 0, 0)),
        Membership::new(vec![nodes.keys().copied().collect::<BTreeSet<_>>()], nodes).unwrap(),
    );
    let at = Some(leader_log_id(claimed_term, claimed, snapshot_index));
    let data = latchkey_raft::snapshot::encode(&at, &membership, &Default::default(), &table);
    let meta = SnapshotMeta {
        last_log_id: at,
        last_membership: membership,
    };
    Craft {
        vote,
        transfer,
        append,
        snapshot: (Vote::new_committed(claimed_term, claimed), meta, data),
    }
}

/// L's own append, a term above its own, that puts another entry (expiring the holder's
/// session) at T's last index, which T committed (T's last two entries are L's, of `term`:
/// the grant's session and acquire, or later L's membership change). A member's lie, not a
/// stranger's: openraft asserts that an entry at or below the committed index is at most the
/// committed one, and the follower's core stops.
fn rewrite_committed(l: u64, term: u64, last: u64, holder: u64) -> AppendEntriesRequest {
    let expire = latchkey_core::Command {
        now_ms: 0,
        op: Op::ExpireSessions {
            ids: vec![latchkey_core::SessionId(holder)],
        },
    };
    let rewritten = leader_log_id(term + 1, l, last);
    AppendEntriesRequest {
        vote: Vote::new_committed(term + 1, l),
        prev_log_id: Some(leader_log_id(term, l, last - 1)),
        entries: vec![Entry {
            log_id: rewritten,
            payload: EntryPayload::Normal(LogCommand(expire)),
        }],
        leader_commit: Some(rewritten),
    }
}

/// What a client reads when a member refuses its handshake for want of a certificate: the
/// TLS 1.3 `certificate_required` alert, as rustls names it.
const CERTIFICATE_REQUIRED: &str = "received fatal alert: CertificateRequired";

/// How hyper reports a request it had queued on a connection that closed before the request
/// was sent (the end of the status's chain of causes).
const CLOSED_BEFORE_SENT: &str = "operation was canceled: connection closed";

/// A status with its chain of causes, as the latchkey client reads a transport failure
/// (`transport_message` in `crates/client/src/error.rs`).
fn error_chain(status: &Status) -> String {
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

/// `text` cut to a line of the matrix's output.
fn cut(mut text: String) -> String {
    const MAX: usize = 300;
    if text.len() > MAX {
        let mut end = MAX;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

/// One cell's result: how it was refused (as it must be), or what went wrong.
type CellResult = Result<String, String>;

/// Runs one cell; what went wrong, if anything.
fn run_cell(
    c: &Cluster,
    rpc: Rpc,
    sender: Sender,
    (l, t, m): (u64, u64, u64),
    name: &str,
    holder: u64,
    snapshot_index: u64,
) -> CellResult {
    let before = c
        .seen(t, l, name)
        .map_err(|e| format!("before the attack: {e}"))?;
    let g0 = &before.groups[0];
    let (term, last) = (g0.term, g0.last_log_index);
    let shape = GroupShape::new(0, c.setup.groups()).unwrap();
    let claim = match sender {
        // The removed member M speaks for itself, with a committed vote above L's.
        Sender::Removed => Claim {
            leader: m,
            term: term + 1,
        },
        _ => Claim { leader: l, term },
    };
    let mut craft = craft(
        l,
        claim,
        t,
        term,
        last,
        holder,
        name,
        shape,
        &c.peers,
        snapshot_index,
    );
    if sender == Sender::RewriteCommitted {
        craft.append = rewrite_committed(l, term, last, holder);
    }
    let plan = c.plan(sender, rpc, l, t, m);
    let log_before = c.member(t).log().len();
    let no_cert_before = c.no_certificate_refusals(t);
    let peer_refused_before = c.peer_refusals(t);
    let answer = c.send(rpc, &plan, t, &craft);
    let mut wrong = Vec::new();
    // What T counts: a refused peer RPC is one more of its reason, and nothing else (counted
    // before the refusal is answered, so read at once); a refused handshake is no peer RPC.
    let peer_refused_after = c.peer_refusals(t);
    let mut expected = peer_refused_before.clone().unwrap_or_default();
    if let (Some(reason), Err(_)) = (sender.counted_as(), &answer) {
        *expected.entry(reason.to_owned()).or_default() += 1;
    }
    if peer_refused_before.is_none() || peer_refused_after.as_ref() != Some(&expected) {
        wrong.push(format!(
            "member {t}'s latchkey_peer_refused_total went from {peer_refused_before:?} to \
             {peer_refused_after:?}, expected {expected:?}"
        ));
    }
    // What T's log must say, on one line, about this refusal.
    let log_line: Option<[String; 2]> = match (&plan.refusal, &answer) {
        (_, Ok(())) => {
            wrong.push("the RPC was taken (no refusal)".to_owned());
            None
        }
        (Refusal::Denied(says), Err(s)) => {
            if s.code() != Code::PermissionDenied || !s.message().contains(says.as_str()) {
                wrong.push(format!(
                    "expected PERMISSION_DENIED saying {says:?}, got {:?}: {}",
                    s.code(),
                    s.message()
                ));
            }
            // The line names the reason it was counted under and the sender's address.
            let reason = sender.counted_as().unwrap_or("?");
            Some([
                format!("refused a peer message ({reason}) from 127.0.0.1:"),
                says.clone(),
            ])
        }
        (Refusal::Handshake, Err(s)) => {
            // What the client reads: the server's alert (TLS 1.3 sends it after the client's
            // Finished, so the client meets it on its first request, as a transport error), or,
            // when hyper had queued the request before the alert closed the connection, that
            // request cancelled by the close; which of the two is a race in the client. The
            // member's count below says why the connection closed.
            let chain = error_chain(s);
            let alert = s.code() == Code::Unknown && chain.contains(CERTIFICATE_REQUIRED);
            let cancelled = s.code() == Code::Cancelled && chain.ends_with(CLOSED_BEFORE_SENT);
            if !alert && !cancelled {
                wrong.push(format!(
                    "expected the handshake refused for want of a certificate \
                     ({CERTIFICATE_REQUIRED:?}), got {chain}"
                ));
            }
            // What the member counts: one more handshake without a certificate (counted
            // when its accept fails, which may come after the client's error: polled).
            let deadline = Instant::now() + LOG_TIMEOUT;
            loop {
                let counted = c.no_certificate_refusals(t);
                if matches!((no_cert_before, counted), (Some(b), Some(a)) if a > b) {
                    break;
                }
                if Instant::now() > deadline {
                    wrong.push(format!(
                        "member {t}'s no-certificate refusals went from {no_cert_before:?} \
                         to {counted:?}"
                    ));
                    break;
                }
                std::thread::sleep(common::POLL);
            }
            Some([
                "refused a client (no-certificate)".to_owned(),
                "TLS handshake: peer sent no certificates".to_owned(),
            ])
        }
    };
    if let Some(says) = log_line {
        let deadline = Instant::now() + LOG_TIMEOUT;
        loop {
            let log = c.member(t).log();
            let new = log.get(log_before..).unwrap_or_default();
            if new
                .lines()
                .any(|l| says.iter().all(|s| l.contains(s.as_str())))
            {
                break;
            }
            if Instant::now() > deadline {
                wrong.push(format!("member {t} logged no line saying {says:?}"));
                break;
            }
            std::thread::sleep(common::POLL);
        }
    }
    match c.seen(t, l, name) {
        Ok(after) if after == before => {}
        Ok(after) => wrong.push(format!(
            "member {t}'s state changed:\n      before {before:?}\n      after  {after:?}"
        )),
        Err(e) => wrong.push(format!("after the attack: {e}")),
    }
    match wrong.is_empty() {
        true => Ok(match answer {
            Err(s) if matches!(plan.refusal, Refusal::Handshake) => error_chain(&s),
            // The oversized rows' values are echoed: a line of the matrix shows their start.
            Err(s) => cut(format!("{:?}: {}", s.code(), s.message())),
            Ok(()) => unreachable!("a taken RPC is wrong"),
        }),
        false => Err(format!(
            "{} (answer: {:?})",
            wrong.join("; "),
            answer.map_err(|s| format!("{:?}: {}", s.code(), s.message()))
        )),
    }
}

/// The positive control: the crafted append and snapshot, sent to T with L's own credentials
/// (its certificate, the fingerprint, the secret, items signed in order for T), are taken and
/// change T as they say, so the cells' "nothing changed" is not vacuous (a craft gone stale,
/// say one whose append no longer follows T's log, would be refused by openraft or ignored,
/// and change nothing whatever its credentials).
///
/// It runs against T itself, at the end, rather than against a throwaway member: what is shown
/// live is the same `craft` at the same target and in the same state as the cells' (nothing
/// is proposed between the cells), which a fresh member would not be without the very log it
/// would have to be given. And it runs last because it wrecks T for good: the append puts in
/// T's log, committed and applied, an entry L never wrote (L's next entry will conflict with
/// it), and the snapshot moves T far past L's log, to a table where the attacker holds the
/// lock. The cluster is dropped after it.
///
/// The append (through an append stream, as the `append-stream` cells send it; the unary
/// `append` cells send the same request) must expire the holder's session: one more entry,
/// applied, one session and one lock fewer. Then the snapshot, at `snapshot_index`, must be
/// installed: T's log and applied index at it, one session (the attacker's) holding the one
/// lock, one more snapshot installed by `/metrics`. `Ok`: what was seen; `Err`: what was not.
fn control(
    c: &Cluster,
    (l, t): (u64, u64),
    name: &str,
    holder: u64,
    snapshot_index: u64,
) -> Result<String, String> {
    // T has all of L's log (the client's lock after the cells wrote to it), so that the
    // append follows T's last entry as it follows L's.
    let caught_up = || {
        let (Ok(seen), Some(leader)) = (c.seen(t, l, name), c.node_status(l)) else {
            return false;
        };
        let leader = &Cluster::groups_of(&leader)[0];
        seen.groups[0].last_log_index == leader.last_log_index
            && seen.groups[0].applied_index == leader.applied_index
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !caught_up() {
        if Instant::now() > deadline {
            return Err(format!("member {t} did not catch up with member {l}"));
        }
        std::thread::sleep(common::POLL);
    }
    let shape = GroupShape::new(0, c.setup.groups()).unwrap();
    let plan = c.plan_real(l, t);
    let mut seen_by_t = Vec::new();
    for rpc in [Rpc::AppendStream, Rpc::Snapshot] {
        let before = c.seen(t, l, name)?;
        let g0 = &before.groups[0];
        let craft = craft(
            l,
            Claim {
                leader: l,
                term: g0.term,
            },
            t,
            g0.term,
            g0.last_log_index,
            holder,
            name,
            shape,
            &c.peers,
            snapshot_index,
        );
        if let Err(s) = c.send(rpc, &plan, t, &craft) {
            return Err(format!(
                "{} with L's credentials was refused: {:?}: {}",
                rpc.name(),
                s.code(),
                s.message()
            ));
        }
        let installs = |s: &Seen| {
            s.metrics
                .iter()
                .find(|m| m.starts_with("latchkey_snapshots_installed"))
                .cloned()
        };
        // What the craft must have done to T's group 0.
        let done = |after: &Seen| {
            let (a, b) = (&after.groups[0], g0);
            match rpc {
                Rpc::AppendStream => {
                    a.last_log_index == b.last_log_index + 1
                        && a.applied_index == b.applied_index + 1
                        && a.sessions + 1 == b.sessions
                        && a.locks + 1 == b.locks
                }
                _ => {
                    a.last_log_index == snapshot_index
                        && a.applied_index == snapshot_index
                        && (a.sessions, a.locks) == (1, 1)
                        && installs(after) != installs(&before)
                }
            }
        };
        // Applied after the answer: polled, bounded.
        let deadline = Instant::now() + LOG_TIMEOUT;
        let after = loop {
            let after = c.seen(t, l, name)?;
            if done(&after) {
                break after;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} with L's credentials was taken but did not do what it says to member \
                     {t}:\n      before {before:?}\n      after  {after:?}",
                    rpc.name()
                ));
            }
            std::thread::sleep(common::POLL);
        };
        let (a, b) = (&after.groups[0], g0);
        seen_by_t.push(format!(
            "{} taken: applied {} -> {}, sessions {} -> {}, locks {} -> {}",
            rpc.name(),
            b.applied_index,
            a.applied_index,
            b.sessions,
            a.sessions,
            b.locks,
            a.locks
        ));
    }
    Ok(seen_by_t.join("; "))
}

/// One cell at most every `REFUSAL_LOG_REFILL_MS`: each cell's refusal must leave its log
/// line, and the refusal log is rate-limited (a burst of `REFUSAL_LOG_BURST`, then one line per
/// refill). Each cell is refused once, so at this pace the bucket never runs dry.
#[derive(Default)]
struct Pace(Option<Instant>);

impl Pace {
    fn wait(&mut self) {
        let refill = Duration::from_millis(latchkey_core::limits::REFUSAL_LOG_REFILL_MS);
        if let Some(last) = self.0 {
            std::thread::sleep(refill.saturating_sub(last.elapsed()));
        }
        self.0 = Some(Instant::now());
    }
}

/// Every cell of `setup` against one cluster; panics listing the failed cells.
fn matrix(setup: Setup) {
    let mut c = Cluster::start(setup);
    let (l, term) = c.leader0();
    let t = (1..=3).find(|&id| id != l).unwrap();
    let m = (1..=3).find(|&id| id != l && id != t).unwrap();
    let status = c.node_status(t).unwrap();
    assert_eq!(
        status.cluster_id,
        ClusterId::founded_by(&c.peers).as_str(),
        "the attacker's idea of the cluster id"
    );
    let name = c.name_in_group0();
    let (session, token) = c.hold(l, &name);
    // The target has applied the grant: from now on nothing is proposed.
    wait_until(
        &format!("member {t} applies the grant"),
        Duration::from_secs(30),
        || {
            let (Ok(seen), Some(leader)) = (c.seen(t, l, &name), c.node_status(l)) else {
                return false;
            };
            seen.groups[0].applied_index == Cluster::groups_of(&leader)[0].applied_index
                && seen.groups[0].locks == 1
        },
    );
    let mut results: Vec<(Rpc, Sender, Result<CellResult, &'static str>)> = Vec::new();
    let mut report = |rpc: Rpc, sender: Sender, result: Result<CellResult, &'static str>| {
        let line = match &result {
            Err(why) => format!("skipped: {why}"),
            Ok(Ok(how)) => format!("refused, nothing changed ({how})"),
            Ok(Err(e)) => format!("FAILED: {e}"),
        };
        eprintln!(
            "[{} | {} | {}] {line}",
            setup.name(),
            rpc.name(),
            sender.name()
        );
        results.push((rpc, sender, result));
    };
    let mut snapshot_index = 1_000;
    let mut pace = Pace::default();
    for rpc in RPCS {
        for sender in SENDERS.into_iter().filter(|s| s.applies_to(rpc)) {
            let result = match sender.skipped_in(setup, rpc) {
                Some(why) => Err(why),
                None => {
                    pace.wait();
                    snapshot_index += 1_000;
                    Ok(run_cell(
                        &c,
                        rpc,
                        sender,
                        (l, t, m),
                        &name,
                        session.id,
                        snapshot_index,
                    ))
                }
            };
            report(rpc, sender, result);
        }
    }
    // Then M is removed (`latchkey cluster remove`, its process stopped) and speaks with its
    // own credentials, which it keeps, claiming a committed vote above L's.
    c.remove(m, (l, t));
    for rpc in RPCS {
        pace.wait();
        snapshot_index += 1_000;
        let result = run_cell(
            &c,
            rpc,
            Sender::Removed,
            (l, t, m),
            &name,
            session.id,
            snapshot_index,
        );
        report(rpc, Sender::Removed, Ok(result));
    }
    // After all cells: the same leader in the same term, the lock with its holder and token,
    // and a real client still locks and gets a (later) token.
    let mut after = Vec::new();
    let (l2, term2) = c.leader0();
    if (l2, term2) != (l, term) {
        after.push(format!(
            "group 0's leader and term went from {:?} to {:?}",
            (l, term),
            (l2, term2)
        ));
    }
    match c.seen(l, l, &name).map(|s| s.lock) {
        Ok(held) if held == (true, session.id, token) => {}
        held => after.push(format!(
            "the held lock went from {:?} to {held:?}",
            (true, session.id, token)
        )),
    }
    let mut args = vec!["lock".to_owned(), "--wait".to_owned(), "10s".to_owned()];
    args.extend(c.client_flags());
    args.extend([
        "deploy/after-the-attacks".to_owned(),
        "--".to_owned(),
        "sh".to_owned(),
        "-c".to_owned(),
        "echo token=$LATCHKEY_TOKEN".to_owned(),
    ]);
    let out = common::run(&args, c.dir.path(), common::CLI_TIMEOUT);
    if !out.status.success() || !out.stdout.contains("token=") {
        after.push(format!(
            "a client could not lock ({}): {}{}",
            out.status, out.stdout, out.stderr
        ));
    }
    // Last, as it wrecks T: the crafts are live.
    let controls = control(&c, (l, t), &name, session.id, snapshot_index + 1_000);
    eprintln!(
        "[{} | control] {}",
        setup.name(),
        match &controls {
            Ok(how) => how.clone(),
            Err(e) => format!("FAILED: {e}"),
        }
    );
    if let Err(e) = controls {
        after.push(format!("the positive control: {e}"));
    }
    let failed: Vec<String> = results
        .iter()
        .filter_map(|(rpc, sender, r)| match r {
            Ok(Err(e)) => Some(format!(
                "  {} | {} | {}: {e}",
                setup.name(),
                rpc.name(),
                sender.name()
            )),
            _ => None,
        })
        .collect();
    let ran = results.iter().filter(|(_, _, r)| r.is_ok()).count();
    eprintln!(
        "[{}] {ran} cells run, {} failed, {} skipped",
        setup.name(),
        failed.len(),
        results.len() - ran
    );
    if !failed.is_empty() || !after.is_empty() {
        panic!(
            "{}: {} of {ran} cells failed:\n{}\n{}\n(member {t} was the target, member {l} the \
             leader)\n{}",
            setup.name(),
            failed.len(),
            failed.join("\n"),
            after.join("\n"),
            c.logs()
        );
    }
}

#[test]
fn peer_attacks_over_mtls_without_a_cluster_secret_are_refused() {
    matrix(Setup::Mtls);
}

#[test]
fn peer_attacks_over_mtls_with_a_cluster_secret_are_refused() {
    matrix(Setup::MtlsSecret);
}

#[test]
fn peer_attacks_in_plaintext_with_a_cluster_secret_and_two_groups_are_refused() {
    matrix(Setup::PlainSecret);
}
