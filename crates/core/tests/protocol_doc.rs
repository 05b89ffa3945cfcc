//! Keeps `docs/protocol.md` (the normative client protocol) true to the code: every RPC of the
//! `.proto`, every error reason the server sends and every metadata key are named in it, and
//! every `limits.rs` constant it names has a row in its table of numbers with the value the
//! constant has. The files are read as text; nothing here runs a server.

use std::path::PathBuf;

use latchkey_core::limits;

fn repo_file(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {}: {e}", full.display()))
}

fn doc() -> String {
    repo_file("docs/protocol.md")
}

/// The value of a `limits` constant the document may cite. A constant cited in the document's
/// table but missing here fails the table test: add it (the compiler then checks it exists).
fn limit_value(name: &str) -> Option<u128> {
    macro_rules! values {
        ($($c:ident),* $(,)?) => {
            match name {
                $(stringify!($c) => Some(limits::$c as u128),)*
                _ => None,
            }
        };
    }
    values!(
        GROUPS_MAX,
        LOCK_NAME_BYTES_MAX,
        SESSION_TTL_MS_MIN,
        SESSION_TTL_MS_MAX,
        SESSION_TTL_MS_DEFAULT,
        SESSIONS_MAX,
        LOCKS_PER_SESSION_MAX,
        WAITERS_PER_LOCK_MAX,
        HOLDERS_PER_LOCK_MAX,
        ELECTION_VALUE_BYTES_MAX,
        LOCK_DELAY_MS_MAX,
        CONTENDED_PER_LEASE_MAX,
        CONTENDED_CHECKS_PER_ANSWER_MAX,
        CONTENDED_NAMES_PER_ANSWER_MAX,
        DELAYS_MAX,
        IDENTITY_DELAYS_DEFAULT,
        DELAYS_PER_IDENTITY_MAX,
        LOCKS_MAX,
        SESSION_OUTCOMES_MAX,
        SESSION_WAITS_IN_FLIGHT_MAX,
        SESSION_SHORT_REQUESTS_IN_FLIGHT_MAX,
        SESSION_REQUESTS_IN_FLIGHT_MAX,
        SESSION_SEQ_WINDOW_MAX,
        CLOCK_DRIFT_PPM_MAX,
        LEASE_RENEW_BATCH_MAX,
        KEEPALIVE_SESSIONS_MAX,
        LIST_RESULTS_MAX,
        LIST_WAITERS_SHOWN_MAX,
        WAIT_TIMEOUT_MS_MAX,
        ACQUIRE_POLL_MS_MAX,
        CLIENT_MESSAGE_BYTES_MAX,
        CLIENT_CONCURRENT_REQUESTS_MAX,
        CLIENT_PENDING_RESET_STREAMS_MAX,
        WAITING_ACQUIRES_MAX,
        BATCH_CALL_OPS_MAX,
        BATCH_OPS_IN_FLIGHT_MAX,
        BATCH_RESULT_BYTES_SMALL_MAX,
        HEARTBEAT_MS_DEFAULT,
        ELECTION_TIMEOUT_MS_MIN_DEFAULT,
        ELECTION_TIMEOUT_MS_MAX_DEFAULT,
        LEADERLESS_MS_MAX_DEFAULT,
        CLIENT_RENEWAL_TTL_DIVISOR,
        CLIENT_SAFETY_MARGIN_TTL_DIVISOR,
        CLIENT_SAFETY_MARGIN_MS_MIN,
        CLIENT_RENEWAL_ATTEMPT_TTL_DIVISOR,
        CLIENT_RENEWAL_ATTEMPT_MS_MIN,
        CLIENT_RENEWAL_RETRY_TTL_DIVISOR,
        CLIENT_RENEWAL_RETRY_MS_MIN,
        CLIENT_RENEWAL_BACKOFF_TTL_DIVISOR,
        CLIENT_RENEWAL_BACKOFF_MS_MIN,
        CLIENT_BACKOFF_MS_INITIAL,
        CLIENT_BACKOFF_MS_MAX,
        CLIENT_RETRY_ELAPSED_MS_MAX,
        CLIENT_UNREACHABLE_MS_MAX,
        CLIENT_ATTEMPTS_MAX,
        CLIENT_REFUSED_HINT_IGNORE_MS,
        CLIENT_ACQUIRE_BACKOFF_MS_MAX,
        CLIENT_PENDING_AFTER_DEADLINE_MS_MAX,
        CLIENT_UNANSWERED_AFTER_DEADLINE_MS_MAX,
        PROPOSE_TIMEOUT_MS,
        CLIENT_RPC_TIMEOUT_MS_DEFAULT,
        CLIENT_CONNECT_TIMEOUT_MS_DEFAULT,
        CLIENT_PING_INTERVAL_MS,
        CLIENT_PING_TIMEOUT_MS,
        OWNER_HOST_BYTES_MAX,
        OWNER_USER_BYTES_MAX,
        OWNER_TEXT_BYTES_MAX,
        AUTH_TOKEN_BYTES_MAX,
        IDENTITY_SESSIONS_DEFAULT,
        IDENTITY_WAITING_DEFAULT,
        REVOKED_GRANTS_PER_SESSION_MAX,
        AUDIT_RECORDS_MAX,
        AUDIT_REASON_BYTES_MAX,
        AUDIT_ACTOR_BYTES_MAX,
        MEMBER_CATCH_UP_TIMEOUT_MS,
        MEMBERSHIP_CHANGE_TIMEOUT_MS,
        CLIENT_MEMBERSHIP_RPC_TIMEOUT_MS,
        MEMBER_ADDR_BYTES_MAX,
        BACKUP_CHUNK_BYTES,
        BACKUP_TABLE_BYTES_MAX,
        BACKUP_CALL_TIMEOUT_MS,
        WATCH_EVENTS_KEPT,
        WATCHERS_MAX,
        WATCH_PROGRESS_MS,
        CLIENT_WATCH_SILENCE_MS,
        WATCH_OUT_OF_TOUCH_FAILOVERS,
    )
}

