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
//! max_delays = 50               # lock-delays asked for, held or running
//!
//! [identities."worker-1.example.com"]  # no token: a client certificate whose subject CN (or
//! roles = ["deployer"]                 # first DNS name) is this name, when --tls-ca is on
//! ```
//!
//! Only SHA-256 hashes of tokens are stored, so the file does not hand out the tokens. Both
//! client APIs check every call through [`Acl::authenticate`] and [`Identity::allows`] in one
//! function (`Node::authorize`), which reports each [`Refusal`] to the member's refusal log
//! and counters (`refusals`); peer RPCs have their own authentication (`peer_auth`).
//!
//! The list in force is an [`AclPolicy`]'s: reloaded from its source (the `--acl` file, or the
//! `[acl]` table of `serve --config`'s file) on SIGHUP and when the file's modification time
//! changes (`reload.rs`), and swapped whole, so a call sees one list or the other, never a mix.
//! A reload that does not parse is refused with a log line and the list in force stays.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use latchkey_core::limits;
use rustls_pki_types::CertificateDer;
use serde::Deserialize;
use sha2::{Digest, Sha256};

pub use crate::certificate::cert_names;
use crate::error::ApiError;
use crate::observe::refusals::{Reason, Refusals};

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

/// Why an access-control file is refused, at start-up or on a reload.
#[derive(Debug, thiserror::Error)]
pub enum AclError {
    #[error("cannot read the access-control file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("the access-control file {path} has {len} bytes, more than the {max} allowed")]
    TooBig { path: String, len: u64, max: u64 },
    #[error("the access-control file {path} is not valid: {message}")]
    Invalid { path: String, message: String },
}

/// Why a client call is refused by the access-control list. The messages are what the client
/// reads; [`Refusal::reason`] is the fixed label it is counted and logged under.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "no credentials: give a bearer token (--auth-token, LATCHKEY_AUTH_TOKEN) or a client \
         certificate"
    )]
    NoCredentials,
    #[error("the authorization header is not `Bearer TOKEN`")]
    BadToken,
    #[error("the bearer token is not in the access-control list")]
    UnknownToken,
    #[error("the client certificate names {names:?}, no identity in the access-control list")]
    UnknownIdentity { names: Vec<String> },
    #[error("identity {identity:?} lacks the {:?} permission on {what}", permission.as_str())]
    Denied {
        identity: String,
        permission: Permission,
        what: String,
    },
    #[error("session {session} belongs to another identity than {identity:?}")]
    NotSessionOwner { session: u64, identity: String },
}

impl Refusal {
    pub fn reason(&self) -> Reason {
        match self {
            Refusal::NoCredentials => Reason::NoCredentials,
            Refusal::BadToken => Reason::BadToken,
            Refusal::UnknownToken => Reason::UnknownToken,
            Refusal::UnknownIdentity { .. } => Reason::UnknownIdentity,
            Refusal::Denied { .. } => Reason::PermissionDenied,
            Refusal::NotSessionOwner { .. } => Reason::NotSessionOwner,
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> ApiError {
        match r {
            Refusal::NoCredentials
            | Refusal::BadToken
            | Refusal::UnknownToken
            | Refusal::UnknownIdentity { .. } => ApiError::Unauthenticated(r.to_string()),
            Refusal::Denied { .. } | Refusal::NotSessionOwner { .. } => {
                ApiError::PermissionDenied(r.to_string())
            }
        }
    }
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
    max_delays: Option<usize>,
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
    /// The most lock-delays it may have at once, asked for, held or running (a running one
    /// outlives its session).
    pub max_delays: usize,
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
    pub fn allows(&self, need: Need<'_>) -> Result<(), Refusal> {
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
            Err(Refusal::Denied {
                identity: self.name.clone(),
                permission,
                what,
            })
        }
    }
}

/// An authenticated client call: its identity, and what a refusal after the access check (a
/// quota, `ops.rs`) needs to be reported like the check's own: where the call came from, and
/// the member's refusal record.
pub struct Caller {
    identity: Arc<Identity>,
    from: Option<SocketAddr>,
    refusals: Arc<Refusals>,
}

impl fmt::Debug for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Caller")
            .field("identity", &self.identity.name)
            .field("from", &self.from)
            .finish()
    }
}

impl std::ops::Deref for Caller {
    type Target = Identity;
    fn deref(&self) -> &Identity {
        &self.identity
    }
}

impl Caller {
    pub(crate) fn new(
        identity: Arc<Identity>,
        from: Option<SocketAddr>,
        refusals: Arc<Refusals>,
    ) -> Caller {
        Caller {
            identity,
            from,
            refusals,
        }
    }

