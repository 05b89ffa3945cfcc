//! Watch: this member's recent lock changes and the live watchers (`Locks.Watch`, `latchkey
//! watch`).
//!
//! The apply observer publishes every applied entry's events ([`latchkey_core::watch_events`])
//! here: the last `WATCH_EVENTS_KEPT` are kept, and every entry goes to a broadcast channel that
//! each watch stream follows. An event's position is its entry's log index (and its ordinal in
//! the entry), the same on every member, so a watcher resumes on any member after the last index
//! it saw. What this member cannot replay (events evicted from the kept ones, entries covered by
//! an installed snapshot or by the snapshot it started from) is announced as `Missed`, never
//! skipped silently: the `floor` below is the highest index whose events may be gone.
//!
//! A stream replays the kept events after its index, then follows the broadcast; one that lags
//! behind the broadcast re-reads from the kept events, or gets the `Missed` notice. At most
//! `WATCHERS_MAX` streams at once. A quiet stream sends `Progress` every `WATCH_PROGRESS_MS`,
//! so the client advances its resume point and takes a member silent for
//! `CLIENT_WATCH_SILENCE_MS` as dead. Before each progress it asks `Node::out_of_touch_for`
//! (`ops.rs`, `leader_contact.rs`): a member out of touch with its group's leader applies
//! nothing new, and its progress would say that nothing changed, so the stream ends with
//! `UNAVAILABLE` `out-of-touch` and the client resumes elsewhere. A leader that steps down
//! stamps the contact itself (`Node::lease_duties`): it was in touch until then. Not caught: a
//! follower cut off with the old leader in a minority still takes that leader's appends
//! (openraft deposes no leader for want of a quorum), so its watches stay, silent, until the
//! partition heals. With several groups a position is per group: the client watches each
//! group with a stream of its own (`WatchRequest.group`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey_core::{limits, WatchEvent};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// One thing a watch stream sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchOut {
    /// Shared with the kept events and every other stream: a stream's replay of up to
    /// `WATCH_EVENTS_KEPT` events (with election values, up to `ELECTION_VALUE_BYTES_MAX` each)
    /// queues pointers, not copies, so `WATCHERS_MAX` streams starting at once cost no more
    /// than one copy of the kept events.
    Event(Arc<WatchEvent>),
    /// The events of entries in `(after, through]` cannot be sent.
    Missed { after: u64, through: u64 },
    /// Every event of the entries up to this index has been sent.
    Progress(u64),
    /// The stream's last item: this member has been out of touch with its group's leader for
    /// this long, so it may have stopped applying while the group goes on
    /// (`Node::out_of_touch_for`). The client resumes on another member.
    OutOfTouch(Duration),
}

/// Whether the member is out of touch with its group's leader, and for how long
/// (`Node::out_of_touch_for`); asked when a stream is quiet.
pub type OutOfTouchFor = Box<dyn Fn() -> Option<Duration> + Send + Sync>;

/// What goes to the live watchers, one per applied entry or installed snapshot.
#[derive(Debug)]
enum Published {
    Entry {
        index: u64,
        events: Vec<Arc<WatchEvent>>,
    },
    /// A snapshot replaced the table: the entries up to `through` were not applied here.
    Installed { through: u64 },
}

struct Kept {
    events: VecDeque<Arc<WatchEvent>>,
    /// Events of entries at or below this index may be missing here.
    floor: u64,
    /// The last entry published (or the snapshot's index).
    last_index: u64,
}

pub struct WatchHub {
    kept: Mutex<Kept>,
    tx: broadcast::Sender<Arc<Published>>,
    watchers: AtomicUsize,
}

#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("too many watch streams on this node (limit {})", limits::WATCHERS_MAX)]
pub struct TooManyWatchers;

impl Default for WatchHub {
    fn default() -> Self {
        WatchHub {
            kept: Mutex::new(Kept {
                events: VecDeque::new(),
                floor: 0,
                last_index: 0,
            }),
            tx: broadcast::channel(limits::WATCH_CHANNEL_CAPACITY).0,
            watchers: AtomicUsize::new(0),
        }
    }
}

