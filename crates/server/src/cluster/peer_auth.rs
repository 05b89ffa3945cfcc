//! Who may speak the peer protocol: only members of this cluster (issue #13).
//!
//! Every peer request carries the sender's member id and this cluster's id (a [`ClusterId`]:
//! the hash of the member list the cluster was founded with, recorded in every member's data
//! dir and handed to a new member with `--join`; it stays when the membership changes), so two
//! clusters that reuse ids and ports cannot cross-talk by accident. Whether the sender is a
//! member is decided by the receiver against its Raft membership (`peer/service.rs`), which
//! changes. With a cluster secret (`--cluster-secret-file`), it also carries an HMAC-SHA256
//! over the method, sender, receiver, fingerprint and payload: a stranger without the secret
//! can neither forge nor alter a message, and a message for one member is not valid at
//! another. Replaying a recorded message is possible to an on-path attacker (Raft
//! treats it as a stale or duplicate message from that member); TLS between members is the
//! answer to an on-path attacker.
//!
//! Messages from an authenticated member are then checked for what openraft asserts on or what
//! would stop the node (see `peer/service.rs`), before openraft sees them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hmac::{Hmac, Mac};
use rustls_pki_types::CertificateDer;
use sha2::{Digest, Sha256};
use tonic::metadata::{MetadataMap, MetadataValue};

use latchkey_core::limits;

use crate::observe::refusals::PeerReason;

/// The sender's member id.
pub const FROM_HEADER: &str = "latchkey-peer-from";
/// The cluster's id, hex.
pub const CLUSTER_HEADER: &str = "latchkey-peer-cluster";
/// HMAC-SHA256 of the message under the cluster secret, hex; only with a secret.
pub const MAC_HEADER: &str = "latchkey-peer-mac";
/// The Raft group a message is for, in a cluster of more than one (issue #16); absent means
/// group 0. Routing only: the group is also in the fingerprint (`PeerAuth::with_group`), so a
/// message given another group's header is refused by that group as another cluster's.
pub const GROUP_HEADER: &str = "latchkey-peer-group";
/// Where the sending member serves the HTTP API (`HOST:PORT`, issue #33), so that a follower
/// can forward HTTP requests to its leader. Only read from an admitted append that the Raft
/// core accepted, and only used for the member that Raft says leads (see `LeaderContact`).
pub const HTTP_ADDR_HEADER: &str = "latchkey-peer-http";
/// With a cluster secret, the MAC of `HTTP_ADDR_HEADER` on a request: over the sender, the
/// receiver, the cluster and the address, so that nobody on the path can point a follower's
/// forwarding (which carries the callers' bearer tokens) at another address. A header of its
/// own, not part of `MAC_HEADER`'s input, so that members of an older release (which neither
/// send nor read the address) still verify every message of this one.
pub const HTTP_MAC_HEADER: &str = "latchkey-peer-http-mac";

/// An HTTP address a request carried, not yet verified ([`PeerAuth::verified_http`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpClaim {
    addr: String,
    mac: Option<String>,
}

type HmacSha256 = Hmac<Sha256>;

/// The peer RPC a message was sent to: part of what the MAC covers, so that a vote cannot be
/// replayed as an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerMethod {
    Vote,
    Append,
    /// The start of a snapshot stream (its headers, with an empty payload).
    Snapshot,
    /// One chunk of a snapshot stream (see [`PeerAuth::sign_chunk`]).
    SnapshotChunk,
    /// The start of a stream of appends (its headers, with an empty payload).
    AppendStream,
    /// One append of such a stream (see [`PeerAuth::sign_item`]).
    AppendItem,
}

impl PeerMethod {
    fn tag(self) -> &'static [u8] {
        match self {
            PeerMethod::Vote => b"vote",
            PeerMethod::Append => b"append",
            PeerMethod::Snapshot => b"snapshot",
            PeerMethod::SnapshotChunk => b"snapshot-chunk",
            PeerMethod::AppendStream => b"append-stream",
            PeerMethod::AppendItem => b"append-item",
        }
    }
}

