//! Leader election (issue #32): [`Session::campaign`](crate::Session::campaign) waits in the
//! name's FIFO queue and returns a [`Leadership`] once this session leads; [`Client::leader`]
//! reads the current [`Leader`]; [`Client::observe`] streams every change of leader or value.
//!
//! An election is an exclusive lock whose grant publishes a value: the leader is the holder,
//! its term's fencing token is the grant's, and it ends like any grant (resign, session lost,
//! force-release). `observe` is built on [`Watch`], which resumes on another member without
//! repeating or skipping an event; on top of it, fencing tokens strictly increase per name, so
//! an observer that applies only grants above the last token it knows never goes back to an
//! older leader, and reports a change only when (leader, token, value) changes.

use std::future::Future;
use std::time::Duration;

use latchkey_core::{Mode, WatchEvent, WatchKind};

use crate::client::Client;
use crate::error::Error;
use crate::lock::LockGuard;
use crate::watch::{Watch, WatchItem};

/// This session leads an election: the grant of its campaign. Dropping it resigns in the
/// background, as dropping a [`LockGuard`] releases.
#[derive(Debug)]
#[must_use = "dropping a leadership resigns in the background"]
pub struct Leadership {
    guard: LockGuard,
}

impl Leadership {
    pub(crate) fn new(guard: LockGuard) -> Leadership {
        Leadership { guard }
    }

    /// The term's fencing token: above every earlier leader's.
    pub fn token(&self) -> u64 {
        self.guard.token()
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.guard.name()
    }

    /// The grant under it (its fencing headers, `is_lost`, `lost_reason`).
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Completes when the leadership may be lost ([`LockGuard::lost`]): stop acting as leader.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// Whether the leadership may be lost ([`LockGuard::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Replaces the published value without giving up leadership. Fails with
    /// [`Error::Conflict`] (`not-election-leader`) if this term has ended.
    pub async fn proclaim(&self, value: impl Into<Vec<u8>>) -> Result<(), Error> {
        self.guard.proclaim(value.into()).await
    }

    /// Gives up leadership: the next candidate in the queue leads with a higher token.
    pub async fn resign(self) -> Result<(), Error> {
        self.guard.release().await
    }

    /// [`Leadership::resign`], keeping what proclaiming under the ended term needs: for the
    /// simulation, whose clients send such late proclaims (as the network can deliver one
    /// sent before a resign after it) so that its checker sees the server refuse them.
    #[doc(hidden)]
    pub async fn resign_keeping_term(mut self) -> (Result<(), Error>, EndedTerm) {
        let resigned = self.guard.release_in_place().await;
        (resigned, EndedTerm { guard: self.guard })
    }
}

/// A term that ended by [`Leadership::resign_keeping_term`]: proclaims under its token, which
/// the server must refuse (`not-election-leader`). For the simulation only.
#[doc(hidden)]
#[derive(Debug)]
pub struct EndedTerm {
    guard: LockGuard,
}

impl EndedTerm {
    /// The ended term's token.
    pub fn token(&self) -> u64 {
        self.guard.token()
    }

    /// A proclaim under the ended term's token.
    pub async fn proclaim(&self, value: impl Into<Vec<u8>>) -> Result<(), Error> {
        self.guard.proclaim(value.into()).await
    }
}

/// An election's leader as a read tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub session: u64,
    /// The leader's term: its grant's fencing token.
    pub token: u64,
    /// What it published (empty when it took the name as a plain lock, without a value).
    pub value: Vec<u8>,
    /// How long it has led, by the Raft leader's clock (`None` from a watch event, which
    /// carries no time).
    pub held_for: Option<Duration>,
}

impl Client {
    /// The current leader of the election `name` (its exclusive holder; linearizable, read on
    /// the Raft leader), or `None` when nobody leads. Needs `read` on the name.
    pub async fn leader(&self, name: &str) -> Result<Option<Leader>, Error> {
        Ok(self.leader_read(name).await?.0)
    }

