//! The HTTP/JSON API (`--http-listen`, issue #15): the client calls of the gRPC `Locks` service
//! (sessions, keepalive, acquire with its long-poll, release, describe, list, this node's
//! status) and the admin force-release (`AdminRelease`, for the web page) as JSON over
//! HTTP/1.1, for clients without gRPC. Like `service.rs` it only
//! translates: every call is checked by `Node::authorize` and runs the same operation of
//! `ops.rs`, so the semantics (exactly-once by session and sequence number, the long-poll bound
//! `ACQUIRE_POLL_MS_MAX`, the leader-only answers) are the gRPC API's. Errors are
//! `error::ErrorBody` JSON with the gRPC reason as `code`.
//!
//! [`ROUTES`] is the API's one list of (method, path): the router is built from it, and a test
//! holds `docs/openapi.json` to it. The document itself is served at `GET /v1/openapi.json`,
//! and the web page (issue #15 item 6) at `GET /ui`: static files from `ui/`, whose script
//! reads the routes above and offers force-release to a viewer who may be an admin (see
//! `ui/app.js`).
//!
//! Before any route's handler, `cross_site::guard` refuses a write that is not JSON or comes from a web
//! page of another origin than the node's own (unless `--http-allow-origin` lists it).
//!
//! Connections come through `tls::accept_loop` like gRPC's (TLS when the node has TLS, with
//! ALPN `http/1.1`), at most `HTTP_CONNECTIONS_MAX` at once, each closed once idle for
//! `HTTP_IDLE_TIMEOUT_MS`; a body is at most `HTTP_BODY_BYTES_MAX`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Bytes;
use axum::extract::connect_info::Connected;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::serve::{IncomingStream, Listener};
use axum::Router;
use latchkey_core::{limits, Actor, SessionId, SessionKey, SessionOwner};
use rustls_pki_types::CertificateDer;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::access::acl::{Caller, Need, Permission};
use crate::access::tls::{self, ServerTls};
use crate::api::cross_site::{self, CrossSite};
use crate::error::{ApiError, ErrorBody, GroupError};
use crate::node::groups::Groups;
use crate::node::ops::{Acquired, Credentials, Held, LockView, NodeStatus, Waiting};
use crate::node::Node;

/// Every route of the HTTP API: (method, path). The router serves exactly these, and
/// `docs/openapi.json` documents exactly these (`cli/tests/http_api.rs`).
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/sessions"),
    ("POST", "/v1/sessions/keepalive"),
    ("POST", "/v1/sessions/close"),
    ("POST", "/v1/locks/acquire"),
    ("POST", "/v1/locks/release"),
    ("GET", "/v1/lock"),
    ("GET", "/v1/locks"),
    ("GET", "/v1/cluster/status"),
    ("POST", "/v1/admin/release"),
    ("GET", "/v1/openapi.json"),
    ("GET", "/ui"),
    ("GET", "/ui/app.js"),
];

/// Whether a route of [`ROUTES`] takes `method` at `path` (the routes have no parameters).
pub(crate) fn serves(method: &axum::http::Method, path: &str) -> bool {
    ROUTES
        .iter()
        .any(|(m, p)| *m == method.as_str() && *p == path)
}

/// The API's description, served at `GET /v1/openapi.json`.
const OPENAPI: &str = include_str!("../../../../docs/openapi.json");

/// The web page (`GET /ui`) and its script (`GET /ui/app.js`): static, no data of their own;
/// the script reads the routes above with the viewer's credentials (see `ui/app.js`).
const UI_HTML: &str = include_str!("ui/index.html");
const UI_JS: &str = include_str!("ui/app.js");

/// The page runs only its own script and reads only this origin: anything that slipped into
/// the page from a server string (which the script never parses as HTML) could not run or send
/// data elsewhere, and no other site may frame it.
const UI_CSP: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; \
     style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The member's Raft groups (issue #16): a request goes to the node of its lock's or its
/// session's group, as in `service.rs`; with one group, everything is group 0's.
type Api = Arc<Groups>;

