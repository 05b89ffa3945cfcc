//! `latchkey serve`: parse the cluster flags, check the configuration, bind, then hand over to
//! the server crate until SIGINT or SIGTERM.
//!
//! Order matters: the configuration is checked before anything touches the data dir, so a
//! refused start (exit 1) leaves no trace; the server then checks the member list the data dir
//! records before it writes anything.

use std::collections::BTreeMap;

use anyhow::Context;
use latchkey_server::acl::{Acl, AclPolicy, AclSource};
use latchkey_server::{ConfigError, ServerConfig, ValidConfig};
use tokio::net::TcpListener;

use crate::ServeArgs;

/// A member list on the command line: `ID=ADDR,ID=ADDR,...`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberList(pub BTreeMap<u64, String>);

/// Parses `1=10.0.0.1:7420,2=10.0.0.2:7420`. Refuses ids below 1, empty addresses and
/// duplicate ids, naming the offending entry (clap reports it as a usage error, exit 2).
pub fn parse_members(text: &str) -> Result<MemberList, String> {
    let mut members = BTreeMap::new();
    for entry in text.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(format!("empty entry in {text:?}; write ID=HOST:PORT,..."));
        }
        let (id, addr) = entry
            .split_once('=')
            .ok_or_else(|| format!("{entry:?} is not ID=HOST:PORT"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| format!("{entry:?}: the id must be a whole number"))?;
        if id == 0 {
            return Err(format!("{entry:?}: member ids start at 1"));
        }
        let addr = addr.trim();
        if addr.is_empty() || !addr.contains(':') {
            return Err(format!("{entry:?}: the address must be HOST:PORT"));
        }
        if let Some(first) = members.insert(id, addr.to_owned()) {
            return Err(format!(
                "member id {id} appears twice ({id}={first} and {entry}); ids must be unique"
            ));
        }
    }
    Ok(MemberList(members))
}

/// Parses a listen address: `IP:PORT`, or `HOST:PORT` resolved now (`localhost:7420`), to the
/// first address the resolver gives. A port is required: a server has no default one.
pub fn parse_listen(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let text = text.trim();
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!(
            "{text:?} has no port; write IP:PORT, e.g. 127.0.0.1:7420"
        ));
    };
    let Ok(port) = port.parse::<u16>() else {
        return Err(format!("{text:?} is not HOST:PORT, e.g. 127.0.0.1:7420"));
    };
    if host.is_empty() {
        return Err(format!("{text:?} is not HOST:PORT, e.g. 127.0.0.1:7420"));
    }
    match (host, port).to_socket_addrs().map(|mut addrs| addrs.next()) {
        Ok(Some(addr)) => Ok(addr),
        Ok(None) => Err(format!(
            "{host:?} resolves to no address; give an IP address, e.g. 0.0.0.0:{port}"
        )),
        Err(e) => Err(format!(
            "cannot resolve {host:?} ({e}); give an IP address, e.g. 0.0.0.0:{port}"
        )),
    }
}

/// Parses an election timeout range `MIN..MAX` in milliseconds, e.g. `1000..2000`.
pub fn parse_ms_range(text: &str) -> Result<(u64, u64), String> {
    let (min, max) = text
        .split_once("..")
        .ok_or_else(|| format!("{text:?} is not MIN..MAX (milliseconds, e.g. 1000..2000)"))?;
    let number = |s: &str| {
        s.trim()
            .parse::<u64>()
            .map_err(|_| format!("{s:?} in {text:?} is not a whole number of milliseconds"))
    };
    let (min, max) = (number(min)?, number(max)?);
    if min >= max {
        return Err(format!("{text:?}: MIN must be below MAX"));
    }
    Ok((min, max))
}

