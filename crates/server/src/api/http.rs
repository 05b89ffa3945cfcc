//! The HTTP/JSON API (`--http-listen`, issue #15): the client calls of the gRPC `Locks` service
//! (sessions, keepalive, acquire with its long-poll, release, describe, list, this node's
//! status, the batch of acquires, releases, closes and a keepalive: `POST /v1/batch`) and the
//! admin force-release (`AdminRelease`, for the web page) as JSON over
//! HTTP/1.1, for clients without gRPC. Like `service.rs` it only
//! translates: every call is checked by `Node::authorize` and runs the same operation of
//! `ops.rs` (acquire, release, close, keepalive and the batch through the functions gRPC's
//! calls run, `calls.rs`), so the semantics (exactly-once by session and sequence number, the
//! long-poll bound `ACQUIRE_POLL_MS_MAX`, the leader-only answers) are the gRPC API's. Errors are
//! `error::ErrorBody` JSON with the gRPC reason as `code`.
//!
//! [`ROUTES`] is the API's one list of (method, path): the router is built from it, and a test
//! holds `docs/openapi.json` to it. The document itself is served at `GET /v1/openapi.json`,
//! and the web page (issue #15 item 6) at `GET /ui`: static files from `ui/`, whose script
//! reads the routes above and offers force-release to a viewer who may be an admin (see
//! `ui/app.js`).
//!
//! A follower forwards a request answered `not-leader` to its group's leader, once, when the
//! caller's identity can be carried (`forward.rs`): any member serves every route.
//!
//! Before any route's handler, `cross_site::guard` refuses a write that is not JSON or comes from a web
//! page of another origin than the node's own (unless `--http-allow-origin` lists it).
//!
//! Connections come through `tls::accept_loop` like gRPC's (TLS when the node has TLS, with
//! ALPN `http/1.1`), at most `HTTP_CONNECTIONS_MAX` at once, each closed once idle for
//! `HTTP_IDLE_TIMEOUT_MS`; a body is at most `HTTP_BODY_BYTES_MAX`.
//!
//! This file is the router, the handlers and their JSON bodies; beside it in `http/`:
//! `routes.rs` ([`ROUTES`]), `cross_site.rs` (the guard), `forward.rs` (to the leader),
//! `listener.rs` (the connections),
//! `decimal.rs` and `whole.rs` (how the JSON bodies spell numbers), and the tests.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use latchkey_core::{limits, Actor, SessionId, SessionKey, SessionOwner};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};

use crate::access::acl::{Caller, Need, Permission};
use crate::access::tls::{self, ServerTls};
use crate::api::calls::{self, Call, Outcome, Poll};
use crate::error::{ApiError, ErrorBody, GroupError};
use crate::node::groups::{Groups, Renewal};
use crate::node::membership::NodeStatus;
use crate::node::ops::{Acquired, Credentials, Held, LockView, Waiting};
use crate::node::Node;

pub mod cross_site;
mod decimal;
mod forward;
mod listener;
mod routes;
#[cfg(test)]
mod tests;
mod whole;

use cross_site::CrossSite;
use listener::{local, HttpListener, HttpPeer};
pub use routes::ROUTES;

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
        ("POST", "/v1/locks/proclaim") => post(proclaim),
        ("POST", "/v1/batch") => post(batch),
        ("GET", "/v1/lock") => get(describe),
        ("GET", "/v1/locks") => get(list),
        ("GET", "/v1/cluster/status") => get(status),
        ("POST", "/v1/admin/release") => post(admin_release),
        ("GET", "/v1/openapi.json") => get(openapi),
        ("GET", "/ui") => get(|| async { ui_asset("text/html; charset=utf-8", UI_HTML) }),
        ("GET", "/ui/app.js") => {
            get(|| async { ui_asset("text/javascript; charset=utf-8", UI_JS) })
        }
        // A browser pointed at the port finds the page (issue #33).
        ("GET", "/") => get(|| async { axum::response::Redirect::to("/ui") }),
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
        // After the guard: a follower sends a request answered `not-leader` on to its leader.
        .route_layer(middleware::from_fn_with_state(
            groups.clone(),
            forward::forward,
        ))
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