/// Why a peer request was refused. Each is logged by the receiver and answered
/// `PERMISSION_DENIED`; nothing reaches openraft.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerAuthError {
    #[error("no `{FROM_HEADER}` member id: not a latchkey member of this cluster")]
    NoSender,
    #[error("member {0} is not a member of this cluster")]
    NotAMember(u64),
    #[error(
        "member {from} was removed from this group at log index {index}; a removed member is \
         refused whatever its message claims (a leader's vote, a longer log) until it is added \
         again (`latchkey cluster add`)"
    )]
    Removed { from: u64, index: u64 },
    #[error("a message claiming to come from this member itself")]
    FromSelf,
    #[error(
        "cluster fingerprint {got:?} is not this cluster's {want}: a member of another cluster \
         (or one started with other --peers or --table-bytes-max)"
    )]
    OtherCluster { got: Option<String>, want: String },
    #[error("no `{MAC_HEADER}`: this cluster requires its cluster secret")]
    NoMac,
    #[error("the message's MAC does not verify: another cluster secret, or an altered message")]
    BadMac,
    #[error(
        "member {from}'s messages must come with a certificate naming `{want}` (its subject CN or \
         a DNS name); this connection's certificate names {names:?}"
    )]
    NotMemberCertificate {
        from: u64,
        want: String,
        names: Vec<String>,
    },
}

impl PeerAuthError {
    /// The reason a refusal for this is counted under (`latchkey_peer_refused_total`).
    pub fn reason(&self) -> PeerReason {
        match self {
            PeerAuthError::NoSender => PeerReason::NoSender,
            PeerAuthError::NotAMember(_) => PeerReason::NotAMember,
            PeerAuthError::Removed { .. } => PeerReason::RemovedMember,
            PeerAuthError::FromSelf => PeerReason::FromSelf,
            PeerAuthError::OtherCluster { .. } => PeerReason::OtherCluster,
            PeerAuthError::NoMac => PeerReason::NoMac,
            PeerAuthError::BadMac => PeerReason::BadMac,
            PeerAuthError::NotMemberCertificate { .. } => PeerReason::NotMemberCertificate,
        }
    }
}

/// The cluster secret's bytes; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(Vec<u8>);

impl ClusterSecret {
    pub fn new(bytes: Vec<u8>) -> ClusterSecret {
        ClusterSecret(bytes)
    }
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(<redacted>)")
    }
}

/// A cluster's identity on the peer protocol: hex of `limits::PEER_FINGERPRINT_BYTES` bytes.
/// Fixed when the cluster is founded and kept for life, whatever its members become.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterId(String);

impl ClusterId {
    /// The id of a cluster founded with `members` (id -> address): a hash of the list, so every
    /// founding member computes the same id without talking to the others. (It is also what
    /// the fingerprint of releases before membership changes was, so their data dirs keep it.)
    pub fn founded_by(members: &BTreeMap<u64, String>) -> ClusterId {
        let mut h = Sha256::new();
        h.update(b"latchkey-cluster-v1");
        for (id, addr) in members {
            h.update(id.to_le_bytes());
            h.update((addr.len() as u64).to_le_bytes());
            h.update(addr.as_bytes());
        }
        ClusterId(hex(&h.finalize()[..limits::PEER_FINGERPRINT_BYTES]))
    }