/// The server configuration the flags describe, checked: built and validated once, before
/// anything binds or touches the data dir. Its `listen` is the flag's; [`serve`] moves it to the
/// address the listener got.
pub fn config(args: &ServeArgs) -> Result<ValidConfig, ConfigError> {
    let mut config = ServerConfig::cluster(
        args.id,
        args.listen,
        args.data_dir.clone(),
        args.peers.clone().unwrap_or_default().0,
    );
    config.join = args.join.clone();
    config.peer_listen = args.peer_listen;
    config.peer_dial = args.peer_dial.clone().unwrap_or_default().0;
    config.heartbeat_ms = args.heartbeat_ms;
    config.coalesce = args.coalesce;
    config.table_bytes_max = args.table_bytes_max;
    config.groups = args.groups;
    config.replicas = args.replicas;
    config.rebalance_after_ms = args.rebalance_after_ms;
    config.snapshot_every_entries = args.snapshot_every_entries;
    config.log_kept_after_snapshot = args.log_kept_after_snapshot;
    config.metrics_listen = args.metrics_listen;
    config.http_listen = args.http_listen;
    config.http_allow_origins = args.http_allow_origin.clone();
    config.cluster_secret = args
        .cluster_secret_file
        .as_deref()
        .map(latchkey_server::peer_auth::read_secret_file)
        .transpose()
        .map_err(ConfigError::ClusterSecret)?;
    // Each may come from a flag, the environment or the config file, so clap cannot pair them.
    config.tls = match (&args.tls_cert, &args.tls_key) {
        (Some(_), None) => return Err(ConfigError::Tls("--tls-cert needs --tls-key".into())),
        (None, Some(_)) => return Err(ConfigError::Tls("--tls-key needs --tls-cert".into())),
        (None, None) if args.tls_ca.is_some() => {
            return Err(ConfigError::Tls(
                "--tls-ca needs --tls-cert and --tls-key".into(),
            ))
        }
        (Some(cert), Some(key)) => Some(
            latchkey_server::tls::ServerTls::load(latchkey_server::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: args.tls_ca.clone(),
            })
            .map_err(ConfigError::Tls)?,
        ),
        _ => None,
    };
    config.acl = match (&args.acl, &args.inline_acl) {
        (Some(path), Some(_)) => {
            return Err(ConfigError::Acl(format!(
                "two access-control lists: --acl {} (or LATCHKEY_ACL, or `acl = \"FILE\"`) and \
                 the config file's inline [acl]; give one",
                path.display()
            )))
        }
        (Some(path), None) => Some(
            AclPolicy::load(AclSource::File(path.clone()))
                .map_err(|e| ConfigError::Acl(e.to_string()))?,
        ),
        // Checked when the config file was read; parsed again from the same text, and reloaded
        // from the file's `[acl]` table.
        (None, Some(text)) => {
            let acl = Acl::parse(text).map_err(|e| {
                ConfigError::Acl(format!("the config file's inline access-control list: {e}"))
            })?;
            let file = args.config.clone().ok_or_else(|| {
                ConfigError::Acl("an inline access-control list without a config file".into())
            })?;
            Some(AclPolicy::loaded(acl, AclSource::ConfigFile(file)))
        }
        (None, None) => None,
    }
    .map(std::sync::Arc::new);
    (
        config.election_timeout_min_ms,
        config.election_timeout_max_ms,
    ) = args.election_timeout_ms;
    config.plant = test_plant(
        std::env::var_os(TEST_PLANT_VAR).as_deref(),
        cfg!(debug_assertions),
    )?;
    config.validate()
}

/// The environment variable that puts a fixed server bug back in a debug build, for the
/// nemesis (`crates/nemesis`, `run --server-plant`) to prove its checks catch it on real
/// processes. Deliberately not a flag: no `--help`, no config-file key, no reference page.
pub const TEST_PLANT_VAR: &str = "LATCHKEY_TEST_PLANT";

/// The planted bugs [`TEST_PLANT_VAR`] may name (`latchkey_server::Plant`'s switches). Only
/// those a nemesis test shows its checks catch are here.
pub(crate) const TEST_PLANTS: &[&str] = &["renew-without-quorum"];

