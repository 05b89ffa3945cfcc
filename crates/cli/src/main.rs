//! `latchkey`: the server and the command-line client in one binary.
//!
//! Layout:
//! - this file: the command-line interface and the one place errors become exit codes;
//! - [`serve`]: `latchkey serve`, a thin wrapper around `latchkey_server::run`;
//! - [`lock`]: `latchkey lock`, running a command under a lock;
//! - [`query`]: `status`, `list` and `cluster status`;
//! - [`admin`]: `admin release`, `admin revoke` and `audit`;
//! - [`snapshot`]: `snapshot save` and `snapshot restore` (backup and restore);
//! - [`watch`]: `latchkey watch`, lock changes as they apply;
//! - [`bench`]: the benchmark (workloads, its own cluster, server metrics);
//! - [`config`]: `serve --config FILE`, the serve flags in a TOML file;
//! - [`duration`]: `15s`-style durations.

mod admin;
mod bench;
mod config;
mod duration;
mod elect;
mod lock;
mod logwriter;
mod query;
mod serve;
mod snapshot;
mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::duration::{parse_duration, parse_ttl};

/// Exit status when the wait for a lock timed out.
pub const EXIT_WAIT_TIMED_OUT: u8 = 3;
/// Exit status when the lock may have been lost and COMMAND was stopped.
pub const EXIT_LOCK_LOST: u8 = 4;
/// Exit status when access control refused the call (permission denied, unknown credentials).
pub const EXIT_PERMISSION_DENIED: u8 = 5;
/// Exit status of every other failure.
pub const EXIT_FAILURE: u8 = 1;
/// Exit status of a usage error: clap's for what it parses, ours for what it cannot check (a
/// config file, a lock name, `bench --clients 0`).
pub const EXIT_USAGE: u8 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "latchkey",
    version,
    about = "A distributed lock service with leases and fencing tokens"
)]
struct Cli {
    /// Give up after this long (e.g. 10s, 1m30s, 250ms): the whole command, but for `lock`
    /// only the time until COMMAND starts (opening the session and waiting for the lock).
    /// Exit status 1.
    #[arg(long, global = true, value_parser = parse_duration, value_name = "DURATION")]
    timeout: Option<Duration>,
    /// Also print the client library's log lines (retries, failed renewals): -v its warnings,
    /// -vv its progress.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process; the serve flags' size is not worth a box (and clap's derive
// would have to see through it).
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run a latchkey node (logs to stderr; stops cleanly on SIGINT/SIGTERM).
    Serve(ServeArgs),
    /// Wait for a lock, run COMMAND while holding it, release it when COMMAND ends.
    ///
    /// COMMAND gets LATCHKEY_LOCK=NAME and LATCHKEY_TOKEN=<fencing token> in its environment.
    /// If the lock may be lost, COMMAND gets SIGTERM at once and SIGKILL shortly after.
    /// Exit status: COMMAND's own (128+N if it died by signal N); 3 if the wait timed out;
    /// 4 if the lock was lost and COMMAND stopped; 5 if access control refused it; 130 or 143
    /// if SIGINT or SIGTERM came before COMMAND started; 1 for other errors (--timeout too);
    /// 2 for usage errors.
    // clap's usage line in a missing-argument error names the options given, also through
    // LATCHKEY_ENDPOINTS, which reads as if `--endpoints` were required: a fixed usage line.
    #[command(override_usage = "latchkey lock [OPTIONS] <NAME> -- <COMMAND>...")]
    Lock(LockArgs),
    /// Run COMMAND while this process leads the election NAME (a lock whose holder publishes
    /// --value), exactly as `latchkey lock` runs it: with LATCHKEY_TOKEN, stopped (its process
    /// group) the moment leadership may be lost. Candidates wait FIFO; `--observe` prints each
    /// leader instead.
    #[command(
        override_usage = "latchkey elect [OPTIONS] <NAME> [-- <COMMAND>...]\n       latchkey elect --observe [--json] <NAME>"
    )]
    Elect(ElectArgs),
    /// Show one lock: holder (session, owner, token, held for; every reader or permit holder of
    /// a read-write lock or semaphore, with the mode) and each waiter (session, owner, waited
    /// for).
    #[command(override_usage = "latchkey status [OPTIONS] <NAME>")]
    Status(StatusArgs),
    /// List held locks, optionally only those whose names start with PREFIX: holder (or every
    /// reader or permit holder), owner, held for, the number of waiters and the longest wait.
    List(ListArgs),
    /// Print lock changes (grants, releases, expiries, queue changes) of the locks whose names
    /// start with PREFIX, one line each, as the cluster applies them, until interrupted (exit
    /// 130). Moves to another endpoint when its member fails, without repeating or skipping an
    /// event; events it can no longer get are reported as a `missed` line.
    Watch(WatchArgs),
    /// Incident tools, each recorded in the audit log (see docs/incidents.md, "Breaking a stuck
    /// lock").
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Show the audit log (force-releases, revocations), newest last.
    Audit(AuditArgs),
    /// Back a running cluster up to a file, or seed a new cluster's data dir from one.
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
    /// Cluster-wide commands.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Measure throughput, latency, server cost, memory and failover time of a workload.
    Bench(BenchArgs),
    /// Print the CLI reference page of the book (docs/cli.md): every command's `--help`.
    #[command(name = "cli-reference", hide = true)]
    CliReference,
}

#[derive(Subcommand, Debug)]
enum AdminCommand {
    /// Force-release a lock: the next waiter gets it with a higher token, and the holder's
    /// `latchkey lock` stops its COMMAND (exit 4) at its next renewal.
    Release(AdminReleaseArgs),
    /// End a session as if its lease had expired: its locks go to their next waiters.
    Revoke(AdminRevokeArgs),
}

#[derive(Args, Debug)]
pub struct AdminReleaseArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Release only if the holder's grant has this fencing token. Of a lock with several
    /// holders (readers, permits: `status` shows each token), it chooses the grant taken;
    /// without it, the first granted holder's.
    #[arg(long)]
    pub token: Option<u64>,
    /// End the lock's running lock-delay instead (only the one under --token, when given:
    /// `status` shows it): its first waiter gets the lock now. A release without it never ends
    /// a delay, not even the one it started itself when it is retried.
    #[arg(long)]
    pub end_delay: bool,
    /// Why (recorded in the audit log).
    #[arg(long)]
    pub reason: String,
    /// The lock's name.
    pub name: String,
}

#[derive(Args, Debug)]
pub struct AdminRevokeArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Why (recorded in the audit log).
    #[arg(long)]
    pub reason: String,
    /// The session's id (as `latchkey status` shows it).
    pub session: u64,
}

#[derive(Args, Debug)]
pub struct AuditArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Print one JSON array.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
enum SnapshotCommand {
    /// Copy the whole table (locks, queues, sessions, the token counter) from the running
    /// cluster's leader, as of a linearizable read, into FILE (written atomically). Needs the
    /// admin permission on every lock under access control.
    Save(SnapshotSaveArgs),
    /// Seed a NEW member's empty data dir from FILE. Restore every member of the new cluster
    /// from the same FILE, each with its own --id and the same --peers, then start them with
    /// `latchkey serve` and those flags. Sessions get a full lease from the new cluster's start;
    /// new tokens are above every token in FILE.
    Restore(SnapshotRestoreArgs),
}

