//! A web page origin, as `--http-allow-origin` takes it and as browsers send it in `Origin`:
//! the HTTP API's cross-site guard (`crate::api::http::cross_site`) compares origins in this form.
//! Part of the configuration, so that the configuration needs nothing of the API.

use std::net::Ipv6Addr;

use latchkey_core::limits;

/// An origin of web pages, `http://host[:port]` or `https://host[:port]`, serialized as
/// browsers send it in `Origin`: scheme and host in lower case, no default port (80, 443).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HttpOrigin(String);

/// Why a text is not an origin `--http-allow-origin` takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadOrigin {
    #[error(
        "`null` is the origin of pages that have none (a sandboxed frame, a local file, a \
         redirect): any site can make one, so it cannot be allowed"
    )]
    Null,
    #[error("an origin is http:// or https://, a host and maybe a port, e.g. https://dash.example.com (no scheme in {0:?})")]
    NoScheme(String),
    #[error("an origin's scheme is http or https, not {0:?}")]
    Scheme(String),
    #[error("an origin has no path, query or fragment: write {0}")]
    Path(String),
    #[error("an origin names no user: write {0}")]
    User(String),
    #[error("an origin needs a host, e.g. https://dash.example.com")]
    NoHost,
    #[error("{0:?} is not a host name or IP address")]
    Host(String),
    #[error("{0:?} is not a port (1 to 65535)")]
    Port(String),
    #[error("an origin is at most {max} bytes", max = limits::HTTP_ORIGIN_BYTES_MAX)]
    TooLong,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    pub(crate) fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

impl HttpOrigin {
    /// `scheme://host[:port]`, as an operator writes it or a browser sends it.
    pub fn parse(text: &str) -> Result<HttpOrigin, BadOrigin> {
        if text.len() > limits::HTTP_ORIGIN_BYTES_MAX {
            return Err(BadOrigin::TooLong);
        }
        if text.eq_ignore_ascii_case("null") {
            return Err(BadOrigin::Null);
        }
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| BadOrigin::NoScheme(text.to_owned()))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            _ => return Err(BadOrigin::Scheme(scheme.to_owned())),
        };
        let (authority, path) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
        if let Some((_, host)) = authority.rsplit_once('@') {
            return Err(BadOrigin::User(format!("{}://{host}", scheme.name())));
        }
        let origin = HttpOrigin::of(scheme, authority)?;
        if !path.is_empty() {
            return Err(BadOrigin::Path(origin.0));
        }
        Ok(origin)
    }

    /// The origin of `scheme` and an authority `host[:port]` (a `Host` header's value).
    pub(crate) fn of(scheme: Scheme, authority: &str) -> Result<HttpOrigin, BadOrigin> {
        let (host, port) = match authority.strip_prefix('[') {
            Some(bracketed) => {
                let (ip, after) = bracketed
                    .split_once(']')
                    .ok_or_else(|| BadOrigin::Host(authority.to_owned()))?;
                let ip: Ipv6Addr = ip
                    .parse()
                    .map_err(|_| BadOrigin::Host(authority.to_owned()))?;
                let port = match after {
                    "" => None,
                    _ => Some(
                        after
                            .strip_prefix(':')
                            .ok_or_else(|| BadOrigin::Host(authority.to_owned()))?,
                    ),
                };
                (format!("[{ip}]"), port)
            }
            None => {
                let (host, port) = match authority.rsplit_once(':') {
                    Some((host, port)) => (host, Some(port)),
                    None => (authority, None),
                };
                if host.is_empty() {
                    return Err(BadOrigin::NoHost);
                }
                let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
                if !host.chars().all(name_char) {
                    return Err(BadOrigin::Host(host.to_owned()));
                }
                (host.to_ascii_lowercase(), port)
            }
        };
        let port = match port {
            None => None,
            Some(text) => match text.parse::<u16>() {
                Ok(0) | Err(_) => return Err(BadOrigin::Port(text.to_owned())),
                Ok(port) if port == scheme.default_port() => None,
                Ok(port) => Some(port),
            },
        };
        Ok(HttpOrigin(match port {
            None => format!("{}://{host}", scheme.name()),
            Some(port) => format!("{}://{host}:{port}", scheme.name()),
        }))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for HttpOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for HttpOrigin {
    type Err = BadOrigin;

    fn from_str(text: &str) -> Result<HttpOrigin, BadOrigin> {
        HttpOrigin::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_read_as_browsers_serialize_them() {
        for (text, origin) in [
            ("https://dash.example", "https://dash.example"),
            ("HTTPS://Dash.Example:443", "https://dash.example"),
            ("http://dash.example:80", "http://dash.example"),
            ("http://dash.example:443", "http://dash.example:443"),
            ("https://dash.example:8443", "https://dash.example:8443"),
            ("http://127.0.0.1:7480", "http://127.0.0.1:7480"),
            ("http://[::1]:7480", "http://[::1]:7480"),
            ("http://[0:0::1]", "http://[::1]"),
        ] {
            assert_eq!(HttpOrigin::parse(text).unwrap().as_str(), origin, "{text}");
        }
        for (text, bad) in [
            ("null", BadOrigin::Null),
            ("NULL", BadOrigin::Null),
            ("dash.example", BadOrigin::NoScheme("dash.example".into())),
            ("*", BadOrigin::NoScheme("*".into())),
            ("ftp://dash.example", BadOrigin::Scheme("ftp".into())),
            (
                "https://dash.example/",
                BadOrigin::Path("https://dash.example".into()),
            ),
            (
                "https://dash.example:443/ui?x#y",
                BadOrigin::Path("https://dash.example".into()),
            ),
            (
                "https://me@dash.example",
                BadOrigin::User("https://dash.example".into()),
            ),
            ("https://", BadOrigin::NoHost),
            ("https://:80", BadOrigin::NoHost),
            (
                "https://dash example",
                BadOrigin::Host("dash example".into()),
            ),
            ("https://dash.example:0", BadOrigin::Port("0".into())),
            ("https://dash.example:", BadOrigin::Port("".into())),
            (
                "https://dash.example:65536",
                BadOrigin::Port("65536".into()),
            ),
            ("http://[::1", BadOrigin::Host("[::1".into())),
            ("http://[::1]x", BadOrigin::Host("[::1]x".into())),
        ] {
            assert_eq!(HttpOrigin::parse(text), Err(bad), "{text}");
        }
        let long = format!(
            "https://{}.example",
            "a".repeat(limits::HTTP_ORIGIN_BYTES_MAX)
        );
        assert_eq!(HttpOrigin::parse(&long), Err(BadOrigin::TooLong));
    }
}
