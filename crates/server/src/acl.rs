//! Client authentication and access control (issue #13 items 3 and 4): who a client is, what
//! it may do to which locks, and how much of the cluster it may hold.
//!
//! The file named by `--acl` is TOML:
//!
//! ```toml
//! [roles.deployer]
//! lock = ["deploy/"]            # sessions, keepalive, acquire, release on names under deploy/
//! read = ["deploy/", "jobs/"]   # status (describe), list, cluster status
//! # admin = [""]                # everything, on every name
//!
//! [identities.ci]
//! token_sha256 = "<hex SHA-256 of the bearer token>"   # printf %s TOKEN | sha256sum
//! roles = ["deployer"]
//! max_sessions = 10             # quotas; defaults in latchkey_core::limits
//! max_waiting = 100
//!
//! [identities."worker-1.example.com"]  # no token: a client certificate whose subject CN (or
//! roles = ["deployer"]                 # first DNS name) is this name, when --tls-ca is on
//! ```
//!
//! Only SHA-256 hashes of tokens are stored, so the file does not hand out the tokens. The
//! service checks every call through [`Acl::authenticate`] and [`Identity::allows`] in one
//! function (`service::LocksService::authorize`); peer RPCs have their own authentication
//! (`peer_auth`).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use latchkey_core::limits;
use rustls_pki_types::CertificateDer;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// What a role grants on a lock-name prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Describe a lock, list locks, read the cluster's status.
    Read,
    /// Create, renew and close sessions; acquire and release locks.
    Lock,
    /// Everything.
    Admin,
}

impl Permission {
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Read => "read",
            Permission::Lock => "lock",
            Permission::Admin => "admin",
        }
    }
}

