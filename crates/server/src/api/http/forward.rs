//! A follower forwards an HTTP request to its group's leader (issue #33), so that any member
//! serves every route (behind a load balancer, say).
//!
//! How: the request runs here first, as on any member. When it is answered `not-leader`
//! naming a leader whose HTTP address this member heard (a leader's appends carry it,
//! `LeaderContact::http_of`), the request is sent once more to that address and the leader's
//! answer is relayed; otherwise, or when no connection to the leader opens, the caller gets
//! this member's `not-leader` as before. A request sent whose answer does not come back in full
//! (not within `HTTP_FORWARD_TIMEOUT_MS`, more than `HTTP_FORWARD_RESPONSE_BYTES_MAX` bytes, the
//! connection lost) gets 503 `raft`: it may have taken effect, and the caller retries it with
//! the same session and sequence number. Only an answer that changed nothing is
//! forwarded: `not-leader` comes before anything is proposed, or from a proposal openraft
//! refused, which a retry with the same (session, seq) answers exactly once.
//!
//! Who the caller is: the leader checks the caller's own credentials, as if it had been called
//! itself. Only a bearer token (`Authorization`) can be carried: the follower sends it
//! unchanged and never a name of its own, so a follower (or anyone) cannot make the leader
//! believe in an identity it holds no token for. A caller known only by its client certificate
//! cannot be carried (the leader would see the follower's connection), so with access control
//! on such a request is not forwarded: the caller gets `not-leader` and asks the leader itself.
//! A follower without access control (a cluster part-way through turning it on) does forward
//! it, so the leader never takes a marked request's certificate for its caller
//! (`http::credentials` leaves it out): such a caller has no credentials there.
//!
//! Over TLS (with `--tls-ca`) the follower dials the leader's HTTP port as members dial each
//! other: the leader verified against the CA, this member's certificate presented because the
//! leader's listener requires one. That certificate is never the caller: under access control
//! only a request with an `Authorization` header is forwarded, and a bearer header wins over
//! any certificate (a bad or unknown token is refused, never passed over for the
//! certificate: `AclPolicy::authenticate`). Without `--tls-ca` a member has no CA to verify
//! the leader with, and does not forward.
//!
//! Cross-site: this runs after `cross_site::guard`, on this member's own origin rules. The
//! forwarded request carries no `Origin`, `Referer` or cookie: a browser's request was judged
//! here, and the leader's answer comes back through this member's guard's headers.
//!
//! One hop: a forwarded request is marked (`FORWARDED_HEADER`) and a marked request is never
//! forwarded again, so a leader that changed in the meantime answers `not-leader` itself. A
//! caller setting the mark only turns forwarding off for its own request.

use std::time::Duration;

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use latchkey_core::limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Api, HttpError};

/// Marks a request a follower forwarded; its value is the follower's id (for the log).
pub const FORWARDED_HEADER: &str = "latchkey-forwarded-by";

/// The request headers a forwarded request keeps: the body's type, the caller's bearer token,
/// what it accepts. Nothing else (no `Origin`, `Cookie`, `Host`, hop-by-hop headers).
const KEPT: [header::HeaderName; 3] = [header::CONTENT_TYPE, header::AUTHORIZATION, header::ACCEPT];