/// The `(NAME, value)` rows of the document's marked table of numbers.
fn table_rows(doc: &str) -> Vec<(String, String)> {
    let begin = doc
        .find("<!-- limits-table:begin -->")
        .expect("docs/protocol.md has no `<!-- limits-table:begin -->` marker");
    let end = doc
        .find("<!-- limits-table:end -->")
        .expect("docs/protocol.md has no `<!-- limits-table:end -->` marker");
    assert!(begin < end, "the table's end marker comes before its begin");
    doc[begin..end]
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // "| `NAME` | value | unit |" splits into ["", "`NAME`", "value", "unit", ""].
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((name.to_owned(), cells.get(2)?.to_string()))
        })
        .collect()
}

/// Whether `word` occurs in `text` as a whole identifier (not inside a longer one).
fn names(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

/// The names of the `pub const`s of `limits.rs`.
fn limits_constants() -> Vec<String> {
    repo_file("crates/core/src/limits.rs")
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("pub const "))
        .filter_map(|rest| rest.split(':').next())
        .map(|n| n.trim().to_owned())
        .collect()
}

#[test]
fn every_rpc_of_the_proto_is_in_the_protocol_doc() {
    let doc = doc();
    let headings: Vec<&str> = doc.lines().filter(|l| l.starts_with('#')).collect();
    let mut service = String::new();
    let mut rpcs = Vec::new();
    for line in repo_file("crates/proto/proto/latchkey.proto").lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("service ") {
            service = rest.split_whitespace().next().unwrap_or("").to_owned();
        }
        if let Some(rest) = line.strip_prefix("rpc ") {
            let name = rest.split('(').next().unwrap_or("").trim().to_owned();
            rpcs.push((service.clone(), name));
        }
    }
    assert!(rpcs.len() >= 15, "found only {rpcs:?} in the .proto");
    let mut missing = Vec::new();
    for (service, rpc) in &rpcs {
        let quoted = format!("`{rpc}`");
        // A client RPC has a section of its own; a member RPC is only named.
        let found = if service == "Locks" {
            headings.iter().any(|h| h.contains(&quoted))
        } else {
            doc.contains(&quoted)
        };
        if !found {
            missing.push(format!("{service}.{rpc}"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/protocol.md does not describe {missing:?} (a `Locks` RPC needs a heading naming it, any other RPC its name in backquotes)"
    );
}

#[test]
fn every_error_reason_the_server_sends_is_in_the_protocol_doc() {
    let doc = doc();
    let source = repo_file("crates/server/src/error.rs");
    let start = source
        .find("fn reason(")
        .expect("error.rs has no fn reason");
    let end = start
        + source[start..]
            .find("fn code(")
            .expect("error.rs has no fn code after fn reason");
    // Every string literal of `fn reason` is a reason.
    let reasons: Vec<&str> = source[start..end].split('"').skip(1).step_by(2).collect();
    assert!(reasons.len() >= 25, "found only {reasons:?} in error.rs");
    let missing: Vec<&&str> = reasons
        .iter()
        .filter(|r| !doc.contains(&format!("`{r}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/protocol.md does not name the error reasons {missing:?}"
    );
}

#[test]
fn every_metadata_key_is_in_the_protocol_doc() {
    let doc = doc();
    let keys: Vec<String> = repo_file("crates/proto/src/lib.rs")
        .lines()
        .filter(|l| l.starts_with("pub const ") && l.contains("&str"))
        .filter_map(|l| l.split('"').nth(1).map(str::to_owned))
        .collect();
    assert_eq!(keys.len(), 4, "expected four metadata keys, found {keys:?}");
    for key in keys.iter().map(String::as_str).chain(["authorization"]) {
        assert!(
            doc.contains(&format!("`{key}")),
            "docs/protocol.md does not name the metadata key {key:?}"
        );
    }
}

#[test]
fn every_limit_the_protocol_doc_names_has_its_value_in_its_table() {
    let doc = doc();
    let rows = table_rows(&doc);
    assert!(rows.len() >= 30, "found only {rows:?} in the table");
    let mut wrong = Vec::new();
    for (name, value) in &rows {
        let Some(actual) = limit_value(name) else {
            wrong.push(format!(
                "{name}: not a constant this test knows (add it to `limit_value`)"
            ));
            continue;
        };
        match value.replace(['_', ','], "").parse::<u128>() {
            Ok(v) if v == actual => {}
            _ => wrong.push(format!(
                "{name}: the table says {value}, limits.rs {actual}"
            )),
        }
    }
    let constants = limits_constants();
    assert!(
        constants.len() >= 50,
        "found only {constants:?} in limits.rs"
    );
    for constant in &constants {
        if names(&doc, constant) && !rows.iter().any(|(n, _)| n == constant) {
            wrong.push(format!(
                "{constant}: named in the text, missing from the table"
            ));
        }
    }
    assert!(wrong.is_empty(), "docs/protocol.md's numbers: {wrong:#?}");
}

/// The helpers themselves: a name inside a longer one does not count, and the table parser
/// reads the row format the document uses.
#[test]
fn the_parsers_read_what_the_document_writes() {
    assert!(names("see `SESSION_TTL_MS_MIN`.", "SESSION_TTL_MS_MIN"));
    assert!(!names("CLIENT_BACKOFF_MS_MAX_X", "CLIENT_BACKOFF_MS_MAX"));
    assert!(!names("X_CLIENT_BACKOFF_MS_MAX", "CLIENT_BACKOFF_MS_MAX"));
    let doc = "<!-- limits-table:begin -->\n| constant | value |\n|---|---|\n\
               | `A_MS` | 1_000 | ms |\n<!-- limits-table:end -->";
    assert_eq!(
        table_rows(doc),
        vec![("A_MS".to_owned(), "1_000".to_owned())]
    );
}