impl WatchHub {
    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().expect("watch hub lock")
    }

    /// The state machine started from a table covering the log up to `applied_index` (its
    /// snapshot): events up to it were never seen here.
    pub fn started_at(&self, applied_index: u64) {
        let mut kept = self.kept();
        kept.floor = applied_index;
        kept.last_index = applied_index;
    }

    /// The entry at `index` was applied with these events (from the apply observer).
    pub fn publish(&self, index: u64, events: Vec<WatchEvent>) {
        let events: Vec<Arc<WatchEvent>> = events.into_iter().map(Arc::new).collect();
        let mut kept = self.kept();
        kept.events.extend(events.iter().cloned());
        while kept.events.len() > limits::WATCH_EVENTS_KEPT {
            let gone = kept.events.pop_front().expect("over the limit");
            kept.floor = kept.floor.max(gone.index);
        }
        kept.last_index = kept.last_index.max(index);
        // Sent under the lock, so a subscriber sees each entry either kept or live, not both
        // or neither. No receiver is fine.
        let _ = self.tx.send(Arc::new(Published::Entry { index, events }));
    }

    /// A snapshot covering the log up to `through` replaced the table.
    pub fn installed(&self, through: u64) {
        let mut kept = self.kept();
        kept.events.clear();
        kept.floor = kept.floor.max(through);
        kept.last_index = kept.last_index.max(through);
        let _ = self.tx.send(Arc::new(Published::Installed { through }));
    }

    /// A watch of `prefix` from after `after` (unset: from now). The stream ends at `shutdown`,
    /// when the client goes away (tonic drops it), or after a [`WatchOut::OutOfTouch`]: each
    /// time it has been quiet for `WATCH_PROGRESS_MS` it asks `out_of_touch` before it sends its
    /// progress.
    pub fn watch(
        self: &Arc<Self>,
        prefix: String,
        after: Option<u64>,
        shutdown: CancellationToken,
        out_of_touch: OutOfTouchFor,
    ) -> Result<impl futures::Stream<Item = WatchOut> + Send + 'static, TooManyWatchers> {
        let guard = WatcherGuard::new(self.clone())?;
        let mut cursor = Cursor {
            hub: self.clone(),
            prefix,
            sent: 0,
            pending: VecDeque::new(),
            rx: self.tx.subscribe(),
            shutdown,
            out_of_touch,
            ended: false,
            _guard: guard,
        };
        cursor.start(after, true);
        Ok(futures::stream::unfold(cursor, |mut c| async move {
            c.next().await.map(|out| (out, c))
        }))
    }
}

/// Counts one watch stream against `WATCHERS_MAX` while it lives.
struct WatcherGuard(Arc<WatchHub>);

impl WatcherGuard {
    fn new(hub: Arc<WatchHub>) -> Result<WatcherGuard, TooManyWatchers> {
        hub.watchers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limits::WATCHERS_MAX).then_some(n + 1)
            })
            .map_err(|_| TooManyWatchers)?;
        Ok(WatcherGuard(hub))
    }
}