/// The layer: runs the request here, then forwards it once if it was answered `not-leader`.
pub(super) async fn forward(State(groups): State<Api>, request: Request, next: Next) -> Response {
    if request.headers().contains_key(FORWARDED_HEADER) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(body) = to_bytes(body, limits::HTTP_BODY_BYTES_MAX).await else {
        return HttpError::BodyTooLarge.into_response();
    };
    let here = next
        .run(Request::from_parts(parts.clone(), Body::from(body.clone())))
        .await;
    if here.status() != StatusCode::SERVICE_UNAVAILABLE {
        return here;
    }
    let (head, answer) = here.into_parts();
    // Our own error body, which is small.
    let answer = to_bytes(answer, limits::HTTP_BODY_BYTES_MAX)
        .await
        .unwrap_or_default();
    let here = || Response::from_parts(head.clone(), Body::from(answer.clone()));
    let Some((group, leader)) = not_leader(&answer) else {
        return here();
    };
    let node = groups.first();
    let carried = parts.headers.contains_key(header::AUTHORIZATION) || node.config.acl.is_none();
    let tls = match &node.config.tls {
        None => None,
        Some(tls) if tls.requires_client_certs() => match tls.http_dial_config() {
            Ok(config) => Some(config),
            Err(e) => {
                tracing::debug!("forwarding an HTTP request: no TLS to dial with: {e}");
                return here();
            }
        },
        Some(_) => return here(),
    };
    if !carried {
        return here();
    }
    let Some(addr) = groups
        .all()
        .iter()
        .find(|n| n.shape.group == group)
        .and_then(|n| {
            n.leader_contact
                .http_of(leader)
                .filter(|a| on_member_host(n, leader, a))
        })
    else {
        return here();
    };
    let target = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str());
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(limits::HTTP_FORWARD_TIMEOUT_MS);
    // Not connected: nothing reached the leader, and this member's `not-leader` is still true.
    let stream =
        match tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(&addr)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                tracing::debug!(leader, %addr, "forwarding an HTTP request: cannot connect: {e}");
                return here();
            }
            Err(_) => return here(),
        };
    let request = Forwarded {
        addr: &addr,
        method: &parts.method,
        target,
        headers: &parts.headers,
        body: &body,
        me: node.id,
    };
    let sent = match tls {
        None => tokio::time::timeout_at(deadline, send(stream, &request)).await,
        Some(config) => {
            let Some(name) = server_name(&addr) else {
                return here();
            };
            let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
            // A handshake refused: nothing reached the leader.
            let stream =
                match tokio::time::timeout_at(deadline, connector.connect(name, stream)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        tracing::debug!(leader, %addr, "forwarding an HTTP request: TLS: {e}");
                        return here();
                    }
                    Err(_) => return here(),
                };
            tokio::time::timeout_at(deadline, send(stream, &request)).await
        }
    };
    let failed = match sent {
        Ok(Ok(relayed)) => return relayed,
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {} ms", limits::HTTP_FORWARD_TIMEOUT_MS),
    };
    // Sent but not answered in full: the leader may have done it. Not `not-leader` (which
    // says nothing was done) but `raft`, an outcome unknown: the caller retries with the same
    // session and sequence number, which a done request answers as it did (exactly once).
    tracing::debug!(leader, %addr, "forwarding an HTTP request: {failed}");
    HttpError::from(crate::error::ApiError::Raft(format!(
        "this request was forwarded to the leader (member {leader}) but its answer did not come \
         back ({failed}); it may have taken effect: retry it with the same session and seq"
    )))
    .into_response()
}

/// Whether `http` (`HOST:PORT`) is on a host the membership records for member `id` (its
/// client or peer address). A follower sends callers' bearer tokens only there: an address
/// header that lies (without a cluster secret anyone who reaches the peer port can send one)
/// cannot point them at another host, and a leader that advertises a loopback `--http-listen`
/// in a cluster of several hosts is not forwarded to (its followers would reach themselves).
fn on_member_host(node: &crate::node::Node, id: u64, http: &str) -> bool {
    use openraft::async_runtime::WatchReceiver;
    let host = |a: &str| {
        a.rsplit_once(':').map(|(h, _)| {
            h.trim_start_matches('[')
                .trim_end_matches(']')
                .to_ascii_lowercase()
        })
    };
    let Some(want) = host(http) else {
        return false;
    };
    let metrics = node.raft.metrics();
    let m = metrics.borrow_watched();
    let Some(member) = m.membership_config.membership().get_node(&id) else {
        return false;
    };
    let recorded = crate::cluster::member_addr::MemberAddr::split(&member.addr);
    let on_it = [Some(recorded.client), recorded.peer]
        .into_iter()
        .flatten()
        .any(|a| host(a).as_deref() == Some(want.as_str()));
    on_it
}

/// The group and leader of a `not-leader` error body.
fn not_leader(body: &[u8]) -> Option<(u32, u64)> {
    let body: serde_json::Value = serde_json::from_slice(body).ok()?;
    if body["code"] != "not-leader" {
        return None;
    }
    let group = body["group"].as_u64().unwrap_or(0);
    Some((u32::try_from(group).ok()?, body["leader_id"].as_u64()?))
}

