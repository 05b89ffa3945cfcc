use super::routes::serves;
use super::*;

/// schemathesis: a PUT to a GET route answered 415 from the cross-site guard, not 405.
#[test]
fn the_guard_knows_which_method_each_route_takes() {
    use axum::http::Method;
    assert!(serves(&Method::POST, "/v1/admin/release"));
    assert!(!serves(&Method::PUT, "/v1/admin/release"));
    assert!(!serves(&Method::PUT, "/ui"));
    assert!(!serves(&Method::POST, "/v1/lock"));
    assert!(!serves(&Method::POST, "/v1/no-such-route"));
}

#[test]
fn query_parameters_are_decoded_and_checked() {
    let q = query(Some("name=deploy%2Fprod+eu&".into()), &["name"]).unwrap();
    assert_eq!(q, vec![("name", "deploy/prod eu".to_owned())]);
    assert_eq!(query(None, &["name"]).unwrap(), vec![]);
    assert!(query(Some("nam=x".into()), &["name"]).is_err());
    assert!(query(Some("name=a&name=b".into()), &["name"]).is_err());
    assert!(query(Some("name=%ff".into()), &["name"]).is_err());
}

#[test]
fn a_secret_is_a_decimal_string_both_ways() {
    let s: SessionJson =
        serde_json::from_str(r#"{"id":3,"secret":"18446744073709551615"}"#).unwrap();
    assert_eq!(s.secret, u64::MAX);
    assert_eq!(
        serde_json::to_string(&s).unwrap(),
        r#"{"id":3,"secret":"18446744073709551615"}"#
    );
    // A number would have lost precision in a JavaScript client: refused.
    assert!(serde_json::from_str::<SessionJson>(r#"{"id":3,"secret":12}"#).is_err());
    // One spelling, the server's: what docs/openapi.json's pattern refuses is refused.
    for other in ["+7", "007", "", " 7", "7 ", "18446744073709551616", "-0"] {
        let body = format!(r#"{{"id":3,"secret":{other:?}}}"#);
        assert!(
            serde_json::from_str::<SessionJson>(&body).is_err(),
            "{body} was taken"
        );
    }
}

/// Regression: schemathesis sent `{"seq": 2352.0, ...}`, valid for docs/openapi.json (a JSON
/// Schema integer is a value), and the server answered 400 "invalid type: floating point".
#[test]
fn an_integer_field_takes_a_whole_number_however_it_is_spelled() {
    let req: AcquireRequest = serde_json::from_str(
        r#"{"session":{"id":1.0,"secret":"5"},"seq":2352.0,"name":"x","wait_timeout_ms":1e3}"#,
    )
    .expect("whole numbers");
    assert_eq!(
        (req.session.id, req.seq, req.wait_timeout_ms),
        (1, 2352, 1000)
    );
    let req: AdminReleaseRequest =
        serde_json::from_str(r#"{"name":"x","reason":"r","token":-0}"#).expect("-0 is 0");
    assert_eq!(req.token, Some(0));
    let req: CreateSessionRequest =
        serde_json::from_str(r#"{"ttl_ms":15e3,"group":null,"owner":{"pid":4294967295}}"#)
            .expect("null is no group");
    assert_eq!((req.ttl_ms, req.group), (15_000, None));
    for refused in [
        r#"{"ttl_ms":1.5}"#,
        r#"{"ttl_ms":-1}"#,
        r#"{"ttl_ms":"15000"}"#,
        r#"{"ttl_ms":18446744073709551616}"#,
        r#"{"ttl_ms":1000,"group":4294967296}"#,
        r#"{"ttl_ms":1000,"owner":{"pid":4294967296}}"#,
        r#"{"ttl_ms":1000,"owner":{"pid":4.2949672955e9}}"#,
    ] {
        assert!(
            serde_json::from_str::<CreateSessionRequest>(refused).is_err(),
            "{refused} was taken"
        );
    }
}

#[test]
fn a_whole_number_is_read_exactly_from_its_text() {
    let max = u64::MAX;
    for (text, want) in [
        ("0", Some(0)),
        ("-0", Some(0)),
        ("-0.0e7", Some(0)),
        ("0e1000000000000000000000", Some(0)),
        ("2.0", Some(2)),
        ("2e0", Some(2)),
        ("2E+3", Some(2000)),
        ("100e-2", Some(1)),
        ("25e-1", None),
        ("1.5", None),
        ("1e-1000000000000000000000", None),
        ("1e1000000000000000000000", None),
        ("-1", None),
        ("1e19", Some(10_000_000_000_000_000_000)),
        ("18446744073709551615", Some(max)),
        ("1.8446744073709551615e19", Some(max)),
        ("184467440737095516150e-1", Some(max)),
        ("18446744073709551616", None),
        ("1.8446744073709551616e19", None),
        ("100000000000000000000", None),
        ("\"5\"", None),
        ("null", None),
        ("[5]", None),
    ] {
        assert_eq!(whole::parse(text, max), want, "{text}");
    }
    assert_eq!(
        whole::parse("4294967295", u32::MAX.into()),
        Some(4_294_967_295)
    );
    assert_eq!(whole::parse("4294967296", u32::MAX.into()), None);
}

fn schema<'a>(doc: &'a serde_json::Value, pointer: &str) -> &'a serde_json::Value {
    doc.pointer(pointer)
        .unwrap_or_else(|| panic!("docs/openapi.json has no {pointer}"))
}

fn pattern(doc: &serde_json::Value, pointer: &str) -> regex::Regex {
    let text = schema(doc, pointer)["pattern"]
        .as_str()
        .unwrap_or_else(|| panic!("{pointer} has no pattern"));
    regex::Regex::new(text).expect("an ECMA-262 pattern the regex crate reads alike")
}

/// The document states each bound the server enforces, equal to its `limits` constant, and
/// each pattern accepts exactly what the core's check does, so a request the document calls
/// valid is accepted and one it calls invalid is refused (issue #31 item 7; schemathesis
/// checks the same against a live node in CI, `scripts/api-fuzz.sh`). Regression: the
/// document had no TTL range, group range, name lengths or integer maxima, and the server
/// refused requests it called valid (`ttl_ms: 0`, `name: ""`, `group: 62`).
#[test]
fn the_openapi_document_states_the_servers_limits() {
    let doc: serde_json::Value = serde_json::from_str(OPENAPI).unwrap();
    let s = "/components/schemas";
    let query = |path: &str, name: &str| {
        let params = schema(
            &doc,
            &format!("/paths/{}/get/parameters", path.replace('/', "~1")),
        );
        params
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == name))
            .map(|p| p["schema"].clone())
            .unwrap_or_else(|| panic!("GET {path} has no parameter {name}"))
    };
    let num = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"));

    let ttl = schema(&doc, &format!("{s}/CreateSessionRequest/properties/ttl_ms"));
    assert_eq!(num(&ttl["minimum"]), limits::SESSION_TTL_MS_MIN);
    assert_eq!(num(&ttl["maximum"]), limits::SESSION_TTL_MS_MAX);

    let last_group = u64::from(limits::GROUPS_MAX - 1);
    let group = schema(
        &doc,
        &format!("{s}/CreateSessionRequest/properties/group/anyOf/0"),
    );
    assert_eq!(num(&group["maximum"]), last_group);
    assert_eq!(num(&query("/v1/locks", "group")["maximum"]), last_group);

    let name_max = limits::LOCK_NAME_BYTES_MAX as u64;
    let names = [
        format!("{s}/AcquireRequest/properties/name"),
        format!("{s}/ReleaseRequest/properties/name"),
        format!("{s}/AdminReleaseRequest/properties/name"),
    ];
    for name in names
        .iter()
        .map(|p| schema(&doc, p).clone())
        .chain([query("/v1/lock", "name")])
    {
        assert_eq!(
            (num(&name["minLength"]), num(&name["maxLength"])),
            (1, name_max),
            "{name}"
        );
    }
    let prefix = query("/v1/locks", "prefix");
    assert_eq!(num(&prefix["maxLength"]), name_max);
    assert!(
        prefix.get("minLength").is_none(),
        "the empty prefix lists all"
    );

    for (field, max) in [
        ("host", limits::OWNER_HOST_BYTES_MAX),
        ("user", limits::OWNER_USER_BYTES_MAX),
        ("text", limits::OWNER_TEXT_BYTES_MAX),
    ] {
        let owner = schema(&doc, &format!("{s}/Owner/properties/{field}"));
        assert_eq!(num(&owner["maxLength"]), max as u64, "owner {field}");
    }
    let admin = format!("{s}/AdminReleaseRequest/properties");
    let reason = schema(&doc, &format!("{admin}/reason"));
    assert_eq!(
        num(&reason["maxLength"]),
        limits::AUDIT_REASON_BYTES_MAX as u64
    );
    let operator = schema(&doc, &format!("{admin}/operator"));
    assert_eq!(
        num(&operator["maxLength"]),
        limits::AUDIT_ACTOR_BYTES_MAX as u64
    );
    // A semaphore's permits (issue #32), in the request and in a lock's answer.
    let permits = schema(
        &doc,
        &format!("{s}/AcquireRequest/properties/mode/oneOf/1/properties/permits"),
    );
    let holders_max = limits::HOLDERS_PER_LOCK_MAX as u64;
    assert_eq!(
        (num(&permits["minimum"]), num(&permits["maximum"])),
        (1, holders_max)
    );
    let shown = schema(&doc, &format!("{s}/Lock/properties/permits/anyOf/0"));
    assert_eq!(num(&shown["maximum"]), holders_max);
    let sessions = schema(&doc, &format!("{s}/KeepAliveRequest/properties/sessions"));
    assert_eq!(
        num(&sessions["maxItems"]),
        limits::KEEPALIVE_SESSIONS_MAX as u64
    );
    // A batch (issue #35): its operations, and its one keepalive.
    let ops = schema(&doc, &format!("{s}/BatchRequest/properties/ops"));
    assert_eq!(
        (num(&ops["minItems"]), num(&ops["maxItems"])),
        (1, limits::BATCH_CALL_OPS_MAX as u64),
        "{ops}"
    );
    assert_eq!((num(&ops["minContains"]), num(&ops["maxContains"])), (0, 1));

    // Every integer has its type's range (or a narrower one): the server reads each into a
    // u64 or a u32.
    fn integers(v: &serde_json::Value, at: &str) {
        match v {
            serde_json::Value::Object(o) => {
                if o.get("type").and_then(|t| t.as_str()) == Some("integer") {
                    let max = match o.get("format").and_then(|f| f.as_str()) {
                        Some("uint64") => u64::MAX,
                        Some("uint32") => u32::MAX.into(),
                        other => panic!("{at}: an integer of format {other:?}"),
                    };
                    let (lo, hi) = (o.get("minimum"), o.get("maximum"));
                    assert!(lo.and_then(|v| v.as_u64()).is_some(), "{at}: no minimum");
                    let hi = hi.and_then(|v| v.as_u64());
                    assert!(
                        hi.is_some_and(|hi| hi <= max),
                        "{at}: maximum {hi:?} of {max}"
                    );
                }
                for (k, v) in o {
                    integers(v, &format!("{at}/{k}"));
                }
            }
            serde_json::Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    integers(v, &format!("{at}/{i}"));
                }
            }
            _ => {}
        }
    }
    integers(&doc, "");

    // The patterns, against the core's checks for every character. A request's name has no
    // control character (a release of one is refused before it reaches the log, unless a
    // lock of that name from before that rule is held, which the schema cannot say); a
    // describe reads any stored name.
    let new_name = pattern(&doc, &format!("{s}/AcquireRequest/properties/name"));
    let admin_name = pattern(&doc, &format!("{admin}/name"));
    let release_name = pattern(&doc, &format!("{s}/ReleaseRequest/properties/name"));
    assert_eq!(new_name.as_str(), admin_name.as_str());
    assert_eq!(new_name.as_str(), release_name.as_str());
    assert!(query("/v1/lock", "name").get("pattern").is_none());
    let reason = pattern(&doc, &format!("{admin}/reason"));
    // Each character the core refuses, on its own; all those it takes, in one string (a
    // match per character takes seconds in a debug build).
    let (mut name_chars, mut reason_chars) = (String::new(), String::new());
    for c in (0..=char::MAX as u32).filter_map(char::from_u32) {
        let (name, one) = (format!("a{c}b"), c.to_string());
        match latchkey_core::validate_name(&name) {
            Ok(()) => name_chars.push(c),
            Err(_) => assert!(!new_name.is_match(&name), "a name with {c:?}"),
        }
        match latchkey_core::validate_reason(&one) {
            Ok(()) => reason_chars.push(c),
            Err(_) => assert!(!reason.is_match(&one), "the reason {c:?}"),
        }
    }
    assert!(
        new_name.is_match(&name_chars),
        "a character of a name is refused"
    );
    // The reason's pattern is found anywhere in it: each character must match on its own.
    let each = regex::Regex::new(&format!("^(?:{})+$", reason.as_str())).unwrap();
    assert!(
        each.is_match(&reason_chars),
        "a character of a reason is refused"
    );
    // The secret's one spelling: every digit changed at every place of the largest secret,
    // every length, signs and leading zeros.
    let secret = pattern(&doc, &format!("{s}/Session/properties/secret"));
    let largest = u64::MAX.to_string();
    let mut spellings: Vec<String> = vec!["".into(), "+1".into(), "-1".into(), "01".into()];
    for at in 0..largest.len() {
        for d in '0'..='9' {
            let mut t = largest.clone();
            t.replace_range(at..=at, &d.to_string());
            spellings.push(t.clone());
            spellings.push(t[at..].to_owned());
            spellings.push(format!("{t}0"));
        }
    }
    for text in spellings {
        let taken =
            serde_json::from_value::<SessionJson>(serde_json::json!({ "id": 1, "secret": text }))
                .is_ok();
        assert_eq!(secret.is_match(&text), taken, "the secret {text:?}");
    }
}

/// A forwarded request's connection certificate is the follower's: it never speaks for the
/// caller (the attacker's review of issue #35, F1). Unmarked, the certificate is the caller's.
#[test]
fn a_forwarded_requests_certificate_is_never_the_callers() {
    use std::sync::Arc;
    let cert = rustls_pki_types::CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x01]);
    let peer = listener::HttpPeer {
        certs: Some(Arc::from(vec![cert])),
        addr: None,
    };
    let mut headers = HeaderMap::new();
    assert!(credentials(&headers, &peer).certs.is_some());
    headers.insert(forward::FORWARDED_HEADER, "2".parse().unwrap());
    let forwarded = credentials(&headers, &peer);
    assert!(forwarded.certs.is_none());
    assert!(forwarded.authorization.is_none());
    headers.insert(header::AUTHORIZATION, "Bearer t".parse().unwrap());
    assert_eq!(
        credentials(&headers, &peer).authorization,
        Some(&b"Bearer t"[..])
    );
}
