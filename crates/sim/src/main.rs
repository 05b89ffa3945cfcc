//! `latchkey-sim`: sweep seeds or replay one.
//!
//! ```text
//! cargo run --release -p latchkey-sim -- --seeds N [--start S]
//! cargo run --release -p latchkey-sim -- --reproduce SEED
//! ```

use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: latchkey-sim --seeds N [--start S] | --reproduce SEED");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| -> Option<Option<u64>> {
        let i = args.iter().position(|a| a == name)?;
        Some(args.get(i + 1).and_then(|v| v.parse().ok()))
    };
    let seeds: Vec<u64> = match (value("--reproduce"), value("--seeds"), value("--start")) {
        (Some(Some(seed)), None, None) => vec![seed],
        (None, Some(Some(n)), start) => {
            let start = match start {
                None => 0,
                Some(Some(s)) => s,
                Some(None) => return usage(),
            };
            (start..start + n).collect()
        }
        _ => return usage(),
    };
    let mut failed = Vec::new();
    for seed in seeds {
        if !latchkey_sim::sweep::run_seed(seed).ok() {
            failed.push(seed);
        }
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("failed seeds: {failed:?}");
        ExitCode::FAILURE
    }
}
