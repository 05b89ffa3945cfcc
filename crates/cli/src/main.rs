//! `latchkey`: the server and the command-line client in one binary.
//!
//! Layout:
//! - this file: the command-line interface and the one place errors become exit codes;
//! - [`serve`]: `latchkey serve`, a thin wrapper around `latchkey_server::run`;
//! - [`lock`]: `latchkey lock`, running a command under a lock;
//! - [`query`]: `status`, `list` and `cluster status`;
//! - [`bench`]: the benchmark (workloads, its own cluster, server metrics);
//! - [`duration`]: `15s`-style durations.

mod bench;
mod duration;
mod lock;
mod logwriter;
mod query;
mod serve;

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
/// Exit status of every other failure (usage errors are clap's 2).
pub const EXIT_FAILURE: u8 = 1;

#[derive(Parser, Debug)]
#[command(
    name = "latchkey",
    version,
    about = "A distributed lock service with leases and fencing tokens"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a latchkey node (logs to stderr; stops cleanly on SIGINT/SIGTERM).
    Serve(ServeArgs),
    /// Wait for a lock, run COMMAND while holding it, release it when COMMAND ends.
    ///
    /// COMMAND gets LATCHKEY_LOCK=NAME and LATCHKEY_TOKEN=<fencing token> in its environment.
    /// If the lock may be lost, COMMAND gets SIGTERM at once and SIGKILL shortly after.
    /// Exit status: COMMAND's own (128+N if it died by signal N); 3 if the wait timed out;
    /// 4 if the lock was lost and COMMAND stopped; 5 if access control refused it; 1 for other
    /// errors; 2 for usage errors.
    Lock(LockArgs),
    /// Show one lock: holder (session, token, held for) and number of waiters.
    Status(StatusArgs),
    /// List held locks, optionally only those whose names start with PREFIX.
    List(ListArgs),
    /// Cluster-wide commands.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Measure throughput, latency, server cost, memory and failover time of a workload.
    Bench(BenchArgs),
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Ask every endpoint for its role, term and log indexes.
    Status(ClusterStatusArgs),
    /// Add a member: start it first with `latchkey serve --id ID --listen ADDR --join
    /// CLUSTER_ID` (the id `cluster status` prints) and an empty data dir. It catches up as a
    /// learner, then becomes a voter.
    Add(MemberAddrArgs),
    /// Remove a member (the leader too: another member then leads). Stop its process after.
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
pub struct MemberIdArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// The member's id.
    #[arg(value_parser = clap::value_parser!(u64).range(1..), value_name = "ID")]
    pub id: u64,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// This node's id (at least 1).
    #[arg(long, default_value_t = 1)]
    pub id: u64,
    /// Address to serve clients and peers on.
    #[arg(long, default_value = "127.0.0.1:7420")]
    pub listen: SocketAddr,
    /// Where the Raft log and snapshots live.
    #[arg(long, default_value = "./latchkey-data")]
    pub data_dir: PathBuf,
    /// The members that found the cluster, this node included: ID=HOST:PORT,... (default: a
    /// single-node cluster of just this node). Read when the data dir is new; afterwards the
    /// membership lives in the log and changes with `cluster add`/`remove`/`move`, and a list
    /// that founds another cluster than the data dir's is refused.
    #[arg(long, value_parser = serve::parse_members, value_name = "ID=ADDR,...")]
    pub peers: Option<serve::MemberList>,
    /// Join an existing cluster (its id, as `latchkey cluster status` prints it): with a new
    /// data dir this node founds nothing and waits until `latchkey cluster add ID=ADDR` adds
    /// it. Keep the flag on restarts.
    #[arg(long, value_name = "CLUSTER_ID", conflicts_with = "peers",
          value_parser = |s: &str| latchkey_server::peer_auth::ClusterId::parse(s))]
    pub join: Option<latchkey_server::peer_auth::ClusterId>,
    /// Dial these members at another address than their --peers one (a proxy): ID=ADDR,...
    #[arg(long, hide = true, value_parser = serve::parse_members, value_name = "ID=ADDR,...")]
    pub peer_dial: Option<serve::MemberList>,
    /// Raft heartbeat interval, in milliseconds.
    #[arg(long, default_value_t = latchkey_core::limits::HEARTBEAT_MS_DEFAULT)]
    pub heartbeat_ms: u64,
    /// Raft election timeout range MIN..MAX, in milliseconds.
    /// The default is `limits::ELECTION_TIMEOUT_MS_{MIN,MAX}_DEFAULT` (a test checks it).
    #[arg(long, default_value = "300..600", value_parser = serve::parse_ms_range, value_name = "MIN..MAX")]
    pub election_timeout_ms: (u64, u64),
    /// Serve Prometheus metrics at http://ADDR/metrics (and /healthz); off unless given.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
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
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The CA that signs members' and clients' certificates (PEM): every connection must then
    /// present a certificate it signed, and members dial each other with mTLS. Required for a
    /// cluster of more than one member over TLS.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// Access control (TOML): identities (bearer-token hashes, client-certificate names), their
    /// roles' permissions on lock-name prefixes, and their quotas. Without it every client may
    /// do anything. See README "Access control".
    #[arg(long, value_name = "FILE")]
    pub acl: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct Endpoints {
    /// Servers to talk to, comma-separated host:port.
    #[arg(
        long,
        env = "LATCHKEY_ENDPOINTS",
        value_delimiter = ',',
        default_value = "127.0.0.1:7420"
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

impl Endpoints {
    /// A client of these endpoints: with TLS for `https://` ones when --ca is given.
    pub fn client(&self) -> Result<latchkey_client::Client, latchkey_client::Error> {
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
    /// Give up waiting after this long (default: wait forever; 0: try once).
    #[arg(long, value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// The lock's name.
    pub name: String,
    /// The command to run under the lock, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub endpoints: Endpoints,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
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
    /// Start a cluster of 1, 3 or 5 `latchkey serve` processes on loopback in a temporary
    /// directory, and stop it afterwards.
    #[arg(long, value_parser = bench::parse_cluster_size, value_name = "N")]
    pub cluster: Option<usize>,
    /// The existing cluster's metrics addresses (HOST:PORT of each `--metrics-listen`), to
    /// report requests and log entries per operation.
    #[arg(long, value_delimiter = ',', value_name = "ADDR,...")]
    pub metrics_endpoints: Vec<String>,
    /// What to measure.
    #[arg(long, value_enum, default_value = "uncontended")]
    pub workload: bench::Workload,
    /// Clients, each with its own connection and session (default: 64; herd 500, hold 100,
    /// failover 8).
    #[arg(long)]
    pub clients: Option<usize>,
    /// Length of the measured window.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Load before the window, excluded from every figure.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Session lease of every client (renewed every third of it).
    #[arg(long, default_value = "15s", value_parser = parse_ttl)]
    pub ttl: Duration,
    /// hold: locks held in total, spread over the clients' sessions.
    #[arg(long, default_value_t = 10_000)]
    pub locks: usize,
    /// failover: leader kills.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
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
}

/// How long an exiting `latchkey lock` waits for its queued log lines to reach stderr.
const LOG_DRAIN_TIMEOUT: Duration = Duration::from_millis(500);

/// The one place an error becomes an exit status.
fn exit_code(error: &anyhow::Error) -> u8 {
    if let Some(Stopped::LockLost { .. }) = error.downcast_ref::<Stopped>() {
        return EXIT_LOCK_LOST;
    }
    match error.downcast_ref::<latchkey_client::Error>() {
        Some(latchkey_client::Error::WaitTimedOut { .. }) => EXIT_WAIT_TIMED_OUT,
        Some(latchkey_client::Error::PermissionDenied { .. }) => EXIT_PERMISSION_DENIED,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log = init_logging(
        match cli.command {
            // openraft's own lines (every vote, every replication retry) at warn: the node
            // logs what an operator needs (elections won, leases resumed, peers down and back).
            // Its heartbeat and replication retries to a member that is down are left out
            // (one line per retry, ten a second); `peer.rs` reports the member going down and
            // coming back instead.
            Command::Serve(_) => {
                "info,openraft=warn,openraft::core::heartbeat=error,openraft::replication=error,\
                 openraft::engine::handler::replication_handler=error"
            }
            // Client commands speak through their own messages; the library's warnings (failed
            // renewals) are still worth seeing.
            _ => "warn",
        },
        // `lock` shares stderr with COMMAND and must never block on it (see logwriter.rs).
        matches!(cli.command, Command::Lock(_)),
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
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve::serve(args).await.map(|()| 0),
            Command::Lock(args) => lock::lock(args).await,
            Command::Status(args) => query::status(args).await.map(|()| 0),
            Command::List(args) => query::list(args).await.map(|()| 0),
            Command::Cluster { command } => match command {
                ClusterCommand::Status(args) => query::cluster_status(args).await.map(|()| 0),
                ClusterCommand::Add(args) => query::cluster_add(args).await.map(|()| 0),
                ClusterCommand::Remove(args) => query::cluster_remove(args).await.map(|()| 0),
                ClusterCommand::Move(args) => query::cluster_move(args).await.map(|()| 0),
            },
            Command::Bench(args) => bench::bench(args).await.map(|()| 0),
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
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
    fn lock_without_command_or_with_bad_ttl_is_a_usage_error() {
        for argv in [
            &["latchkey", "lock", "a"][..],
            &["latchkey", "lock", "--ttl", "100ms", "a", "--", "true"][..],
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
    }

    #[test]
    fn bad_member_lists_are_usage_errors() {
        for peers in ["1=h:1,1=h:2", "1=h:1,x", "0=h:1"] {
            let e = Cli::try_parse_from(["latchkey", "serve", "--peers", peers]).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{peers}");
        }
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
