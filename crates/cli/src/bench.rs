//! `latchkey bench`: acquire/release cycles from a few sessions at once; prints the rate and
//! the latency of one cycle. A rough tool for a first number, not a benchmark harness.

use std::time::{Duration, Instant};

use anyhow::Context;
use latchkey_client::Client;
use latchkey_core::limits::SESSION_TTL_MS_DEFAULT;

use crate::BenchArgs;

pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency >= 1, "--concurrency must be at least 1");
    anyhow::ensure!(args.ops >= 1, "--ops must be at least 1");
    anyhow::ensure!(
        args.concurrency as usize <= latchkey_core::limits::WAITERS_PER_LOCK_MAX,
        "--concurrency is above the server's waiters per lock"
    );
    let client = Client::connect(args.endpoints.endpoints.clone()).await?;
    let per_worker = args.ops.div_ceil(u64::from(args.concurrency));
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..args.concurrency {
        let client = client.clone();
        let name = if args.shared {
            format!("{}shared", args.prefix)
        } else {
            format!("{}{worker}", args.prefix)
        };
        workers.spawn(async move {
            let session = client
                .session(Duration::from_millis(SESSION_TTL_MS_DEFAULT))
                .await
                .context("opening a session")?;
            let mut latencies = Vec::with_capacity(per_worker as usize);
            for _ in 0..per_worker {
                let t = Instant::now();
                let guard = session.lock(name.clone()).wait(None).await?;
                guard.release().await?;
                latencies.push(t.elapsed());
            }
            session.close().await?;
            anyhow::Ok(latencies)
        });
    }
    let mut latencies = Vec::new();
    while let Some(joined) = workers.join_next().await {
        latencies.extend(joined??);
    }
    let elapsed = start.elapsed();
    latencies.sort();
    let pct = |p: usize| latencies[(latencies.len() * p / 100).min(latencies.len() - 1)];
    println!(
        "{} acquire/release cycles in {:.2}s from {} sessions ({}): {:.0} cycles/s; latency p50 {:.2} ms, p99 {:.2} ms",
        latencies.len(),
        elapsed.as_secs_f64(),
        args.concurrency,
        if args.shared { "one shared lock" } else { "one lock each" },
        latencies.len() as f64 / elapsed.as_secs_f64(),
        pct(50).as_secs_f64() * 1e3,
        pct(99).as_secs_f64() * 1e3,
    );
    Ok(())
}