fn handler(method: &str, path: &str) -> MethodRouter<Api> {
    match (method, path) {
        ("POST", "/v1/sessions") => post(create_session),
        ("POST", "/v1/sessions/keepalive") => post(keep_alive),
        ("POST", "/v1/sessions/close") => post(close_session),
        ("POST", "/v1/locks/acquire") => post(acquire),
        ("POST", "/v1/locks/release") => post(release),
        ("GET", "/v1/lock") => get(describe),
        ("GET", "/v1/locks") => get(list),
        ("GET", "/v1/cluster/status") => get(status),
        ("POST", "/v1/admin/release") => post(admin_release),
        ("GET", "/v1/openapi.json") => get(openapi),
        ("GET", "/ui") => get(|| async { ui_asset("text/html; charset=utf-8", UI_HTML) }),
        ("GET", "/ui/app.js") => {
            get(|| async { ui_asset("text/javascript; charset=utf-8", UI_JS) })
        }
        _ => unreachable!("ROUTES lists {method} {path}, which has no handler"),
    }
}

/// The API's router, built from [`ROUTES`]; anything else is answered with a JSON error.
/// Every request to a route passes `cross_site`'s guard first (`policy`), before its handler.
pub(crate) fn router(groups: Arc<Groups>, policy: CrossSite) -> Router {
    ROUTES
        .iter()
        .fold(Router::new(), |router, (method, path)| {
            router.route(path, handler(method, path))
        })
        .fallback(|| async {
            ErrorBody {
                code: "no-such-route",
                message: "no such route: see GET /v1/openapi.json".into(),
                leader_id: None,
                leader_addr: None,
                group: None,
            }
            .into_response_with(StatusCode::NOT_FOUND)
        })
        .method_not_allowed_fallback(|| async {
            ErrorBody {
                code: "method-not-allowed",
                message: "this route does not take this method: see GET /v1/openapi.json".into(),
                leader_id: None,
                leader_addr: None,
                group: None,
            }
            .into_response_with(StatusCode::METHOD_NOT_ALLOWED)
        })
        .layer(DefaultBodyLimit::max(limits::HTTP_BODY_BYTES_MAX))
        // On every route, before its handler: a request that matches no route, or none of its
        // methods, changes nothing and gets its 404 or 405 as it is.
        .route_layer(middleware::from_fn_with_state(
            Arc::new(policy),
            cross_site::guard,
        ))
        .with_state(groups)
}

/// An HTTP API failure: an operation's error (of one group, whose body then names it), or a
/// request refused before it reached one.
enum HttpError {
    Api(GroupError),
    BodyTooLarge,
}

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> HttpError {
        HttpError::Api(GroupError::of_cluster(e))
    }
}

impl From<GroupError> for HttpError {
    fn from(e: GroupError) -> HttpError {
        HttpError::Api(e)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        match self {
            HttpError::Api(e) => {
                let (leader_id, leader_addr) = e.error.leader_hint();
                ErrorBody {
                    code: e.error.reason(),
                    message: e.error.to_string(),
                    leader_id,
                    leader_addr,
                    group: e.group(),
                }
                .into_response_with(e.error.http_status())
            }
            HttpError::BodyTooLarge => ErrorBody {
                code: "body-too-large",
                message: format!(
                    "the request body is over {} bytes",
                    limits::HTTP_BODY_BYTES_MAX
                ),
                leader_id: None,
                leader_addr: None,
                group: None,
            }
            .into_response_with(StatusCode::PAYLOAD_TOO_LARGE),
        }
    }
}

type Answer = Result<Response, HttpError>;

fn json<T: Serialize>(body: &T) -> Response {
    let bytes = serde_json::to_vec(body).expect("API answers always encode");
    ([(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

/// The request body as `T`; a body that is not JSON of that shape is `invalid-request` naming
/// what is wrong (serde's line, column and field).
fn parse<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, HttpError> {
    let body = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => HttpError::BodyTooLarge,
        _ => ApiError::Invalid(rejection.body_text()).into(),
    })?;
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::Invalid(format!("the body is not the JSON this call takes: {e}")).into()
    })
}

/// The query string's parameters, each once and each one of `known`, percent-decoded.
fn query<'a>(raw: Option<String>, known: &[&'a str]) -> Result<Vec<(&'a str, String)>, ApiError> {
    let mut out: Vec<(&'a str, String)> = Vec::new();
    let raw = raw.unwrap_or_default();
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(&s.replace('+', " "))
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| ApiError::Invalid(format!("{pair:?} is not UTF-8 once decoded")))
        };
        let key = decode(key)?;
        let Some(known) = known.iter().find(|k| **k == key) else {
            return Err(ApiError::Invalid(format!(
                "unknown query parameter {key:?}; this call takes {known:?}"
            )));
        };
        if out.iter().any(|(k, _)| k == known) {
            return Err(ApiError::Invalid(format!(
                "the query parameter {key:?} is given twice"
            )));
        }
        out.push((known, decode(value)?));
    }
    Ok(out)
}