/// The host of `addr` (`HOST:PORT`, `[V6]:PORT`) as the leader's certificate must name it.
fn server_name(addr: &str) -> Option<rustls_pki_types::ServerName<'static>> {
    let (host, _) = addr.rsplit_once(':')?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    rustls_pki_types::ServerName::try_from(host).ok()
}

/// A request to forward: to the leader's HTTP address, from this member (`me`).
struct Forwarded<'a> {
    addr: &'a str,
    method: &'a Method,
    target: &'a str,
    headers: &'a HeaderMap,
    body: &'a Bytes,
    me: u64,
}

/// One HTTP/1.1 request on `stream` (a connection of its own, plain or TLS, closed after the
/// answer); the answer's status, type and body.
async fn send<S>(mut stream: S, request: &Forwarded<'_>) -> std::io::Result<Response>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let Forwarded {
        addr,
        method,
        target,
        headers,
        body,
        me,
    } = *request;
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\
         content-length: {}\r\n{FORWARDED_HEADER}: {me}\r\n",
        body.len()
    )
    .into_bytes();
    for name in KEPT {
        if let Some(value) = headers.get(&name) {
            head.extend_from_slice(name.as_str().as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
    }
    head.extend_from_slice(b"\r\n");
    stream.write_all(&head).await?;
    stream.write_all(body).await?;
    // A TLS stream may hold the last record until flushed.
    stream.flush().await?;
    let mut answer = Vec::new();
    (&mut stream)
        .take(limits::HTTP_FORWARD_RESPONSE_BYTES_MAX as u64 + 1)
        .read_to_end(&mut answer)
        .await?;
    if answer.len() > limits::HTTP_FORWARD_RESPONSE_BYTES_MAX {
        return Err(bad("the answer is too large to relay"));
    }
    parse_answer(&answer)
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

/// An HTTP/1.1 answer read to its end: a status line, headers, and a body of `content-length`
/// bytes (the API's answers all have one). Relayed: the status, the body, its type, and a
/// 401's `WWW-Authenticate`; no other header (a cookie, say) passes.
fn parse_answer(answer: &[u8]) -> std::io::Result<Response> {
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of the answer's head"))?;
    let head = std::str::from_utf8(&answer[..end]).map_err(|_| bad("the head is not UTF-8"))?;
    let body = &answer[end + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| bad("no status"))?;
    let mut content_type = None;
    let mut authenticate = None;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-type") {
            content_type = HeaderValue::from_str(value).ok();
        } else if name.eq_ignore_ascii_case("www-authenticate") {
            authenticate = HeaderValue::from_str(value).ok();
        } else if name.eq_ignore_ascii_case("content-length") {
            length = value.parse::<usize>().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(bad("a chunked answer"));
        }
    }
    if length.is_some_and(|n| n != body.len()) {
        return Err(bad("the answer's body is not its content-length"));
    }
    let mut response = Response::new(Body::from(body.to_vec()));
    *response.status_mut() = status;
    if let Some(content_type) = content_type {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
    }
    if let Some(authenticate) = authenticate {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, authenticate);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_not_leader_body_names_its_group_and_leader() {
        let body =
            br#"{"code":"not-leader","message":"m","leader_id":2,"leader_addr":"h:1","group":1}"#;
        assert_eq!(not_leader(body), Some((1, 2)));
        let no_group = br#"{"code":"not-leader","message":"m","leader_id":3}"#;
        assert_eq!(not_leader(no_group), Some((0, 3)));
        let no_leader = br#"{"code":"not-leader","message":"m"}"#;
        assert_eq!(not_leader(no_leader), None);
        let other = br#"{"code":"unavailable","message":"m","leader_id":2}"#;
        assert_eq!(not_leader(other), None);
    }

    #[test]
    fn an_answer_is_relayed_with_its_status_type_and_body_only() {
        let answer = b"HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\nset-cookie: x=1\r\ncontent-length: 2\r\n\r\n{}";
        let r = parse_answer(answer).unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(r.headers().len(), 1, "{:?}", r.headers());
        let answer = b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\nwww-authenticate: Bearer realm=\"latchkey\"\r\ncontent-length: 2\r\n\r\n{}";
        let r = parse_answer(answer).unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            r.headers().get(header::WWW_AUTHENTICATE).unwrap(),
            "Bearer realm=\"latchkey\""
        );
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n{}").is_err());
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").is_err());
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n").is_err());
    }
}
