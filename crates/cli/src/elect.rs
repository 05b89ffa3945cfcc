//! `latchkey elect --observe NAME`: the election's leader, then each change, one line each.
//! (`latchkey elect NAME -- COMMAND` runs in `lock.rs`: a campaign is an acquire.)

use latchkey_client::Leader;
use serde::Serialize;

use crate::ElectArgs;

/// One line of `elect --observe --json`: a leader.
#[derive(Serialize, Debug, PartialEq)]
struct LeaderJson<'a> {
    session: u64,
    token: u64,
    /// The published value as UTF-8 (bytes that are not are replaced).
    value: std::borrow::Cow<'a, str>,
}

fn json(l: &Leader) -> LeaderJson<'_> {
    LeaderJson {
        session: l.session,
        token: l.token,
        value: String::from_utf8_lossy(&l.value),
    }
}

fn human(name: &str, l: &Leader) -> String {
    format!(
        "{name}: leader session {} token {} value {:?}",
        l.session,
        l.token,
        String::from_utf8_lossy(&l.value)
    )
}

/// Runs until interrupted (exit 130 by `bounded`) or until the watch gives up.
pub async fn observe(args: ElectArgs) -> anyhow::Result<()> {
    let client = args.endpoints.client()?;
    let mut observe = client.observe(&args.name).await?;
    loop {
        let leader = observe.next().await?;
        if args.json {
            println!("{}", serde_json::to_string(&json(&leader))?);
        } else {
            println!("{}", human(&args.name, &leader));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        let l = Leader {
            session: 5,
            token: 12,
            value: b"10.0.0.1:80".to_vec(),
            held_for: None,
        };
        assert_eq!(
            human("svc", &l),
            "svc: leader session 5 token 12 value \"10.0.0.1:80\""
        );
        assert_eq!(
            serde_json::to_string(&json(&l)).unwrap(),
            r#"{"session":5,"token":12,"value":"10.0.0.1:80"}"#
        );
    }
}