fn param(params: &[(&str, String)], name: &str) -> Option<String> {
    params
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.clone())
}

/// What a connection presented: the client certificate chain of its TLS session, if any, and
/// its address.
#[derive(Debug, Clone)]
pub(crate) struct HttpPeer {
    certs: Option<Arc<[CertificateDer<'static>]>>,
    addr: Option<SocketAddr>,
}

fn credentials<'a>(headers: &'a HeaderMap, peer: &'a HttpPeer) -> Credentials<'a> {
    Credentials {
        authorization: headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()),
        certs: peer.certs.as_deref(),
        from: peer.addr,
    }
}

/// Checks the call with [`Node::authorize`], the one access check of both APIs, at the node
/// of the sessions' group (whose they are is in its table; a member outside that group sends
/// the client to one of its replicas), or the member's first node when it names none.
fn authorize(
    groups: &Groups,
    headers: &HeaderMap,
    peer: &HttpPeer,
    need: Need<'_>,
    sessions: &[SessionId],
) -> Result<Option<Caller>, HttpError> {
    let node = match sessions.first() {
        Some(id) => groups.of_session(*id)?,
        None => groups.first(),
    };
    Ok(node.authorize(credentials(headers, peer), need, sessions)?)
}

/// An operation's error at `node`: of its group.
fn in_group(node: &Node) -> impl FnOnce(ApiError) -> GroupError + '_ {
    move |e| GroupError::of(node.shape, e)
}

/// A session as JSON: the secret is a decimal string, since a 64-bit secret is beyond the
/// integers a JSON number carries exactly (JavaScript's 2^53).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionJson {
    #[serde(deserialize_with = "whole::deserialize")]
    id: u64,
    #[serde(with = "decimal")]
    secret: u64,
}

impl From<SessionJson> for SessionKey {
    fn from(s: SessionJson) -> SessionKey {
        SessionKey {
            id: SessionId(s.id),
            secret: s.secret,
        }
    }
}

/// A secret's one spelling, the one the server gives (`docs/openapi.json`'s pattern for it):
/// decimal digits without a sign or leading zeros. `u64::from_str` alone would also take
/// `+7` and `007`, which the document calls invalid.
mod decimal {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let text = String::deserialize(d)?;
        match text.parse::<u64>() {
            Ok(v) if v.to_string() == text => Ok(v),
            _ => Err(serde::de::Error::custom(format!(
                "{text:?} is not a secret: the decimal digits of a 64-bit number, without sign \
                 or leading zeros, as the session was given"
            ))),
        }
    }
}