#[derive(Args, Debug)]
pub struct SnapshotSaveArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Where to write the backup.
    pub file: PathBuf,
}

#[derive(Args, Debug)]
pub struct SnapshotRestoreArgs {
    /// The backup written by `latchkey snapshot save`.
    pub file: PathBuf,
    /// The new member's data dir: missing or empty (anything else is refused).
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// The new member's id, as it will be given to `serve`.
    #[arg(long, default_value_t = 1)]
    pub id: u64,
    /// The new cluster's members, as they will be given to `serve` (default: a single-node
    /// cluster of just this member at --listen).
    #[arg(long, value_parser = serve::parse_members, value_name = "ID=ADDR,...")]
    pub peers: Option<serve::MemberList>,
    /// This member's address, for a single-node cluster (no --peers), as given to `serve`.
    #[arg(long, default_value = "127.0.0.1:7420", value_parser = serve::parse_listen, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Replicas per Raft group of the new cluster, as it will be given to `serve` (0: every
    /// member): each group is seeded only on its replicas.
    #[arg(long, default_value_t = 0, value_name = "R")]
    pub replicas: u32,
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Ask every endpoint for its role, term and log indexes.
    Status(ClusterStatusArgs),
    /// Add a member: start it first with `latchkey serve --id ID --listen ADDR --join
    /// CLUSTER_ID` (the id `cluster status` prints) and an empty data dir. It catches up as a
    /// learner, then becomes a voter. In every Raft group, or in those of `--group`.
    Add(MemberAddArgs),
    /// Remove a member (the leader too: another member then leads). Stop its process after.
    /// From every Raft group that has it, or from those of `--group`.
    Remove(MemberIdArgs),
    /// Record a member's new address, after restarting it there with its data dir.
    Move(MemberAddrArgs),
}

#[derive(Args, Debug)]
pub struct MemberAddrArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// The member, as ID=HOST:PORT (the address it serves clients and peers on).
    #[arg(value_parser = query::parse_member, value_name = "ID=ADDR")]
    pub member: (u64, String),
}

#[derive(Args, Debug)]
pub struct MemberAddArgs {
    #[command(flatten)]
    pub member: MemberAddrArgs,
    /// Change only this Raft group (repeat it, or give G,G,...): with replica subsets
    /// (`serve --replicas`), the groups the member is to replicate, e.g. those of the member
    /// it replaces. Every group when not given, which a cluster without --replicas needs: there
    /// every member is in every group.
    #[arg(long = "group", value_name = "G", value_delimiter = ',')]
    pub groups: Vec<u32>,
}

#[derive(Args, Debug)]
pub struct MemberIdArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// The member's id.
    #[arg(value_parser = clap::value_parser!(u64).range(1..), value_name = "ID")]
    pub id: u64,
    /// Change only this Raft group (repeat it, or give G,G,...; for replica subsets, like
    /// `cluster add --group`). Every group when not given.
    #[arg(long = "group", value_name = "G", value_delimiter = ',')]
    pub groups: Vec<u32>,
}

