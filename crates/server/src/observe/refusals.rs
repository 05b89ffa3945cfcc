//! Refusals, made visible (issue #31 item 5): every refusal is counted by reason and logged
//! with where it came from, through a token bucket so that a flood of refusals can neither
//! flood the log nor grow the member's memory. One mechanism, [`Refusals`], for the two kinds
//! of refusal a member makes, each with its own closed set of reasons, counter and bucket (a
//! flood of one kind does not silence the other):
//!
//! - a refused client ([`Reason`], `latchkey_auth_refused_total{reason}`): the TLS accept loop
//!   (`tls.rs`), for a handshake without a certificate the CA signed, below gRPC and HTTP; and
//!   `Node::authorize` (`ops.rs`), the one access check of both client APIs, for everything the
//!   access-control list refuses (and, through [`crate::access::acl::Caller`], a quota it
//!   exceeds). Logged here ([`Refusals::refused`]).
//! - a refused peer RPC ([`PeerReason`], `latchkey_peer_refused_total{reason}`): the peer
//!   service's one admission path (`cluster/peer/admission.rs`), which writes the line (the
//!   sender's address, the member it claims to be, the group) when [`Refusals::count`] lets it.
//!
//! The label values are this module's fixed strings ([`RefusalReason::as_str`]), never anything
//! a client or peer sent: an attacker cannot make series. The state is one bucket and one count
//! per reason, whatever the number of addresses refusals come from.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use latchkey_core::limits;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// Why a client was refused: the `reason` label, a fixed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A TLS handshake without a client certificate where `--tls-ca` requires one.
    NoCertificate,
    /// A TLS handshake whose client certificate the CA did not sign (or that is expired, or
    /// otherwise refused by the verifier).
    BadCertificate,
    /// Access control is on and the call carries neither a token nor a client certificate.
    NoCredentials,
    /// An `authorization` header that is not `Bearer TOKEN`.
    BadToken,
    /// A bearer token whose hash no identity has.
    UnknownToken,
    /// A client certificate naming no identity of the access-control list.
    UnknownIdentity,
    /// A call its identity's roles do not allow.
    PermissionDenied,
    /// A call with a session of another identity.
    NotSessionOwner,
    /// A new session or queued acquire beyond the identity's quota.
    Quota,
}

/// A closed set of refusal reasons: the `reason` label of one counter, and what its log left
/// out. `ALL[r.index()] == r`.
pub trait RefusalReason: Copy + Eq + fmt::Debug + Send + Sync + 'static {
    const ALL: &'static [Self];

    /// The label value.
    fn as_str(self) -> &'static str;

    /// The position in `ALL`.
    fn index(self) -> usize;
}

impl RefusalReason for Reason {
    const ALL: &'static [Reason] = &Reason::ALL;

    fn as_str(self) -> &'static str {
        Reason::as_str(self)
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl Reason {
    pub const ALL: [Reason; 9] = [
        Reason::NoCertificate,
        Reason::BadCertificate,
        Reason::NoCredentials,
        Reason::BadToken,
        Reason::UnknownToken,
        Reason::UnknownIdentity,
        Reason::PermissionDenied,
        Reason::NotSessionOwner,
        Reason::Quota,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NoCertificate => "no-certificate",
            Reason::BadCertificate => "bad-certificate",
            Reason::NoCredentials => "no-credentials",
            Reason::BadToken => "bad-token",
            Reason::UnknownToken => "unknown-token",
            Reason::UnknownIdentity => "unknown-identity",
            Reason::PermissionDenied => "permission-denied",
            Reason::NotSessionOwner => "not-session-owner",
            Reason::Quota => "quota",
        }
    }
}

