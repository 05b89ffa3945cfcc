//! One latchkey node served by this process: `latchkey_server::run` on a loopback listener,
//! stopped through its shutdown future.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use latchkey_proto::v1 as pb;
use latchkey_proto::v1::locks_client::LocksClient;
use latchkey_server::ServerConfig;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::wait::wait_until_async;

/// How long a node gets to stop once told to (it drains its tasks and closes its stores).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// A single-member latchkey node running in this process. Dropping it stops the node too (the
/// shutdown sender goes with it), but only [`Node::stop`] waits for that and reports how it went.
pub struct Node {
    /// The client address.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
    /// The data dir's temporary parent, when the node made its own.
    _dir: Option<tempfile::TempDir>,
}

impl Node {
    /// Starts a node on a free loopback port with its data in a temporary directory of its own,
    /// removed when the node drops.
    pub async fn start() -> anyhow::Result<Node> {
        Node::start_with(|_| {}).await
    }

    /// [`Node::start`], with `tweak` applied to the configuration as [`Node::start_in`] does.
    pub async fn start_with(tweak: impl FnOnce(&mut ServerConfig)) -> anyhow::Result<Node> {
        let dir = tempfile::tempdir().context("temp dir")?;
        let data_dir = dir.path().join("data");
        std::fs::create_dir_all(&data_dir).context("creating the data dir")?;
        let mut node = Node::start_in(&data_dir, None, tweak).await?;
        node._dir = Some(dir);
        Ok(node)
    }

    /// Starts a node with its data in `data_dir` (kept: a restart on the same dir sees it), on
    /// `addr` or a free loopback port, with `tweak` applied to the default single-member
    /// configuration before it is validated.
    pub async fn start_in(
        data_dir: &Path,
        addr: Option<SocketAddr>,
        tweak: impl FnOnce(&mut ServerConfig),
    ) -> anyhow::Result<Node> {
        let listener = tokio::net::TcpListener::bind(addr.unwrap_or(([127, 0, 0, 1], 0).into()))
            .await
            .context("binding the node's listener")?;
        let addr = listener.local_addr()?;
        let mut config = ServerConfig::single(1, addr, PathBuf::from(data_dir));
        tweak(&mut config);
        let config = config.validate()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(latchkey_server::run(listener, config, async move {
            // A dropped sender stops the node too.
            let _ = stopped.await;
        }));
        Ok(Node {
            addr,
            stop: Some(stop),
            task: Some(task),
            _dir: None,
        })
    }

    /// The address a client dials (`HOST:PORT`).
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// A raw gRPC client of this node, once the node leads and has applied an entry of its term
    /// (so it serves reads); an error after `timeout`, or as soon as the node stops on its own.
    pub async fn ready_client(
        &mut self,
        timeout: Duration,
    ) -> anyhow::Result<LocksClient<Channel>> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))?
            .connect_lazy();
        let client = LocksClient::new(channel);
        let task = self.task.as_ref().context("the node was stopped")?;
        let waited = wait_until_async("the node to lead", timeout, || {
            let mut client = client.clone();
            async move {
                if task.is_finished() {
                    return true;
                }
                matches!(
                    client.node_status(pb::NodeStatusRequest {}).await,
                    Ok(s) if s.get_ref().role == "leader" && s.get_ref().applied_index > 0
                )
            }
        })
        .await;
        if task.is_finished() {
            let task = self.task.take().expect("checked above");
            let result = task.await.context("the node's task")?;
            anyhow::bail!("the node stopped on its own: {result:?}");
        }
        waited?;
        Ok(client)
    }

    /// Tells the node to stop and waits (at most [`STOP_TIMEOUT`]) for `run` to return; its
    /// result.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take().context("the node was already stopped")?;
        tokio::time::timeout(STOP_TIMEOUT, task)
            .await
            .with_context(|| format!("the node did not stop within {STOP_TIMEOUT:?}"))?
            .context("the node's task")?
    }
}

/// The text of a member's `/metrics` at `metrics_addr` (its `--metrics-listen`), read with a
/// plain HTTP/1.0 GET (bounded by a 10-s read timeout).
pub async fn scrape_metrics(metrics_addr: SocketAddr) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(metrics_addr)?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
    .await?
}

/// The value of the counter line `name` (with its labels, e.g. `x_total{method="batch"}`) in
/// a `/metrics` text; 0 when the line is absent (a labelled counter never incremented).
pub fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .map_or(0, |v| v.trim().parse().expect("a counter's value"))
}
