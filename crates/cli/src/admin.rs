//! `latchkey admin release`, `latchkey admin revoke` and `latchkey audit`: the incident tools
//! and their record (issue #14 item 6).

use serde::Serialize;

use crate::{AdminReleaseArgs, AdminRevokeArgs, AuditArgs};

/// Who the operator says they are (`user@host`), recorded beside the identity the server
/// authenticated (if access control is on).
fn operator() -> String {
    let me = latchkey_client::SessionOptions::owner_of_this_process("");
    match (me.user.is_empty(), me.host.is_empty()) {
        (false, false) => format!("{}@{}", me.user, me.host),
        (false, true) => me.user,
        (true, false) => format!("@{}", me.host),
        (true, true) => String::new(),
    }
}

pub async fn release(args: AdminReleaseArgs) -> anyhow::Result<()> {
    let client = args.endpoints.client()?;
    if args.end_delay {
        let (session, token) = client
            .admin_end_delay(&args.name, args.token, &args.reason, &operator())
            .await?;
        println!(
            "{}: lock-delay ended (it began when session {session} lost token {token})",
            args.name
        );
        return Ok(());
    }
    let (session, token) = client
        .admin_release(&args.name, args.token, &args.reason, &operator())
        .await?;
    println!(
        "{}: force-released from session {session} (token {token})",
        args.name
    );
    Ok(())
}

pub async fn revoke(args: AdminRevokeArgs) -> anyhow::Result<()> {
    let client = args.endpoints.client()?;
    let locks = client
        .admin_revoke(args.session, &args.reason, &operator())
        .await?;
    println!("session {}: revoked; it held {locks} locks", args.session);
    Ok(())
}

/// One audit record, as printed with `--json`.
#[derive(Serialize, Debug, PartialEq)]
pub struct AuditJson {
    /// The Raft group whose log holds it (0 in a cluster of one); `index` is of that log.
    pub group: u32,
    pub index: u64,
    pub at_ms: u64,
    pub action: String,
    /// force-release: the lock; revoke: null.
    pub lock: Option<String>,
    pub session: u64,
    /// force-release: the grant taken, and the next holder's (null: nobody waited).
    pub token: Option<u64>,
    pub next_token: Option<u64>,
    /// revoke: how many locks the session held.
    pub locks: Option<u32>,
    /// The authenticated identity, or "anonymous" without access control.
    pub identity: String,
    pub operator: String,
    pub reason: String,
}

impl From<&latchkey_client::AuditEntry> for AuditJson {
    fn from(r: &latchkey_client::AuditEntry) -> AuditJson {
        let release = r.action == "force-release";
        AuditJson {
            group: r.group,
            index: r.index,
            at_ms: r.at_ms,
            action: r.action.clone(),
            lock: release.then(|| r.lock.clone()),
            session: r.session,
            token: release.then_some(r.token),
            next_token: (release && r.next_token != 0).then_some(r.next_token),
            locks: (!release).then_some(r.locks),
            identity: r.identity.clone().unwrap_or_else(|| "anonymous".into()),
            operator: r.operator.clone(),
            reason: r.reason.clone(),
        }
    }
}

fn human(r: &AuditJson) -> String {
    let when = humantime_ms(r.at_ms);
    let what = match &r.lock {
        Some(lock) => format!(
            "force-release {lock} from session {} (token {}{})",
            r.session,
            r.token.unwrap_or(0),
            r.next_token
                .map(|t| format!(", next holder token {t}"))
                .unwrap_or_default()
        ),
        None => format!(
            "revoke session {} (held {} locks)",
            r.session,
            r.locks.unwrap_or(0)
        ),
    };
    let by = if r.operator.is_empty() {
        r.identity.clone()
    } else {
        format!("{} ({})", r.identity, r.operator)
    };
    format!("{when}  {what}  by {by}: {}", r.reason)
}

/// Unix ms as UTC `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, Howard Hinnant's algorithm).
fn humantime_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

pub async fn audit(args: AuditArgs) -> anyhow::Result<()> {
    let client = args.endpoints.client()?;
    let records: Vec<AuditJson> = client.audit().await?.iter().map(AuditJson::from).collect();
    if args.json {
        println!("{}", serde_json::to_string(&records)?);
    } else if records.is_empty() {
        println!("no administrative actions recorded");
    } else {
        for r in &records {
            println!("{}", human(r));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_ms_print_as_utc() {
        assert_eq!(humantime_ms(0), "1970-01-01T00:00:00Z");
        assert_eq!(humantime_ms(1_709_251_199_000), "2024-02-29T23:59:59Z");
    }
}