    /// [`Client::leader`], with the index of the last log entry applied when it was read.
    async fn leader_read(&self, name: &str) -> Result<(Option<Leader>, u64), Error> {
        let (info, index) = self.describe_read(name).await?;
        let leader = info
            .holders
            .into_iter()
            .next()
            .filter(|_| info.mode == Mode::Exclusive)
            .map(|h| Leader {
                session: h.session,
                token: h.token,
                value: h.value.unwrap_or_default(),
                held_for: Some(h.held_for),
            });
        Ok((leader, index))
    }

    /// Every change of leader or value of the election `name`, from its current leader on;
    /// see [`Observe`]. Needs `read` on the name.
    pub async fn observe(&self, name: &str) -> Result<Observe, Error> {
        // The watch first, then the read: whatever changes in between comes as events,
        // which the tokens put in their place (see the module doc).
        let watch = self.watch(name, None).await?;
        let mut observe = Observe {
            client: self.clone(),
            name: name.to_owned(),
            watch,
            state: Observed::default(),
        };
        observe.resync().await?;
        Ok(observe)
    }
}

/// A stream of an election's leaders ([`Client::observe`]), as etcd's `Observe`: the leader
/// when it started (if one leads), then each new leader and each new value of a leader, never
/// the same twice in a row, never an older leader after a newer one (tokens increase). A time
/// with no leader is not an item: a handover (one log entry ends a term and starts the next)
/// reads as the next leader, and [`Client::leader`] says whether anyone leads now. It resumes
/// across member failures with its watch; if the member can no longer replay what was missed,
/// it re-reads the leader.
pub struct Observe {
    client: Client,
    name: String,
    watch: Watch,
    state: Observed,
}

impl Observe {
    /// The next leader, or the leader's next value.
    pub async fn next(&mut self) -> Result<Leader, Error> {
        loop {
            if let Some(news) = self.state.news() {
                return Ok(news);
            }
            match self.watch.next().await? {
                WatchItem::Event(e) if e.lock == self.name => self.state.apply(e),
                WatchItem::Event(_) => {}
                WatchItem::Missed { .. } => self.resync().await?,
            }
        }
    }

    /// Reads the leader now (a linearizable read).
    async fn resync(&mut self) -> Result<(), Error> {
        let (leader, index) = self.client.leader_read(&self.name).await?;
        self.state.read(leader, index);
        Ok(())
    }
}

/// What an [`Observe`] knows: pure, fed the leader reads and the name's watch events.
#[derive(Debug, Default)]
struct Observed {
    /// The leader as the reads and events tell it now (`None`: nobody leads).
    current: Option<Leader>,
    /// The leader last delivered.
    delivered: Option<Leader>,
    /// The highest token seen for the name: a grant at or below it is old news.
    last_token: u64,
    /// The log index the last read reflects: an event at or below it is in the read already
    /// (a member that lags behind the one read may replay it after the read: a proclaim
    /// replayed then would bring an older value back under the same token).
    read_index: u64,
}

impl Observed {
    /// A read of the leader, reflecting the log up to `index`. One older than what the events
    /// already said (a read that raced them) is ignored.
    fn read(&mut self, leader: Option<Leader>, index: u64) {
        match &leader {
            Some(l) if l.token < self.last_token => return,
            Some(l) => self.last_token = l.token,
            None => {}
        }
        self.read_index = self.read_index.max(index);
        self.current = leader;
    }

    fn apply(&mut self, e: WatchEvent) {
        if e.index <= self.read_index {
            return;
        }
        let token = e.token.unwrap_or(0);
        match e.kind {
            WatchKind::Granted if e.mode == Some(Mode::Exclusive) && token > self.last_token => {
                self.last_token = token;
                self.current = Some(Leader {
                    session: e.session.0,
                    token,
                    value: e.value.unwrap_or_default(),
                    held_for: None,
                });
            }
            WatchKind::Proclaimed => {
                if let Some(l) = self.current.as_mut().filter(|l| l.token == token) {
                    l.value = e.value.unwrap_or_default();
                }
            }
            WatchKind::Released
            | WatchKind::Expired
            | WatchKind::Revoked
            | WatchKind::ForceReleased
                if self.current.as_ref().is_some_and(|l| l.token == token) =>
            {
                self.current = None;
            }
            _ => {}
        }
    }