    /// The error of a call beyond this identity's quota (`message` says which), counted and
    /// logged as a refusal.
    pub fn over_quota(&self, message: String) -> ApiError {
        self.refusals.refused(self.from, Reason::Quota, &message);
        ApiError::QuotaExceeded(message)
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

/// A file's text, bounded in size, for [`AclError`]s naming it.
fn read_bounded(path: &Path, max: u64) -> Result<String, AclError> {
    let shown = path.display().to_string();
    let len = std::fs::metadata(path)
        .map_err(|error| AclError::Read {
            path: shown.clone(),
            error,
        })?
        .len();
    if len > max {
        return Err(AclError::TooBig {
            path: shown,
            len,
            max,
        });
    }
    std::fs::read_to_string(path).map_err(|error| AclError::Read { path: shown, error })
}

impl Acl {
    /// Reads and checks the file named by `--acl`.
    pub fn load(path: &Path) -> Result<Acl, AclError> {
        let text = read_bounded(path, limits::ACL_FILE_BYTES_MAX)?;
        Acl::parse(&text).map_err(|message| AclError::Invalid {
            path: path.display().to_string(),
            message,
        })
    }

    /// Reads the `[acl]` table of a `serve --config` file and checks it. The server reads only
    /// this table of the file (its other keys are the command's flags, read at start).
    pub fn load_from_config(path: &Path) -> Result<Acl, AclError> {
        let text = read_bounded(path, limits::CONFIG_FILE_BYTES_MAX)?;
        let invalid = |message: String| AclError::Invalid {
            path: path.display().to_string(),
            message,
        };
        let table: toml::Table = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        match table.get("acl") {
            Some(toml::Value::Table(acl)) => {
                let text = toml::to_string(acl).map_err(|e| invalid(e.to_string()))?;
                Acl::parse(&text).map_err(|e| invalid(format!("its [acl] table: {e}")))
            }
            Some(_) => Err(invalid(
                "`acl` is no longer a table (a list inline); switching to a file takes a \
                 restart"
                    .into(),
            )),
            None => Err(invalid(
                "it has no [acl] table any more; turning access control off takes a restart".into(),
            )),
        }
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
                max_delays: id.max_delays.unwrap_or(limits::IDENTITY_DELAYS_DEFAULT),
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
    ) -> Result<Arc<Identity>, Refusal> {
        if let Some(header) = authorization {
            let token = std::str::from_utf8(header)
                .ok()
                .and_then(|h| h.strip_prefix("Bearer "))
                .filter(|t| !t.is_empty() && t.len() <= limits::AUTH_TOKEN_BYTES_MAX)
                .ok_or(Refusal::BadToken)?;
            return self
                .by_token_hash
                .get(&token_hash(token))
                .cloned()
                .ok_or(Refusal::UnknownToken);
        }
        let Some(cert) = peer_certs.and_then(|c| c.first()) else {
            return Err(Refusal::NoCredentials);
        };
        let names = cert_names(cert);
        match names.iter().find_map(|n| self.by_name.get(n)) {
            Some(identity) => Ok(identity.clone()),
            None => Err(Refusal::UnknownIdentity { names }),
        }
    }
}

/// Where an [`AclPolicy`] reloads its list from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AclSource {
    /// `--acl FILE` (or `LATCHKEY_ACL`, or `acl = "FILE"` in the config file).
    File(PathBuf),
    /// The `[acl]` table of the `serve --config` file.
    ConfigFile(PathBuf),
    /// Given whole by the caller (tests, embedders); nothing to reload.
    Fixed,
}

impl AclSource {
    fn path(&self) -> Option<&Path> {
        match self {
            AclSource::File(p) | AclSource::ConfigFile(p) => Some(p),
            AclSource::Fixed => None,
        }
    }

    fn load(&self) -> Result<Acl, AclError> {
        match self {
            AclSource::File(p) => Acl::load(p),
            AclSource::ConfigFile(p) => Acl::load_from_config(p),
            AclSource::Fixed => unreachable!("a fixed list is never reloaded"),
        }
    }
}

/// The access-control list in force, and where it is reloaded from. A call reads it once
/// ([`AclPolicy::current`]) and is decided by that list whole; a reload swaps it for the next
/// call.
pub struct AclPolicy {
    source: AclSource,
    current: RwLock<Arc<Acl>>,
    /// The source file's modification time when last read (a refused reload included, so that
    /// it is not retried until the file changes again).
    loaded_mtime: Mutex<Option<SystemTime>>,
}

impl fmt::Debug for AclPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AclPolicy")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

fn mtime(path: Option<&Path>) -> Option<SystemTime> {
    std::fs::metadata(path?).and_then(|m| m.modified()).ok()
}

impl AclPolicy {
    /// Reads the list from `source` (not [`AclSource::Fixed`]).
    pub fn load(source: AclSource) -> Result<AclPolicy, AclError> {
        let loaded_mtime = mtime(source.path());
        let acl = source.load()?;
        Ok(AclPolicy {
            source,
            current: RwLock::new(Arc::new(acl)),
            loaded_mtime: Mutex::new(loaded_mtime),
        })
    }