/// Every serve flag (but `--config`) is also a key of the config file (its long name) and an
/// environment variable (`LATCHKEY_` and the long name in capitals, `-` as `_`); a test checks
/// both. Precedence: flag, environment, file, default (see `config.rs`).
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Read settings from this TOML file: its keys are these flags' long names (`listen`,
    /// `data-dir`, `peers`, ...). Flags and LATCHKEY_* variables win over it. Relative paths
    /// in it are relative to its directory. See latchkey.example.toml.
    #[arg(long, env = "LATCHKEY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// This node's id (at least 1).
    #[arg(long, env = "LATCHKEY_ID", default_value_t = 1)]
    pub id: u64,
    /// Address to serve clients and peers on: IP:PORT, or HOST:PORT resolved once at start.
    #[arg(long, env = "LATCHKEY_LISTEN", default_value = "127.0.0.1:7420", value_parser = serve::parse_listen, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Serve the other members (Raft) on this address instead of --listen, which then answers
    /// clients only. This member's --peers entry (or `cluster add` address) must then be
    /// ID=CLIENT_ADDR/PEER_ADDR. Same TLS as --listen.
    #[arg(long, env = "LATCHKEY_PEER_LISTEN", value_parser = serve::parse_listen, value_name = "ADDR")]
    pub peer_listen: Option<SocketAddr>,
    /// Where the Raft log and snapshots live.
    #[arg(
        long,
        env = "LATCHKEY_DATA_DIR",
        default_value = "./latchkey-data",
        value_name = "DIR"
    )]
    pub data_dir: PathBuf,
    /// The members that found the cluster, this node included: ID=HOST:PORT,... (default: a
    /// single-node cluster of just this node); ID=HOST:PORT/PEER_HOST:PORT for a member that
    /// serves the others on its --peer-listen address. Read when the data dir is new;
    /// afterwards the membership lives in the log and changes with `cluster add`/`remove`/
    /// `move`, and a list that founds another cluster than the data dir's is refused.
    #[arg(long, env = "LATCHKEY_PEERS", value_parser = serve::parse_members, value_name = "ID=ADDR,...")]
    pub peers: Option<serve::MemberList>,
    /// Join an existing cluster (its id, as `latchkey cluster status` prints it): with a new
    /// data dir this node founds nothing and waits until `latchkey cluster add ID=ADDR` adds
    /// it. Keep the flag on restarts.
    #[arg(long, env = "LATCHKEY_JOIN", value_name = "CLUSTER_ID", conflicts_with = "peers",
          value_parser = |s: &str| latchkey_server::peer_auth::ClusterId::parse(s))]
    pub join: Option<latchkey_server::peer_auth::ClusterId>,
    /// Dial these members at another address than their --peers one (a proxy): ID=ADDR,...
    #[arg(long, hide = true, env = "LATCHKEY_PEER_DIAL", value_parser = serve::parse_members, value_name = "ID=ADDR,...")]
    pub peer_dial: Option<serve::MemberList>,
    /// As leader, gather the client operations that arrive while its writes in flight (two)
    /// are busy into one log entry (the leader's coalescing, issue #35;
    /// `ServerConfig::coalesce`): `true` or `false`. A lone operation is written at once
    /// either way. `--coalesce false` writes an
    /// entry per operation, as before issue #35.
    #[arg(long, env = "LATCHKEY_COALESCE", value_name = "BOOL", default_value_t = true,
          num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub coalesce: bool,
    /// Raft heartbeat interval, in milliseconds.
    #[arg(long, env = "LATCHKEY_HEARTBEAT_MS", default_value_t = latchkey_core::limits::HEARTBEAT_MS_DEFAULT)]
    pub heartbeat_ms: u64,
    /// Raft election timeout range MIN..MAX, in milliseconds: a follower that hears no leader
    /// for a random time in this range starts an election.
    // The default is `limits::ELECTION_TIMEOUT_MS_{MIN,MAX}_DEFAULT` (a test checks it).
    #[arg(long, env = "LATCHKEY_ELECTION_TIMEOUT_MS", default_value = "300..600", value_parser = serve::parse_ms_range, value_name = "MIN..MAX")]
    pub election_timeout_ms: (u64, u64),
    /// Serve Prometheus metrics at http://ADDR/metrics (and /healthz); off unless given.
    #[arg(long, env = "LATCHKEY_METRICS_LISTEN", value_parser = serve::parse_listen, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the HTTP/JSON API at http://ADDR/v1/ (https:// with --tls-cert); off unless given.
    /// Its description: GET /v1/openapi.json, or docs/openapi.json in the source.
    #[arg(long, env = "LATCHKEY_HTTP_LISTEN", value_parser = serve::parse_listen, value_name = "ADDR")]
    pub http_listen: Option<SocketAddr>,
    /// A web page origin, http(s)://HOST[:PORT], that may write to the HTTP API and read its
    /// answers (CORS) although it is not the node's own: repeat it, or give ORIGIN,ORIGIN (at
    /// most 16). Without it, a write from a web page of another origin is refused (cross-site
    /// request forgery).
    #[arg(long = "http-allow-origin", env = "LATCHKEY_HTTP_ALLOW_ORIGIN", value_delimiter = ',',
          value_name = "ORIGIN",
          value_parser = |s: &str| latchkey_server::cross_site::HttpOrigin::parse(s))]
    pub http_allow_origin: Vec<latchkey_server::cross_site::HttpOrigin>,
    /// A file holding this cluster's secret (at least 16 bytes, mode 0600; e.g.
    /// `head -c 32 /dev/urandom | base64 > FILE`). Every member signs its peer messages with it
    /// and refuses those that do not verify, so strangers and other clusters cannot speak Raft
    /// to it. Give every member the same file. Never give the secret itself on the command line.
    #[arg(long, env = "LATCHKEY_CLUSTER_SECRET_FILE", value_name = "FILE")]
    pub cluster_secret_file: Option<std::path::PathBuf>,
    /// Log lines as human-readable text or as one JSON object per line (for log shippers).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "LATCHKEY_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Serve TLS with this certificate (PEM, chain first) and --tls-key. Reloaded on SIGHUP
    /// and when the files change, so a renewed certificate needs no restart.
    #[arg(long, env = "LATCHKEY_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "LATCHKEY_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// The CA that signs members' and clients' certificates (PEM): every connection must then
    /// present a certificate it signed, and members dial each other with mTLS. Required for a
    /// cluster of more than one member over TLS. Reloaded on SIGHUP and when the file changes,
    /// for new connections (members' connections to each other included).
    #[arg(long, env = "LATCHKEY_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Access control (TOML): identities (bearer-token hashes, client-certificate names), their
    /// roles' permissions on lock-name prefixes, and their quotas. Without it every client may
    /// do anything. Reloaded on SIGHUP and when the file changes. See docs/securing.md, "Access
    /// control".
    #[arg(long, env = "LATCHKEY_ACL", value_name = "FILE")]
    pub acl: Option<PathBuf>,
    /// The access-control list given inline in the config file (`[acl]`, see `config.rs`):
    /// not a flag.
    #[arg(skip)]
    pub inline_acl: Option<String>,
    /// The lock table's memory budget, in bytes: sessions, held locks, queued waits and the
    /// outcomes sessions remember. A request that would take the table past it is refused
    /// (`table-full`) until releases or closes make room. Give every member the same value
    /// (members with different ones refuse each other). At most the default, 1 GiB.
    #[arg(long, env = "LATCHKEY_TABLE_BYTES_MAX", default_value_t = latchkey_core::limits::TABLE_BYTES_MAX, value_name = "BYTES")]
    pub table_bytes_max: usize,
    /// The Raft groups the lock namespace is split over (1 to 64), each with its own Raft log,
    /// leader and leases: more groups spread the grants over more leaders. A member's groups
    /// share one log writer. Fixed when the cluster is founded: give every member the same
    /// value, and the same on every restart (a data dir refuses another).
    #[arg(long, env = "LATCHKEY_GROUPS", default_value_t = 1, value_name = "N")]
    pub groups: u32,
    /// Replicas per Raft group: 0 (the default) puts every group on every member; R (3 or
    /// more, at most the founding members) places group g on R of them, the (g mod N)-th
    /// member by id and the next R-1, so that a cluster of more members than a group needs
    /// (e.g. 9 members, 24 groups of 3) grows with its members. A member outside a group sends
    /// its clients to the group's replicas. Fixed when the cluster is founded, like --groups.
    #[arg(long, env = "LATCHKEY_REPLICAS", default_value_t = 0, value_name = "R")]
    pub replicas: u32,
    /// With several groups: how long (ms) a group's preferred leader (the member that founded
    /// it) must have been caught up and answering before the group's leader hands the group
    /// back to it, so that leaderships spread again after a member returns. 0: never.
    #[arg(long, env = "LATCHKEY_REBALANCE_AFTER_MS", default_value_t = latchkey_core::limits::REBALANCE_AFTER_MS_DEFAULT, value_name = "MS")]
    pub rebalance_after_ms: u64,
    /// Entries between snapshots; the log before a snapshot is purged. With --coalesce, also
    /// this many operations (a batch entry counts each of its operations).
    #[arg(long, env = "LATCHKEY_SNAPSHOT_EVERY_ENTRIES", default_value_t = latchkey_core::limits::SNAPSHOT_EVERY_ENTRIES_DEFAULT, value_name = "N")]
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind a snapshot, so that a member a little behind catches up by
    /// entries rather than by a snapshot.
    #[arg(long, env = "LATCHKEY_LOG_KEPT_AFTER_SNAPSHOT", default_value_t = latchkey_core::limits::LOG_KEPT_AFTER_SNAPSHOT_DEFAULT, value_name = "N")]
    pub log_kept_after_snapshot: u64,
}

#[derive(Args, Debug, Clone)]
pub struct Endpoints {
    /// Servers to talk to, comma-separated HOST:PORT (https://HOST:PORT for TLS).
    #[arg(
        long,
        env = "LATCHKEY_ENDPOINTS",
        value_delimiter = ',',
        default_value = "127.0.0.1:7420",
        value_parser = parse_endpoint,
        value_name = "HOST:PORT,..."
    )]
    pub endpoints: Vec<String>,
    /// The CA that signed the servers' certificates (PEM); needed for https:// endpoints.
    #[arg(long, env = "LATCHKEY_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// This client's certificate (PEM), for servers that require one (--tls-ca).
    #[arg(long, env = "LATCHKEY_CERT", value_name = "FILE", requires = "key")]
    pub cert: Option<PathBuf>,
    /// The private key of --cert (PEM).
    #[arg(long, env = "LATCHKEY_KEY", value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
    /// The bearer token of this client's identity, for servers with --acl. Prefer the
    /// environment variable: a command line is visible to other users.
    #[arg(
        long,
        env = "LATCHKEY_AUTH_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub auth_token: Option<String>,
}