/// Why a peer RPC was refused (`peer/admission.rs`): the `reason` label of
/// `latchkey_peer_refused_total`, a fixed set. The first nine are the sender's credentials
/// (`PeerAuthError`, `peer_auth.rs`), the rest what its message says (`peer/service.rs`'s checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerReason {
    /// A `latchkey-peer-group` that is not a number, or names a group this member does not run.
    UnknownGroup,
    /// No readable `latchkey-peer-from` member id.
    NoSender,
    /// A message claiming to come from this member itself.
    FromSelf,
    /// Another cluster's (or group's) fingerprint.
    OtherCluster,
    /// No MAC where the cluster has a secret.
    NoMac,
    /// A MAC that does not verify (another secret, an altered or replayed message).
    BadMac,
    /// With mTLS between members, a connection whose certificate does not name the sender.
    NotMemberCertificate,
    /// A sender outside this group's membership whose message vouches for nothing.
    NotAMember,
    /// A sender a membership change removed from this group.
    RemovedMember,
    /// A payload or chunk header that does not decode, or a stream that does not begin as one
    /// must (`INVALID_ARGUMENT`, the others are `PERMISSION_DENIED`).
    Malformed,
    /// An append or snapshot chunk out of its place in its stream.
    OutOfPlace,
    /// A message speaking for another member's vote than its sender's.
    NotItsVote,
    /// An append that rewrites an entry this member committed.
    RewritesCommitted,
    /// A vote that would skip the leader lease for a member the leader did not name its
    /// successor, or a successor named by a member that does not lead this term.
    Succession,
    /// A snapshot above this member's table budget.
    SnapshotTooLarge,
    /// A snapshot that does not check out (its vote, meta, length, data or invariants).
    BadSnapshot,
}

impl PeerReason {
    pub const ALL: [PeerReason; 16] = [
        PeerReason::UnknownGroup,
        PeerReason::NoSender,
        PeerReason::FromSelf,
        PeerReason::OtherCluster,
        PeerReason::NoMac,
        PeerReason::BadMac,
        PeerReason::NotMemberCertificate,
        PeerReason::NotAMember,
        PeerReason::RemovedMember,
        PeerReason::Malformed,
        PeerReason::OutOfPlace,
        PeerReason::NotItsVote,
        PeerReason::RewritesCommitted,
        PeerReason::Succession,
        PeerReason::SnapshotTooLarge,
        PeerReason::BadSnapshot,
    ];
}

impl RefusalReason for PeerReason {
    const ALL: &'static [PeerReason] = &PeerReason::ALL;

    fn as_str(self) -> &'static str {
        match self {
            PeerReason::UnknownGroup => "unknown-group",
            PeerReason::NoSender => "no-sender",
            PeerReason::FromSelf => "from-self",
            PeerReason::OtherCluster => "other-cluster",
            PeerReason::NoMac => "no-mac",
            PeerReason::BadMac => "bad-mac",
            PeerReason::NotMemberCertificate => "not-member-certificate",
            PeerReason::NotAMember => "not-a-member",
            PeerReason::RemovedMember => "removed-member",
            PeerReason::Malformed => "malformed",
            PeerReason::OutOfPlace => "out-of-place",
            PeerReason::NotItsVote => "not-its-vote",
            PeerReason::RewritesCommitted => "rewrites-committed",
            PeerReason::Succession => "succession",
            PeerReason::SnapshotTooLarge => "snapshot-too-large",
            PeerReason::BadSnapshot => "bad-snapshot",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The `reason` label of a refusal counter.
pub(crate) type ReasonLabel = [(&'static str, &'static str); 1];

/// The refusals the log left out since its last line, by reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suppressed<R = Reason> {
    /// By `R::index`; as long as `R::ALL`.
    counts: Vec<u64>,
    _reasons: std::marker::PhantomData<R>,
}

impl<R: RefusalReason> Default for Suppressed<R> {
    fn default() -> Suppressed<R> {
        Suppressed {
            counts: vec![0; R::ALL.len()],
            _reasons: std::marker::PhantomData,
        }
    }
}

impl<R: RefusalReason> Suppressed<R> {
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

impl<R: RefusalReason> fmt::Display for Suppressed<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for &reason in R::ALL {
            let n = self.counts[reason.index()];
            if n > 0 {
                let sep = if first { "" } else { ", " };
                write!(f, "{sep}{}: {n}", reason.as_str())?;
                first = false;
            }
        }
        Ok(())
    }
}

/// The refusal log's token bucket, pure (the caller gives the time): at most
/// `REFUSAL_LOG_BURST` lines at once, one more every `REFUSAL_LOG_REFILL_MS`; what it leaves out
/// is counted by reason and handed to the next line it lets through.
#[derive(Debug)]
pub struct LogBucket<R = Reason> {
    tokens: u32,
    /// When the last token was added (or the bucket found full); `None` before the first line.
    refilled_at: Option<Instant>,
    suppressed: Suppressed<R>,
}

