//! The HTTP API's one guard against cross-site requests (issue #31 item 3): a route layer of
//! the router (`http::router`), so no route, present or future, runs its handler before it ran
//! (a request that matches no route, or none of its methods, changes nothing and gets its 404
//! or 405 as it is).
//!
//! A browser lets any web page send requests to any address: a form (`text/plain`, urlencoded,
//! multipart) or a `fetch` without CORS, with no question asked first, and with what the user
//! has for that address (a client certificate over TLS). The page cannot read the answer, but
//! the request acts. So a request that may change state (any method but the safe GET, HEAD,
//! OPTIONS) must
//! - come from no web page (no `Origin`: curl, the libraries), from the node's own origin
//!   (`http://` or, when the node has TLS, `https://`, and the request's `Host`: the web page
//!   at `/ui`), or from an origin the operator listed (`--http-allow-origin`); a browser that
//!   says the request comes from another site (`Sec-Fetch-Site: same-site` or `cross-site`) is
//!   believed, `Origin` or not. Else: 403 `cross-origin`.
//! - carry `Content-Type: application/json` (parameters allowed), which no form can send and a
//!   `fetch` of another origin sends only after a CORS preflight, which the node answers only
//!   for a listed origin. Else: 415 `unsupported-media-type`.
//!
//! Reads are not refused: without CORS headers a page of another origin cannot read their
//! answers, and a link to `/ui` from elsewhere must open it. A listed origin gets CORS headers
//! on every answer (`Access-Control-Allow-Origin` naming exactly it, and its preflights
//! answered); no other origin ever does.
//!
//! What the sender controls: a program that is not a browser sends whatever headers it likes,
//! but it has only its own credentials, which the access check (`--acl`) judges. A browser
//! does not let a page set `Origin`, `Sec-Fetch-Site` or `Host`. A page at a name its author
//! points at the node's address (DNS rebinding) has the node's origin by `Host`: only `--acl`
//! stops it, since the browser keeps the user's credentials for the node's own name.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use latchkey_core::limits;

use crate::config::origin::Scheme;
pub use crate::config::origin::{BadOrigin, HttpOrigin};
use crate::error::ErrorBody;

/// What the guard knows of the node: the scheme its HTTP API is served with, and the origins
/// the operator listed.
#[derive(Debug)]
pub(crate) struct CrossSite {
    scheme: Scheme,
    allowed: Vec<HttpOrigin>,
}

impl CrossSite {
    pub(crate) fn new(tls: bool, allowed: Vec<HttpOrigin>) -> CrossSite {
        CrossSite {
            scheme: if tls { Scheme::Https } else { Scheme::Http },
            allowed,
        }
    }

    /// The request's `Origin`, when the operator listed it.
    fn listed(&self, headers: &HeaderMap) -> Option<HttpOrigin> {
        let origin = headers.get(header::ORIGIN)?.to_str().ok()?;
        HttpOrigin::parse(origin)
            .ok()
            .filter(|o| self.allowed.contains(o))
    }

    /// Why a request from an unlisted origin is refused, if it comes from another origin than
    /// the node's own, by its `Origin` or its `Sec-Fetch-Site`.
    fn foreign(&self, headers: &HeaderMap) -> Option<Refusal> {
        if let Some(origin) = headers.get(header::ORIGIN) {
            let own = headers
                .get(header::HOST)
                .and_then(|host| host.to_str().ok())
                .and_then(|host| HttpOrigin::of(self.scheme, host).ok());
            match origin.to_str().ok().map(HttpOrigin::parse) {
                Some(Ok(origin)) if Some(&origin) == own.as_ref() => {}
                Some(Ok(origin)) => return Some(Refusal::Other { origin, own }),
                Some(Err(BadOrigin::Null)) => return Some(Refusal::Null),
                _ => return Some(Refusal::Unreadable(quoted(origin))),
            }
        }
        // No Origin, or the node's own: the browser's word still counts.
        let site = headers
            .get("sec-fetch-site")?
            .as_bytes()
            .to_ascii_lowercase();
        (site == b"cross-site" || site == b"same-site")
            .then(|| Refusal::FetchSite(String::from_utf8_lossy(&site).into_owned()))
    }
}