/// `--wait`: a duration; a negative one gets a sentence (clap took `-1s` for a flag).
pub fn parse_wait(text: &str) -> Result<Duration, String> {
    if text.trim_start().starts_with('-') {
        return Err(
            "a wait cannot be negative: give 0 to try once, or leave --wait out to wait \
                    until the lock is granted"
                .to_owned(),
        );
    }
    parse_duration(text)
}

/// A semaphore's permits, 1 to `limits::HOLDERS_PER_LOCK_MAX`.
pub fn parse_permits(text: &str) -> Result<u32, String> {
    let max = latchkey_core::limits::HOLDERS_PER_LOCK_MAX;
    match text.trim().parse::<u64>() {
        Ok(n) if n >= 1 && n <= max as u64 => Ok(n as u32),
        _ => Err(format!(
            "a semaphore has 1 to {max} permits (how many holders may run at once), not {text:?}"
        )),
    }
}

impl LockArgs {
    /// How `--shared` and `--permits` ask to take the lock (exclusive without either).
    pub fn mode(&self) -> latchkey_core::Mode {
        match (self.shared, self.permits) {
            (_, Some(n)) => latchkey_core::Mode::Permits(n),
            (true, None) => latchkey_core::Mode::Shared,
            (false, None) => latchkey_core::Mode::Exclusive,
        }
    }
}

/// A lock name as the server takes it (`latchkey_core::validate_name`): refused as a usage
/// error before anything is sent, without echoing more than the start of a long one.
pub fn parse_lock_name() -> LockNameParser {
    LockNameParser
}

/// Parses a lock name (see [`parse_lock_name`]).
#[derive(Clone, Copy, Debug)]
pub struct LockNameParser;

/// How much of a refused lock name an error quotes.
const NAME_QUOTED_CHARS: usize = 40;

impl clap::builder::TypedValueParser for LockNameParser {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let text = value.to_string_lossy();
        latchkey_core::validate_name(&text).map_err(|e| {
            let quoted: String = text.chars().take(NAME_QUOTED_CHARS).collect();
            let quoted = if quoted.len() < text.len() {
                format!("{quoted}... ({} bytes)", text.len())
            } else {
                quoted
            };
            let arg = arg.map_or_else(
                || "NAME".to_owned(),
                |a| a.get_id().to_string().to_uppercase(),
            );
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value '{quoted}' for '<{arg}>': {e}\n"),
            )
            .with_cmd(cmd)
        })?;
        Ok(text.into_owned())
    }
}

/// An endpoint: `HOST:PORT`, `http://HOST:PORT` or `https://HOST:PORT` (IPv6 as `[::1]:7420`).
/// A port is required: latchkey has no well-known one, and a URI without one would mean port
/// 80 or 443.
pub fn parse_endpoint(text: &str) -> Result<String, String> {
    let text = text.trim();
    let rest = ["http://", "https://"]
        .iter()
        .find_map(|scheme| text.strip_prefix(scheme))
        .unwrap_or(text);
    if rest.contains("://") {
        return Err(format!("{text:?}: the scheme must be http:// or https://"));
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let port = match authority.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && (!host.contains(':') || host.ends_with(']')) => {
            port
        }
        _ => {
            return Err(format!(
                "{text:?} has no port; write HOST:PORT, e.g. 127.0.0.1:7420"
            ))
        }
    };
    if port.parse::<u16>().map_or(true, |port| port == 0) {
        return Err(format!("{text:?}: {port:?} is not a port (1 to 65535)"));
    }
    Ok(text.to_owned())
}

impl Endpoints {
    /// A client of these endpoints: with TLS for `https://` ones when --ca is given. Without
    /// batching: a command makes one call at a time, so it would only send `Batch` calls of one.
    pub fn client(&self) -> Result<latchkey_client::Client, latchkey_client::Error> {
        self.client_batching(None)
    }

    /// [`Endpoints::client`], gathering its sessions' operations into `Batch` calls with
    /// `Some(K)`, K of them in flight to one member (`ClientConfig::batch`,
    /// `batch_calls_in_flight`; the bench's `--batch`, `--batch-in-flight`).
    pub fn client_batching(
        &self,
        batch: Option<usize>,
    ) -> Result<latchkey_client::Client, latchkey_client::Error> {
        let mut env = latchkey_client::ClientEnv::default();
        match &self.ca {
            None if self.cert.is_some() => {
                return Err(latchkey_client::Error::InvalidArgument {
                    message: "--cert needs --ca (the CA that signed the servers' certificates)"
                        .into(),
                })
            }
            None => {}
            Some(ca) => {
                let tls = latchkey_client::ClientTls::from_files(
                    ca,
                    self.cert.as_deref().zip(self.key.as_deref()),
                )?;
                env.connector = std::sync::Arc::new(latchkey_client::TlsConnector::new(tls));
            }
        }
        let config = latchkey_client::ClientConfig {
            auth_token: self
                .auth_token
                .as_deref()
                .map(latchkey_client::AuthToken::new)
                .transpose()?,
            batch: batch.is_some(),
            batch_calls_in_flight: batch
                .unwrap_or(latchkey_core::limits::CLIENT_BATCH_CALLS_IN_FLIGHT_DEFAULT),
            ..latchkey_client::ClientConfig::default()
        };
        latchkey_client::Client::with_env(self.endpoints.clone(), config, env)
    }
}

#[derive(Args, Debug)]
pub struct LockArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Session lease: how long the lock outlives this process if it stops renewing.
    #[arg(long, default_value = "15s", value_parser = parse_ttl)]
    pub ttl: Duration,
    /// Give up waiting after this long (default: wait forever; 0: try once, and say who holds
    /// the lock).
    #[arg(long, value_parser = parse_wait, allow_hyphen_values = true, value_name = "DURATION")]
    pub wait: Option<Duration>,
    /// Free text about who holds the lock and why, shown by `status` and `list` next to this
    /// process's host name, pid and user.
    #[arg(long, value_name = "TEXT")]
    pub owner: Option<String>,
    /// Take the lock as a reader: any number of `--shared` holders run at once, never beside
    /// a holder without it (a writer). FIFO with writers: a reader behind a waiting writer
    /// waits.
    #[arg(long, conflicts_with = "permits")]
    pub shared: bool,
    /// Take one of N permits of a counting semaphore: at most N holders run at once (1 to
    /// 1024; every holder of NAME must give the same N).
    #[arg(long, value_name = "N", value_parser = parse_permits)]
    pub permits: Option<u32>,
    /// Lock-delay: if this process's session expires (it was killed, hung or cut off) or an
    /// operator takes the lock, nobody gets it for this long after (at most 5m), for a
    /// resource that cannot check fencing tokens. A clean exit hands it over at once.
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = crate::duration::parse_duration,
        conflicts_with_all = ["shared", "permits"]
    )]
    pub lock_delay: Option<Duration>,
    /// The lock's name.
    #[arg(value_parser = parse_lock_name())]
    pub name: String,
    /// The command to run under the lock, after `--`. Without one, the lock is held until
    /// Ctrl-C or SIGTERM, its token printed on stdout (as `etcdctl lock NAME` does).
    #[arg(last = true, num_args = 1.., value_name = "COMMAND")]
    pub command: Vec<String>,
    /// Set by `latchkey elect`: the acquire is a campaign publishing this value.
    #[arg(skip)]
    pub campaign: Option<Vec<u8>>,
}

