//! `latchkey watch [PREFIX]`: lock changes, one line each, as the cluster applies them.
//! `--json` lines carry the event's `ordinal` within its entry too: `(index, ordinal)` is its
//! position, the same on every member.

use latchkey_client::{WatchEvent, WatchItem};
use serde::Serialize;

use crate::WatchArgs;

/// One line of `watch --json`. `token` is null for queue changes; a `missed` line has only
/// `kind`, `after_index` and `through_index`.
#[derive(Serialize, Debug, PartialEq)]
#[serde(untagged)]
enum LineJson<'a> {
    Event {
        index: u64,
        ordinal: u32,
        kind: &'static str,
        lock: &'a str,
        session: u64,
        token: Option<u64>,
    },
    Missed {
        kind: &'static str,
        after_index: u64,
        through_index: u64,
    },
}

fn json(item: &WatchItem) -> LineJson<'_> {
    match item {
        WatchItem::Event(e) => LineJson::Event {
            index: e.index,
            ordinal: e.ordinal,
            kind: e.kind.as_str(),
            lock: &e.lock,
            session: e.session.0,
            token: e.token,
        },
        WatchItem::Missed {
            after_index,
            through_index,
        } => LineJson::Missed {
            kind: "missed",
            after_index: *after_index,
            through_index: *through_index,
        },
    }
}

fn human(item: &WatchItem) -> String {
    match item {
        WatchItem::Event(WatchEvent {
            index,
            kind,
            lock,
            session,
            token,
            ..
        }) => {
            let token = token.map(|t| format!(" token {t}")).unwrap_or_default();
            format!("{index} {} {lock} session {session}{token}", kind.as_str())
        }
        WatchItem::Missed {
            after_index,
            through_index,
        } => format!(
            "{through_index} missed: the events after index {after_index} up to {through_index} \
             are no longer kept (re-list the locks if their state matters)"
        ),
    }
}

/// Runs until interrupted (exit 130 by `bounded`) or until the watch gives up.
pub async fn watch(args: WatchArgs) -> anyhow::Result<()> {
    let client = args.endpoints.client()?;
    let mut watch = client.watch(&args.prefix, args.after).await?;
    loop {
        let item = watch.next().await?;
        if args.json {
            println!("{}", serde_json::to_string(&json(&item))?);
        } else {
            println!("{}", human(&item));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_client::WatchKind;
    use latchkey_core::SessionId;

    #[test]
    fn lines() {
        let granted = WatchItem::Event(WatchEvent {
            index: 12,
            ordinal: 1,
            kind: WatchKind::Granted,
            lock: "jobs/a".into(),
            session: SessionId(5),
            token: Some(12),
        });
        assert_eq!(human(&granted), "12 granted jobs/a session 5 token 12");
        assert_eq!(
            serde_json::to_value(json(&granted)).unwrap(),
            serde_json::json!({"index":12,"ordinal":1,"kind":"granted","lock":"jobs/a","session":5,"token":12})
        );
        let missed = WatchItem::Missed {
            after_index: 3,
            through_index: 9,
        };
        assert_eq!(
            serde_json::to_value(json(&missed)).unwrap(),
            serde_json::json!({"kind":"missed","after_index":3,"through_index":9})
        );
    }
}