/// Why a request is refused as cross-origin.
enum Refusal {
    Other {
        origin: HttpOrigin,
        own: Option<HttpOrigin>,
    },
    Null,
    Unreadable(String),
    FetchSite(String),
}

impl Refusal {
    fn message(&self) -> String {
        let why = "a web page of another origin than this node's must not change its state: any \
                   page its user opens could send it (cross-site request forgery)";
        match self {
            Refusal::Other { origin, own } => format!(
                "refused a request from the web page at {origin}, not this node's origin ({}): \
                 {why}. If that page is yours, start the node with --http-allow-origin {origin}",
                own.as_ref()
                    .map_or("unknown: no Host header".to_owned(), |o| o.to_string())
            ),
            Refusal::Null => format!(
                "refused a request from a web page without an origin (Origin: null: a sandboxed \
                 frame, a local file, a redirect), which any site can make: {why}"
            ),
            Refusal::Unreadable(origin) => {
                format!("refused a request with the unreadable Origin {origin}: {why}")
            }
            Refusal::FetchSite(site) => format!(
                "refused a request the browser says comes from another site (Sec-Fetch-Site: \
                 {site}): {why}. If the page is yours, start the node with \
                 --http-allow-origin ORIGIN"
            ),
        }
    }
}

/// A header's value for an error message: at most `HTTP_QUOTED_HEADER_BYTES_MAX` bytes of it.
fn quoted(value: &HeaderValue) -> String {
    let text = String::from_utf8_lossy(value.as_bytes());
    let mut end = text.len().min(limits::HTTP_QUOTED_HEADER_BYTES_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    match end < text.len() {
        true => format!("{:?}...", &text[..end]),
        false => format!("{text:?}"),
    }
}

/// `Content-Type: application/json`, with parameters or not, given once; else what was given.
fn json_content_type(headers: &HeaderMap) -> Result<(), String> {
    let mut given = headers.get_all(header::CONTENT_TYPE).iter();
    match (given.next(), given.next()) {
        (None, _) => Err("none".to_owned()),
        (Some(_), Some(_)) => Err("several".to_owned()),
        (Some(value), None) => {
            let essence = value
                .as_bytes()
                .split(|b| *b == b';')
                .next()
                .unwrap_or_default()
                .trim_ascii();
            match essence.eq_ignore_ascii_case(b"application/json") {
                true => Ok(()),
                false => Err(quoted(value)),
            }
        }
    }
}

fn error(status: StatusCode, code: &'static str, message: String) -> Response {
    ErrorBody {
        code,
        message,
        leader_id: None,
        leader_addr: None,
        group: None,
    }
    .into_response_with(status)
}

/// The guard, run on every request to a route before its handler (see the module comment).
pub(crate) async fn guard(
    State(policy): State<Arc<CrossSite>>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let listed = policy.listed(headers);
    let method = request.method();
    if let Some(origin) = listed
        .as_ref()
        .filter(|_| method == Method::OPTIONS)
        .filter(|_| headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD))
    {
        return preflight(origin);
    }
    // A method this path's route does not take reaches no handler: the router answers 405
    // (404 for no route), which changes nothing, whatever the request's origin.
    if !method.is_safe() && super::routes::serves(method, request.uri().path()) {
        if let Some(refusal) = listed.is_none().then(|| policy.foreign(headers)).flatten() {
            tracing::debug!(method = %method, path = %request.uri().path(), "HTTP API: {}", refusal.message());
            return error(StatusCode::FORBIDDEN, "cross-origin", refusal.message());
        }
        if let Err(given) = json_content_type(headers) {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                format!(
                    "a request that changes state must have Content-Type: application/json \
                     (this one has {given}): a web page of another origin cannot send that \
                     without the node's consent (a CORS preflight), as it can send a form"
                ),
            );
        }
    }
    let mut response = next.run(request).await;
    let answer = response.headers_mut();
    if !policy.allowed.is_empty() {
        // Whether the answer has CORS headers depends on the Origin: caches must know.
        answer.append(header::VARY, HeaderValue::from_static("origin"));
    }
    if let Some(origin) = listed {
        answer.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin_value(&origin));
    }
    response
}

