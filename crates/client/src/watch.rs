//! [`Watch`]: a stream of lock changes that survives its member.
//!
//! Every member applies the same log, so an event's position (log index, ordinal within the
//! entry) is the same on every member. The watch remembers the last position it delivered; when
//! its stream breaks (the member died or restarted, its connection stalled past
//! `CLIENT_WATCH_SILENCE_MS`) it opens a new one on another endpoint from that index and drops
//! what it already delivered. Events a member can no longer replay come as
//! [`WatchItem::Missed`], never as a silent gap.

use std::time::Duration;

use latchkey_core::{limits, SessionId, WatchEvent, WatchKind};
use latchkey_proto::v1 as pb;
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
    client: Client,
    prefix: String,
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
    pub async fn watch(&self, prefix: &str, after_index: Option<u64>) -> Result<Watch, Error> {
        let mut watch = Watch {
            client: self.clone(),
            prefix: prefix.to_owned(),
            last: after_index.map(|i| (i, WHOLE_ENTRY)),
            stream: None,
            broken: 0,
            backoff: Backoff::new(&self.config().retry),
        };
        watch.open().await?;
        Ok(watch)
    }
}

impl Watch {
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
        };
        let opts = CallOpts {
            attempt_timeout: self.client.config().rpc_timeout,
            backoff_max: None,
            group: 0,
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

    /// The next event (or missed notice). Waits as long as nothing changes; an error means the
    /// watch gave up (no member answered within the client's retry budget, or access was
    /// refused).
    pub async fn next(&mut self) -> Result<WatchItem, Error> {
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
            if let Some(item) = self.accept(message)? {
                return Ok(item);
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

    fn watch(last: Option<(u64, u32)>) -> Watch {
        let client = Client::with_config(["127.0.0.1:1"], crate::ClientConfig::default()).unwrap();
        Watch {
            backoff: Backoff::new(&client.config().retry),
            client,
            prefix: String::new(),
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