impl<R: RefusalReason> Default for LogBucket<R> {
    fn default() -> LogBucket<R> {
        LogBucket {
            tokens: limits::REFUSAL_LOG_BURST,
            refilled_at: None,
            suppressed: Suppressed::default(),
        }
    }
}

impl<R: RefusalReason> LogBucket<R> {
    /// A refusal for `reason` at `now`: `Some(left out since the last line)` when its line may
    /// be written, `None` when it is left out (and counted).
    pub fn admit(&mut self, now: Instant, reason: R) -> Option<Suppressed<R>> {
        let refill = Duration::from_millis(limits::REFUSAL_LOG_REFILL_MS);
        let since = *self.refilled_at.get_or_insert(now);
        let earned = now.saturating_duration_since(since).as_millis() / refill.as_millis();
        if earned > 0 {
            let room = u128::from(limits::REFUSAL_LOG_BURST - self.tokens);
            self.tokens += earned.min(room) as u32;
            // Full: time spent full earns nothing later.
            self.refilled_at = Some(if earned >= room {
                now
            } else {
                since + refill * earned as u32
            });
        }
        if self.tokens == 0 {
            self.suppressed.counts[reason.index()] += 1;
            return None;
        }
        self.tokens -= 1;
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// A member's record of one kind of refusal: the counters and the rate-limited log.
pub struct Refusals<R = Reason> {
    counts: Family<ReasonLabel, Counter<u64, AtomicU64>>,
    log: Mutex<LogBucket<R>>,
}

impl<R> fmt::Debug for Refusals<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refusals").finish_non_exhaustive()
    }
}

impl<R: RefusalReason> Default for Refusals<R> {
    fn default() -> Refusals<R> {
        Refusals::new()
    }
}

impl<R: RefusalReason> Refusals<R> {
    pub fn new() -> Refusals<R> {
        let counts = Family::<ReasonLabel, Counter<u64, AtomicU64>>::default();
        // Every reason's series from the start, at 0: a rate or an alert needs no first refusal.
        for &reason in R::ALL {
            counts
                .get_or_create(&[("reason", reason.as_str())])
                .inc_by(0);
        }
        Refusals {
            counts,
            log: Mutex::new(LogBucket::default()),
        }
    }

    /// The counters, for the metrics registry.
    pub(crate) fn counts(&self) -> Family<ReasonLabel, Counter<u64, AtomicU64>> {
        self.counts.clone()
    }

    /// How many refusals of `reason` were counted.
    pub fn counted(&self, reason: R) -> u64 {
        self.counts
            .get_or_create(&[("reason", reason.as_str())])
            .get()
    }

    /// Counts a refusal of `reason` that gets no line of this log (its caller logged it
    /// already, and says so at debug).
    pub fn count_unlogged(&self, reason: R) {
        self.counts
            .get_or_create(&[("reason", reason.as_str())])
            .inc();
    }

    /// Counts a refusal of `reason`: `Some(the refusals left out since the last line)` when
    /// its log line may be written now, `None` when the log leaves it out.
    pub fn count(&self, reason: R) -> Option<Suppressed<R>> {
        self.count_unlogged(reason);
        self.log
            .lock()
            .expect("refusal log lock poisoned")
            .admit(Instant::now(), reason)
    }
}

impl Refusals<Reason> {
    /// Counts a refused client and logs it (rate-limited): `from` is the client's address,
    /// `why` the explanation it was given (cut to `REFUSAL_LOG_DETAIL_BYTES_MAX`).
    pub fn refused(&self, from: Option<SocketAddr>, reason: Reason, why: &dyn fmt::Display) {
        let Some(suppressed) = self.count(reason) else {
            return;
        };
        let from = from.map_or_else(|| "an unknown address".to_owned(), |a| a.to_string());
        let why = cut(why.to_string(), limits::REFUSAL_LOG_DETAIL_BYTES_MAX);
        let reason = reason.as_str();
        match suppressed.total() {
            0 => tracing::warn!(%from, reason, "refused a client ({reason}) from {from}: {why}"),
            n => tracing::warn!(
                %from,
                reason,
                suppressed = n,
                "refused a client ({reason}) from {from}: {why} ({n} refusals not logged since \
                 the last line: {suppressed})"
            ),
        }
    }
}