/// The bug [`TEST_PLANT_VAR`] plants, if set: only in a debug build (`debug_build`, which
/// [`config`] gives as `cfg!(debug_assertions)`). A release build (what users install and
/// packages ship) refuses to start with it set, rather than ignore it, so that a leftover
/// variable is seen at once and a lock service that breaks its own guarantee can never be
/// started by an environment variable; `cfg!` is a constant, so the release build's planting
/// branch is dead code. CI's nemesis runs the debug binary (`.ci/run`, stage nemesis).
pub fn test_plant(
    value: Option<&std::ffi::OsStr>,
    debug_build: bool,
) -> Result<latchkey_server::Plant, ConfigError> {
    let Some(value) = value else {
        return Ok(latchkey_server::Plant::default());
    };
    if !debug_build {
        return Err(ConfigError::TestPlant(format!(
            "{TEST_PLANT_VAR} is set: it puts a fixed bug back for tests, and only a debug \
             build accepts it; unset it"
        )));
    }
    match value.to_str() {
        Some("renew-without-quorum") => Ok(latchkey_server::Plant {
            renew_without_quorum: true,
            ..latchkey_server::Plant::default()
        }),
        _ => Err(ConfigError::TestPlant(format!(
            "{TEST_PLANT_VAR}={value:?} names no planted bug; known: {}",
            TEST_PLANTS.join(", ")
        ))),
    }
}

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Refuse a bad configuration before binding or touching the data dir.
    let config = config(&args).context("refusing to start")?;
    if let Some(mine) = config.peers.get(&config.id) {
        let mine = latchkey_server::member_addr::MemberAddr::split(mine).client;
        if config.listen.port() != 0 && mine.parse().ok() != Some(config.listen) {
            // Not fatal (NAT, 0.0.0.0), but usually a typo that leaves the node unreachable.
            tracing::warn!(
                "--listen {} differs from this node's address {mine} in --peers",
                config.listen
            );
        }
    }
    if config.peers.len() > 1 && config.cluster_secret.is_none() {
        tracing::warn!(
            "peers are not authenticated: anyone who reaches {} can send Raft messages as a \
             member (give every member --cluster-secret-file FILE)",
            config.peer_listen.unwrap_or(config.listen)
        );
    }
    let client_addrs = std::iter::once(config.listen).chain(config.http_listen);
    for addr in client_addrs.filter(|a| config.acl.is_none() && !a.ip().is_loopback()) {
        tracing::warn!(
            "WARNING: serving clients on {addr} without authentication: anyone who reaches this \
             address can take, release and list every lock (give --acl FILE, see \
             docs/securing.md, \"Access control\")"
        );
    }
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    // With port 0 the kernel picks one; record the real address.
    let listen = listener
        .local_addr()
        .context("reading the listen address")?;
    let shutdown = shutdown_signal().context("installing signal handlers")?;
    // SIGHUP: reload the certificate, key and CA, and the access-control list, now (rotation
    // and access changes without a restart). Handled with or without them: its default action
    // ends the process, and `systemctl reload` sends it to any member. The task ends with the
    // process.
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing signal handlers")?;
    let reloadable = latchkey_server::reload::Reloadable::of(&config);
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            let files = reloadable.clone();
            let _ = tokio::task::spawn_blocking(move || files.reload("SIGHUP")).await;
        }
    });
    latchkey_server::run(listener, config.listening_on(listen), shutdown).await
}

/// Completes on the first SIGINT or SIGTERM.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
            _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_parse_and_refuse_duplicates_and_junk() {
        let m = parse_members("1=a:1, 2=b:2,3=b:3").unwrap();
        assert_eq!(m.0.len(), 3);
        assert_eq!(m.0[&2], "b:2");
        let dup = parse_members("1=a:1,2=b:2,1=c:3").unwrap_err();
        assert!(dup.contains("member id 1 appears twice"), "{dup}");
        for bad in ["", "1=a:1,", "x=a:1", "0=a:1", "1", "1=", "1=nohostport"] {
            assert!(parse_members(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn listen_addresses_resolve_and_need_a_port() {
        assert_eq!(
            parse_listen("127.0.0.1:7420"),
            Ok("127.0.0.1:7420".parse().unwrap())
        );
        let local = parse_listen("localhost:7420").expect("localhost resolves");
        assert!(local.ip().is_loopback() && local.port() == 7420, "{local}");
        for bad in [
            "localhost",
            "127.0.0.1",
            ":7420",
            "localhost:x",
            "localhost:70000",
        ] {
            assert!(parse_listen(bad).is_err(), "{bad:?}");
        }
        let e = parse_listen("no-such-host.invalid:7420").unwrap_err();
        assert!(e.contains("give an IP address"), "{e}");
    }

    /// `LATCHKEY_TEST_PLANT` plants in a debug build only; a release build refuses to start
    /// with it set, whatever it names.
    #[test]
    fn the_test_plant_is_refused_by_a_release_build() {
        use std::ffi::OsStr;
        let quorum = Some(OsStr::new("renew-without-quorum"));
        assert!(test_plant(quorum, true).unwrap().renew_without_quorum);
        assert_eq!(test_plant(None, true).unwrap(), Default::default());
        assert_eq!(test_plant(None, false).unwrap(), Default::default());
        for value in [quorum, Some(OsStr::new("")), Some(OsStr::new("x"))] {
            let e = test_plant(value, false).unwrap_err().to_string();
            assert!(e.contains("only a debug build accepts it"), "{e}");
        }
        let e = test_plant(Some(OsStr::new("renew")), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("names no planted bug"), "{e}");
    }

    #[test]
    fn election_timeout_is_a_range() {
        assert_eq!(parse_ms_range("1000..2000"), Ok((1000, 2000)));
        assert!(parse_ms_range("2000..1000").is_err());
        assert!(parse_ms_range("1000").is_err());
        assert!(parse_ms_range("a..b").is_err());
    }
}
