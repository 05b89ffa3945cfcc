//! Refused clients, made visible (issue #31 item 5): every refusal is counted by reason
//! (`latchkey_auth_refused_total{reason}` on `/metrics`) and logged with the client's address,
//! through a token bucket so that a flood of refusals can neither flood the log nor grow the
//! member's memory.
//!
//! Two places refuse a client, and both report here: the TLS accept loop (`tls.rs`), for a
//! handshake without a certificate the CA signed, below gRPC and HTTP; and `Node::authorize`
//! (`ops.rs`), the one access check of both client APIs, for everything the access-control
//! list refuses (and, through [`crate::access::acl::Caller`], a quota it exceeds).
//!
//! The label values are this module's fixed strings ([`Reason::as_str`]), never anything a
//! client sent: an attacker cannot make series. The state is one bucket and one count per
//! reason, whatever the number of addresses refusals come from.

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

    fn index(self) -> usize {
        self as usize
    }
}

/// The `reason` label of `latchkey_auth_refused_total`.
pub(crate) type ReasonLabel = [(&'static str, &'static str); 1];

/// The refusals the log left out since its last line, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Suppressed([u64; Reason::ALL.len()]);

impl Suppressed {
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

impl fmt::Display for Suppressed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for reason in Reason::ALL {
            let n = self.0[reason.index()];
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
pub struct LogBucket {
    tokens: u32,
    /// When the last token was added (or the bucket found full); `None` before the first line.
    refilled_at: Option<Instant>,
    suppressed: Suppressed,
}

impl Default for LogBucket {
    fn default() -> LogBucket {
        LogBucket {
            tokens: limits::REFUSAL_LOG_BURST,
            refilled_at: None,
            suppressed: Suppressed::default(),
        }
    }
}

impl LogBucket {
    /// A refusal for `reason` at `now`: `Some(left out since the last line)` when its line may
    /// be written, `None` when it is left out (and counted).
    pub fn admit(&mut self, now: Instant, reason: Reason) -> Option<Suppressed> {
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
            self.suppressed.0[reason.index()] += 1;
            return None;
        }
        self.tokens -= 1;
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// A member's record of refused clients: the counters and the rate-limited log.
pub struct Refusals {
    counts: Family<ReasonLabel, Counter<u64, AtomicU64>>,
    log: Mutex<LogBucket>,
}

impl fmt::Debug for Refusals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refusals").finish_non_exhaustive()
    }
}

impl Default for Refusals {
    fn default() -> Refusals {
        Refusals::new()
    }
}

impl Refusals {
    pub fn new() -> Refusals {
        let counts = Family::<ReasonLabel, Counter<u64, AtomicU64>>::default();
        // Every reason's series from the start, at 0: a rate or an alert needs no first refusal.
        for reason in Reason::ALL {
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
    pub fn count(&self, reason: Reason) -> u64 {
        self.counts
            .get_or_create(&[("reason", reason.as_str())])
            .get()
    }

    /// Counts a refusal and logs it (rate-limited): `from` is the client's address, `why` the
    /// explanation it was given (cut to `REFUSAL_LOG_DETAIL_BYTES_MAX`).
    pub fn refused(&self, from: Option<SocketAddr>, reason: Reason, why: &dyn fmt::Display) {
        self.counts
            .get_or_create(&[("reason", reason.as_str())])
            .inc();
        let admitted = self
            .log
            .lock()
            .expect("refusal log lock poisoned")
            .admit(Instant::now(), reason);
        let Some(suppressed) = admitted else {
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
fn cut(mut text: String, max: usize) -> String {
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
            assert_eq!(refusals.count(reason), 0);
        }
        refusals.refused(None, Reason::PermissionDenied, &"x".repeat(100_000));
        assert_eq!(refusals.count(Reason::PermissionDenied), 1);
        let labels: std::collections::BTreeSet<_> =
            Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), Reason::ALL.len(), "labels are distinct");
        for (i, reason) in Reason::ALL.iter().enumerate() {
            assert_eq!(reason.index(), i);
        }
    }

    #[test]
    fn a_long_explanation_is_cut_at_a_character() {
        assert_eq!(cut("abc".into(), 3), "abc");
        assert_eq!(cut("abcd".into(), 3), "abc...");
        assert_eq!(cut("aé".into(), 2), "a...");
    }
}
