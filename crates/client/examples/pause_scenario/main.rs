//! The process-pause scenario, narrated: why a lock needs a fencing token at the resource.
//!
//! ```text
//! cargo run -p latchkey-client --example pause_scenario
//! cargo run -p latchkey-client --example pause_scenario -- --endpoints 127.0.0.1:7420
//! ```
//!
//! Worker A (a second process) takes a lock and writes to a fenced key-value store; then it is
//! frozen with SIGSTOP for longer than its lease. Worker B gets the lock with a higher token
//! and writes. A resumes: its client library reports the lock lost, but the write A had on its
//! way still goes out, with the old token, and the store refuses it.
//!
//! Without `--endpoints` the latchkey node runs inside this process on a loopback port; with
//! it, the scenario uses your cluster (a `latchkey serve`). Exit status 0 when every step went
//! as described, 1 otherwise. `tests/fencing_pause.rs` asserts the same steps.

mod scenario;

use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: pause_scenario [--endpoints HOST:PORT[,HOST:PORT...]]
  --endpoints LIST   use this latchkey cluster; default: a node in this process";

fn main() -> ExitCode {
    if scenario::is_worker() {
        // This is worker A, started by the scenario below.
        return match scenario::worker_a() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("worker A: {e:#}");
                ExitCode::FAILURE
            }
        };
    }

    let mut endpoints = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--endpoints", Some(list)) => {
                endpoints = Some(list.split(',').map(str::to_owned).collect())
            }
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("pause_scenario: cannot find my own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let config = scenario::Config {
        endpoints,
        // Short, so the scenario takes seconds; a renewal every 2/3 s keeps it safe meanwhile.
        ttl: Duration::from_secs(2),
        lock: "pause-scenario/orders".to_owned(),
        key: "orders".to_owned(),
        worker: std::process::Command::new(exe),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("pause_scenario: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(scenario::run(&config, &|line| println!("{line}")));
    match result.and_then(|report| report.check()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pause_scenario: the scenario did not go as described: {e:#}");
            ExitCode::FAILURE
        }
    }
}