    /// Reads an id as `cluster status` prints it.
    pub fn parse(text: &str) -> Result<ClusterId, String> {
        let text = text.trim();
        if text.len() != limits::CLUSTER_ID_CHARS
            || !text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!(
                "{text:?} is not a cluster id ({} lower-case hex digits, as `latchkey cluster \
                 status` prints it)",
                limits::CLUSTER_ID_CHARS
            ));
        }
        Ok(ClusterId(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ClusterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The group a peer request is for (`GROUP_HEADER`; group 0 without one), or why not.
pub fn group_of_request(meta: &MetadataMap) -> Result<u32, String> {
    match meta.get(GROUP_HEADER) {
        None => Ok(0),
        Some(v) => v.to_str().ok().and_then(|v| v.parse().ok()).ok_or_else(|| {
            let v = String::from_utf8_lossy(v.as_bytes());
            // A group is at most 10 digits: quote no more of what a stranger sent.
            format!("bad `{GROUP_HEADER}` {:?}", quoted(&v, 10))
        }),
    }
}

/// At most `max` bytes of `text` (cut at a character boundary, marked when cut): what a peer
/// refusal quotes back and logs of a header a stranger sent.
fn quoted(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// A member's credentials on the peer protocol: its id, its cluster's id, its secret if it
/// has one.
#[derive(Clone)]
pub struct PeerAuth {
    me: u64,
    fingerprint: String,
    secret: Option<Vec<u8>>,
    /// With mTLS between members (`--tls-ca`): a member's messages must come over a connection
    /// whose client certificate names that member (`member-ID`), so that a client holding a
    /// certificate from the same CA cannot speak for a member.
    member_certificates: bool,
    /// The group this member's messages are for, in a cluster of more than one group.
    group: Option<u32>,
    /// Where this member serves the HTTP API, sent with every message and answer
    /// (`HTTP_ADDR_HEADER`).
    http_addr: Option<String>,
    /// Where the members this one exchanged messages with said they serve HTTP, for the
    /// cluster status only (never for forwarding: that trusts only `LeaderContact`'s).
    heard_http: std::sync::Arc<std::sync::Mutex<BTreeMap<u64, String>>>,
}

impl std::fmt::Debug for PeerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerAuth")
            .field("me", &self.me)
            .field("fingerprint", &self.fingerprint)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl PeerAuth {
    /// This cluster's fingerprint (hex), as every peer message carries it.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// A member of `cluster` with the default table budget.
    pub fn new(me: u64, cluster: ClusterId, secret: Option<ClusterSecret>) -> PeerAuth {
        PeerAuth::with_table_bytes_max(me, cluster, limits::TABLE_BYTES_MAX, secret)
    }

    /// `cluster`: the cluster's id. The fingerprint every message carries covers this member's
    /// table budget too: the budget decides what `apply` answers, so members with different
    /// budgets would apply the same log to different tables; they refuse each other instead.
    pub fn with_table_bytes_max(
        me: u64,
        cluster: ClusterId,
        table_bytes_max: usize,
        secret: Option<ClusterSecret>,
    ) -> PeerAuth {
        let mut h = Sha256::new();
        h.update(b"latchkey-fingerprint-v2");
        h.update(cluster.0.as_bytes());
        h.update((table_bytes_max as u64).to_le_bytes());
        PeerAuth {
            me,
            fingerprint: hex(&h.finalize()[..limits::PEER_FINGERPRINT_BYTES]),
            secret: secret.map(|s| s.0),
            member_certificates: false,
            group: None,
            http_addr: None,
            heard_http: Default::default(),
        }
    }

    /// This member's credentials in one Raft group of a cluster of several (issue #16): its
    /// messages name the group (`GROUP_HEADER`) and carry a fingerprint of the group and the
    /// group count besides the cluster, so the groups of one cluster, which have the same
    /// members, never take each other's messages (and members started with another
    /// `--groups` refuse each other). One group keeps the cluster's fingerprint as before.
    /// `replicas` (`--replicas`, 0: every member) is covered too when set: members that place
    /// the groups differently would found a group with different voters, so they refuse each
    /// other (a cluster without it keeps its fingerprint).
    pub fn with_group(mut self, shape: latchkey_core::GroupShape, replicas: u32) -> PeerAuth {
        if shape.groups > 1 || replicas != 0 {
            let mut h = Sha256::new();
            h.update(b"latchkey-group-v1");
            h.update(self.fingerprint.as_bytes());
            h.update(shape.group.to_le_bytes());
            h.update(shape.groups.to_le_bytes());
            if replicas != 0 {
                h.update(b"replicas");
                h.update(replicas.to_le_bytes());
            }
            self.fingerprint = hex(&h.finalize()[..limits::PEER_FINGERPRINT_BYTES]);
            self.group = Some(shape.group);
        }
        self
    }

    /// Requires every peer message to come with a client certificate that names its sender
    /// (see [`member_certificate_name`]); on when members dial each other over mTLS.
    /// This member serves the HTTP API at `addr` (`HOST:PORT`): its messages say so.
    pub fn with_http_addr(mut self, addr: Option<String>) -> PeerAuth {
        self.http_addr = addr.filter(|a| a.len() <= limits::HOST_PORT_BYTES_MAX);
        self
    }

    pub fn with_member_certificates(mut self, on: bool) -> PeerAuth {
        self.member_certificates = on;
        self
    }

    /// Checks, when member certificates are required, that the connection's client
    /// certificate names member `from`.
    pub fn verify_certificate(
        &self,
        from: u64,
        peer_certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<(), PeerAuthError> {
        if !self.member_certificates {
            return Ok(());
        }
        let want = member_certificate_name(from);
        let names = peer_certs
            .and_then(|c| c.first())
            .map(crate::certificate::cert_names)
            .unwrap_or_default();
        if names.contains(&want) {
            Ok(())
        } else {
            Err(PeerAuthError::NotMemberCertificate { from, want, names })
        }
    }

    /// Whether `from` may speak to this member, given the members of its Raft membership
    /// (voters and learners) and whether the message vouches for a sender it does not know
    /// (`peer/service.rs`: a leader's committed vote at least this member's own, or a candidate whose
    /// log reaches further than this member's). A member that knows no membership yet (started
    /// with `--join`, not added yet) takes any sender of its cluster: the leader that adds it
    /// is not in a membership it could know. A member that missed the change adding a member
    /// (it was down or cut off) must still follow that member as leader, and vote for it, or
    /// the cluster could be stuck; a sender that vouches for nothing is refused. A sender that
    /// a membership change removed (`removed_at`: the index of that entry, as this member
    /// applied it) is refused whatever its message vouches (issue #31: a removed member keeps
    /// its credentials, and its claims are its own), unless the membership has it again.
    pub fn check_member(
        &self,
        from: u64,
        known: &std::collections::BTreeSet<u64>,
        removed_at: Option<u64>,
        vouched: bool,
    ) -> Result<(), PeerAuthError> {
        if known.contains(&from) {
            return Ok(());
        }
        if let Some(index) = removed_at {
            return Err(PeerAuthError::Removed { from, index });
        }
        if known.is_empty() || vouched {
            return Ok(());
        }
        Err(PeerAuthError::NotAMember(from))
    }

    pub fn has_secret(&self) -> bool {
        self.secret.is_some()
    }

    fn mac(
        &self,
        secret: &[u8],
        method: PeerMethod,
        from: u64,
        to: u64,
        payload: &[u8],
    ) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
        m.update(b"latchkey-peer-v1\0");
        m.update(method.tag());
        m.update(b"\0");
        m.update(&from.to_le_bytes());
        m.update(&to.to_le_bytes());
        m.update(self.fingerprint.as_bytes());
        m.update(payload);
        m
    }

    /// Stamps a request this member sends to member `to`.
    pub fn sign(&self, meta: &mut MetadataMap, method: PeerMethod, to: u64, payload: &[u8]) {
        meta.insert(FROM_HEADER, MetadataValue::from(self.me));
        if let Some(group) = self.group {
            meta.insert(GROUP_HEADER, MetadataValue::from(group));
        }
        self.stamp_http(meta);
        if let (Some(secret), Some(addr)) = (&self.secret, &self.http_addr) {
            let tag = self.http_mac(secret, self.me, to, addr).finalize();
            meta.insert(
                HTTP_MAC_HEADER,
                hex(&tag.into_bytes()).parse().expect("hex is ASCII"),
            );
        }
        meta.insert(
            CLUSTER_HEADER,
            self.fingerprint.parse().expect("hex is ASCII"),
        );
        if let Some(secret) = &self.secret {
            let tag = self.mac(secret, method, self.me, to, payload).finalize();
            meta.insert(
                MAC_HEADER,
                hex(&tag.into_bytes()).parse().expect("hex is ASCII"),
            );
        }
    }

    /// Puts this member's HTTP address on an answer (`HTTP_ADDR_HEADER`).
    pub fn stamp_http(&self, meta: &mut MetadataMap) {
        if let Some(value) = self.http_addr.as_deref().and_then(|a| a.parse().ok()) {
            meta.insert(HTTP_ADDR_HEADER, value);
        }
    }

    /// Member `id` said it serves HTTP at `addr` (or nothing, then it serves none). At most
    /// `HTTP_ADDRS_KNOWN_MAX` members are remembered.
    pub fn heard_http(&self, id: u64, addr: Option<String>) {
        let mut heard = self.heard_http.lock().expect("heard http lock");
        match addr {
            Some(addr) if heard.len() < limits::HTTP_ADDRS_KNOWN_MAX || heard.contains_key(&id) => {
                heard.insert(id, addr);
            }
            Some(_) => {}
            None => {
                heard.remove(&id);
            }
        }
    }

    /// Where member `id` serves HTTP, as far as this member knows: its own, or what `id` said.
    pub fn http_of(&self, id: u64) -> Option<String> {
        if id == self.me {
            return self.http_addr.clone();
        }
        let heard = self.heard_http.lock().expect("heard http lock");
        heard.get(&id).cloned()
    }

    fn http_mac(&self, secret: &[u8], from: u64, to: u64, addr: &str) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
        m.update(b"latchkey-peer-http-v1\0");
        m.update(&from.to_le_bytes());
        m.update(&to.to_le_bytes());
        m.update(self.fingerprint.as_bytes());
        m.update(addr.as_bytes());
        m
    }

    /// The HTTP address a request claims (`HTTP_ADDR_HEADER`, with its MAC if any), to be
    /// verified once the request's sender is known.
    pub fn http_claim_of(meta: &MetadataMap) -> Option<HttpClaim> {
        Some(HttpClaim {
            addr: PeerAuth::http_addr_of(meta)?,
            mac: meta
                .get(HTTP_MAC_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        })
    }

    /// The address `claim` names, if member `from` sent it to this member: with a cluster
    /// secret only when its MAC verifies (`HTTP_MAC_HEADER`), else as claimed (without a secret
    /// a member is known only by what it says, as for every other field).
    pub fn verified_http(&self, from: u64, claim: Option<HttpClaim>) -> Option<String> {
        let claim = claim?;
        let Some(secret) = &self.secret else {
            return Some(claim.addr);
        };
        let tag = unhex(claim.mac.as_deref()?)?;
        // `verify_slice` compares in constant time.
        self.http_mac(secret, from, self.me, &claim.addr)
            .verify_slice(&tag)
            .ok()
            .map(|()| claim.addr)
    }

    /// The sender's HTTP address (`HTTP_ADDR_HEADER`) if it sent one that is `HOST:PORT`.
    pub fn http_addr_of(meta: &MetadataMap) -> Option<String> {
        let addr = meta.get(HTTP_ADDR_HEADER)?.to_str().ok()?;
        let well_formed = addr.len() <= limits::HOST_PORT_BYTES_MAX
            && crate::cluster::member_addr::MemberAddr::check(addr).is_ok_and(|a| a.peer.is_none());
        well_formed.then(|| addr.to_owned())
    }

    /// The MAC of one chunk of a snapshot stream this member sends to member `to`: over its
    /// header and data, so that no chunk can be altered, and, since the header names the
    /// transfer and the offset, none moved to another place or another transfer. Empty without
    /// a secret.
    pub fn sign_chunk(&self, to: u64, header: &[u8], data: &[u8]) -> Vec<u8> {
        self.sign_item(PeerMethod::SnapshotChunk, to, header, data)
    }

    /// The MAC of one message of a stream (`method` says which kind: a snapshot chunk, an
    /// append) that this member sends to member `to`, over its header and data. The header
    /// places the message in its stream, so the MAC keeps it from being altered, moved, or
    /// taken for a message of another kind. Empty without a secret.
    pub fn sign_item(&self, method: PeerMethod, to: u64, header: &[u8], data: &[u8]) -> Vec<u8> {
        match &self.secret {
            None => Vec::new(),
            Some(secret) => self
                .item_mac(secret, method, self.me, to, header, data)
                .finalize()
                .into_bytes()
                .to_vec(),
        }
    }

    /// Checks one message of a stream from member `from` (see [`PeerAuth::sign_item`]).
    pub fn verify_item(
        &self,
        method: PeerMethod,
        from: u64,
        header: &[u8],
        data: &[u8],
        mac: &[u8],
    ) -> Result<(), PeerAuthError> {
        let Some(secret) = &self.secret else {
            return Ok(());
        };
        if mac.is_empty() {
            return Err(PeerAuthError::NoMac);
        }
        self.item_mac(secret, method, from, self.me, header, data)
            .verify_slice(mac)
            .map_err(|_| PeerAuthError::BadMac)
    }

    fn item_mac(
        &self,
        secret: &[u8],
        method: PeerMethod,
        from: u64,
        to: u64,
        header: &[u8],
        data: &[u8],
    ) -> HmacSha256 {
        // The header's length first, so that no split of the same bytes into header and data
        // has the same MAC.
        let mut m = self.mac(
            secret,
            method,
            from,
            to,
            &(header.len() as u64).to_le_bytes(),
        );
        m.update(header);
        m.update(data);
        m
    }

    /// Checks a request this member received; the sender's id if it speaks for this cluster
    /// (and knows the secret, when there is one). Whether it is a member is
    /// [`PeerAuth::check_member`]'s question.
    pub fn verify(
        &self,
        meta: &MetadataMap,
        method: PeerMethod,
        payload: &[u8],
    ) -> Result<u64, PeerAuthError> {
        let from: u64 = meta
            .get(FROM_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .ok_or(PeerAuthError::NoSender)?;
        if from == self.me {
            return Err(PeerAuthError::FromSelf);
        }
        let cluster = meta.get(CLUSTER_HEADER).and_then(|v| v.to_str().ok());
        if cluster != Some(self.fingerprint.as_str()) {
            return Err(PeerAuthError::OtherCluster {
                // Quoted back to the sender and logged: never more than a fingerprint's length
                // of what a stranger sent.
                got: cluster.map(|c| quoted(c, self.fingerprint.len())),
                want: self.fingerprint.clone(),
            });
        }
        if let Some(secret) = &self.secret {
            let tag = meta
                .get(MAC_HEADER)
                .and_then(|v| v.to_str().ok())
                .ok_or(PeerAuthError::NoMac)?;
            let tag = unhex(tag).ok_or(PeerAuthError::BadMac)?;
            // `verify_slice` compares in constant time.
            self.mac(secret, method, from, self.me, payload)
                .verify_slice(&tag)
                .map_err(|_| PeerAuthError::BadMac)?;
        }
        Ok(from)
    }
}

/// The name a member's certificate must carry (subject CN or a DNS subject alternative name)
/// when members authenticate with mTLS: `member-ID`.
pub fn member_certificate_name(id: u64) -> String {
    format!("member-{id}")
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        write!(s, "{b:02x}").expect("writing to a String cannot fail");
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.len() > 2 * limits::PEER_MAC_BYTES {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Reads a cluster secret file: its bytes, trailing whitespace trimmed (an editor's newline
/// must not split a cluster). Refuses an empty or short secret, and a file others may read.
pub fn read_secret_file(path: &std::path::Path) -> Result<ClusterSecret, String> {
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "cannot read the cluster secret file {}: {e}",
            path.display()
        )
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "the cluster secret file {} may be read by others (mode {:o}); make it 0600",
                path.display(),
                mode & 0o777
            ));
        }
    }
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    let secret = bytes[..end].to_vec();
    if secret.len() < limits::CLUSTER_SECRET_BYTES_MIN {
        return Err(format!(
            "the cluster secret in {} is {} bytes; at least {} are needed (e.g. `head -c 32 \
             /dev/urandom | base64 > FILE`)",
            path.display(),
            secret.len(),
            limits::CLUSTER_SECRET_BYTES_MIN
        ));
    }
    if secret.len() > limits::CLUSTER_SECRET_BYTES_MAX {
        return Err(format!(
            "the cluster secret in {} is {} bytes; at most {} are read",
            path.display(),
            secret.len(),
            limits::CLUSTER_SECRET_BYTES_MAX
        ));
    }
    Ok(ClusterSecret(secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members() -> ClusterId {
        ClusterId::founded_by(
            &(1..=3)
                .map(|i| (i, format!("127.0.0.1:{}", 7000 + i)))
                .collect(),
        )
    }

    fn signed(from: &PeerAuth, to: u64, payload: &[u8]) -> MetadataMap {
        let mut m = MetadataMap::new();
        from.sign(&mut m, PeerMethod::Append, to, payload);
        m
    }

    /// With a cluster secret, an HTTP address is believed only as its sender signed it for
    /// this member: one changed on the path, moved to another receiver or sender, or sent
    /// without its MAC is not (a follower forwards callers' bearer tokens to it; review of
    /// issue #33's forwarding). Without a secret it is taken as claimed.
    #[test]
    fn an_http_address_is_believed_only_as_signed() {
        let secret = || {
            Some(ClusterSecret::new(
                b"0123456789abcdef0123456789abcdef".to_vec(),
            ))
        };
        let leader =
            PeerAuth::new(1, members(), secret()).with_http_addr(Some("10.0.0.1:7480".into()));
        let follower = PeerAuth::new(2, members(), secret());
        let m = signed(&leader, 2, b"append");
        let claim = PeerAuth::http_claim_of(&m);
        assert_eq!(
            follower.verified_http(1, claim.clone()).as_deref(),
            Some("10.0.0.1:7480")
        );
        assert_eq!(
            follower.verified_http(3, claim.clone()),
            None,
            "another sender"
        );
        let third = PeerAuth::new(3, members(), secret());
        assert_eq!(
            third.verified_http(1, claim),
            None,
            "signed for another receiver"
        );
        let mut changed = m.clone();
        changed.insert(HTTP_ADDR_HEADER, "10.6.6.6:80".parse().unwrap());
        assert_eq!(
            follower.verified_http(1, PeerAuth::http_claim_of(&changed)),
            None
        );
        let mut stripped = m.clone();
        stripped.remove(HTTP_MAC_HEADER);
        assert_eq!(
            follower.verified_http(1, PeerAuth::http_claim_of(&stripped)),
            None
        );
        // The message's own MAC still verifies with the address changed: it is not its input.
        assert!(follower
            .verify(&changed, PeerMethod::Append, b"append")
            .is_ok());
        let open = PeerAuth::new(2, members(), None);
        let plain = PeerAuth::new(1, members(), None).with_http_addr(Some("10.0.0.1:7480".into()));
        let m = signed(&plain, 2, b"append");
        assert_eq!(
            open.verified_http(1, PeerAuth::http_claim_of(&m))
                .as_deref(),
            Some("10.0.0.1:7480")
        );
    }

    /// A cluster without replica subsets keeps the fingerprints it had before they existed (its
    /// data dirs and members of older releases must still be its own), and a replica count
    /// changes every group's, so members that would place the groups differently refuse each
    /// other (ARCHITECTURE.md: every founding member places a group on the same voters).
    #[test]
    fn the_replica_count_is_in_the_group_fingerprint_only_when_set() {
        let of = |shape, replicas| {
            PeerAuth::new(1, members(), None)
                .with_group(shape, replicas)
                .fingerprint()
                .to_owned()
        };
        let single = latchkey_core::GroupShape::SINGLE;
        let second = latchkey_core::GroupShape::new(1, 3).unwrap();
        assert_eq!(
            of(single, 0),
            PeerAuth::new(1, members(), None).fingerprint()
        );
        assert_eq!(of(single, 0), "4ab2ddab9ebeb924e6c864e4f548d631");
        assert_eq!(of(second, 0), "693f4c4c92292fe4dc5f89a734db25d2");
        assert_ne!(of(second, 3), of(second, 0));
        assert_ne!(of(second, 3), of(second, 4));
        assert_ne!(of(single, 3), of(single, 0));
    }

    /// The attack matrix's `cluster-oversized` cell sent 4 KiB as the fingerprint, and the
    /// refusal quoted it whole to the sender and into the log.
    #[test]
    fn a_refusal_quotes_no_more_of_a_strangers_headers_than_a_fingerprint() {
        let auth = PeerAuth::new(1, members(), None);
        let mut meta = signed(&PeerAuth::new(2, members(), None), 1, b"x");
        let long = "f".repeat(4096);
        meta.insert(CLUSTER_HEADER, long.parse().unwrap());
        let refused = auth.verify(&meta, PeerMethod::Append, b"x").unwrap_err();
        let text = refused.to_string();
        assert!(text.contains("is not this cluster's"), "{text}");
        assert!(text.len() < 400, "{} bytes: {text}", text.len());

        meta.insert(GROUP_HEADER, long.parse().unwrap());
        let refused = group_of_request(&meta).unwrap_err();
        assert!(refused.len() < 100, "{} bytes: {refused}", refused.len());
    }

    #[test]
    fn a_member_with_the_secret_is_accepted() {
        let s = Some(ClusterSecret::new(b"0123456789abcdef".to_vec()));
        let (a, b) = (
            PeerAuth::new(1, members(), s.clone()),
            PeerAuth::new(2, members(), s),
        );
        let m = signed(&a, 2, b"hello");
        assert_eq!(b.verify(&m, PeerMethod::Append, b"hello"), Ok(1));
    }

    #[test]
    fn an_altered_payload_another_method_receiver_or_secret_is_refused() {
        let s = Some(ClusterSecret::new(b"0123456789abcdef".to_vec()));
        let a = PeerAuth::new(1, members(), s.clone());
        let b = PeerAuth::new(2, members(), s.clone());
        let c = PeerAuth::new(3, members(), s);
        let m = signed(&a, 2, b"hello");
        assert_eq!(
            b.verify(&m, PeerMethod::Append, b"hellO"),
            Err(PeerAuthError::BadMac)
        );
        assert_eq!(
            b.verify(&m, PeerMethod::Vote, b"hello"),
            Err(PeerAuthError::BadMac)
        );
        assert_eq!(
            c.verify(&m, PeerMethod::Append, b"hello"),
            Err(PeerAuthError::BadMac)
        );
        let stranger = PeerAuth::new(
            1,
            members(),
            Some(ClusterSecret::new(b"another-secret-0".to_vec())),
        );
        let m = signed(&stranger, 2, b"hello");
        assert_eq!(
            b.verify(&m, PeerMethod::Append, b"hello"),
            Err(PeerAuthError::BadMac)
        );
        let unsigned = PeerAuth::new(1, members(), None);
        let m = signed(&unsigned, 2, b"hello");
        assert_eq!(
            b.verify(&m, PeerMethod::Append, b"hello"),
            Err(PeerAuthError::NoMac)
        );
    }

    #[test]
    fn a_non_member_another_cluster_or_no_sender_is_refused() {
        let b = PeerAuth::new(2, members(), None);
        let known: std::collections::BTreeSet<u64> = [1, 2, 3].into();
        assert_eq!(b.check_member(1, &known, None, false), Ok(()));
        assert_eq!(
            b.check_member(9, &known, None, false),
            Err(PeerAuthError::NotAMember(9))
        );
        // A member not added yet knows no membership; a sender the message vouches for passes.
        assert_eq!(b.check_member(9, &Default::default(), None, false), Ok(()));
        assert_eq!(b.check_member(9, &known, None, true), Ok(()));
        // Issue #31: a removed sender is refused even when its message vouches for it, unless
        // the membership has it again (added under the same id).
        assert_eq!(
            b.check_member(9, &known, Some(40), true),
            Err(PeerAuthError::Removed { from: 9, index: 40 })
        );
        assert_eq!(b.check_member(3, &known, Some(40), true), Ok(()));
        let other: BTreeMap<u64, String> = [(1, "127.0.0.1:7001".to_owned())].into();
        let m = signed(
            &PeerAuth::new(1, ClusterId::founded_by(&other), None),
            2,
            b"x",
        );
        assert!(matches!(
            b.verify(&m, PeerMethod::Append, b"x"),
            Err(PeerAuthError::OtherCluster { .. })
        ));
        assert_eq!(
            b.verify(&MetadataMap::new(), PeerMethod::Append, b"x"),
            Err(PeerAuthError::NoSender)
        );
        let m = signed(&PeerAuth::new(2, members(), None), 2, b"x");
        assert_eq!(
            b.verify(&m, PeerMethod::Append, b"x"),
            Err(PeerAuthError::FromSelf)
        );
    }

    #[test]
    fn a_cluster_id_parses_as_printed_and_nothing_else() {
        let id = members();
        assert_eq!(ClusterId::parse(id.as_str()), Ok(id.clone()));
        for bad in ["", "xyz", &id.as_str()[1..], &id.as_str().to_uppercase()] {
            assert!(ClusterId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_secret_is_not_printed() {
        let a = PeerAuth::new(
            1,
            members(),
            Some(ClusterSecret::new(b"do-not-print-me!".to_vec())),
        );
        assert!(!format!("{a:?}").contains("do-not-print-me"));
    }

    #[test]
    fn a_secret_file_readable_by_others_or_too_short_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("secret");
        std::fs::write(&p, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_secret_file(&p).unwrap_err().contains("0600"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            read_secret_file(&p).unwrap(),
            ClusterSecret::new(b"0123456789abcdef0123".to_vec())
        );
        std::fs::write(&p, "short\n").unwrap();
        assert!(read_secret_file(&p).unwrap_err().contains("at least"));
    }

    fn certificate(common_name: &str) -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn with_member_certificates_only_a_certificate_naming_the_sender_speaks_for_it() {
        let b = PeerAuth::new(2, members(), None).with_member_certificates(true);
        assert_eq!(
            b.verify_certificate(1, Some(&[certificate("member-1")])),
            Ok(())
        );
        // A client certificate from the same CA, or another member's, is not member 1's.
        for name in ["client", "member-3", "member-10"] {
            assert!(matches!(
                b.verify_certificate(1, Some(&[certificate(name)])),
                Err(PeerAuthError::NotMemberCertificate { from: 1, .. })
            ));
        }
        assert!(b.verify_certificate(1, None).is_err());
        // Without mTLS between members there is nothing to check.
        let plain = PeerAuth::new(2, members(), None);
        assert_eq!(plain.verify_certificate(1, None), Ok(()));
    }
}