/// The integers of a request body: any JSON number whose value is whole and in the field's
/// range, however it is spelled (`2`, `2.0`, `2e0`, `-0`). JSON Schema's `integer`, which
/// `docs/openapi.json` states, is a value, not a spelling, and a JSON encoder may write a whole
/// float as `2.0`; serde's `u64` takes digits alone. The value is read from the number's text,
/// exactly: `1e19` is 10^19, `1.5` and `18446744073709551616` are refused.
mod whole {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer};
    use serde_json::value::RawValue;

    /// The integer types of request fields, with their largest value.
    pub trait Bounded: TryFrom<u64> {
        const MAX: u64;
    }

    impl Bounded for u64 {
        const MAX: u64 = u64::MAX;
    }

    impl Bounded for u32 {
        const MAX: u64 = u32::MAX as u64;
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Bounded>(d: D) -> Result<T, D::Error> {
        let raw = <Box<RawValue>>::deserialize(d)?;
        of(raw.get()).map_err(D::Error::custom)
    }

    /// An optional field: absent or `null` is `None`.
    pub fn option<'de, D: Deserializer<'de>, T: Bounded>(d: D) -> Result<Option<T>, D::Error> {
        let raw = <Option<Box<RawValue>>>::deserialize(d)?;
        raw.map(|raw| of(raw.get()))
            .transpose()
            .map_err(D::Error::custom)
    }

    fn of<T: Bounded>(text: &str) -> Result<T, String> {
        parse(text, T::MAX)
            .and_then(|v| T::try_from(v).ok())
            .ok_or_else(|| format!("{text} is not a whole number from 0 to {}", T::MAX))
    }

    /// The value of the JSON number `text` when it is whole and at most `max`. JSON's grammar
    /// is `-? int (. frac)? ([eE] [+-]? exp)?`; anything else (a string, `null`) is `None`.
    pub(super) fn parse(text: &str, max: u64) -> Option<u64> {
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let (negative, unsigned) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
            Some((m, e)) => (m, Some(e)),
            None => (unsigned, None),
        };
        let (int, frac) = match mantissa.split_once('.') {
            Some((int, frac)) if digits(frac) => (int, frac),
            Some(_) => return None,
            None => (mantissa, ""),
        };
        if !digits(int) {
            return None;
        }
        // An exponent past a million only says "zero" or "out of range" either way.
        let exponent: i64 = match exponent {
            None => 0,
            Some(e) => {
                let (sign, magnitude) = match e.strip_prefix('-') {
                    Some(m) => (-1, m),
                    None => (1, e.strip_prefix('+').unwrap_or(e)),
                };
                if !digits(magnitude) {
                    return None;
                }
                sign * magnitude.parse::<i64>().unwrap_or(i64::MAX).min(1_000_000)
            }
        };
        // The value is `significant * 10^scale`.
        let all = format!("{int}{frac}");
        let mut significant = all.trim_start_matches('0');
        if significant.is_empty() {
            return Some(0);
        }
        let mut scale = exponent - frac.len() as i64;
        while scale < 0 && significant.ends_with('0') {
            significant = &significant[..significant.len() - 1];
            scale += 1;
        }
        if negative || scale < 0 || significant.len() as i64 + scale > 20 {
            return None;
        }
        let value = significant.parse::<u128>().ok()? * 10u128.pow(scale as u32);
        u64::try_from(value).ok().filter(|v| *v <= max)
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnerJson {
    #[serde(default)]
    host: String,
    #[serde(default, deserialize_with = "whole::deserialize")]
    pid: u32,
    #[serde(default)]
    user: String,
    #[serde(default)]
    text: String,
}

impl From<OwnerJson> for SessionOwner {
    fn from(o: OwnerJson) -> SessionOwner {
        SessionOwner {
            host: o.host,
            pid: o.pid,
            user: o.user,
            text: o.text,
        }
    }
}

impl From<SessionOwner> for OwnerJson {
    fn from(o: SessionOwner) -> OwnerJson {
        OwnerJson {
            host: o.host,
            pid: o.pid,
            user: o.user,
            text: o.text,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateSessionRequest {
    #[serde(deserialize_with = "whole::deserialize")]
    ttl_ms: u64,
    owner: Option<OwnerJson>,
    /// The Raft group to make the session in, that of the locks it will take (`GET
    /// /v1/lock?name=` answers a lock's): required when the cluster has several.
    #[serde(default, deserialize_with = "whole::option")]
    group: Option<u32>,
}

#[derive(Serialize)]
struct CreateSessionResponse {
    session: SessionJson,
    ttl_ms: u64,
    /// The session's group, and the cluster's group count.
    group: u32,
    groups: u32,
}

async fn create_session(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    groups.first().metrics.request("create_session");
    let who = authorize(
        &groups,
        &headers,
        &peer,
        Need::Anywhere(Permission::Lock),
        &[],
    )?;
    let req: CreateSessionRequest = parse(body)?;
    let node = groups.named(req.group, "POST /v1/sessions without a \"group\"")?;
    let created = node
        .create_session(req.ttl_ms, who.as_ref(), req.owner.map(Into::into))
        .await
        .map_err(in_group(node))?;
    Ok(json(&CreateSessionResponse {
        session: SessionJson {
            id: created.key.id.0,
            secret: created.key.secret,
        },
        ttl_ms: created.ttl_ms,
        group: node.shape.group,
        groups: groups.count(),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeepAliveRequest {
    sessions: Vec<SessionJson>,
}

#[derive(Serialize)]
struct LeaseJson {
    id: u64,
    alive: bool,
    ttl_ms: u64,
    revoked_tokens: Vec<u64>,
    revoked_through: Option<u64>,
}

/// A group whose sessions a keepalive of several groups could not renew here now: send them to
/// `leader_addr` (the error body's fields, and the group).
#[derive(Serialize)]
struct RefusedJson {
    group: u32,
    code: &'static str,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    leader_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    leader_addr: Option<String>,
}

#[derive(Serialize)]
struct KeepAliveResponse {
    leases: Vec<LeaseJson>,
    refused: Vec<RefusedJson>,
}

async fn keep_alive(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    groups.first().metrics.request("keep_alive");
    // Parsed before the access check, which needs the sessions' ids.
    let req: KeepAliveRequest = parse(body)?;
    let keys: Vec<SessionKey> = req.sessions.into_iter().map(Into::into).collect();
    let renewal = groups
        .keep_alive(&keys, |node, ids| {
            node.authorize(
                credentials(&headers, &peer),
                Need::Anywhere(Permission::Lock),
                ids,
            )
            .map(|_| ())
            .map_err(GroupError::of_cluster)
        })
        .await?;
    let leases = renewal
        .leases
        .into_iter()
        .map(|l| LeaseJson {
            id: l.id.0,
            alive: l.alive,
            ttl_ms: l.ttl_ms,
            revoked_tokens: l.revoked_tokens,
            revoked_through: l.revoked_through,
        })
        .collect();
    let refused = renewal
        .refused
        .into_iter()
        .map(|(group, e)| {
            let (leader_id, leader_addr) = e.leader_hint();
            RefusedJson {
                group,
                code: e.reason(),
                message: e.to_string(),
                leader_id,
                leader_addr: leader_addr.map(str::to_owned),
            }
        })
        .collect();
    Ok(json(&KeepAliveResponse { leases, refused }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CloseSessionRequest {
    session: SessionJson,
}

async fn close_session(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    groups.first().metrics.request("close_session");
    let req: CloseSessionRequest = parse(body)?;
    let id = SessionId(req.session.id);
    authorize(
        &groups,
        &headers,
        &peer,
        Need::Anywhere(Permission::Lock),
        &[id],
    )?;
    let node = groups.of_session(id)?;
    node.close_session(req.session.into())
        .await
        .map_err(in_group(node))?;
    Ok(json(&serde_json::json!({})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireRequest {
    session: SessionJson,
    #[serde(deserialize_with = "whole::deserialize")]
    seq: u64,
    name: String,
    #[serde(default, deserialize_with = "whole::deserialize")]
    wait_timeout_ms: u64,
}

#[derive(Serialize)]
struct HolderJson {
    session: u64,
    token: u64,
    held_for_ms: u64,
    owner: Option<OwnerJson>,
}

fn holder(h: Held) -> HolderJson {
    HolderJson {
        session: h.session.0,
        token: h.token,
        held_for_ms: h.held_for_ms,
        owner: h.owner.map(Into::into),
    }
}

/// `result` is `granted` (with `token`), `pending` (with `position`: re-send the same request)
/// or `not-granted` (with `held_by` when the lock was held and no wait was asked).
#[derive(Serialize)]
struct AcquireResponse {
    result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    position: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    held_by: Option<HolderJson>,
}

fn acquire_response(a: Acquired) -> AcquireResponse {
    let none = AcquireResponse {
        result: "",
        token: None,
        position: None,
        held_by: None,
    };
    match a {
        Acquired::Granted { token } => AcquireResponse {
            result: "granted",
            token: Some(token),
            ..none
        },
        Acquired::Pending { position } => AcquireResponse {
            result: "pending",
            position: Some(position),
            ..none
        },
        Acquired::NotGranted { held_by } => AcquireResponse {
            result: "not-granted",
            held_by: held_by.map(holder),
            ..none
        },
    }
}

async fn acquire(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    groups.first().metrics.request("acquire");
    let req: AcquireRequest = parse(body)?;
    let id = SessionId(req.session.id);
    let who = authorize(
        &groups,
        &headers,
        &peer,
        Need::Lock(&req.name, Permission::Lock),
        &[id],
    )?;
    let node = groups.of_lock_in(&req.name, id)?;
    let acquired = node
        .acquire(
            req.session.into(),
            req.seq,
            req.name,
            req.wait_timeout_ms,
            who.as_ref(),
        )
        .await
        .map_err(in_group(node))?;
    Ok(json(&acquire_response(acquired)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseRequest {
    session: SessionJson,
    #[serde(deserialize_with = "whole::deserialize")]
    seq: u64,
    name: String,
    #[serde(deserialize_with = "whole::deserialize")]
    token: u64,
}

async fn release(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    groups.first().metrics.request("release");
    let req: ReleaseRequest = parse(body)?;
    let id = SessionId(req.session.id);
    authorize(
        &groups,
        &headers,
        &peer,
        Need::Lock(&req.name, Permission::Lock),
        &[id],
    )?;
    let node = groups.of_lock_in(&req.name, id)?;
    let released = node
        .release(req.session.into(), req.seq, req.name, req.token)
        .await
        .map_err(in_group(node))?;
    Ok(json(&serde_json::json!({ "released": released })))
}

#[derive(Serialize)]
struct WaiterJson {
    session: u64,
    waited_ms: u64,
    owner: Option<OwnerJson>,
}

/// One lock: `holder` is null when it is free; `queue` lists its waiters in order (all from
/// describe, the first few from list), `waiters` counts them all.
#[derive(Serialize)]
struct LockJson {
    name: String,
    holder: Option<HolderJson>,
    waiters: u32,
    queue: Vec<WaiterJson>,
}

fn lock_json(lock: LockView) -> LockJson {
    LockJson {
        name: lock.name,
        holder: lock.held.map(holder),
        waiters: lock.waiters,
        queue: lock
            .queue
            .into_iter()
            .map(|w: Waiting| WaiterJson {
                session: w.session.0,
                waited_ms: w.waited_ms,
                owner: w.owner.map(Into::into),
            })
            .collect(),
    }
}

async fn describe(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Answer {
    groups.first().metrics.request("describe");
    let params = query(raw, &["name"])?;
    let name = param(&params, "name")
        .ok_or_else(|| ApiError::Invalid("give the lock's name: ?name=NAME".into()))?;
    authorize(
        &groups,
        &headers,
        &peer,
        Need::Lock(&name, Permission::Read),
        &[],
    )?;
    let group = latchkey_core::group_of(&name, groups.count());
    let node = groups.serving(group)?;
    let lock = node.describe(&name).await.map_err(in_group(node))?;
    Ok(json(
        &serde_json::json!({ "lock": lock_json(lock), "group": group }),
    ))
}

#[derive(Serialize)]
struct ListResponse {
    locks: Vec<LockJson>,
    truncated: bool,
}

async fn list(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Answer {
    groups.first().metrics.request("list");
    let params = query(raw, &["prefix", "limit", "group"])?;
    let prefix = param(&params, "prefix").unwrap_or_default();
    let whole = |name: &str| -> Result<Option<u64>, ApiError> {
        param(&params, name)
            .map(|text| {
                text.parse::<u64>().map_err(|_| {
                    ApiError::Invalid(format!("{name}={text:?} is not a whole number"))
                })
            })
            .transpose()
    };
    let limit = whole("limit")?.unwrap_or(0) as usize;
    let group = whole("group")?
        .map(|g| {
            u32::try_from(g).map_err(|_| ApiError::Invalid(format!("group={g} is out of range")))
        })
        .transpose()?;
    authorize(
        &groups,
        &headers,
        &peer,
        Need::Prefix(&prefix, Permission::Read),
        &[],
    )?;
    let node = groups.named(group, "GET /v1/locks without ?group=")?;
    let (locks, truncated) = node.list(&prefix, limit).await.map_err(in_group(node))?;
    Ok(json(&ListResponse {
        locks: locks.into_iter().map(lock_json).collect(),
        truncated,
    }))
}

#[derive(Serialize)]
struct MemberJson {
    id: u64,
    addr: String,
}

#[derive(Serialize)]
struct StatusResponse {
    id: u64,
    role: &'static str,
    term: u64,
    last_log_index: u64,
    committed_index: u64,
    applied_index: u64,
    leader_id: Option<u64>,
    members: Vec<MemberJson>,
    learners: Vec<MemberJson>,
    cluster_id: String,
    sessions: u64,
    locks: u64,
    /// Whether this node checks credentials (`--acl`): the web page offers its admin actions
    /// without a token only when it does not.
    access_control: bool,
    /// The cluster's Raft groups; the fields above are group 0's, `group_status` has each
    /// group's as this member sees it.
    groups: u32,
    group_status: Vec<GroupStatusJson>,
}

/// One Raft group as this member sees it (`role` is `outside` in a group it is not placed in,
/// with replica subsets).
#[derive(Serialize)]
struct GroupStatusJson {
    group: u32,
    role: &'static str,
    term: u64,
    last_log_index: u64,
    applied_index: u64,
    leader_id: Option<u64>,
    /// The leader's client (gRPC) address, from the group's membership.
    leader_addr: Option<String>,
    sessions: u64,
    locks: u64,
    voters: Vec<MemberJson>,
}

fn group_status_json(group: u32, s: NodeStatus) -> GroupStatusJson {
    // The client part of the membership's `CLIENT/PEER` (`member_addr.rs`), as a hint names.
    let leader_addr = s.leader_id.and_then(|leader| {
        s.members
            .iter()
            .find(|(id, _)| *id == leader)
            .map(|(_, addr)| {
                crate::cluster::member_addr::MemberAddr::split(addr)
                    .client
                    .to_owned()
            })
    });
    GroupStatusJson {
        group,
        role: s.role.as_str(),
        term: s.term,
        last_log_index: s.last_log_index,
        applied_index: s.applied_index,
        leader_id: s.leader_id,
        leader_addr,
        sessions: s.sessions,
        locks: s.locks,
        voters: members_json(s.members),
    }
}

fn members_json(members: Vec<(u64, String)>) -> Vec<MemberJson> {
    members
        .into_iter()
        .map(|(id, addr)| MemberJson { id, addr })
        .collect()
}

fn status_response(
    s: NodeStatus,
    access_control: bool,
    group_status: Vec<GroupStatusJson>,
) -> StatusResponse {
    StatusResponse {
        id: s.id,
        role: s.role.as_str(),
        term: s.term,
        last_log_index: s.last_log_index,
        committed_index: s.committed_index,
        applied_index: s.applied_index,
        leader_id: s.leader_id,
        members: members_json(s.members),
        learners: members_json(s.learners),
        cluster_id: s.cluster_id,
        sessions: s.sessions,
        locks: s.locks,
        access_control,
        groups: group_status.len() as u32,
        group_status,
    }
}

async fn status(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
) -> Answer {
    let node = groups.first();
    node.metrics.request("node_status");
    authorize(
        &groups,
        &headers,
        &peer,
        Need::Anywhere(Permission::Read),
        &[],
    )?;
    let access_control = node.config.acl.is_some();
    let group_status = groups
        .all()
        .iter()
        .map(|n| group_status_json(n.shape.group, n.status()))
        .collect();
    Ok(json(&status_response(
        node.status(),
        access_control,
        group_status,
    )))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdminReleaseRequest {
    name: String,
    /// Release only if the holder's grant has this token.
    #[serde(default, deserialize_with = "whole::option")]
    token: Option<u64>,
    reason: String,
    /// Who says they are doing it, recorded beside the authenticated identity.
    #[serde(default)]
    operator: String,
}

/// The gRPC `AdminRelease` over HTTP: same access check (`admin` on the lock), same operation,
/// same audit record.
async fn admin_release(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    groups.first().metrics.request("admin_release");
    let req: AdminReleaseRequest = parse(body)?;
    let who = authorize(
        &groups,
        &headers,
        &peer,
        Need::Lock(&req.name, Permission::Admin),
        &[],
    )?;
    let by = Actor {
        identity: who.map(|w| w.name.clone()),
        claimed: req.operator,
    };
    let node = groups.of_lock(&req.name)?;
    let (session, token) = node
        .force_release(req.name, req.token, by, req.reason)
        .await
        .map_err(in_group(node))?;
    Ok(json(
        &serde_json::json!({ "session": session.0, "token": token }),
    ))
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// A static file of the web page. Served without an access check, like the OpenAPI document:
/// it holds no data; what it shows comes from the API calls it makes with the viewer's token.
fn ui_asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, UI_CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// A connection the HTTP API serves: what it tells about its client.
trait HttpConnection: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn peer(&self) -> HttpPeer;
}

impl HttpConnection for TcpStream {
    fn peer(&self) -> HttpPeer {
        HttpPeer {
            certs: None,
            addr: self.peer_addr().ok(),
        }
    }
}

impl HttpConnection for tokio_rustls::server::TlsStream<TcpStream> {
    fn peer(&self) -> HttpPeer {
        let (tcp, tls) = self.get_ref();
        HttpPeer {
            certs: tls.peer_certificates().map(Arc::from),
            addr: tcp.peer_addr().ok(),
        }
    }
}

/// A served connection holding one of the `HTTP_CONNECTIONS_MAX` slots until it is dropped, and
/// failing (so that hyper closes it) once it was idle, nothing read or written, for
/// `HTTP_IDLE_TIMEOUT_MS`.
struct Counted<IO> {
    io: IO,
    idle: Pin<Box<tokio::time::Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl<IO> Counted<IO> {
    fn new(io: IO, slot: OwnedSemaphorePermit) -> Counted<IO> {
        Counted {
            io,
            idle: Box::pin(tokio::time::sleep(IDLE)),
            _slot: slot,
        }
    }

    /// After an I/O call: progress restarts the idle clock; no progress fails the connection
    /// once the clock ran out (polling it also arms the wake-up for that moment).
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        match polled {
            Poll::Pending => match self.idle.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "HTTP API connection idle too long",
                ))),
                Poll::Pending => Poll::Pending,
            },
            ready => {
                self.idle.as_mut().reset(tokio::time::Instant::now() + IDLE);
                ready
            }
        }
    }
}

const IDLE: std::time::Duration = std::time::Duration::from_millis(limits::HTTP_IDLE_TIMEOUT_MS);

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        self.watch(cx, polled)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Counted<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The connections `tls::accept_loop` hands over (handshake done), as axum's listener.
struct HttpListener<IO> {
    incoming: mpsc::Receiver<std::io::Result<IO>>,
    slots: Arc<Semaphore>,
}

impl<IO: HttpConnection> Listener for HttpListener<IO> {
    type Io = Counted<IO>;
    type Addr = HttpPeer;

    async fn accept(&mut self) -> (Counted<IO>, HttpPeer) {
        loop {
            let slot = self
                .slots
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            match self.incoming.recv().await {
                Some(Ok(io)) => {
                    let peer = io.peer();
                    return (Counted::new(io, slot), peer);
                }
                Some(Err(e)) => {
                    // EMFILE and the like: back off a little rather than spin (axum's own loop
                    // does the same).
                    tracing::warn!(error = %e, "HTTP API: accepting a connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                // The accept loop ended: only graceful shutdown is left to do.
                None => std::future::pending().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<HttpPeer> {
        Ok(HttpPeer {
            certs: None,
            addr: None,
        })
    }
}

impl<IO: HttpConnection> Connected<IncomingStream<'_, HttpListener<IO>>> for HttpPeer {
    fn connect_info(stream: IncomingStream<'_, HttpListener<IO>>) -> HttpPeer {
        stream.remote_addr().clone()
    }
}

/// Serves the HTTP API on `listener` (TLS when `tls` is given) until `shutdown` completes and
/// the requests in flight are answered (long-polls end with the node's shutdown).
pub(crate) async fn serve(
    listener: TcpListener,
    groups: Arc<Groups>,
    tls: Option<Arc<ServerTls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // The scheme of the node's own origin is this listener's.
    let policy = CrossSite::new(
        tls.is_some(),
        groups.first().config.http_allow_origins.clone(),
    );
    let refusals = groups.first().metrics.refusals.clone();
    let app = router(groups, policy).into_make_service_with_connect_info::<HttpPeer>();
    let slots = Arc::new(Semaphore::new(limits::HTTP_CONNECTIONS_MAX));
    let (tx_capacity, addr) = (limits::CONN_HANDSHAKES_IN_FLIGHT_MAX, local(&listener));
    match tls {
        None => {
            let (tx, incoming) = mpsc::channel(tx_capacity);
            let accept = tokio::spawn(tls::accept_loop(listener, tx, tls::plaintext_handshake));
            tracing::info!(%addr, "serving the HTTP API");
            let served = axum::serve(HttpListener { incoming, slots }, app)
                .with_graceful_shutdown(shutdown)
                .await;
            // The listener (the channel's receiver) is dropped: the accept loop returns.
            let _ = accept.await;
            served
        }
        Some(server_tls) => {
            let (tx, incoming) = mpsc::channel(tx_capacity);
            let accept = tokio::spawn(tls::accept_loop(listener, tx, move |stream, from| {
                let refusals = refusals.clone();
                tls::tls_handshake(
                    server_tls.clone(),
                    tls::Served::Http,
                    refusals,
                    stream,
                    from,
                )
            }));
            tracing::info!(%addr, "serving the HTTP API over TLS");
            let served = axum::serve(HttpListener { incoming, slots }, app)
                .with_graceful_shutdown(shutdown)
                .await;
            let _ = accept.await;
            served
        }
    }
}

fn local(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map(|a: SocketAddr| a.to_string())
        .unwrap_or_else(|e| format!("? ({e})"))
}

#[cfg(test)]
mod tests {
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
        let sessions = schema(&doc, &format!("{s}/KeepAliveRequest/properties/sessions"));
        assert_eq!(
            num(&sessions["maxItems"]),
            limits::KEEPALIVE_SESSIONS_MAX as u64
        );

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
            let taken = serde_json::from_value::<SessionJson>(
                serde_json::json!({ "id": 1, "secret": text }),
            )
            .is_ok();
            assert_eq!(secret.is_match(&text), taken, "the secret {text:?}");
        }
    }
}
