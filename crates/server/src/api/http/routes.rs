//! The HTTP API's one list of routes, [`ROUTES`]: the router is built from it, the cross-site
//! guard asks it which method a path takes, and a test holds `docs/openapi.json` to it. A leaf,
//! so that the guard (`cross_site.rs`) and the router (`http.rs`) both use it without using
//! each other.

/// Every route of the HTTP API: (method, path). The router serves exactly these, and
/// `docs/openapi.json` documents exactly these (`cli/tests/http_api.rs`).
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/sessions"),
    ("POST", "/v1/sessions/keepalive"),
    ("POST", "/v1/sessions/close"),
    ("POST", "/v1/locks/acquire"),
    ("POST", "/v1/locks/release"),
    ("POST", "/v1/locks/proclaim"),
    ("POST", "/v1/batch"),
    ("GET", "/v1/lock"),
    ("GET", "/v1/locks"),
    ("GET", "/v1/cluster/status"),
    ("POST", "/v1/admin/release"),
    ("GET", "/v1/openapi.json"),
    ("GET", "/ui"),
    ("GET", "/ui/app.js"),
    ("GET", "/"),
];

/// Whether a route of [`ROUTES`] takes `method` at `path` (the routes have no parameters).
pub(crate) fn serves(method: &axum::http::Method, path: &str) -> bool {
    ROUTES
        .iter()
        .any(|(m, p)| *m == method.as_str() && *p == path)
}
