//! `latchkey-sim`: sweep seeds or replay one.
//!
//! ```text
//! cargo run --release -p latchkey-sim -- --seeds N [--start S]
//! cargo run --release -p latchkey-sim -- --reproduce SEED
//! ```
//!
//! `--groups G` runs each seed in a cluster of G Raft groups (issue #16; a seed's own shape
//! has one). `--replicas R` (3 or 4) places each group on R nodes of five (the seed's own
//! node count is replaced by 5), so that members outside a group meet clients.
//!
//! `--show-config` prints each seed's configuration without running it.
//! `--plant stale-mark|resume-early|renew-without-quorum` puts a fixed lease bug back (issue
//! #9, bugs 1 and 2; a keepalive answered without a quorum's confirmation) in every run, to
//! find seeds that catch it; `--plant permit-freed-twice|reader-past-writer|
//! writer-beside-readers|writer-token-reused` one of the lock table's read-write lock and
//! semaphore bugs (issue #32, `latchkey_core::TablePlant`). `--primitives` gives every seed a
//! read-write lock and a semaphore (half the seeds have them in their own shape);
//! `--no-primitives` takes them from every seed (the lease plants' seeds were found without).
//! `--lock-delay` has half the clients' mutex acquires ask for a 1-3 s lock-delay (issue #32
//! item 4, `RunConfig::lock_delay`; off in every seed's own shape), and `--plant
//! delay-ends-early` has the leader end each delay at half its length (`Plant::
//! delay_ends_early`), which the `lock_delay` checker must catch. `--elections` has the
//! clients campaign in an election, proclaim, resign and read its leader (issue #32 item 1,
//! `RunConfig::elections`; off in every seed's own shape), and `--plant proclaim-past-term`
//! has the table accept a proclaim under an ended term's token (`TablePlant::
//! proclaim_past_term`), which the `election` checker must catch; so must it `--plant
//! refused-proclaim-applied` (a refused proclaim's value published), `--plant
//! proclaim-kept-old-value` (an acknowledged proclaim that keeps the term's old value) and
//! `--plant leader-hidden-while-contended` (a read finding no leader while candidates wait).
//! `--coalesce` turns the leader's batch entries (issue #35, `RunConfig::coalesce`: on in the
//! odd seeds' own shape) on for every seed, `--no-coalesce` off; `--plant
//! batch-answers-reversed` has the leader hand a batch's answers to its callers newest first
//! (`Plant::batch_answers_reversed`), which the checkers must catch. `--client-batch` has the
//! clients batch their operations (issue #35, `RunConfig::client_batch`: on in the seeds whose
//! `seed / 2` is odd) in every seed, `--no-client-batch` in none.

use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: latchkey-sim (--seeds N [--start S] | --reproduce SEED) [--groups G] [--replicas R] \
         [--plant stale-mark|resume-early|renew-without-quorum|permit-freed-twice|\
         reader-past-writer|writer-beside-readers|writer-token-reused|delay-ends-early|\
         proclaim-past-term|refused-proclaim-applied|proclaim-kept-old-value|\
         leader-hidden-while-contended|batch-answers-reversed] [--primitives|--no-primitives] \
         [--lock-delay] [--elections] [--coalesce|--no-coalesce] \
         [--client-batch|--no-client-batch] [--show-config]"
    );
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
    let mut plant = latchkey_server::Plant::default();
    if let Some(i) = args.iter().position(|a| a == "--plant") {
        match args.get(i + 1).map(String::as_str) {
            Some("stale-mark") => plant.stale_mark_after_install = true,
            Some("resume-early") => plant.resume_before_applied = true,
            Some("renew-without-quorum") => plant.renew_without_quorum = true,
            Some("permit-freed-twice") => plant.table.permit_freed_twice = true,
            Some("reader-past-writer") => plant.table.reader_past_writer = true,
            Some("writer-beside-readers") => plant.table.writer_beside_readers = true,
            Some("writer-token-reused") => plant.table.writer_token_reused = true,
            Some("delay-ends-early") => plant.delay_ends_early = true,
            Some("batch-answers-reversed") => plant.batch_answers_reversed = true,
            Some("proclaim-past-term") => plant.table.proclaim_past_term = true,
            Some("refused-proclaim-applied") => plant.table.refused_proclaim_applied = true,
            Some("proclaim-kept-old-value") => plant.table.proclaim_kept_old_value = true,
            Some("leader-hidden-while-contended") => {
                plant.table.leader_hidden_while_contended = true
            }
            _ => return usage(),
        }
    }
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
    let groups = match value("--groups") {
        None => 1,
        Some(Some(g)) if (1..=u64::from(latchkey_core::limits::GROUPS_MAX)).contains(&g) => {
            g as u32
        }
        Some(_) => return usage(),
    };
    // Every node must be in some group (`check_replicas`): groups + replicas - 1 >= 5.
    let replicas = match value("--replicas") {
        None => 0,
        Some(Some(r)) if (3..=4).contains(&r) && u64::from(groups) + r > 5 => r as u32,
        Some(_) => return usage(),
    };
    let mut failed = Vec::new();
    let mut reached = latchkey_sim::coverage::Coverage::default();
    let (count, started) = (seeds.len(), std::time::Instant::now());
    for seed in seeds {
        let mut config = latchkey_sim::RunConfig::from_seed(seed);
        config.plant = plant;
        config.groups = groups;
        if args.iter().any(|a| a == "--no-primitives") {
            // Mutexes only, as every seed ran before issue #32 (the lease plants' seeds).
            config.primitives = None;
        }
        if args.iter().any(|a| a == "--primitives") && config.primitives.is_none() {
            // Every seed with a read-write lock and a semaphore (the plant hunts of issue #32).
            config.primitives = Some(latchkey_sim::config::Primitives::GIVEN);
        }
        if args.iter().any(|a| a == "--lock-delay") {
            // Half the mutex acquires ask for a lock-delay (the lock-delay plant's hunts).
            config.lock_delay = true;
        }
        if args.iter().any(|a| a == "--elections") {
            // The clients campaign in an election too (the election plant's hunts).
            config.elections = true;
        }
        if args.iter().any(|a| a == "--coalesce") {
            // Every seed with the leader's batch entries (the batching plant's hunts).
            config.coalesce = true;
        }
        if args.iter().any(|a| a == "--no-coalesce") {
            // No batch entries, as every seed ran before issue #35's coalescing.
            config.coalesce = false;
        }
        if args.iter().any(|a| a == "--client-batch") {
            // Every seed's clients batch their operations (issue #35).
            config.client_batch = true;
        }
        if args.iter().any(|a| a == "--no-client-batch") {
            // No client batches, as every seed ran before issue #35's defaults.
            config.client_batch = false;
        }
        if replicas != 0 {
            config.nodes = 5;
            config.replicas = replicas;
        }
        if args.iter().any(|a| a == "--show-config") {
            println!("{config:?}");
            continue;
        }
        let report = latchkey_sim::sweep::run_config(&config);
        reached.add(&report.coverage);
        if !report.ok() {
            failed.push(seed);
        }
    }
    println!(
        "{count} seeds in {:.0}s, {} failed; reached in all: {reached}",
        started.elapsed().as_secs_f64(),
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("failed seeds: {failed:?}");
        ExitCode::FAILURE
    }
}