/// `text` cut to at most `max` bytes, at a character boundary, marked when cut.
pub(crate) fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFILL: Duration = Duration::from_millis(limits::REFUSAL_LOG_REFILL_MS);

    #[test]
    fn a_flood_gets_the_burst_then_one_line_per_refill_with_what_was_left_out() {
        let mut bucket = LogBucket::default();
        let start = Instant::now();
        let burst = limits::REFUSAL_LOG_BURST as usize;
        let written = (0..10_000)
            .filter(|_| bucket.admit(start, Reason::UnknownToken).is_some())
            .count();
        assert_eq!(written, burst);
        // Half a refill later: still nothing.
        assert_eq!(bucket.admit(start + REFILL / 2, Reason::Quota), None);
        // One refill later, one line, which carries every refusal left out, by reason.
        let said = bucket
            .admit(start + REFILL, Reason::NoCertificate)
            .expect("a line after a refill");
        assert_eq!(said.total(), 10_000 - burst as u64 + 1);
        assert_eq!(
            said.to_string(),
            format!("unknown-token: {}, quota: 1", 10_000 - burst)
        );
        assert_eq!(bucket.admit(start + REFILL, Reason::NoCertificate), None);
    }

    #[test]
    fn a_quiet_spell_refills_the_burst_and_no_more() {
        let mut bucket = LogBucket::default();
        let start = Instant::now();
        while bucket.admit(start, Reason::BadToken).is_some() {}
        let later = start + REFILL * 1_000;
        let written = (0..100)
            .filter(|_| bucket.admit(later, Reason::BadToken).is_some())
            .count();
        assert_eq!(written, limits::REFUSAL_LOG_BURST as usize);
        // The first line after the spell said what was left out; later ones have nothing to say.
        let mut bucket = LogBucket::default();
        assert_eq!(
            bucket.admit(start, Reason::Quota),
            Some(Suppressed::default())
        );
    }

    #[test]
    fn every_reason_has_its_series_from_the_start_and_counts() {
        let refusals = Refusals::new();
        for reason in Reason::ALL {
            assert_eq!(refusals.counted(reason), 0);
        }
        refusals.refused(None, Reason::PermissionDenied, &"x".repeat(100_000));
        assert_eq!(refusals.counted(Reason::PermissionDenied), 1);
        labels_are_distinct_and_indexed::<Reason>();
        labels_are_distinct_and_indexed::<PeerReason>();
    }

    fn labels_are_distinct_and_indexed<R: RefusalReason>() {
        let labels: std::collections::BTreeSet<_> = R::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), R::ALL.len(), "labels are distinct");
        for (i, reason) in R::ALL.iter().enumerate() {
            assert_eq!(reason.index(), i, "{reason:?}");
        }
    }

    /// Peer refusals (issue #31): counted by reason whatever the log leaves out, their own
    /// bucket (a flood of refused clients does not silence them), and the line after a flood
    /// says what it left out, by peer reason.
    #[test]
    fn peer_refusals_are_all_counted_and_their_log_is_rate_limited_on_its_own() {
        let clients = Refusals::<Reason>::new();
        let peers = Refusals::<PeerReason>::new();
        for reason in PeerReason::ALL {
            assert_eq!(peers.counted(reason), 0);
        }
        while clients.count(Reason::UnknownToken).is_some() {}
        let burst = limits::REFUSAL_LOG_BURST as usize;
        let lines = (0..1_000)
            .filter(|_| peers.count(PeerReason::BadMac).is_some())
            .count();
        assert_eq!(lines, burst, "the peers' bucket is their own, and bounded");
        assert_eq!(
            peers.counted(PeerReason::BadMac),
            1_000,
            "every refusal counted"
        );
        assert_eq!(peers.counted(PeerReason::NoMac), 0);
        let mut bucket = LogBucket::<PeerReason>::default();
        let start = Instant::now();
        while bucket.admit(start, PeerReason::RemovedMember).is_some() {}
        let said = bucket
            .admit(start + REFILL, PeerReason::OutOfPlace)
            .expect("a line after a refill");
        assert_eq!(said.to_string(), "removed-member: 1");
    }

    #[test]
    fn a_long_explanation_is_cut_at_a_character() {
        assert_eq!(cut("abc".into(), 3), "abc");
        assert_eq!(cut("abcd".into(), 3), "abc...");
        assert_eq!(cut("aé".into(), 2), "a...");
    }
}