fn origin_value(origin: &HttpOrigin) -> HeaderValue {
    HeaderValue::from_str(origin.as_str()).expect("an origin is a valid header value")
}

/// A listed origin's CORS preflight: it may send the API's methods with JSON and a bearer
/// token.
fn preflight(origin: &HttpOrigin) -> Response {
    (
        StatusCode::NO_CONTENT,
        [
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, origin_value(origin)),
            (
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, HEAD, POST"),
            ),
            (
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static("authorization, content-type"),
            ),
            (
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from(limits::HTTP_CORS_MAX_AGE_S),
            ),
            (header::VARY, HeaderValue::from_static("origin")),
        ],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn the_own_origin_is_the_scheme_and_the_host_header() {
        let plain = CrossSite::new(false, vec![]);
        let tls = CrossSite::new(true, vec![]);
        for (policy, host, origin) in [
            (&plain, "127.0.0.1:7480", "http://127.0.0.1:7480"),
            (&plain, "Node.Example", "http://node.example"),
            (&plain, "node.example:80", "http://node.example"),
            (&plain, "node.example", "http://node.example:80"),
            (&tls, "node.example:443", "https://node.example"),
            (&tls, "[::1]:7480", "https://[::1]:7480"),
        ] {
            let h = headers(&[("host", host), ("origin", origin)]);
            assert!(policy.foreign(&h).is_none(), "{host} {origin}");
        }
        for (policy, host, origin) in [
            (&plain, "127.0.0.1:7480", "https://127.0.0.1:7480"),
            (&tls, "127.0.0.1:7480", "http://127.0.0.1:7480"),
            (&plain, "127.0.0.1:7480", "http://127.0.0.1:7481"),
            (&plain, "127.0.0.1:7480", "http://localhost:7480"),
            (&plain, "node.example:8080", "http://node.example"),
            (&plain, "not a host", "http://not a host"),
            (&plain, "127.0.0.1:7480", "null"),
        ] {
            let h = headers(&[("host", host), ("origin", origin)]);
            assert!(policy.foreign(&h).is_some(), "{host} {origin}");
        }
        // Without a Host, no origin is the node's own.
        assert!(plain
            .foreign(&headers(&[("origin", "http://127.0.0.1:7480")]))
            .is_some());
        // Without an Origin, only the browser's word for another site refuses.
        assert!(plain.foreign(&headers(&[("host", "a:1")])).is_none());
        for site in ["cross-site", "same-site", "Cross-Site"] {
            let h = headers(&[
                ("host", "127.0.0.1:7480"),
                ("origin", "http://127.0.0.1:7480"),
                ("sec-fetch-site", site),
            ]);
            assert!(plain.foreign(&h).is_some(), "{site}");
        }
        for site in ["same-origin", "none"] {
            let h = headers(&[("host", "a:1"), ("sec-fetch-site", site)]);
            assert!(plain.foreign(&h).is_none(), "{site}");
        }
    }

    #[test]
    fn only_json_is_taken() {
        for ok in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=UTF-8",
        ] {
            assert!(
                json_content_type(&headers(&[("content-type", ok)])).is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "text/json",
            "application/json-seq",
            "",
        ] {
            assert!(
                json_content_type(&headers(&[("content-type", bad)])).is_err(),
                "{bad}"
            );
        }
        assert!(json_content_type(&headers(&[])).is_err());
        let twice = headers(&[
            ("content-type", "application/json"),
            ("content-type", "text/plain"),
        ]);
        assert!(json_content_type(&twice).is_err());
    }

    #[test]
    fn a_quoted_header_is_bounded() {
        let long = HeaderValue::from_str(&"x".repeat(1000)).unwrap();
        assert!(quoted(&long).len() <= limits::HTTP_QUOTED_HEADER_BYTES_MAX + 8);
    }
}
