//! `latchkey watch [PREFIX]`: lock changes, one line each, as the cluster applies them.
//! `--json` lines carry the event's `ordinal` within its entry too: `(index, ordinal)` is its
//! position, the same on every member. A grant says its mode (a reader's, a permit's), and an
//! election's grant or proclaim its value (issue #32).

use latchkey_client::{WatchEvent, WatchItem};
use serde::Serialize;

use crate::WatchArgs;

/// One line of `watch --json`. `token` is null for queue changes; a `missed` line has only
/// `kind`, `after_index` and `through_index`.
#[derive(Serialize, Debug, PartialEq)]
#[serde(untagged)]
enum LineJson<'a> {
    Event {
        /// The Raft group whose log `index` is of; only with several groups.
        #[serde(skip_serializing_if = "Option::is_none")]
        group: Option<u32>,
        index: u64,
        ordinal: u32,
        kind: &'static str,
        lock: &'a str,
        session: u64,
        token: Option<u64>,
        /// A grant's mode (`exclusive`, `shared`, `permits`); only on `granted` lines.
        #[serde(skip_serializing_if = "Option::is_none")]
        mode: Option<&'static str>,
        /// A semaphore's permits; only on a permit's `granted` line.
        #[serde(skip_serializing_if = "Option::is_none")]
        permits: Option<u32>,
        /// An election's value (UTF-8): a campaign's `granted`, a `proclaimed`.
        #[serde(skip_serializing_if = "Option::is_none")]
        value: Option<String>,
    },
    Missed {
        #[serde(skip_serializing_if = "Option::is_none")]
        group: Option<u32>,
        kind: &'static str,
        after_index: u64,
        through_index: u64,
    },
}

/// `group` is `None` in a cluster of one group.
fn json(group: Option<u32>, item: &WatchItem) -> LineJson<'_> {
    match item {
        WatchItem::Event(e) => LineJson::Event {
            group,
            index: e.index,
            ordinal: e.ordinal,
            kind: e.kind.as_str(),
            lock: &e.lock,
            session: e.session.0,
            token: e.token,
            mode: e.mode.map(mode_name),
            permits: match e.mode {
                Some(latchkey_core::Mode::Permits(n)) => Some(n),
                _ => None,
            },
            value: e
                .value
                .as_deref()
                .map(|v| String::from_utf8_lossy(v).into_owned()),
        },
        WatchItem::Missed {
            after_index,
            through_index,
        } => LineJson::Missed {
            group,
            kind: "missed",
            after_index: *after_index,
            through_index: *through_index,
        },
    }
}

fn mode_name(mode: latchkey_core::Mode) -> &'static str {
    match mode {
        latchkey_core::Mode::Exclusive => "exclusive",
        latchkey_core::Mode::Shared => "shared",
        latchkey_core::Mode::Permits(_) => "permits",
    }
}

fn human(group: Option<u32>, item: &WatchItem) -> String {
    let line = match item {
        WatchItem::Event(WatchEvent {
            index,
            kind,
            lock,
            session,
            token,
            mode,
            value,
            ..
        }) => {
            let token = token.map(|t| format!(" token {t}")).unwrap_or_default();
            // A mutex's grant reads as before; a reader's or a permit's says so.
            let how = match mode {
                Some(latchkey_core::Mode::Shared) => " (shared)".to_owned(),
                Some(latchkey_core::Mode::Permits(n)) => format!(" (a permit of {n})"),
                _ => String::new(),
            };
            let value = value
                .as_deref()
                .map(|v| format!(" value {:?}", String::from_utf8_lossy(v)))
                .unwrap_or_default();
            format!(
                "{index} {} {lock} session {session}{token}{how}{value}",
                kind.as_str()
            )
        }
        WatchItem::Missed {
            after_index,
            through_index,
        } => format!(
            "{through_index} missed: the events after index {after_index} up to {through_index} \
             are no longer kept (re-list the locks if their state matters)"
        ),
    };
    match group {
        Some(g) => format!("group {g} {line}"),
        None => line,
    }
}

/// Runs until interrupted (exit 130 by `bounded`) or until the watch gives up.
pub async fn watch(args: WatchArgs) -> anyhow::Result<()> {
    let client = args.endpoints.client()?;
    let after = (!args.after.is_empty()).then_some(args.after.as_slice());
    let mut watch = client.watch_from(&args.prefix, after).await?;
    let several = watch.groups() > 1;
    loop {
        let (group, item) = watch.next_in_group().await?;
        let group = several.then_some(group);
        if args.json {
            println!("{}", serde_json::to_string(&json(group, &item))?);
        } else {
            println!("{}", human(group, &item));
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
            mode: Some(latchkey_core::Mode::Exclusive),
            value: None,
        });
        assert_eq!(
            human(None, &granted),
            "12 granted jobs/a session 5 token 12"
        );
        assert_eq!(
            human(Some(2), &granted),
            "group 2 12 granted jobs/a session 5 token 12"
        );
        assert_eq!(
            serde_json::to_value(json(Some(2), &granted)).unwrap()["group"],
            2
        );
        assert_eq!(
            serde_json::to_value(json(None, &granted)).unwrap(),
            serde_json::json!({"index":12,"ordinal":1,"kind":"granted","lock":"jobs/a","session":5,"token":12,"mode":"exclusive"})
        );
        // An election's grant and proclaim, a permit's grant (issue #32).
        let event = |kind, mode, value: Option<&str>| {
            WatchItem::Event(WatchEvent {
                index: 20,
                ordinal: 0,
                kind,
                lock: "svc".into(),
                session: SessionId(7),
                token: Some(20),
                mode,
                value: value.map(|v| v.as_bytes().to_vec()),
            })
        };
        let campaign = event(
            WatchKind::Granted,
            Some(latchkey_core::Mode::Exclusive),
            Some("a:80"),
        );
        assert_eq!(
            human(None, &campaign),
            "20 granted svc session 7 token 20 value \"a:80\""
        );
        let proclaimed = event(WatchKind::Proclaimed, None, Some("a:81"));
        assert_eq!(
            serde_json::to_value(json(None, &proclaimed)).unwrap(),
            serde_json::json!({"index":20,"ordinal":0,"kind":"proclaimed","lock":"svc","session":7,"token":20,"value":"a:81"})
        );
        let permit = event(
            WatchKind::Granted,
            Some(latchkey_core::Mode::Permits(3)),
            None,
        );
        assert_eq!(
            human(None, &permit),
            "20 granted svc session 7 token 20 (a permit of 3)"
        );
        let json_permit = serde_json::to_value(json(None, &permit)).unwrap();
        assert_eq!(
            (&json_permit["mode"], &json_permit["permits"]),
            (&"permits".into(), &3.into())
        );
        let missed = WatchItem::Missed {
            after_index: 3,
            through_index: 9,
        };
        assert_eq!(
            serde_json::to_value(json(None, &missed)).unwrap(),
            serde_json::json!({"kind":"missed","after_index":3,"through_index":9})
        );
    }
}
