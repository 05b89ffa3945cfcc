//! [`Watch`]: a stream of lock changes that survives its member.
//!
//! Every member applies the same log, so an event's position (log index, ordinal within the
//! entry) is the same on every member. The watch remembers the last position it delivered; when
//! its stream breaks (the member died or restarted, its connection stalled past
//! `CLIENT_WATCH_SILENCE_MS`) it opens a new one on another endpoint from that index and drops
//! what it already delivered. Events a member can no longer replay come as
//! [`WatchItem::Missed`], never as a silent gap.
//!
//! In a cluster of several Raft groups (issue #16) each group has its own log, so positions are
//! per group: a watch is one stream per group (`GroupWatch`, each resuming on its own), read by
//! one task per group into one bounded queue that [`Watch::next`] takes from, each item with
//! its group and that group's resume index once it is delivered.

use std::time::Duration;

use latchkey_core::{limits, SessionId, WatchEvent, WatchKind};
use latchkey_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::Streaming;

use crate::client::{CallOpts, Client};
use crate::error::Error;
use crate::retry::Backoff;

/// One item of a [`Watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchItem {
    Event(WatchEvent),
    /// The events of the entries after `after_index` up to `through_index` cannot be delivered
    /// (the member no longer keeps them); re-read the locks if their state matters.
    Missed {
        after_index: u64,
        through_index: u64,
    },
}

/// "Every event of this index delivered": sorts after any ordinal of it.
const WHOLE_ENTRY: u32 = u32::MAX;

/// A watch of the locks under one prefix; see [`Client::watch`].
pub struct Watch {
    inner: Inner,
}

enum Inner {
    /// A cluster of one group: its stream, read here.
    One(Box<GroupWatch>),
    /// Several groups: their streams, each read by a task of `tasks`.
    Many(Merged),
}

struct Merged {
    rx: mpsc::Receiver<Delivered>,
    /// Each group's resume index after the items taken so far.
    resume: Vec<Option<u64>>,
    /// Aborted when the watch is dropped.
    tasks: JoinSet<()>,
    /// The error that ended a group's stream: the watch ends with it.
    ended: Option<Error>,
}

/// One step of a group's stream (an item, or `None`: its position moved without one, a
/// `Progress`), with that group's resume index once it is taken.
struct Delivered {
    group: u32,
    item: Result<Option<WatchItem>, Error>,
    resume: Option<u64>,
}

/// The stream of one Raft group, resumed on another member when it breaks.
struct GroupWatch {
    client: Client,
    prefix: String,
    /// The group watched, of `groups` (`group` is unset in the request with one group).
    group: u32,
    groups: u32,
    /// The position of the last thing delivered: `(index, WHOLE_ENTRY)` once every event of
    /// `index` is; `None` until the first stream said where it starts.
    last: Option<(u64, u32)>,
    stream: Option<(Streaming<pb::WatchMessage>, String)>,
    /// Streams opened in a row that broke before they delivered anything.
    broken: u32,
    backoff: Backoff,
}

impl Client {
    /// Watches the locks whose names start with `prefix`: grants, releases, expiries, queue
    /// changes, in log order, from after log index `after_index` (`None`: from now). Needs
    /// `read` on the prefix under access control. The watch moves to another endpoint by
    /// itself when its member fails, without repeating or skipping an event.
    ///
    /// In a cluster of several Raft groups each group's events come in its log order, the
    /// groups' interleaved as they arrive; `after_index` must be `None` there (each group has
    /// its own positions: [`Client::watch_from`] resumes one).
    pub async fn watch(&self, prefix: &str, after_index: Option<u64>) -> Result<Watch, Error> {
        let after = after_index.map(|i| vec![i]);
        self.watch_from(prefix, after.as_deref()).await
    }