#[derive(Args, Debug)]
pub struct ElectArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Session lease: how long leadership outlives this process if it stops renewing.
    #[arg(long, default_value = "15s", value_parser = parse_ttl)]
    pub ttl: Duration,
    /// Give up waiting to lead after this long (default: wait forever).
    #[arg(long, value_parser = parse_wait, allow_hyphen_values = true, value_name = "DURATION")]
    pub wait: Option<Duration>,
    /// Free text about this candidate, shown by `status` and `list`.
    #[arg(long, value_name = "TEXT")]
    pub owner: Option<String>,
    /// The value this candidate publishes while it leads (an address, a name; at most 1024
    /// bytes), read by `latchkey status NAME` and `--observe`.
    #[arg(long, value_name = "V", conflicts_with = "observe")]
    pub value: Option<String>,
    /// Print the election's leader (if one leads), then each new leader and each new value,
    /// one line each, until interrupted (exit 130); moves to another endpoint when its member
    /// fails, without repeating or skipping a change.
    #[arg(long)]
    pub observe: bool,
    /// With --observe: one JSON object per line (`{"session", "token", "value"}`).
    #[arg(long, requires = "observe")]
    pub json: bool,
    /// The election's name.
    #[arg(value_parser = parse_lock_name())]
    pub name: String,
    /// The command to run while leading, after `--`. Without one, leadership is held until
    /// Ctrl-C or SIGTERM, its token printed on stdout.
    #[arg(last = true, num_args = 1.., value_name = "COMMAND", conflicts_with = "observe")]
    pub command: Vec<String>,
}

impl ElectArgs {
    /// The `latchkey lock` these arguments run: an exclusive acquire that campaigns.
    pub fn into_lock_args(self) -> LockArgs {
        LockArgs {
            endpoints: self.endpoints,
            ttl: self.ttl,
            wait: self.wait,
            owner: self.owner,
            shared: false,
            permits: None,
            lock_delay: None,
            name: self.name,
            command: self.command,
            campaign: Some(self.value.unwrap_or_default().into_bytes()),
        }
    }
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    #[arg(value_parser = parse_lock_name())]
    pub name: String,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Print one JSON array.
    #[arg(long)]
    pub json: bool,
    #[arg(default_value = "")]
    pub prefix: String,
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Print one JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// Start after this log index (an event's `index`), replaying what the member still keeps;
    /// default: from now. A cluster of several Raft groups takes one index per group, in group
    /// order (`--after 120,97,88`: each group's last index printed).
    #[arg(long, value_name = "INDEX[,INDEX...]", value_delimiter = ',')]
    pub after: Vec<u64>,
    #[arg(default_value = "")]
    pub prefix: String,
}

#[derive(Args, Debug)]
pub struct ClusterStatusArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// An existing cluster to load (ignored with --cluster).
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Start a cluster of 1, 3, 5 (or, for --replicas, 6, 7 or 9) `latchkey serve` processes on
    /// loopback in a temporary directory, and stop it afterwards.
    #[arg(long, value_parser = bench::parse_cluster_size, value_name = "N")]
    pub cluster: Option<usize>,
    /// With --cluster: start it with this many Raft groups (`serve --groups`), and report each
    /// group's share of the operations.
    #[arg(long, default_value_t = 1, value_name = "G")]
    pub groups: u32,
    /// With --cluster: place each group on this many of its members (`serve --replicas`; 0:
    /// every member in every group).
    #[arg(long, default_value_t = 0, value_name = "R")]
    pub replicas: u32,
    /// The existing cluster's metrics addresses (HOST:PORT of each `--metrics-listen`), to
    /// report requests and log entries per operation.
    #[arg(long, value_delimiter = ',', value_name = "ADDR,...")]
    pub metrics_endpoints: Vec<String>,
    /// What to measure.
    #[arg(long, value_enum, default_value = "uncontended")]
    pub workload: bench::Workload,
    /// Clients, each with its own connection and session (default: 64; herd 500, hold 100,
    /// failover 8; election: 3 candidate processes).
    #[arg(long)]
    pub clients: Option<usize>,
    /// Connections the clients share: that many `Client`s in this process, each with its own
    /// connection to each member, the clients' sessions spread evenly over them (default: one
    /// per client). A service whose concurrent requests each take a lock of their own over a
    /// few connections is `--clients 64 --connections 4`. Not for election (its candidates
    /// are processes).
    #[arg(long, value_name = "C")]
    pub connections: Option<usize>,
    /// The clients gather the operations their sessions send while a call is in flight into
    /// `Batch` calls (the client library's `ClientConfig::batch`, off by default, issue #35).
    /// Not for election.
    #[arg(long)]
    pub batch: bool,
    /// With --batch: the `Batch` calls each client has in flight to one member at once
    /// (`ClientConfig::batch_calls_in_flight`; default: the library's).
    #[arg(long, value_name = "K", requires = "batch", value_parser = clap::value_parser!(u64).range(1..=latchkey_core::limits::CLIENT_BATCH_CALLS_IN_FLIGHT_MAX as u64))]
    pub batch_in_flight: Option<u64>,
    /// With --cluster: its members write an entry per operation (`serve --coalesce false`), as
    /// before issue #35; without it they gather the operations that arrive while their writes
    /// in flight are busy into one log entry (the leader's coalescing, serve's default).
    #[arg(long, requires = "cluster")]
    pub no_coalesce: bool,
    /// Length of the measured window.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Load before the window, excluded from every figure.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Session lease of every client (renewed every third of it; default 15s, election 3s).
    #[arg(long, value_parser = parse_ttl)]
    pub ttl: Option<Duration>,
    /// hold: locks held in total, spread over the clients' sessions.
    #[arg(long, default_value_t = 10_000)]
    pub locks: usize,
    /// failover: kills of the Raft leader; election: kills of the election's leader process.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// semaphore: the semaphore's permits (at most that many clients hold one at once).
    #[arg(long, default_value_t = 8)]
    pub permits: u32,
    /// semaphore: how long each client holds its permit before releasing it.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub hold: Duration,
    /// Prefix of the lock names used.
    #[arg(long, default_value = "bench/")]
    pub prefix: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Failures with an exit status of their own.