/// What a request says of who sends it, for [`Node::authorize`]. A request a follower
/// forwarded (marked `forward::FORWARDED_HEADER`) came over the follower's connection: its
/// certificate is the follower's, never the caller's, so it is left out and only the caller's
/// bearer token can speak for it (`forward.rs`). A caller that sets the mark itself only loses
/// its own certificate. Found by an attacker's review (issue #35): a follower running without
/// `--acl` forwarded a certificate-only request, and the leader judged it as the follower.
fn credentials<'a>(headers: &'a HeaderMap, peer: &'a HttpPeer) -> Credentials<'a> {
    let forwarded = headers.contains_key(forward::FORWARDED_HEADER);
    Credentials {
        authorization: headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()),
        certs: if forwarded {
            None
        } else {
            peer.certs.as_deref()
        },
        from: peer.addr,
    }
}

/// Checks the call with [`Node::authorize`], the one access check of both APIs
/// (`calls::authorize`), with the credentials the request carries.
fn authorize(
    groups: &Groups,
    headers: &HeaderMap,
    peer: &HttpPeer,
    need: Need<'_>,
    sessions: &[SessionId],
) -> Result<Option<Caller>, HttpError> {
    Ok(calls::authorize(
        groups,
        credentials(headers, peer),
        need,
        sessions,
    )?)
}

/// An operation's error at `node`: of its group.
fn in_group(node: &Node) -> impl FnOnce(ApiError) -> GroupError + '_ {
    move |e| GroupError::of(node.shape, e)
}