/// What a call needs: a permission on one lock, on every lock under a prefix, or on some lock
/// (calls that name no lock: sessions, keepalives, cluster status).
#[derive(Debug, Clone, Copy)]
pub enum Need<'a> {
    Lock(&'a str, Permission),
    Prefix(&'a str, Permission),
    Anywhere(Permission),
}

/// Why an access-control file is refused at start-up.
#[derive(Debug, thiserror::Error)]
pub enum AclError {
    #[error("cannot read the access-control file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("the access-control file {path} has {len} bytes, more than the {max} allowed")]
    TooBig { path: String, len: u64, max: u64 },
    #[error("the access-control file {path} is not valid: {message}")]
    Invalid { path: String, message: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AclFile {
    #[serde(default)]
    roles: BTreeMap<String, RoleFile>,
    #[serde(default)]
    identities: BTreeMap<String, IdentityFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleFile {
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    lock: Vec<String>,
    #[serde(default)]
    admin: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdentityFile {
    token_sha256: Option<String>,
    #[serde(default)]
    roles: Vec<String>,
    max_sessions: Option<usize>,
    max_waiting: Option<usize>,
}

/// An authenticated client: its name, its grants and its quotas.
#[derive(Debug, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    /// (permission, lock-name prefix), from all its roles.
    grants: Vec<(Permission, String)>,
    /// The most sessions it may have at once.
    pub max_sessions: usize,
    /// The most Acquire requests its sessions may have queued at once.
    pub max_waiting: usize,
}

impl Identity {
    fn grants(&self, want: Permission) -> impl Iterator<Item = &str> {
        self.grants
            .iter()
            .filter(move |(p, _)| *p == want || *p == Permission::Admin)
            .map(|(_, prefix)| prefix.as_str())
    }

    /// Whether this identity may do what `need` says; `Err` names the lock (or prefix) and the
    /// permission.
    pub fn allows(&self, need: Need<'_>) -> Result<(), ApiError> {
        let (allowed, what, permission) = match need {
            Need::Lock(name, p) => (
                self.grants(p).any(|g| name.starts_with(g)),
                format!("lock {name:?}"),
                p,
            ),
            Need::Prefix(prefix, p) => (
                self.grants(p).any(|g| prefix.starts_with(g)),
                format!("every lock under the prefix {prefix:?}"),
                p,
            ),
            Need::Anywhere(p) => (self.grants(p).next().is_some(), "any lock".to_owned(), p),
        };
        if allowed {
            Ok(())
        } else {
            Err(ApiError::PermissionDenied(format!(
                "identity {:?} lacks the {:?} permission on {what}",
                self.name,
                permission.as_str()
            )))
        }
    }
}

/// The access-control list: identities by name and by the hash of their token.
pub struct Acl {
    by_name: HashMap<String, Arc<Identity>>,
    by_token_hash: HashMap<[u8; 32], Arc<Identity>>,
}

impl fmt::Debug for Acl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acl")
            .field("identities", &self.by_name.len())
            .finish_non_exhaustive()
    }
}

fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Acl {
    /// Reads and checks the file named by `--acl`.
    pub fn load(path: &Path) -> Result<Acl, AclError> {
        let shown = path.display().to_string();
        let len = std::fs::metadata(path)
            .map_err(|error| AclError::Read {
                path: shown.clone(),
                error,
            })?
            .len();
        if len > limits::ACL_FILE_BYTES_MAX {
            return Err(AclError::TooBig {
                path: shown,
                len,
                max: limits::ACL_FILE_BYTES_MAX,
            });
        }
        let text = std::fs::read_to_string(path).map_err(|error| AclError::Read {
            path: shown.clone(),
            error,
        })?;
        Acl::parse(&text).map_err(|message| AclError::Invalid {
            path: shown,
            message,
        })
    }

    /// Parses an access-control file's text; the error says what is wrong and where.
    pub fn parse(text: &str) -> Result<Acl, String> {
        let file: AclFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut by_name = HashMap::new();
        let mut by_token_hash = HashMap::new();
        for (name, id) in file.identities {
            if name.is_empty() {
                return Err("an identity has an empty name".into());
            }
            let mut grants = Vec::new();
            for role in &id.roles {
                let r = file.roles.get(role).ok_or_else(|| {
                    format!("identity {name:?} has the role {role:?}, which is not defined under [roles]")
                })?;
                for (p, prefixes) in [
                    (Permission::Read, &r.read),
                    (Permission::Lock, &r.lock),
                    (Permission::Admin, &r.admin),
                ] {
                    grants.extend(prefixes.iter().map(|prefix| (p, prefix.clone())));
                }
            }
            let identity = Arc::new(Identity {
                name: name.clone(),
                grants,
                max_sessions: id.max_sessions.unwrap_or(limits::IDENTITY_SESSIONS_DEFAULT),
                max_waiting: id.max_waiting.unwrap_or(limits::IDENTITY_WAITING_DEFAULT),
            });
            if let Some(hex) = &id.token_sha256 {
                let hash = parse_hash(hex).ok_or_else(|| {
                    format!(
                        "identity {name:?}: token_sha256 must be 64 hex digits (the SHA-256 of the \
                         token, e.g. `printf %s TOKEN | sha256sum`)"
                    )
                })?;
                if let Some(other) = by_token_hash.insert(hash, identity.clone()) {
                    return Err(format!(
                        "identities {:?} and {name:?} have the same token",
                        other.name
                    ));
                }
            }
            by_name.insert(name, identity);
        }
        Ok(Acl {
            by_name,
            by_token_hash,
        })
    }

    /// Who is calling: the identity of the bearer token (`authorization: Bearer ...`) if one
    /// is given, else the one named by the client certificate (subject CN, then first DNS
    /// name). `Err` (UNAUTHENTICATED) when neither names a known identity.
    pub fn authenticate(
        &self,
        authorization: Option<&[u8]>,
        peer_certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<Arc<Identity>, ApiError> {
        if let Some(header) = authorization {
            let token = std::str::from_utf8(header)
                .ok()
                .and_then(|h| h.strip_prefix("Bearer "))
                .filter(|t| !t.is_empty() && t.len() <= limits::AUTH_TOKEN_BYTES_MAX)
                .ok_or_else(|| {
                    ApiError::Unauthenticated(
                        "the authorization header is not `Bearer TOKEN`".into(),
                    )
                })?;
            return self
                .by_token_hash
                .get(&token_hash(token))
                .cloned()
                .ok_or_else(|| {
                    ApiError::Unauthenticated(
                        "the bearer token is not in the access-control list".into(),
                    )
                });
        }
        let Some(cert) = peer_certs.and_then(|c| c.first()) else {
            return Err(ApiError::Unauthenticated(
                "no credentials: give a bearer token (--auth-token, LATCHKEY_AUTH_TOKEN) or a \
                 client certificate"
                    .into(),
            ));
        };
        let names = cert_names(cert);
        names
            .iter()
            .find_map(|n| self.by_name.get(n))
            .cloned()
            .ok_or_else(|| {
                ApiError::Unauthenticated(format!(
                    "the client certificate names {names:?}, no identity in the access-control \
                     list"
                ))
            })
    }
}

/// The names a client certificate gives its holder: the subject's common name, then the first
/// DNS subject alternative name.
pub fn cert_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok(parsed) = webpki::EndEntityCert::try_from(cert) else {
        return Vec::new();
    };
    let mut names: Vec<String> = common_name(parsed.subject()).into_iter().collect();
    names.extend(parsed.valid_dns_names().next().map(str::to_owned));
    names
}

/// The first common name (OID 2.5.4.3) in a DER-encoded X.509 Name (the contents of its
/// SEQUENCE, as webpki gives it). Names are SET { SEQUENCE { OID, string } }*; a full ASN.1
/// parser is not needed to find one attribute.
fn common_name(mut name: &[u8]) -> Option<String> {
    /// One TLV: (tag, contents, rest).
    fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let tag = *b.first()?;
        let first = *b.get(1)? as usize;
        let (len, header) = if first < 0x80 {
            (first, 2)
        } else {
            let n = first & 0x7f;
            if n == 0 || n > 2 {
                return None;
            }
            let mut len = 0usize;
            for i in 0..n {
                len = (len << 8) | *b.get(2 + i)? as usize;
            }
            (len, 2 + n)
        };
        let end = header.checked_add(len)?;
        Some((tag, b.get(header..end)?, b.get(end..)?))
    }
    const CN_OID: &[u8] = &[0x55, 0x04, 0x03];
    while !name.is_empty() {
        let (_set_tag, mut set, rest) = tlv(name)?;
        name = rest;
        while !set.is_empty() {
            let (_seq_tag, attr, rest) = tlv(set)?;
            set = rest;
            let (oid_tag, oid, value) = tlv(attr)?;
            if oid_tag == 0x06 && oid == CN_OID {
                let (_string_tag, text, _) = tlv(value)?;
                return std::str::from_utf8(text).ok().map(str::to_owned);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
        [roles.deployer]
        lock = ["deploy/"]
        read = ["deploy/", "jobs/"]

        [roles.root]
        admin = [""]

        [identities.ci]
        # sha256("ci-token")
        token_sha256 = "HASH"
        roles = ["deployer"]
        max_sessions = 2
        max_waiting = 3

        [identities."worker.example.com"]
        roles = ["deployer", "root"]
    "#;

    fn example() -> Acl {
        let hash: String = token_hash("ci-token")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Acl::parse(&EXAMPLE.replace("HASH", &hash)).unwrap()
    }

    #[test]
    fn the_example_parses_with_its_grants_and_quotas() {
        let acl = example();
        let ci = acl.authenticate(Some(b"Bearer ci-token"), None).unwrap();
        assert_eq!(ci.name, "ci");
        assert_eq!((ci.max_sessions, ci.max_waiting), (2, 3));
        assert!(ci
            .allows(Need::Lock("deploy/web", Permission::Lock))
            .is_ok());
        assert!(ci.allows(Need::Lock("jobs/x", Permission::Read)).is_ok());
        assert!(ci
            .allows(Need::Prefix("deploy/a", Permission::Read))
            .is_ok());
        let worker = &acl.by_name["worker.example.com"];
        assert_eq!(worker.max_sessions, limits::IDENTITY_SESSIONS_DEFAULT);
        assert!(worker
            .allows(Need::Lock("anything", Permission::Lock))
            .is_ok());
    }

    #[test]
    fn a_denial_names_the_lock_and_the_permission() {
        let acl = example();
        let ci = acl.authenticate(Some(b"Bearer ci-token"), None).unwrap();
        for (need, want) in [
            (
                Need::Lock("jobs/x", Permission::Lock),
                "\"lock\" permission on lock \"jobs/x\"",
            ),
            (
                Need::Prefix("", Permission::Read),
                "\"read\" permission on every lock under the prefix \"\"",
            ),
            (
                Need::Anywhere(Permission::Admin),
                "\"admin\" permission on any lock",
            ),
        ] {
            match ci.allows(need) {
                Err(ApiError::PermissionDenied(m)) => assert!(m.contains(want), "{m}"),
                other => panic!("{need:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn wrong_or_missing_credentials_are_unauthenticated() {
        let acl = example();
        for header in [
            Some(&b"Bearer wrong"[..]),
            Some(&b"Basic Y2k6eA=="[..]),
            Some(&b"Bearer "[..]),
            None,
        ] {
            assert!(
                matches!(
                    acl.authenticate(header, None),
                    Err(ApiError::Unauthenticated(_))
                ),
                "{header:?}"
            );
        }
    }

    #[test]
    fn unknown_keys_are_an_error_naming_the_key() {
        let e = Acl::parse("[identities.a]\nrole = [\"x\"]\n")
            .err()
            .unwrap();
        assert!(e.contains("role"), "{e}");
        let e = Acl::parse("[roles.r]\nwrite = [\"x\"]\n").err().unwrap();
        assert!(e.contains("write"), "{e}");
        let e = Acl::parse("[users.a]\n").err().unwrap();
        assert!(e.contains("users"), "{e}");
    }

    #[test]
    fn undefined_roles_bad_hashes_and_shared_tokens_are_refused() {
        let e = Acl::parse("[identities.a]\nroles = [\"nope\"]\n")
            .err()
            .unwrap();
        assert!(e.contains("\"nope\""), "{e}");
        let e = Acl::parse("[identities.a]\ntoken_sha256 = \"abc\"\n")
            .err()
            .unwrap();
        assert!(e.contains("64 hex digits"), "{e}");
        let h = "a".repeat(64);
        let e = Acl::parse(&format!(
            "[identities.a]\ntoken_sha256 = \"{h}\"\n[identities.b]\ntoken_sha256 = \"{h}\"\n"
        ))
        .err()
        .unwrap();
        assert!(e.contains("same token"), "{e}");
    }

    #[test]
    fn a_certificate_names_its_identity_by_common_name_then_dns_name() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["worker.example.com".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "latchkey tests");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "the-cn");
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            cert_names(cert.der()),
            vec!["the-cn".to_owned(), "worker.example.com".to_owned()]
        );
        let acl = example();
        let certs = vec![cert.der().clone()];
        assert_eq!(
            acl.authenticate(None, Some(&certs)).unwrap().name,
            "worker.example.com"
        );
    }
}