#[derive(Debug, thiserror::Error)]
pub enum Stopped {
    #[error("lock {name:?} may have been lost ({why}); COMMAND was stopped")]
    LockLost { name: String, why: String },
    /// An operator force-released the lock (`admin release`): it is lost for certain, and
    /// `latchkey audit` says who and why. COMMAND, if any, was stopped.
    #[error("lock {name:?} was force-released by an operator (token {token}; see `latchkey audit`){}", if *.command { "; COMMAND was stopped" } else { "" })]
    ForceReleased {
        name: String,
        token: u64,
        command: bool,
    },
    /// `lock NAME` without COMMAND: the lock it held may have been lost.
    #[error("lock {name:?} may have been lost ({why})")]
    HeldLockLost { name: String, why: String },
    /// Input that passed its parser but not the command's rules (exit 2, like clap's own).
    #[error("{0}")]
    Usage(String),
    /// SIGINT or SIGTERM ended the command (exit 128 + the signal, as a shell reports it).
    #[error("{what}: gave up")]
    Signal {
        what: String,
        signal: nix::sys::signal::Signal,
    },
    /// `--timeout` ran out.
    #[error("gave up after --timeout {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    /// COMMAND could not be started: exit 127 when it was not found, 126 otherwise (not
    /// executable), as a shell reports it.
    #[error("cannot run {command:?}: {}", io_reason(.io))]
    CannotRun {
        command: String,
        // Not a `source`: the message says it once.
        io: std::io::Error,
    },
}

/// An I/O error in a few words ("No such file or directory"), without Rust's "(os error 2)".
fn io_reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.rsplit_once(" (os error ") {
        Some((reason, _)) => reason.to_owned(),
        None => text,
    }
}

/// Exit status of a COMMAND that was not found, and of one that could not be executed.
const EXIT_COMMAND_NOT_FOUND: u8 = 127;
const EXIT_COMMAND_NOT_EXECUTABLE: u8 = 126;

/// How long an exiting `latchkey lock` waits for its queued log lines to reach stderr.
const LOG_DRAIN_TIMEOUT: Duration = Duration::from_millis(500);