/// Runs `call` (`calls.rs`, as gRPC runs it) with the credentials the request carries.
async fn run(
    groups: &Groups,
    headers: &HeaderMap,
    peer: &HttpPeer,
    call: Call,
) -> Result<Outcome, HttpError> {
    Ok(calls::run(groups, credentials(headers, peer), call, Poll::Long).await?)
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
    /// Conflict events: held names someone waits for (as gRPC's `SessionLease.contended`).
    contended: Vec<String>,
    /// `contended` is part of them, not all (as gRPC's `SessionLease.contended_truncated`).
    contended_truncated: bool,
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

fn keep_alive_call(req: KeepAliveRequest) -> Call {
    Call::KeepAlive(req.sessions.into_iter().map(Into::into).collect())
}

fn keep_alive_response(renewal: Renewal) -> KeepAliveResponse {
    let leases = renewal
        .leases
        .into_iter()
        .map(|l| LeaseJson {
            id: l.id.0,
            alive: l.alive,
            ttl_ms: l.ttl_ms,
            revoked_tokens: l.revoked_tokens,
            revoked_through: l.revoked_through,
            contended: l.contended,
            contended_truncated: l.contended_truncated,
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
    KeepAliveResponse { leases, refused }
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
    let Outcome::Renewed(renewal) = run(&groups, &headers, &peer, keep_alive_call(req)).await?
    else {
        unreachable!("a keepalive is answered with a renewal")
    };
    Ok(json(&keep_alive_response(renewal)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CloseSessionRequest {
    session: SessionJson,
}

/// The answer of a close: nothing more than its success.
#[derive(Serialize)]
struct Closed {}

async fn close_session(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    groups.first().metrics.request("close_session");
    let req: CloseSessionRequest = parse(body)?;
    let call = Call::CloseSession(req.session.into());
    run(&groups, &headers, &peer, call).await?;
    Ok(json(&Closed {}))
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
    /// `"exclusive"` (the default), `"shared"`, or `{"permits": N}` (docs/primitives.md).
    #[serde(default)]
    mode: ModeJson,
    /// A campaign's election value (UTF-8; exclusive mode only).
    #[serde(default)]
    value: Option<String>,
    /// Lock-delay in ms (docs/primitives.md); 0, the default, for none.
    #[serde(default, deserialize_with = "whole::deserialize")]
    lock_delay_ms: u64,
}

/// How an acquire takes a name, as the JSON says it: a string, or an object for a
/// semaphore's permits, so that no field depends on another.
#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
enum ModeJson {
    #[default]
    Exclusive,
    Shared,
    Permits(#[serde(deserialize_with = "whole::deserialize")] u32),
}

impl From<ModeJson> for latchkey_core::Mode {
    fn from(m: ModeJson) -> latchkey_core::Mode {
        match m {
            ModeJson::Exclusive => latchkey_core::Mode::Exclusive,
            ModeJson::Shared => latchkey_core::Mode::Shared,
            ModeJson::Permits(n) => latchkey_core::Mode::Permits(n),
        }
    }
}

/// A mode in an answer: its name, and a semaphore's permits (null for a lock).
fn mode_name(mode: latchkey_core::Mode) -> (&'static str, Option<u32>) {
    match mode {
        latchkey_core::Mode::Exclusive => ("exclusive", None),
        latchkey_core::Mode::Shared => ("shared", None),
        latchkey_core::Mode::Permits(n) => ("permits", Some(n)),
    }
}

#[derive(Serialize)]
struct HolderJson {
    session: u64,
    token: u64,
    held_for_ms: u64,
    owner: Option<OwnerJson>,
    /// The election value this holder published (UTF-8, lossy), only when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
}

fn holder(h: Held) -> HolderJson {
    HolderJson {
        session: h.session.0,
        token: h.token,
        held_for_ms: h.held_for_ms,
        owner: h.owner.map(Into::into),
        value: h
            .value
            .as_deref()
            .map(|v| String::from_utf8_lossy(v).into_owned()),
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
            held_by: held_by.map(|(h, _)| holder(h)),
            ..none
        },
    }
}

fn acquire_call(req: AcquireRequest) -> Call {
    Call::Acquire(calls::Acquire {
        session: req.session.into(),
        seq: req.seq,
        name: req.name,
        wait_timeout_ms: req.wait_timeout_ms,
        mode: req.mode.into(),
        value: req.value.map(String::into_bytes),
        lock_delay_ms: req.lock_delay_ms,
    })
}

async fn acquire(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    groups.first().metrics.request("acquire");
    let req: AcquireRequest = parse(body)?;
    let Outcome::Acquired(acquired) = run(&groups, &headers, &peer, acquire_call(req)).await?
    else {
        unreachable!("an acquire is answered with its outcome")
    };
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

#[derive(Serialize)]
struct ReleaseResponse {
    released: bool,
}

fn release_call(req: ReleaseRequest) -> Call {
    Call::Release {
        session: req.session.into(),
        seq: req.seq,
        name: req.name,
        token: req.token,
    }
}

async fn release(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    groups.first().metrics.request("release");
    let req: ReleaseRequest = parse(body)?;
    let Outcome::Released(released) = run(&groups, &headers, &peer, release_call(req)).await?
    else {
        unreachable!("a release is answered with whether it released")
    };
    Ok(json(&ReleaseResponse { released }))
}

/// `POST /v1/batch` (issue #35 item 1): the gRPC `Batch` call. Each operation is the JSON body
/// of its own route (`/v1/locks/acquire`, `/v1/locks/release`, `/v1/sessions/close`,
/// `/v1/sessions/keepalive`) under the route's last word.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchRequest {
    ops: Vec<BatchOpJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
enum BatchOpJson {
    Acquire(AcquireRequest),
    Release(ReleaseRequest),
    Close(CloseSessionRequest),
    Keepalive(KeepAliveRequest),
}

/// One operation's answer: its own route's answer under the same word, or `error`.
#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum BatchResultJson {
    Acquire(AcquireResponse),
    Release(ReleaseResponse),
    Close(Closed),
    Keepalive(KeepAliveResponse),
    Error(BatchErrorJson),
}

/// An operation's error: the fields of the HTTP API's error body (`error::ErrorBody`), and
/// the HTTP status its own call would have been answered with.
#[derive(Serialize)]
struct BatchErrorJson {
    status: u16,
    code: &'static str,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    leader_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    leader_addr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<u32>,
}

#[derive(Serialize)]
struct BatchResponse {
    results: Vec<BatchResultJson>,
}

fn batch_result(result: Result<Outcome, GroupError>) -> BatchResultJson {
    match result {
        Ok(Outcome::Acquired(a)) => BatchResultJson::Acquire(acquire_response(a)),
        Ok(Outcome::Released(released)) => BatchResultJson::Release(ReleaseResponse { released }),
        Ok(Outcome::Closed) => BatchResultJson::Close(Closed {}),
        Ok(Outcome::Renewed(r)) => BatchResultJson::Keepalive(keep_alive_response(r)),
        Err(e) => {
            let (leader_id, leader_addr) = e.error.leader_hint();
            BatchErrorJson {
                status: e.error.http_status().as_u16(),
                code: e.error.reason(),
                message: e.error.to_string(),
                leader_id,
                leader_addr: leader_addr.map(str::to_owned),
                group: e.group(),
            }
            .into()
        }
    }
}

impl From<BatchErrorJson> for BatchResultJson {
    fn from(e: BatchErrorJson) -> BatchResultJson {
        BatchResultJson::Error(e)
    }
}

/// The `not-leader` error a batch is answered with as a whole, so that a follower forwards
/// it to its leader as any route's request (`forward.rs`): when every operation was refused
/// before anything was proposed, at least one because this member does not lead, and all
/// those name the same group and leader. Then nothing changed here, and the leader answers
/// every operation, those refused here too (its own access check, its own table). Otherwise
/// each operation keeps its answer, a `not-leader` one with its group's leader hint, as in
/// the gRPC `Batch`.
fn not_leader_for_all(results: &[Result<Outcome, GroupError>]) -> Option<GroupError> {
    let mut not_leader: Option<&GroupError> = None;
    for result in results {
        let e = result.as_ref().err()?;
        match &e.error {
            ApiError::NotLeader { .. } => match not_leader {
                Some(first)
                    if first.group() != e.group()
                        || first.error.leader_hint() != e.error.leader_hint() =>
                {
                    return None
                }
                Some(_) => {}
                None => not_leader = Some(e),
            },
            // Refused before anything was proposed.
            ApiError::Invalid(_)
            | ApiError::PermissionDenied(_)
            | ApiError::Unauthenticated(_)
            | ApiError::WrongGroup { .. }
            | ApiError::NotWithGroups { .. }
            | ApiError::NoSuchGroup { .. } => {}
            _ => return None,
        }
    }
    not_leader.cloned()
}

async fn batch(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    groups.first().metrics.request("batch");
    let req: BatchRequest = parse(body)?;
    let calls = req
        .ops
        .into_iter()
        .map(|op| {
            Ok(match op {
                BatchOpJson::Acquire(req) => acquire_call(req),
                BatchOpJson::Release(req) => release_call(req),
                BatchOpJson::Close(req) => Call::CloseSession(req.session.into()),
                BatchOpJson::Keepalive(req) => keep_alive_call(req),
            })
        })
        .collect();
    let results = calls::batch(&groups, credentials(&headers, &peer), calls).await?;
    if let Some(e) = not_leader_for_all(&results) {
        return Err(e.into());
    }
    Ok(json(&BatchResponse {
        results: results.into_iter().map(batch_result).collect(),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProclaimRequest {
    session: SessionJson,
    #[serde(deserialize_with = "whole::deserialize")]
    seq: u64,
    name: String,
    #[serde(deserialize_with = "whole::deserialize")]
    token: u64,
    value: String,
}

async fn proclaim(
    State(groups): State<Api>,
    ConnectInfo(peer): ConnectInfo<HttpPeer>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    groups.first().metrics.request("proclaim");
    let req: ProclaimRequest = parse(body)?;
    let id = SessionId(req.session.id);
    authorize(
        &groups,
        &headers,
        &peer,
        Need::Lock(&req.name, Permission::Lock),
        &[id],
    )?;
    let node = groups.of_lock_in(&req.name, id)?;
    node.proclaim(
        req.session.into(),
        req.seq,
        req.name,
        req.token,
        req.value.into_bytes(),
    )
    .await
    .map_err(in_group(node))?;
    Ok(json(&serde_json::json!({})))
}

#[derive(Serialize)]
struct WaiterJson {
    session: u64,
    waited_ms: u64,
    owner: Option<OwnerJson>,
    mode: &'static str,
}

/// One lock: `holder` is null when it is free (of several holders, the first granted);
/// `holders` lists every holder; `mode` is how it is held (`permits`: a semaphore of `permits`);
/// `queue` lists its waiters in order (all from describe, the first few from list), `waiters`
/// counts them all.
#[derive(Serialize)]
struct LockJson {
    name: String,
    holder: Option<HolderJson>,
    mode: &'static str,
    permits: Option<u32>,
    holders: Vec<HolderJson>,
    waiters: u32,
    queue: Vec<WaiterJson>,
    /// The lock-delay the holder's grant asked for (ms), when it asked for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    lock_delay_ms: Option<u64>,
    /// While a lock-delay runs: ms until the name is granted again.
    #[serde(skip_serializing_if = "Option::is_none")]
    delay_remaining_ms: Option<u64>,
    /// While a lock-delay runs: the lost grant's token; `end_delay` naming it ends the delay.
    #[serde(skip_serializing_if = "Option::is_none")]
    delay_token: Option<u64>,
}

fn lock_json(lock: LockView) -> LockJson {
    let (mode, permits) = mode_name(lock.mode);
    LockJson {
        name: lock.name,
        holder: lock.held.map(holder),
        mode,
        permits,
        holders: lock.holders.into_iter().map(holder).collect(),
        waiters: lock.waiters,
        queue: lock
            .queue
            .into_iter()
            .map(|w: Waiting| WaiterJson {
                session: w.session.0,
                waited_ms: w.waited_ms,
                owner: w.owner.map(Into::into),
                mode: mode_name(w.mode).0,
            })
            .collect(),
        lock_delay_ms: lock.lock_delay_ms,
        delay_remaining_ms: lock.delay_remaining_ms,
        delay_token: lock.delay_token,
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
    let (lock, read_index) = node.describe(&name).await.map_err(in_group(node))?;
    Ok(json(&serde_json::json!({
        "lock": lock_json(lock),
        "group": group,
        "read_index": read_index,
    })))
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
    /// Where it serves the HTTP API, as this member heard (members say so in their Raft
    /// messages and answers); null when it serves none or has not said yet.
    http_addr: Option<String>,
}

/// Where member `id` serves HTTP, as this member knows.
type HttpOf<'a> = &'a dyn Fn(u64) -> Option<String>;

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

fn group_status_json(group: u32, s: NodeStatus, http_of: HttpOf<'_>) -> GroupStatusJson {
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
        voters: members_json(s.members, http_of),
    }
}

fn members_json(members: Vec<(u64, String)>, http_of: HttpOf<'_>) -> Vec<MemberJson> {
    members
        .into_iter()
        .map(|(id, addr)| MemberJson {
            id,
            addr,
            http_addr: http_of(id),
        })
        .collect()
}

fn status_response(
    s: NodeStatus,
    access_control: bool,
    group_status: Vec<GroupStatusJson>,
    http_of: HttpOf<'_>,
) -> StatusResponse {
    StatusResponse {
        id: s.id,
        role: s.role.as_str(),
        term: s.term,
        last_log_index: s.last_log_index,
        committed_index: s.committed_index,
        applied_index: s.applied_index,
        leader_id: s.leader_id,
        members: members_json(s.members, http_of),
        learners: members_json(s.learners, http_of),
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
    let http_of = |id: u64| groups.all().iter().find_map(|n| n.peer_auth.http_of(id));
    let group_status = groups
        .all()
        .iter()
        .map(|n| group_status_json(n.shape.group, n.status(), &http_of))
        .collect();
    Ok(json(&status_response(
        node.status(),
        access_control,
        group_status,
        &http_of,
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
    /// End the running lock-delay (under `token`, if given) instead of taking a holder.
    #[serde(default)]
    end_delay: bool,
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
        .force_release(req.name, req.token, req.end_delay, by, req.reason)
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
