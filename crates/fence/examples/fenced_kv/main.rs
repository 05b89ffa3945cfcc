//! A fenced key-value store over HTTP: every write must carry a latchkey fencing token.
//!
//! ```text
//! cargo run -p latchkey-fence --example fenced_kv -- [--listen ADDR] [--data-dir DIR]
//! curl -X PUT -H 'latchkey-lock: demo' -H 'latchkey-token: 7' --data 'hello' http://127.0.0.1:7430/kv/greeting
//! curl http://127.0.0.1:7430/kv/greeting
//! ```
//!
//! With `--data-dir` the highest token per lock survives a restart (the durable gate); without
//! it they live in memory. Each write attempt is printed as one line on stdout. Stop it with
//! Ctrl-C: every admitted token is already fsynced, so there is nothing to flush.
//!
//! All the logic lives in `service.rs` beside this file; this file only parses arguments.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;

use latchkey_fence::{DurableConfig, DurableGate, FenceGate, MemoryGate};
use service::{limits, run, FencedKv, ServerConfig, Shutdown};

// Also compiled into tests (`tests/http.rs`, `latchkey-testkit`), which use parts `main` does not.
#[allow(dead_code)]
mod service;

const USAGE: &str = "usage: fenced_kv [--listen ADDR] [--data-dir DIR]
  --listen ADDR    address to serve on (default 127.0.0.1:7430)
  --data-dir DIR   keep the highest token per lock in DIR (durable gate); default: in memory";

struct Args {
    listen: String,
    data_dir: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        listen: "127.0.0.1:7430".to_owned(),
        data_dir: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--listen" => args.listen = it.next().ok_or("--listen needs an address")?,
            "--data-dir" => {
                args.data_dir = Some(it.next().ok_or("--data-dir needs a directory")?.into())
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

fn serve<G: FenceGate>(gate: G, listener: TcpListener) -> std::io::Result<()> {
    let kv = FencedKv::new(gate, limits::KV_KEYS_MAX);
    let shutdown = Shutdown::new(&listener)?;
    run(
        listener,
        &kv,
        &ServerConfig::default(),
        &shutdown,
        &|event| println!("{event}"),
    )
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("fenced_kv: {message}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let listener = match TcpListener::bind(&args.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fenced_kv: cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = listener
        .local_addr()
        .map_or_else(|_| args.listen.clone(), |a| a.to_string());
    let result = match &args.data_dir {
        Some(dir) => match DurableGate::open(dir, DurableConfig::default()) {
            Ok(gate) => {
                println!(
                    "fenced_kv listening on http://{addr} (durable gate in {})",
                    dir.display()
                );
                serve(gate, listener)
            }
            Err(e) => {
                eprintln!("fenced_kv: cannot open the gate: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => {
            println!("fenced_kv listening on http://{addr} (in-memory gate)");
            serve(MemoryGate::new(), listener)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fenced_kv: {e}");
            ExitCode::FAILURE
        }
    }
}