    /// The leader to deliver, if it is news: another leader or value than the last delivered.
    fn news(&mut self) -> Option<Leader> {
        let now = self.current.as_ref()?;
        let same = self.delivered.as_ref().is_some_and(|d| {
            (d.session, d.token, &d.value) == (now.session, now.token, &now.value)
        });
        if same {
            return None;
        }
        self.delivered = Some(now.clone());
        Some(now.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_core::SessionId;

    /// An event of the entry at log index `index`.
    fn event(
        index: u64,
        kind: WatchKind,
        session: u64,
        token: u64,
        value: Option<&str>,
    ) -> WatchEvent {
        WatchEvent {
            index,
            ordinal: 0,
            kind,
            lock: "svc".into(),
            session: SessionId(session),
            token: Some(token),
            mode: (kind == WatchKind::Granted).then_some(Mode::Exclusive),
            value: value.map(|v| v.as_bytes().to_vec()),
        }
    }

    fn leader(session: u64, token: u64, value: &str) -> Leader {
        Leader {
            session,
            token,
            value: value.as_bytes().to_vec(),
            held_for: None,
        }
    }

    /// Each leader and value once, in term order; a handover reads as the next leader; a read
    /// that raced the events, or a replayed older grant, never brings an older leader back.
    #[test]
    fn each_leader_and_value_is_news_once_and_never_an_older_leader() {
        use WatchKind::*;
        let mut o = Observed::default();
        o.read(Some(leader(1, 10, "a")), 20);
        assert_eq!(o.news(), Some(leader(1, 10, "a")));
        assert_eq!(o.news(), None, "the same leader twice");
        // The events from before the read (the watch opened first) change nothing.
        o.apply(event(10, Granted, 1, 10, Some("a")));
        o.apply(event(7, Granted, 9, 7, Some("old")));
        assert_eq!(o.news(), None);
        o.apply(event(21, Proclaimed, 1, 10, Some("a2")));
        assert_eq!(o.news(), Some(leader(1, 10, "a2")));
        // A proclaim of an ended term is not news.
        o.apply(event(22, Proclaimed, 9, 7, Some("stale")));
        assert_eq!(o.news(), None);
        // A handover: released then granted in one entry; only the new leader is news.
        o.apply(event(23, Released, 1, 10, None));
        assert_eq!(o.news(), None, "no leader is not an item");
        o.apply(event(23, Granted, 2, 12, Some("b")));
        assert_eq!(o.news(), Some(leader(2, 12, "b")));
        // A read older than the events (it raced them) is ignored.
        o.read(Some(leader(1, 10, "a2")), 21);
        assert_eq!(o.news(), None);
        // Readers and permits are not leaders.
        let mut shared = event(25, Granted, 3, 14, None);
        shared.mode = Some(Mode::Shared);
        o.apply(event(24, Expired, 2, 12, None));
        o.apply(shared);
        assert_eq!(o.news(), None);
    }

    /// The watch was opened on a member that lags behind the one the read went to: it replays
    /// the leader's proclaims the read already reflects. Under the same token a replayed
    /// proclaim looks current, so only the read's index tells it is old news.
    #[test]
    fn a_proclaim_replayed_after_a_read_that_reflects_a_later_one_is_not_news() {
        use WatchKind::*;
        let mut o = Observed::default();
        // The read: leader 1 under token 10 with value "v2", as of log index 30.
        o.read(Some(leader(1, 10, "v2")), 30);
        assert_eq!(o.news(), Some(leader(1, 10, "v2")));
        // The lagging member's replay: the grant (index 10) and the first proclaim (index 20).
        // (`Observe::next` asks for news after each event.)
        for e in [
            event(10, Granted, 1, 10, Some("v0")),
            event(20, Proclaimed, 1, 10, Some("v1")),
            event(30, Proclaimed, 1, 10, Some("v2")),
        ] {
            o.apply(e);
            assert_eq!(o.news(), None, "an older value after a newer one");
        }
        // What comes after the read is news.
        o.apply(event(31, Proclaimed, 1, 10, Some("v3")));
        assert_eq!(o.news(), Some(leader(1, 10, "v3")));
    }
}