    /// `acl`, already read from `source` (the CLI checks an inline list where it reads the
    /// config file, with the key's line in its errors), reloaded from `source` from now on.
    pub fn loaded(acl: Acl, source: AclSource) -> AclPolicy {
        AclPolicy {
            loaded_mtime: Mutex::new(mtime(source.path())),
            source,
            current: RwLock::new(Arc::new(acl)),
        }
    }

    /// A list that is never reloaded.
    pub fn fixed(acl: Acl) -> AclPolicy {
        AclPolicy::loaded(acl, AclSource::Fixed)
    }

    pub fn source(&self) -> &AclSource {
        &self.source
    }

    /// The list in force now.
    pub fn current(&self) -> Arc<Acl> {
        self.current.read().expect("ACL lock poisoned").clone()
    }

    /// Reads the source again and puts its list in force; a list that does not load is
    /// refused and the one in force stays (the error says why). `Ok(false)`: nothing to reload.
    pub fn reload(&self) -> Result<bool, AclError> {
        if self.source == AclSource::Fixed {
            return Ok(false);
        }
        let before = mtime(self.source.path());
        let loaded = self.source.load();
        *self.loaded_mtime.lock().expect("mtime lock poisoned") = before;
        let acl = loaded?;
        *self.current.write().expect("ACL lock poisoned") = Arc::new(acl);
        Ok(true)
    }

    /// Whether the source file changed since it was last read.
    pub(crate) fn changed(&self) -> bool {
        self.source != AclSource::Fixed
            && *self.loaded_mtime.lock().expect("mtime lock poisoned") != mtime(self.source.path())
    }

    /// [`AclPolicy::reload`], logged; `why` says what asked for it.
    pub fn reload_logged(&self, why: &str) {
        match self.reload() {
            Ok(false) => {}
            Ok(true) => {
                let identities = self.current().by_name.len();
                tracing::info!(
                    source = ?self.source,
                    identities,
                    "{why}: reloaded the access-control list ({identities} identities)"
                );
            }
            Err(e) => tracing::error!("{why}: keeping the access-control list in force: {e}"),
        }
    }
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
            match ci.allows(need).map_err(ApiError::from) {
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
                    acl.authenticate(header, None).map_err(ApiError::from),
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

    /// A reload puts a changed file's list in force; one that does not parse is refused and
    /// the list in force stays, for a file and for a config file's `[acl]` table alike.
    #[test]
    fn a_reload_swaps_a_good_list_and_keeps_the_old_one_over_a_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        let one = "[roles.r]\nread = [\"\"]\n[identities.one]\nroles = [\"r\"]\n";
        let two = "[roles.r]\nread = [\"\"]\n[identities.two]\nroles = [\"r\"]\n";
        let config_text = |acl: &str| {
            let acl = acl
                .replace("[roles", "[acl.roles")
                .replace("[identities", "[acl.identities");
            format!("id = 1\n{acl}")
        };
        for inline in [false, true] {
            let text = |acl: &str| {
                if inline {
                    config_text(acl)
                } else {
                    acl.to_owned()
                }
            };
            let file = if inline { "latchkey.toml" } else { "acl.toml" };
            let path = dir.path().join(file);
            let source = if inline {
                AclSource::ConfigFile(path.clone())
            } else {
                AclSource::File(path.clone())
            };
            std::fs::write(&path, text(one)).unwrap();
            let policy = AclPolicy::load(source).unwrap();
            let names = |p: &AclPolicy| {
                let mut n: Vec<String> = p.current().by_name.keys().cloned().collect();
                n.sort();
                n
            };
            assert_eq!(names(&policy), ["one"]);
            assert!(!policy.changed());
            std::fs::write(&path, text(two)).unwrap();
            assert!(policy.reload().unwrap());
            assert_eq!(names(&policy), ["two"]);
            std::fs::write(&path, text("[identities.x]\nroles = [\"undefined\"]\n")).unwrap();
            let e = policy.reload().unwrap_err().to_string();
            assert!(e.contains("undefined") && e.contains(file), "{e}");
            assert_eq!(names(&policy), ["two"], "{file}: the old list stays");
            std::fs::write(&path, "not toml [").unwrap();
            assert!(policy.reload().is_err());
            assert_eq!(names(&policy), ["two"]);
        }
        // A config file whose [acl] went away: refused, the list stays.
        let path = dir.path().join("latchkey.toml");
        std::fs::write(&path, config_text(one)).unwrap();
        let policy = AclPolicy::load(AclSource::ConfigFile(path.clone())).unwrap();
        std::fs::write(&path, "id = 1\n").unwrap();
        let e = policy.reload().unwrap_err().to_string();
        assert!(e.contains("no [acl] table"), "{e}");
        assert!(policy.current().by_name.contains_key("one"));
        assert!(!AclPolicy::fixed(example()).reload().unwrap());
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