impl Drop for WatcherGuard {
    fn drop(&mut self) {
        self.0.watchers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One watch stream's position: everything up to `sent` has been sent or declared missed.
struct Cursor {
    hub: Arc<WatchHub>,
    prefix: String,
    sent: u64,
    pending: VecDeque<WatchOut>,
    rx: broadcast::Receiver<Arc<Published>>,
    shutdown: CancellationToken,
    out_of_touch: OutOfTouchFor,
    /// An `OutOfTouch` was sent: nothing more is.
    ended: bool,
    _guard: WatcherGuard,
}

impl Cursor {
    /// (Re)subscribes after `after` (unset: now): what the kept events hold after it, or a
    /// `Missed` for what they no longer hold, then the live channel from there.
    fn start(&mut self, after: Option<u64>, first: bool) {
        let kept = self.hub.kept();
        // Subscribed under the lock: every entry is either in `kept` or still to come on `rx`.
        self.rx = self.hub.tx.subscribe();
        let after = after.unwrap_or(kept.last_index);
        if first {
            self.pending.push_back(WatchOut::Progress(after));
        }
        self.sent = after;
        if after < kept.floor {
            self.pending.push_back(WatchOut::Missed {
                after,
                through: kept.floor,
            });
            self.sent = kept.floor;
        }
        for e in kept.events.iter().filter(|e| e.index > self.sent) {
            if e.lock.starts_with(&self.prefix) {
                self.pending.push_back(WatchOut::Event(e.clone()));
            }
        }
        self.sent = self.sent.max(kept.last_index);
    }

    async fn next(&mut self) -> Option<WatchOut> {
        loop {
            if self.ended {
                return None;
            }
            if let Some(out) = self.pending.pop_front() {
                return Some(out);
            }
            let progress = Duration::from_millis(limits::WATCH_PROGRESS_MS);
            let received = tokio::select! {
                _ = self.shutdown.cancelled() => return None,
                r = tokio::time::timeout(progress, self.rx.recv()) => r,
            };
            match received {
                Err(_quiet) => {
                    if let Some(silent) = (self.out_of_touch)() {
                        self.ended = true;
                        return Some(WatchOut::OutOfTouch(silent));
                    }
                    return Some(WatchOut::Progress(self.sent));
                }
                Ok(Ok(published)) => self.take(&published),
                // Behind the channel: catch up from the kept events (or say what is gone).
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                    let sent = self.sent;
                    self.start(Some(sent), false);
                }
                Ok(Err(broadcast::error::RecvError::Closed)) => return None,
            }
        }
    }

    fn take(&mut self, published: &Published) {
        match published {
            Published::Entry { index, events } => {
                if *index <= self.sent {
                    return;
                }
                self.sent = *index;
                for e in events.iter().filter(|e| e.lock.starts_with(&self.prefix)) {
                    self.pending.push_back(WatchOut::Event(e.clone()));
                }
            }
            Published::Installed { through } => {
                if *through > self.sent {
                    self.pending.push_back(WatchOut::Missed {
                        after: self.sent,
                        through: *through,
                    });
                    self.sent = *through;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use latchkey_core::{SessionId, WatchKind};

    fn event(index: u64, lock: &str) -> WatchEvent {
        WatchEvent {
            index,
            ordinal: 0,
            kind: WatchKind::Granted,
            lock: lock.into(),
            session: SessionId(1),
            token: Some(index),
            mode: Some(latchkey_core::Mode::Exclusive),
            value: None,
        }
    }

    /// A member in touch with its leader.
    fn in_touch() -> OutOfTouchFor {
        Box::new(|| None)
    }

    async fn take(
        s: &mut (impl futures::Stream<Item = WatchOut> + Unpin),
        n: usize,
    ) -> Vec<WatchOut> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(
                tokio::time::timeout(Duration::from_secs(5), s.next())
                    .await
                    .expect("an item in time")
                    .expect("stream open"),
            );
        }
        out
    }

    #[tokio::test]
    async fn replays_kept_events_after_the_index_then_follows_live_ones_filtered() {
        let hub = Arc::new(WatchHub::default());
        hub.started_at(2);
        hub.publish(3, vec![event(3, "a/1")]);
        hub.publish(4, vec![event(4, "b/1")]);
        hub.publish(5, vec![event(5, "a/2")]);
        let s = hub
            .watch("a/".into(), Some(3), CancellationToken::new(), in_touch())
            .unwrap();
        let mut s = Box::pin(s);
        hub.publish(6, vec![event(6, "a/3")]);
        assert_eq!(
            take(&mut s, 3).await,
            vec![
                WatchOut::Progress(3),
                WatchOut::Event(Arc::new(event(5, "a/2"))),
                WatchOut::Event(Arc::new(event(6, "a/3"))),
            ]
        );
    }

    /// Streams replaying the kept events (each up to `WATCH_EVENTS_KEPT`, with election values)
    /// share them: what each stream queues is a pointer to the one kept event.
    #[tokio::test]
    async fn streams_replaying_the_kept_events_share_them() {
        let hub = Arc::new(WatchHub::default());
        hub.publish(5, vec![event(5, "a/1")]);
        let mut replays = Vec::new();
        for _ in 0..2 {
            let mut s = Box::pin(
                hub.watch("a/".into(), Some(0), CancellationToken::new(), in_touch())
                    .unwrap(),
            );
            match take(&mut s, 2).await.pop() {
                Some(WatchOut::Event(e)) => replays.push(e),
                other => panic!("expected the replayed event, got {other:?}"),
            }
        }
        let kept = hub.kept().events[0].clone();
        assert!(replays.iter().all(|e| Arc::ptr_eq(e, &kept)));
    }

    #[tokio::test]
    async fn a_resume_from_before_what_is_kept_is_told_it_missed_events() {
        let hub = Arc::new(WatchHub::default());
        hub.started_at(10);
        hub.publish(11, vec![event(11, "x")]);
        let mut s = Box::pin(
            hub.watch(String::new(), Some(4), CancellationToken::new(), in_touch())
                .unwrap(),
        );
        assert_eq!(
            take(&mut s, 3).await,
            vec![
                WatchOut::Progress(4),
                WatchOut::Missed {
                    after: 4,
                    through: 10
                },
                WatchOut::Event(Arc::new(event(11, "x"))),
            ]
        );
        // A snapshot install while watching: a gap, announced.
        hub.installed(20);
        hub.publish(21, vec![event(21, "y")]);
        assert_eq!(
            take(&mut s, 2).await,
            vec![
                WatchOut::Missed {
                    after: 11,
                    through: 20
                },
                WatchOut::Event(Arc::new(event(21, "y"))),
            ]
        );
    }

    #[tokio::test]
    async fn evicted_events_raise_the_floor() {
        let hub = Arc::new(WatchHub::default());
        for i in 1..=(limits::WATCH_EVENTS_KEPT as u64 + 5) {
            hub.publish(i, vec![event(i, "x")]);
        }
        let mut s = Box::pin(
            hub.watch(String::new(), Some(0), CancellationToken::new(), in_touch())
                .unwrap(),
        );
        assert_eq!(
            take(&mut s, 3).await,
            vec![
                WatchOut::Progress(0),
                WatchOut::Missed {
                    after: 0,
                    through: 5
                },
                WatchOut::Event(Arc::new(event(6, "x"))),
            ]
        );
    }

    #[tokio::test]
    async fn a_lagging_watcher_catches_up_from_the_kept_events_without_a_gap() {
        let hub = Arc::new(WatchHub::default());
        let mut s = Box::pin(
            hub.watch(String::new(), None, CancellationToken::new(), in_touch())
                .unwrap(),
        );
        let n = limits::WATCH_CHANNEL_CAPACITY as u64 * 3;
        for i in 1..=n {
            hub.publish(i, vec![event(i, "x")]);
        }
        let got = take(&mut s, n as usize + 1).await;
        assert_eq!(got[0], WatchOut::Progress(0));
        for (i, out) in got[1..].iter().enumerate() {
            assert_eq!(*out, WatchOut::Event(Arc::new(event(i as u64 + 1, "x"))));
        }
    }

    #[tokio::test]
    async fn watchers_are_bounded_and_counted_down_when_dropped() {
        let hub = Arc::new(WatchHub::default());
        let streams: Vec<_> = (0..limits::WATCHERS_MAX)
            .map(|_| {
                hub.watch(String::new(), None, CancellationToken::new(), in_touch())
                    .unwrap()
            })
            .collect();
        assert!(hub
            .watch(String::new(), None, CancellationToken::new(), in_touch())
            .is_err());
        drop(streams);
        assert!(hub
            .watch(String::new(), None, CancellationToken::new(), in_touch())
            .is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_on_a_member_out_of_touch_with_its_leader_ends_with_how_long() {
        let hub = Arc::new(WatchHub::default());
        let out_of_touch = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = out_of_touch.clone();
        let ask: OutOfTouchFor = Box::new(move || {
            flag.load(Ordering::Relaxed)
                .then_some(Duration::from_secs(4))
        });
        let mut s = Box::pin(
            hub.watch(String::new(), Some(0), CancellationToken::new(), ask)
                .unwrap(),
        );
        hub.publish(1, vec![event(1, "x")]);
        // In touch: quiet means progress.
        assert_eq!(
            take(&mut s, 3).await,
            vec![
                WatchOut::Progress(0),
                WatchOut::Event(Arc::new(event(1, "x"))),
                WatchOut::Progress(1),
            ]
        );
        // Out of touch: what is applied is still sent, then the next quiet moment ends it.
        out_of_touch.store(true, Ordering::Relaxed);
        hub.publish(2, vec![event(2, "x")]);
        assert_eq!(
            take(&mut s, 2).await,
            vec![
                WatchOut::Event(Arc::new(event(2, "x"))),
                WatchOut::OutOfTouch(Duration::from_secs(4)),
            ]
        );
        assert_eq!(s.next().await, None, "nothing after OutOfTouch");
    }
}
