//! `latchkey serve`: bind, then hand over to the server crate until SIGINT or SIGTERM.

use anyhow::Context;
use latchkey_server::ServerConfig;
use tokio::net::TcpListener;

use crate::ServeArgs;

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    // With port 0 the kernel picks one; record the real address.
    let listen = listener
        .local_addr()
        .context("reading the listen address")?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create data directory {}", args.data_dir.display()))?;
    let config = ServerConfig::single(args.id, listen, args.data_dir);
    let shutdown = shutdown_signal().context("installing signal handlers")?;
    latchkey_server::run(listener, config, shutdown).await
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