/// The one place an error becomes an exit status.
fn exit_code(error: &anyhow::Error) -> u8 {
    match error.downcast_ref::<Stopped>() {
        Some(
            Stopped::LockLost { .. } | Stopped::HeldLockLost { .. } | Stopped::ForceReleased { .. },
        ) => return EXIT_LOCK_LOST,
        Some(Stopped::Usage(_)) => return EXIT_USAGE,
        Some(Stopped::Signal { signal, .. }) => return (128 + *signal as i32).min(255) as u8,
        Some(Stopped::CannotRun { io, .. }) => {
            return match io.kind() {
                std::io::ErrorKind::NotFound => EXIT_COMMAND_NOT_FOUND,
                _ => EXIT_COMMAND_NOT_EXECUTABLE,
            }
        }
        Some(Stopped::Timeout(_)) | None => {}
    }
    if error.downcast_ref::<config::ConfigFileError>().is_some() {
        return EXIT_USAGE;
    }
    match error.downcast_ref::<latchkey_client::Error>() {
        Some(latchkey_client::Error::WaitTimedOut { .. } | latchkey_client::Error::Held { .. }) => {
            EXIT_WAIT_TIMED_OUT
        }
        Some(latchkey_client::Error::PermissionDenied { .. }) => EXIT_PERMISSION_DENIED,
        // Bad input (a lock name, a TTL, an endpoint), refused by the library or a server.
        Some(latchkey_client::Error::InvalidArgument { .. }) => EXIT_USAGE,
        _ => EXIT_FAILURE,
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr; through a [`logwriter::LossyStderr`] when `lossy` (returned, to drain it
/// before exiting).
fn init_logging(default: &str, lossy: bool, format: LogFormat) -> Option<logwriter::LossyStderr> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    if format == LogFormat::Json {
        // One object per line, no colours; `lock` never asks for JSON (it is a serve flag).
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
        return None;
    }
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    match lossy.then(logwriter::LossyStderr::start) {
        Some(Ok(writer)) => {
            builder.with_writer(writer.clone()).init();
            Some(writer)
        }
        Some(Err(e)) => {
            eprintln!("latchkey: warning: cannot start the log thread ({e}); logging directly");
            builder.with_writer(std::io::stderr).init();
            None
        }
        None => {
            builder.with_writer(std::io::stderr).init();
            None
        }
    }
}

/// mimalloc instead of glibc's malloc: the server allocates and frees small buffers for every
/// request (HTTP/2 frames, protobuf messages, log entries), and a profile of the leader under
/// load showed 11% of its CPU in glibc's malloc and free (issue #11, docs/PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The book's CLI reference (docs/cli.md), generated from the clap definition so that it cannot
/// drift from it: each command's long help, as `latchkey ... --help` prints it on a terminal of
/// 100 columns, with environment variables' current values left out (the page must not depend
/// on who generated it). `crates/cli/tests/book.rs` fails when the checked-in page differs.
fn cli_reference() -> String {
    fn render(command: &clap::Command, path: &str, out: &mut String) {
        if command.is_hide_set() || command.get_name() == "help" {
            return;
        }
        let help = command
            .clone()
            .term_width(100)
            .mut_args(|arg| arg.hide_env_values(true))
            .render_long_help()
            .to_string();
        let help: Vec<&str> = help.trim_end().lines().map(str::trim_end).collect();
        out.push_str(&format!(
            "## {path}\n\n```text\n{}\n```\n\n",
            help.join("\n")
        ));
        for sub in command.get_subcommands() {
            render(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }
    let mut command = cli_command();
    command.build();
    let mut out = String::from(
        "# CLI reference\n\n\
         <!-- Generated from the clap definition by `latchkey cli-reference > docs/cli.md`; \
         crates/cli/tests/book.rs fails when it differs. Do not edit by hand. -->\n\n\
         Every command and flag of `latchkey`, as its `--help` prints them. \
         [Using the CLI](cli-guide.md) says how they behave: durations, exit statuses, owners, \
         watches.\n\n",
    );
    render(&command, "latchkey", &mut out);
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// The clap definition, with the client commands' global flags (`--timeout`, `-v`) left out
/// of `serve --help` (issue #33 item 6): a member runs until it is stopped and logs through
/// RUST_LOG. `serve` gets hidden flags of the same ids, which clap's propagation of global
/// flags then leaves alone, so `serve --timeout` still parses (to be refused with a sentence).
fn cli_command() -> clap::Command {
    use clap::{Arg, CommandFactory};
    Cli::command().mut_subcommand("serve", |serve| {
        serve
            .arg(
                Arg::new("timeout")
                    .long("timeout")
                    .value_parser(parse_duration)
                    .hide(true),
            )
            .arg(
                Arg::new("verbose")
                    .short('v')
                    .long("verbose")
                    .action(clap::ArgAction::Count)
                    .hide(true),
            )
    })
}

/// The command line, with `serve --config FILE`'s values as the serve flags' defaults (see
/// `config.rs`). A clap error exits here (2, or 0 for --help); a config file error is returned.
fn parse_cli() -> Result<Cli, config::ConfigFileError> {
    use clap::FromArgMatches;
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut command = cli_command();
    let mut inline_acl = None;
    if let Some(path) = config::path_in(&command, &argv) {
        let serve = command
            .find_subcommand("serve")
            .expect("latchkey has a serve subcommand");
        let values = config::load(&path, serve)?;
        command = command.mut_subcommand("serve", |serve| config::apply(serve, &values));
        inline_acl = values.inline_acl;
    }
    let mut cli = command
        .try_get_matches_from(&argv)
        .and_then(|matches| Cli::from_arg_matches(&matches))
        .unwrap_or_else(|e| e.exit());
    if let Command::Serve(args) = &mut cli.command {
        args.inline_acl = inline_acl;
    }
    if cli.timeout.is_some() && matches!(cli.command, Command::Serve(_)) {
        cli_command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                "--timeout bounds client commands; `serve` runs until it is stopped",
            )
            .exit();
    }
    Ok(cli)
}

fn main() -> ExitCode {
    let cli = match parse_cli() {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("latchkey: {e}");
            return ExitCode::from(exit_code(&e.into()));
        }
    };
    let log = init_logging(
        match cli.command {
            // openraft's own lines at error only: the node logs what an operator needs
            // (elections won, leases resumed, peers down and back, refusals). openraft's warn
            // lines are its internal chatter in a healthy cluster: every retry of a heartbeat
            // or replication to a member that is down (ten a second), and on each failover its
            // vote requests to the dead leader as 600-character error chains (issue #33; a
            // test holds a failover to no openraft WARN line); `peer.rs` reports the member
            // going down and coming back instead. RUST_LOG=openraft=warn shows them.
            Command::Serve(_) => "info,openraft=error",
            // Client commands speak through their own messages (issue #33: the library's log
            // lines mixed into a command's output); `-v` adds the library's warnings (failed
            // renewals, retries), `-vv` its progress.
            _ => match cli.verbose {
                0 => "error",
                1 => "warn",
                _ => "info",
            },
        },
        // `lock` and `elect` share stderr with COMMAND and must never block on it (see
        // logwriter.rs).
        matches!(cli.command, Command::Lock(_) | Command::Elect(_)),
        match &cli.command {
            Command::Serve(args) => args.log_format,
            _ => LogFormat::Text,
        },
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("latchkey: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let timeout = cli.timeout;
    let result = runtime.block_on(async move {
        match cli.command {
            // Both handle SIGINT and SIGTERM themselves (a clean shutdown; COMMAND's group).
            Command::Serve(args) => serve::serve(args).await.map(|()| 0),
            Command::Lock(args) => lock::lock(args, timeout).await,
            Command::Elect(args) if args.observe => {
                bounded(timeout, elect::observe(args)).await.map(|()| 0)
            }
            Command::Elect(args) => lock::lock(args.into_lock_args(), timeout).await,
            Command::Status(args) => bounded(timeout, query::status(args)).await.map(|()| 0),
            Command::List(args) => bounded(timeout, query::list(args)).await.map(|()| 0),
            Command::Watch(args) => bounded(timeout, watch::watch(args)).await.map(|()| 0),
            Command::Cluster { command } => match command {
                ClusterCommand::Status(args) => bounded(timeout, query::cluster_status(args))
                    .await
                    .map(|()| 0),
                ClusterCommand::Add(args) => {
                    bounded(timeout, query::cluster_add(args)).await.map(|()| 0)
                }
                ClusterCommand::Remove(args) => bounded(timeout, query::cluster_remove(args))
                    .await
                    .map(|()| 0),
                ClusterCommand::Move(args) => bounded(timeout, query::cluster_move(args))
                    .await
                    .map(|()| 0),
            },
            Command::Admin {
                command: AdminCommand::Release(args),
            } => bounded(timeout, admin::release(args)).await.map(|()| 0),
            Command::Admin {
                command: AdminCommand::Revoke(args),
            } => bounded(timeout, admin::revoke(args)).await.map(|()| 0),
            Command::Audit(args) => bounded(timeout, admin::audit(args)).await.map(|()| 0),
            Command::Snapshot {
                command: SnapshotCommand::Save(args),
            } => bounded(timeout, snapshot::save(args)).await.map(|()| 0),
            Command::Snapshot {
                command: SnapshotCommand::Restore(args),
            } => bounded(timeout, snapshot::restore(args)).await.map(|()| 0),
            Command::Bench(args) => bounded(timeout, bench::bench(args)).await.map(|()| 0),
            Command::CliReference => {
                print!("{}", cli_reference());
                Ok(0)
            }
        }
    });
    // Do not wait for best-effort background calls of the client library.
    runtime.shutdown_timeout(Duration::from_millis(100));
    if let Some(log) = log {
        log.drain(LOG_DRAIN_TIMEOUT);
    }
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("latchkey: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

/// Runs a client command within `--timeout`, and ends it on SIGINT (exit 130) or SIGTERM (143).
/// Dropping the command's future closes what it opened (connections, a bench's cluster).
async fn bounded(
    timeout: Option<Duration>,
    command: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    use nix::sys::signal::Signal;
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let stopped = |what: &str, signal| Stopped::Signal {
        what: what.into(),
        signal,
    };
    let deadline = async {
        match timeout {
            Some(timeout) => tokio::time::sleep(timeout).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        result = command => result,
        () = deadline => Err(Stopped::Timeout(timeout.unwrap_or_default()).into()),
        _ = interrupt.recv() => Err(stopped("SIGINT", Signal::SIGINT).into()),
        _ = terminate.recv() => Err(stopped("SIGTERM", Signal::SIGTERM).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
        cli_command().debug_assert();
    }

    /// `serve --help` has no paragraph on the client commands' `--timeout` and `-v` (issue #33
    /// item 6); the client commands keep them, and `serve --timeout` still parses, to be refused
    /// with a sentence.
    #[test]
    fn serve_help_leaves_out_the_client_flags() {
        use clap::FromArgMatches;
        let help = |sub: &str| {
            let mut command = cli_command();
            command.build();
            command
                .find_subcommand_mut(sub)
                .unwrap()
                .render_long_help()
                .to_string()
        };
        let serve = help("serve");
        assert!(!serve.contains("--timeout"), "{serve}");
        assert!(!serve.contains("--verbose"), "{serve}");
        for sub in ["lock", "status", "bench"] {
            let client = help(sub);
            assert!(client.contains("--timeout <DURATION>"), "{sub}: {client}");
            assert!(client.contains("--verbose"), "{sub}: {client}");
        }
        for argv in [
            &["latchkey", "serve", "--timeout", "1s"][..],
            &["latchkey", "--timeout", "1s", "serve"][..],
        ] {
            let matches = cli_command().try_get_matches_from(argv).unwrap();
            let cli = Cli::from_arg_matches(&matches).unwrap();
            assert_eq!(cli.timeout, Some(Duration::from_secs(1)), "{argv:?}");
        }
        let matches = cli_command()
            .try_get_matches_from(["latchkey", "status", "-vv", "--timeout", "2s", "x"])
            .unwrap();
        let cli = Cli::from_arg_matches(&matches).unwrap();
        assert_eq!(
            (cli.timeout, cli.verbose),
            (Some(Duration::from_secs(2)), 2)
        );
    }

    #[test]
    fn lock_takes_the_command_after_double_dash() {
        let cli = Cli::try_parse_from([
            "latchkey", "lock", "--ttl", "2s", "--wait", "0", "jobs/a", "--", "sh", "-c", "true",
        ])
        .unwrap();
        let Command::Lock(args) = cli.command else {
            panic!("not lock")
        };
        assert_eq!(args.ttl, Duration::from_secs(2));
        assert_eq!(args.wait, Some(Duration::ZERO));
        assert_eq!(args.name, "jobs/a");
        assert_eq!(args.command, ["sh", "-c", "true"]);
    }

    #[test]
    fn lock_with_bad_ttl_or_wait_is_a_usage_error() {
        // (`lock a` without COMMAND holds the lock until a signal: not a usage error.)
        let cli = Cli::try_parse_from(["latchkey", "lock", "a"]).unwrap();
        let Command::Lock(args) = cli.command else {
            panic!("not lock")
        };
        assert!(args.command.is_empty());
        for argv in [
            &["latchkey", "lock", "--ttl", "100ms", "a", "--", "true"][..],
            &["latchkey", "lock", "--wait", "-1s", "a", "--", "true"][..],
            &["latchkey", "lock", "--wait", "5", "a", "--", "true"][..],
        ] {
            let e = Cli::try_parse_from(argv).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{argv:?}");
        }
    }

    #[test]
    fn serve_takes_the_cluster_flags() {
        let cli = Cli::try_parse_from([
            "latchkey",
            "serve",
            "--id",
            "2",
            "--peers",
            "1=h:1,2=h:2,3=h:3",
            "--peer-dial",
            "1=p:1",
            "--heartbeat-ms",
            "100",
            "--election-timeout-ms",
            "800..1600",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        let config = serve::config(&args).expect("a valid configuration");
        assert_eq!(config.id, 2);
        assert_eq!(config.peers.len(), 3);
        assert_eq!(config.peer_dial[&1], "p:1");
        assert_eq!(config.heartbeat_ms, 100);
        assert_eq!(
            (
                config.election_timeout_min_ms,
                config.election_timeout_max_ms
            ),
            (800, 1600)
        );
    }

    /// The flags' defaults are the server's, which say why they are what they are.
    #[test]
    fn serve_defaults_are_the_servers() {
        let cli = Cli::try_parse_from(["latchkey", "serve"]).unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        let flags = serve::config(&args).expect("the defaults are valid");
        let server = latchkey_server::ServerConfig::single(1, args.listen, args.data_dir.clone());
        assert_eq!(flags.heartbeat_ms, server.heartbeat_ms);
        assert_eq!(
            (flags.election_timeout_min_ms, flags.election_timeout_max_ms),
            (
                server.election_timeout_min_ms,
                server.election_timeout_max_ms
            )
        );
        assert_eq!(flags.coalesce, server.coalesce);
    }

    /// The leader's coalescing is on by default (issue #35) and `--coalesce false` turns it
    /// off; a bare `--coalesce` still turns it on.
    #[test]
    fn coalescing_is_on_unless_turned_off() {
        let cases: [(&[&str], bool); 4] = [
            (&[], true),
            (&["--coalesce", "false"], false),
            (&["--coalesce=false"], false),
            (&["--coalesce"], true),
        ];
        for (flags, want) in cases {
            let argv = ["latchkey", "serve"].iter().chain(flags);
            let cli = Cli::try_parse_from(argv).unwrap();
            let Command::Serve(args) = cli.command else {
                panic!("not serve")
            };
            let config = serve::config(&args).expect("valid");
            assert_eq!(config.coalesce, want, "{flags:?}");
        }
        let e = Cli::try_parse_from(["latchkey", "serve", "--coalesce", "sometimes"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn bad_member_lists_are_usage_errors() {
        for peers in ["1=h:1,1=h:2", "1=h:1,x", "0=h:1"] {
            let e = Cli::try_parse_from(["latchkey", "serve", "--peers", peers]).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{peers}");
        }
    }

    #[test]
    fn endpoints_need_a_port() {
        for good in [
            "a:1",
            "http://a:7420",
            "https://a.b:7420/",
            "[::1]:7420",
            "10.0.0.1:7420",
        ] {
            assert_eq!(parse_endpoint(good).as_deref(), Ok(good), "{good}");
        }
        for bad in [
            "a",
            "http://a",
            "https://a/",
            "::1",
            "a:0",
            "a:x",
            "ftp://a:1",
            ":7420",
        ] {
            let e = parse_endpoint(bad).unwrap_err();
            assert!(e.contains(bad), "{bad}: {e}");
        }
        let e =
            Cli::try_parse_from(["latchkey", "status", "--endpoints", "a:1,b", "x"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn endpoints_split_on_commas() {
        let cli =
            Cli::try_parse_from(["latchkey", "status", "--endpoints", "a:1,b:2", "x"]).unwrap();
        let Command::Status(args) = cli.command else {
            panic!("not status")
        };
        assert_eq!(args.endpoints.endpoints, ["a:1", "b:2"]);
    }

    #[test]
    fn exit_codes() {
        let timed_out =
            anyhow::Error::new(latchkey_client::Error::WaitTimedOut { name: "a".into() });
        assert_eq!(exit_code(&timed_out), EXIT_WAIT_TIMED_OUT);
        let lost = anyhow::Error::new(Stopped::LockLost {
            name: "a".into(),
            why: "x".into(),
        });
        assert_eq!(exit_code(&lost), EXIT_LOCK_LOST);
        assert_eq!(exit_code(&anyhow::anyhow!("boom")), EXIT_FAILURE);
        let wrapped = anyhow::Error::new(latchkey_client::Error::WaitTimedOut { name: "a".into() })
            .context("waiting");
        assert_eq!(exit_code(&wrapped), EXIT_WAIT_TIMED_OUT);
        let denied = anyhow::Error::new(latchkey_client::Error::PermissionDenied {
            reason: "permission-denied".into(),
            message: "x".into(),
        });
        assert_eq!(exit_code(&denied), EXIT_PERMISSION_DENIED);
        let bad_name = anyhow::Error::new(latchkey_client::Error::InvalidArgument {
            message: "x".into(),
        });
        assert_eq!(exit_code(&bad_name), EXIT_USAGE);
        let usage = anyhow::Error::new(Stopped::Usage("--clients must be 1 to 10000".into()));
        assert_eq!(exit_code(&usage), EXIT_USAGE);
        let interrupted = anyhow::Error::new(Stopped::Signal {
            what: "SIGINT".into(),
            signal: nix::sys::signal::Signal::SIGINT,
        });
        assert_eq!(exit_code(&interrupted), 130);
        let timeout = anyhow::Error::new(Stopped::Timeout(Duration::from_millis(1500)));
        assert_eq!(exit_code(&timeout), EXIT_FAILURE);
        assert_eq!(timeout.to_string(), "gave up after --timeout 1s 500ms");
    }

    /// Without --acl anyone who reaches the port may do anything, so by default it is reachable
    /// from this machine only.
    #[test]
    fn the_default_listen_address_is_loopback() {
        let cli = Cli::try_parse_from(["latchkey", "serve"]).unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        assert!(args.listen.ip().is_loopback(), "{}", args.listen);
    }
}
