//! `latchkey-nemesis run`: a Jepsen-style run on real processes (see the library's docs);
//! `latchkey-nemesis worker`: one client worker, started by `run` inside its namespace.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use latchkey_nemesis::cli_worker::{self, CliPlant, CliWorkerArgs, HoldArgs};
use latchkey_nemesis::members::ServerPlant;
use latchkey_nemesis::run::{run, RunConfig};
use latchkey_nemesis::schedule::{self, FaultKind};
use latchkey_nemesis::worker::{self, Plant, WorkerArgs};

#[derive(Parser)]
#[command(
    name = "latchkey-nemesis",
    about = "Faults on real latchkey processes, every history checked (needs root)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A run: members and workers in network namespaces, faults, then the checks. Exit status
    /// 0 with no violation, 1 with one, 2 if the run could not be made.
    Run(RunArgs),
    /// Check the workers' histories a kept run left in DIR again (no two holders at one
    /// time, token order, each lock's linearizability; not the resources'). Exit status 0
    /// with no violation, 1 with one, 2 if the histories could not be read.
    Check {
        /// The run's directory (`run --dir`, or the one a failed run kept).
        dir: PathBuf,
    },
    /// One client worker (started by `run`).
    #[command(hide = true)]
    Worker(WorkerArgs),
    /// One client worker that runs `latchkey lock` (started by `run`).
    #[command(hide = true)]
    CliWorker(CliWorkerArgs),
    /// The critical section, as COMMAND of a CLI worker's `latchkey lock`.
    #[command(hide = true)]
    Hold(HoldArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// The latchkey binary (e.g. target/release/latchkey).
    #[arg(long)]
    latchkey: PathBuf,
    /// Run every fault kind once, in a fixed order (the CI mode, about two minutes), instead
    /// of a random schedule.
    #[arg(long, conflicts_with = "minutes")]
    ci: bool,
    /// How long each fault of the `--ci` schedule lasts, in seconds (a worker pause always
    /// lasts twice the lease and a second).
    #[arg(long, default_value_t = 6, requires = "ci")]
    fault_secs: u64,
    /// Length of a random schedule.
    #[arg(long, default_value_t = 10)]
    minutes: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Only these fault kinds (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Vec<FaultKind>,
    #[arg(long, default_value_t = 3)]
    members: u32,
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Client workers that are the real CLI, `latchkey lock NAME -- COMMAND` run again and
    /// again (each in its own namespace too), besides the `--workers` of the Rust client.
    #[arg(long, default_value_t = 0)]
    cli_workers: u32,
    #[arg(long, default_value_t = 2)]
    locks: u32,
    /// Raft groups the members split the lock names over (`serve --groups`).
    #[arg(long, default_value_t = 1)]
    groups: u32,
    /// The workers' session lease, in seconds.
    #[arg(long, default_value_t = 3)]
    ttl_secs: u64,
    /// A bug planted in the workers, which the checks must catch.
    #[arg(long, value_enum)]
    plant: Option<Plant>,
    /// A bug planted in the members, which the checks must catch. Only a debug build of
    /// `latchkey` accepts it (a release build refuses to start).
    #[arg(long, value_enum)]
    server_plant: Option<ServerPlant>,
    /// A bug planted in the CLI workers' `latchkey lock`, which the checks must catch. Only
    /// a debug build of `latchkey` accepts it.
    #[arg(long, value_enum)]
    cli_plant: Option<CliPlant>,
    /// How long each worker's critical section lasts between its two hold checks, in
    /// milliseconds.
    #[arg(long, default_value_t = 300)]
    hold_ms: u64,
    /// Keep the logs and histories here (default: a temporary directory, kept if the run fails).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Run without the PostgreSQL resource (for a machine without Debian's postgresql).
    #[arg(long)]
    no_postgres: bool,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Check { dir } => match latchkey_nemesis::check::kept_run(&dir) {
            Ok((operations, violations)) => {
                println!("operations {operations}");
                println!("violations: {}", violations.len());
                for v in violations.iter().take(20) {
                    println!("  {v}");
                }
                if violations.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }
            Err(e) => {
                eprintln!("check: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Worker(args) => match worker::main(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("worker: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::CliWorker(args) => match cli_worker::main(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cli worker: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Hold(args) => match cli_worker::hold(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("hold: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Run(args) => {
            let ttl = Duration::from_secs(args.ttl_secs);
            let hold = Duration::from_millis(args.hold_ms);
            let kinds = if args.faults.is_empty() {
                FaultKind::ALL.to_vec()
            } else {
                args.faults.clone()
            };
            let faults = if args.ci {
                schedule::fixed(
                    &kinds,
                    Duration::from_secs(args.fault_secs),
                    Duration::from_secs(4),
                    ttl,
                )
            } else {
                schedule::random(
                    args.seed,
                    &kinds,
                    Duration::from_secs(args.minutes * 60),
                    ttl,
                )
            };
            let config = RunConfig {
                latchkey: args.latchkey,
                members: args.members,
                workers: args.workers,
                cli_workers: args.cli_workers,
                locks: args.locks,
                groups: args.groups,
                faults,
                seed: args.seed,
                ttl,
                plant: args.plant,
                server_plant: args.server_plant,
                cli_plant: args.cli_plant,
                hold,
                settle: ttl * 2 + Duration::from_secs(3),
                // Acquires invoked in its last 11 s (a wait and a second) are not judged; the
                // time before (at least 4 s) must see a worker invoke one even after it waited
                // behind a holder, whose critical section may be long (`--hold-ms`).
                liveness: Duration::from_secs(15).max(Duration::from_secs(11) + hold * 2),
                dir: args.dir,
                postgres: !args.no_postgres,
            };
            match run(&config) {
                Ok(report) => {
                    print!("{}", report.summary());
                    if report.violations.is_empty() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    }
                }
                Err(e) => {
                    eprintln!("nemesis: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