    /// [`Client::watch`] from after one log index per Raft group (`after[g]` for group g, as
    /// [`Watch::resume_indexes`] gave them; one index with one group), or from now (`None`).
    pub async fn watch_from(&self, prefix: &str, after: Option<&[u64]>) -> Result<Watch, Error> {
        let groups = self.groups().await?;
        if let Some(after) = after {
            if after.len() != groups as usize {
                return Err(Error::InvalidArgument {
                    message: format!(
                        "a watch resumes after one log index per Raft group: this cluster has \
                         {groups}, and {} were given",
                        after.len()
                    ),
                });
            }
        }
        let mut watches = Vec::with_capacity(groups as usize);
        for group in 0..groups {
            let mut watch = GroupWatch {
                client: self.clone(),
                prefix: prefix.to_owned(),
                group,
                groups,
                last: after.map(|a| (a[group as usize], WHOLE_ENTRY)),
                stream: None,
                broken: 0,
                backoff: Backoff::new(&self.config().retry),
            };
            // Opened here, so that a refusal (access, a bad prefix) is this call's error.
            watch.open().await?;
            watches.push(watch);
        }
        if groups == 1 {
            let one = watches.pop().expect("one group");
            return Ok(Watch {
                inner: Inner::One(Box::new(one)),
            });
        }
        let (tx, rx) = mpsc::channel(limits::CLIENT_WATCH_GROUP_ITEMS_QUEUED_MAX * groups as usize);
        let resume = watches.iter().map(GroupWatch::resume_index).collect();
        let mut tasks = JoinSet::new();
        for mut watch in watches {
            let tx = tx.clone();
            tasks.spawn(async move {
                loop {
                    let item = watch.next_step().await;
                    let done = item.is_err();
                    let delivered = Delivered {
                        group: watch.group,
                        item,
                        resume: watch.resume_index(),
                    };
                    // The watch was dropped, or this group's stream ended it.
                    if tx.send(delivered).await.is_err() || done {
                        return;
                    }
                }
            });
        }
        Ok(Watch {
            inner: Inner::Many(Merged {
                rx,
                resume,
                tasks,
                ended: None,
            }),
        })
    }
}

impl Watch {
    /// The Raft groups watched (1 in a cluster of one).
    pub fn groups(&self) -> u32 {
        match &self.inner {
            Inner::One(_) => 1,
            Inner::Many(m) => m.resume.len() as u32,
        }
    }

    /// The next event (or missed notice). Waits as long as nothing changes; an error means the
    /// watch gave up (no member answered within the client's retry budget, or access was
    /// refused).
    pub async fn next(&mut self) -> Result<WatchItem, Error> {
        self.next_in_group().await.map(|(_, item)| item)
    }

    /// [`Watch::next`], with the Raft group whose log the item is of (0 with one group): an
    /// event's index is of that group's log.
    pub async fn next_in_group(&mut self) -> Result<(u32, WatchItem), Error> {
        match &mut self.inner {
            Inner::One(watch) => watch.next().await.map(|item| (0, item)),
            Inner::Many(merged) => {
                loop {
                    if let Some(e) = &merged.ended {
                        return Err(e.clone());
                    }
                    tokio::select! {
                        // What a task sent before it ended comes first.
                        biased;
                        delivered = merged.rx.recv() => {
                            let Some(delivered) = delivered else {
                                // Every task ends by sending its error first, unless it panicked.
                                merged.ended =
                                    Some(Error::Protocol("every group's watch task stopped".into()));
                                continue;
                            };
                            match delivered.item {
                                Ok(item) => {
                                    merged.resume[delivered.group as usize] = delivered.resume;
                                    if let Some(item) = item {
                                        return Ok((delivered.group, item));
                                    }
                                }
                                Err(e) => merged.ended = Some(e),
                            }
                        }
                        // A group whose task panicked would go silent while the others go on:
                        // a gap nobody announced. End the watch instead.
                        Some(joined) = merged.tasks.join_next() => {
                            if let Err(e) = joined {
                                merged.ended = Some(Error::Protocol(format!(
                                    "a group's watch task failed: {e}"
                                )));
                            }
                        }
                    }
                }
            }
        }
    }

    /// The log index up to which every event has been delivered (or announced missed): where
    /// a new watch would resume (`latchkey watch --after`). With several Raft groups, `None`:
    /// see [`Watch::resume_indexes`].
    pub fn resume_index(&self) -> Option<u64> {
        match &self.inner {
            Inner::One(watch) => watch.resume_index(),
            Inner::Many(_) => None,
        }
    }

