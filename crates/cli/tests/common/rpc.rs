//! In-process observation of a cluster, for tests that must look more often or more precisely
//! than a `latchkey` CLI process per question allows.
//!
//! - [`runtime`]: the tokio runtime a test drives its in-process clients with.
//! - [`pinned`]: a raw gRPC `Locks` client that talks to one member only (the client library
//!   would follow leader hints), and [`reason`], the `latchkey-error` of a status.
//! - [`Observer`]: every member's own `NodeStatus`, asked concurrently with a short deadline, so
//!   a paused member costs one timeout, not a stalled test.

use std::time::Duration;

use latchkey_client::{Client, ClientConfig, NodeStatus, RetryPolicy};
use latchkey_proto::v1::locks_client::LocksClient;
use tonic::transport::{Channel, Endpoint};

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A raw gRPC client for `addr` alone; connects lazily (on the first call).
pub fn pinned(rt: &tokio::runtime::Runtime, addr: &str) -> LocksClient<Channel> {
    let _in_runtime = rt.enter();
    LocksClient::new(
        Endpoint::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect_timeout(Duration::from_secs(1))
            .connect_lazy(),
    )
}

/// A request with a deadline (sent to the server as `grpc-timeout`).
pub fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

/// The stable reason a server put on an error (`latchkey-error` metadata).
pub fn reason(status: &tonic::Status) -> Option<String> {
    status
        .metadata()
        .get(latchkey_proto::ERROR_REASON_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Asks members for their own status, each once, with a short deadline.
pub struct Observer {
    client: Client,
}

impl Observer {
    /// `timeout`: how long one member may take to answer before it counts as silent.
    pub fn new(seed: &str, timeout: Duration) -> Observer {
        let config = ClientConfig {
            connect_timeout: timeout,
            rpc_timeout: timeout,
            retry: RetryPolicy {
                attempts_max: 1,
                elapsed_max: timeout,
                unreachable_max: timeout,
                backoff_initial: Duration::from_millis(10),
                backoff_max: Duration::from_millis(10),
            },
            auth_token: None,
            batch: false,
            ..ClientConfig::default()
        };
        Observer {
            client: Client::with_config([seed], config).expect("observer client"),
        }
    }

    /// Each of `addrs` asked at once: its status, or `None` if it did not answer in time.
    pub fn statuses(
        &self,
        rt: &tokio::runtime::Runtime,
        addrs: &[String],
    ) -> Vec<Option<NodeStatus>> {
        rt.block_on(async {
            let asks = addrs.iter().map(|a| {
                let (client, a) = (self.client.clone(), a.clone());
                async move { client.node_status(&a).await.ok() }
            });
            futures_join_all(asks).await
        })
    }
}

/// `join_all` without a futures dependency: spawn each and collect in order.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("status task"));
    }
    out
}