    /// Each group's [`Watch::resume_index`], in group order, once every group has one (for
    /// [`Client::watch_from`]).
    pub fn resume_indexes(&self) -> Option<Vec<u64>> {
        match &self.inner {
            Inner::One(watch) => watch.resume_index().map(|i| vec![i]),
            Inner::Many(merged) => merged.resume.iter().copied().collect(),
        }
    }
}

impl GroupWatch {
    /// The log index up to which every event has been delivered (or announced missed): where
    /// a new watch would resume (`latchkey watch --after`).
    pub fn resume_index(&self) -> Option<u64> {
        self.last
            .map(|(i, o)| if o == WHOLE_ENTRY { i } else { i - 1 })
    }

    async fn open(&mut self) -> Result<(), Error> {
        let request = pb::WatchRequest {
            prefix: self.prefix.clone(),
            after_index: self.resume_index(),
            group: (self.groups > 1).then_some(self.group),
        };
        let opts = CallOpts {
            attempt_timeout: self.client.config().rpc_timeout,
            backoff_max: None,
            group: self.group,
        };
        let (stream, answered) = self
            .client
            .call_traced(opts, request, |mut c, mut r| async move {
                // The attempt's deadline bounds opening the stream; the stream itself is
                // open-ended, so the server must not be told to end it then.
                r.metadata_mut().remove("grpc-timeout");
                c.watch(r).await
            })
            .await?;
        self.stream = Some((stream, answered.endpoint));
        Ok(())
    }

    /// The next event (or missed notice).
    async fn next(&mut self) -> Result<WatchItem, Error> {
        loop {
            if let Some(item) = self.next_step().await? {
                return Ok(item);
            }
        }
    }

    /// The next item, or `None` once a message moved the position without one (a `Progress`
    /// past it), so that a watch of several groups knows each group's resume index even when
    /// nothing under the prefix changes there. Waits as long as nothing changes; an error means
    /// the watch gave up (no member answered within the client's retry budget, or access was
    /// refused).
    async fn next_step(&mut self) -> Result<Option<WatchItem>, Error> {
        let silence = Duration::from_millis(limits::CLIENT_WATCH_SILENCE_MS);
        loop {
            let Some((stream, endpoint)) = self.stream.as_mut() else {
                self.broken += 1;
                if self.broken > self.client.config().retry.attempts_max {
                    return Err(Error::Protocol(format!(
                        "watch: {} streams in a row broke before delivering anything",
                        self.broken - 1
                    )));
                }
                if self.broken > 1 {
                    let delay = self.client.backoff_delay(&mut self.backoff);
                    tokio::time::sleep(self.client.clock().timer_duration(delay)).await;
                }
                self.open().await?;
                continue;
            };
            let message = match tokio::time::timeout(silence, stream.message()).await {
                Ok(Ok(Some(message))) => message,
                Ok(Err(status)) => {
                    // An access or argument error is not cured by another member.
                    if let Some(e) = fatal(&status) {
                        return Err(e);
                    }
                    tracing::debug!(%endpoint, %status, "watch stream broke; resuming");
                    self.lost_stream();
                    continue;
                }
                Ok(Ok(None)) | Err(_) => {
                    tracing::debug!(%endpoint, "watch stream ended or went silent; resuming");
                    self.lost_stream();
                    continue;
                }
            };
            self.broken = 0;
            self.backoff = Backoff::new(&self.client.config().retry);
            let before = self.last;
            if let Some(item) = self.accept(message)? {
                return Ok(Some(item));
            }
            if self.last != before {
                return Ok(None);
            }
        }
    }

    fn lost_stream(&mut self) {
        if let Some((_, endpoint)) = self.stream.take() {
            self.client.unreachable(&endpoint);
        }
    }

    /// Takes one message of the stream: the item to deliver, if it is news.
    fn accept(&mut self, message: pb::WatchMessage) -> Result<Option<WatchItem>, Error> {
        use pb::watch_message::Item;
        let item = message
            .item
            .ok_or_else(|| Error::Protocol("Watch sent an empty message".into()))?;
        let (position, out) = match item {
            Item::Progress(p) => ((p.index, WHOLE_ENTRY), None),
            Item::Missed(m) => (
                (m.through_index, WHOLE_ENTRY),
                Some(WatchItem::Missed {
                    after_index: m.after_index,
                    through_index: m.through_index,
                }),
            ),
            Item::Event(e) => {
                let kind = WatchKind::parse(&e.kind).ok_or_else(|| {
                    Error::Protocol(format!("Watch sent an unknown event kind {:?}", e.kind))
                })?;
                let token = match kind {
                    WatchKind::Queued | WatchKind::WaitEnded => None,
                    _ => Some(e.token),
                };
                let event = WatchEvent {
                    index: e.index,
                    ordinal: e.ordinal,
                    kind,
                    lock: e.lock,
                    session: SessionId(e.session),
                    token,
                    mode: e.mode.map(|m| crate::types::mode_from_pb(m, e.permits)),
                    value: e.value,
                };
                (event.position(), Some(WatchItem::Event(event)))
            }
        };
        // Already delivered (a resumed stream replays the last entry): drop it.
        if self.last.is_some_and(|last| position <= last) {
            return Ok(None);
        }
        self.last = Some(position);
        Ok(out)
    }
}

/// The statuses that end a watch rather than move it to another member.
fn fatal(status: &tonic::Status) -> Option<Error> {
    use tonic::Code;
    match (status.code(), crate::error::classify(status)) {
        (
            Code::PermissionDenied | Code::Unauthenticated | Code::InvalidArgument,
            crate::error::Failure::Fatal(e),
        ) => Some(e),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(last: Option<(u64, u32)>) -> GroupWatch {
        let client = Client::with_config(["127.0.0.1:1"], crate::ClientConfig::default()).unwrap();
        GroupWatch {
            backoff: Backoff::new(&client.config().retry),
            client,
            prefix: String::new(),
            group: 0,
            groups: 1,
            last,
            stream: None,
            broken: 0,
        }
    }

    fn event(index: u64, ordinal: u32) -> pb::WatchMessage {
        pb::WatchMessage {
            item: Some(pb::watch_message::Item::Event(pb::WatchEvent {
                index,
                ordinal,
                kind: "granted".into(),
                lock: "x".into(),
                session: 1,
                token: index,
                ..Default::default()
            })),
        }
    }

    fn progress(index: u64) -> pb::WatchMessage {
        pb::WatchMessage {
            item: Some(pb::watch_message::Item::Progress(pb::WatchProgress {
                index,
            })),
        }
    }

    #[tokio::test]
    async fn a_resumed_stream_repeats_nothing_already_delivered() {
        let mut w = watch(None);
        assert_eq!(w.accept(progress(4)).unwrap(), None);
        assert!(w.accept(event(5, 0)).unwrap().is_some());
        assert!(w.accept(event(5, 1)).unwrap().is_some());
        // Cut mid-entry: the new stream starts after 4 and replays entry 5.
        assert_eq!(w.resume_index(), Some(4));
        assert_eq!(w.accept(progress(4)).unwrap(), None);
        assert_eq!(w.accept(event(5, 0)).unwrap(), None);
        assert_eq!(w.accept(event(5, 1)).unwrap(), None);
        assert!(w.accept(event(5, 2)).unwrap().is_some());
        assert!(w.accept(event(7, 0)).unwrap().is_some());
        assert_eq!(w.accept(progress(9)).unwrap(), None);
        assert_eq!(w.resume_index(), Some(9));
    }

    #[tokio::test]
    async fn a_missed_notice_is_delivered_and_moves_the_position() {
        let mut w = watch(Some((2, WHOLE_ENTRY)));
        let missed = pb::WatchMessage {
            item: Some(pb::watch_message::Item::Missed(pb::WatchMissed {
                after_index: 2,
                through_index: 10,
            })),
        };
        assert_eq!(
            w.accept(missed).unwrap(),
            Some(WatchItem::Missed {
                after_index: 2,
                through_index: 10
            })
        );
        assert_eq!(w.accept(event(9, 0)).unwrap(), None);
        assert_eq!(w.resume_index(), Some(10));
    }
}
