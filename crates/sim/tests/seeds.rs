//! The CI seeds: a fixed set of seeded simulations (safety phase with faults, then liveness),
//! each checked by every checker. About 25–45 s per seed in a debug build on 2 cores.
//! A failure prints the seed and the command that replays it.

use latchkey_sim::coverage::Coverage;
use latchkey_sim::sim::{run, RunConfig};
use latchkey_sim::sweep::{failure_text, run_seed};

/// Seeds run on every `cargo test` (sweep more with `cargo run --release -p latchkey-sim --
/// --seeds N`).
const CI_SEEDS: std::ops::Range<u64> = 0..5;

/// Whether the server reports waits that ended at their wait timeout (`ProbeEvent::
/// WaitsExpired`). Until it does, the CI seeds cannot reach that state; flip this when it does.
const WAIT_EXPIRY_IN_SERVER: bool = true;

#[test]
fn ci_seeds_pass_every_checker() {
    let mut failures = Vec::new();
    let mut near_expiry = 0;
    let mut faults = Vec::new();
    let mut reached = Coverage::default();
    for seed in CI_SEEDS {
        let report = run_seed(seed);
        if !report.ok() {
            failures.push(failure_text(&report));
        }
        near_expiry += report.hold_checks_near_expiry;
        reached.add(&report.coverage);
        faults.extend(report.faults);
    }
    println!("the CI seeds reached: {reached}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A resuming leader whose lease table kept a mark its table no longer has is bug 1 itself.
    assert_eq!(
        reached.stale_marks_at_resume, 0,
        "a leader resumed leases from marks its table does not carry: {reached}"
    );
    // A leader resuming leases below a committed renewal it has not applied is bug 2 itself.
    assert_eq!(
        reached.resumed_with_renewal_unapplied, 0,
        "a leader resumed leases before applying a committed renewal: {reached}"
    );
    // Each lease state a known bug needs (issue #9), reached at least once, or the seeds say
    // nothing about that bug (3,729 seeds once passed with both bugs in).
    for (count, state) in [
        (reached.snapshot_installs, "a snapshot install"),
        (
            reached.resumed_after_install,
            "a leader resuming leases after a snapshot install (bug 1)",
        ),
        (
            reached.resumed_before_lease_write_applied,
            "a leader elected before applying a committed lease write (bug 2)",
        ),
        (
            reached.elected_before_renewal_applied,
            "a leader elected before applying a committed logged renewal (bug 2 exactly)",
        ),
        (reached.failovers, "a failover"),
        (reached.logged_renewals, "a logged renewal"),
        (reached.sessions_expired, "a session expiry"),
        (
            if WAIT_EXPIRY_IN_SERVER {
                reached.wait_expiries
            } else {
                1
            },
            "a wait expired by the server",
        ),
    ] {
        assert!(count > 0, "the CI seeds never reached {state}: {reached}");
    }
    // Seeds 1 and 3 coalesce (`RunConfig::coalesce`, on in the odd seeds): the checkers must
    // have read batch entries of several operations, each operation as an entry of its own,
    // or coalescing runs in production on a path the simulation did not judge.
    assert!(
        reached.batch_entries_of_several > 0,
        "the CI seeds committed no batch entry of two or more operations: {reached}"
    );
    // Seeds 2 and 3 have their clients batch (`RunConfig::client_batch`, on where `seed / 2`
    // is odd; seed 3 with the leader's coalescing too): some Batch call must have carried
    // operations of several sessions, or the library's default runs on a path the simulation
    // did not judge.
    assert!(
        reached.client_batches_of_several > 0,
        "the CI seeds' clients sent no Batch call of two or more operations: {reached}"
    );
    // With coalescing (seeds 1 and 3) a member asks for a snapshot by operations
    // (`Node::lease_duties`, issue #35): openraft's policy counts entries, 256 operations
    // each at most. The ask must have run, and a snapshot been built after it, or that path
    // runs in production unjudged by the checkers.
    assert!(
        reached.snapshots_asked_by_ops > 0,
        "the CI seeds never asked for a snapshot by operations: {reached}"
    );
    assert!(
        reached.snapshots_built_after_ask > 0,
        "the CI seeds built no snapshot after asking for one by operations: {reached}"
    );
    // The seeds must exercise what the checkers judge, or passing proves little: clients that
    // checked their guard shortly before the cluster expired their session (the deadline rule
    // at its edge), and every kind of client fault actually carried out.
    assert!(
        near_expiry > 0,
        "no hold check came within 1 s of its session's expiry"
    );
    for kind in [
        "kill client",
        "pause client c",
        "cut client",
        "crash n",
        "isolate leader",
        "renewal-then-failover",
    ] {
        assert!(
            faults
                .iter()
                .any(|f| f.contains(kind) && !f.contains(" at its next ")),
            "no fault {kind:?} was carried out in the CI seeds"
        );
    }
}

/// CI seeds run in a cluster of two Raft groups (issue #16): every node a member of both,
/// each group with its own log, its checkers over its own locks' operations. Seed 54's fault
/// schedules follow group 0's leader and seed 85's group 1's (`RunConfig::targeted_group`);
/// chosen from a release scan of seeds 0-85 (mutexes only, `latchkey-sim --groups 2
/// --no-primitives`) so that each group reaches both lease bugs' states and a keepalive at a
/// deposed leader (no seed of the scan reached all in both groups alone). The seeds before,
/// 0 and 23, stopped reaching a keepalive at a deposed leader once the client re-sent a
/// multi-group keepalive's refused groups to their new leader within the renewal (issue #34);
/// seed 13, the choice before the sim's connect backoff, had reached neither state after it.
const CI_SEEDS_OF_TWO_GROUPS: [u64; 2] = [54, 85];

#[test]
fn ci_seeds_of_two_groups_pass_every_checker() {
    let mut failures = Vec::new();
    let mut by_group = vec![latchkey_sim::sim::GroupReport::default(); 2];
    for seed in CI_SEEDS_OF_TWO_GROUPS {
        let mut config = RunConfig::from_seed(seed);
        config.groups = 2;
        // Mutexes only, as when these seeds were chosen for the coverage asserted below (issue
        // #9's states in every group); with seed 0's read-write lock and semaphore, group 1
        // reached no leader resumed before a committed lease write was applied (CI).
        config.primitives = None;
        let report = latchkey_sim::sweep::run_config(&config);
        if !report.ok() {
            failures.push(failure_text(&report));
        }
        assert_eq!(report.by_group.len(), 2, "one report per group");
        for (sum, g) in by_group.iter_mut().zip(&report.by_group) {
            sum.grants += g.grants;
            sum.committed_entries += g.committed_entries;
            sum.coverage.add(&g.coverage);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Each group must have been judged on something, and through a failover of its own, or
    // passing says nothing about it.
    for (g, sum) in by_group.iter().enumerate() {
        println!(
            "group {g}: {} grants, {} committed entries; reached {}",
            sum.grants, sum.committed_entries, sum.coverage
        );
        assert!(sum.grants > 0, "no lock of group {g} was granted");
        assert!(
            sum.coverage.failovers > 0,
            "group {g} never changed leader: {}",
            sum.coverage
        );
    }
    assert!(
        by_group.iter().any(|g| g.coverage.sessions_expired > 0),
        "no session expired in any group"
    );
    // A leader change by transfer (the rebalance after a node returns) skips the followers'
    // leader lease: the lease checkers must have judged at least one.
    let transfers: usize = by_group
        .iter()
        .map(|g| g.coverage.transfers_completed)
        .sum();
    assert!(
        transfers > 0,
        "no group changed leader by a leader transfer"
    );
    // In each group, a deposed leader asked to renew after its successor resumed the leases:
    // the state a renewal without a quorum's confirmation needs (seed 23 reaches it 6 times in
    // each group, and the fixed code refuses each).
    for (g, sum) in by_group.iter().enumerate() {
        assert!(
            sum.coverage.keepalives_at_deposed_leader > 0,
            "group {g}: no keepalive reached a deposed leader after its successor resumed the \
             leases: {}",
            sum.coverage
        );
    }
    // The states issue #9's two bugs need, in every group: a leader that resumes the leases
    // after installing a snapshot (bug 1), and one elected before it applied a committed lease
    // write of an earlier term (bug 2).
    for (g, sum) in by_group.iter().enumerate() {
        assert!(
            sum.coverage.resumed_after_install > 0,
            "group {g}: no leader resumed the leases after a snapshot install: {}",
            sum.coverage
        );
        assert!(
            sum.coverage.resumed_before_lease_write_applied > 0,
            "group {g}: no leader resumed before a committed lease write was applied: {}",
            sum.coverage
        );
    }
}

/// Groups across machines (issue #16 item 5): five nodes, five groups of three replicas
/// (`RunConfig::replicas`; group g on nodes g+1, g+2, g+3, wrapping). The clients know every
/// node and ask the ones outside a lock's group too, which send them on to one of its
/// replicas; each group is checked over its own log and locks, and the fault plans that follow
/// a leader follow the targeted group's, within its three voters. The seed was chosen by a
/// release scan (see the issue note) for a failover in every group.
const CI_SEED_OF_REPLICA_SUBSETS: u64 = 0;

#[test]
fn a_seed_of_replica_subsets_passes_every_checker() {
    let mut config = RunConfig::from_seed(CI_SEED_OF_REPLICA_SUBSETS);
    config.nodes = 5;
    config.groups = 5;
    config.replicas = 3;
    let report = latchkey_sim::sweep::run_config(&config);
    assert!(report.ok(), "{}", failure_text(&report));
    assert_eq!(report.by_group.len(), 5, "one report per group");
    let mut sent = 0;
    for (g, group) in report.by_group.iter().enumerate() {
        println!(
            "group {g} (voters {:?}): {} grants, {} committed entries; reached {}",
            config.group_voters(g as u32),
            group.grants,
            group.committed_entries,
            group.coverage
        );
        assert!(group.grants > 0, "no lock of group {g} was granted");
        assert!(
            group.coverage.failovers > 0,
            "group {g} never changed leader: {}",
            group.coverage
        );
        sent += group.coverage.sent_to_replica;
    }
    // Without a client meeting a member outside its lock's group, the hints were not tested.
    assert!(
        sent > 0,
        "no member outside a group sent a client to a replica"
    );
}

/// The checkers of a group above 0 have teeth: with the early acknowledgement planted in a
/// cluster of two groups, a violation names group 1 (seed 0: 14 violations, in both groups).
#[test]
fn a_planted_early_ack_is_caught_in_a_cluster_of_two_groups() {
    let mut config = RunConfig::from_seed(0);
    config.groups = 2;
    config.disk.ack_before_fsync = true;
    let report = run(&config);
    println!(
        "planted bug, two groups: {} violations (first: {:?}), run error: {:?}",
        report.violations.len(),
        report.violations.first().map(|v| v.to_string()),
        report.sim_error
    );
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.message.starts_with("group 1: ")),
        "the planted bug went unnoticed in group 1; violations: {:#?}",
        report.violations
    );
}

/// A keepalive answered without a quorum's confirmation after it arrived (`ops.rs`
/// `keep_alive` on the node's own belief that it leads: `Plant::renew_without_quorum`) is
/// what the leader transfers of a cluster of several groups are safe without; put back, the
/// lease oracle catches it. The state it needs, a keepalive reaching a deposed leader after
/// its successor resumed the leases, is counted (`keepalives_at_deposed_leader`) and required
/// of the seed that catches it. Several seeds, so that one seed's trajectory moving (a
/// schedule change elsewhere once moved seed 23's) does not blunt the test. Release sweep with
/// the plant, two groups, seeds 0-399 (`latchkey-sim --groups 2 --plant renew-without-quorum`):
/// 166 seeds reached the state and 13 were caught, each by the lease oracle: 23, 41, 80, 84,
/// 108, 119, 120, 138, 252, 261, 281, 342 and 371. Seeds 23, 80 and 371 had the most lease
/// violations (772, 499, 328). Since the client re-sends a multi-group keepalive's refused
/// groups to their new leader within the renewal (issue #34), fewer keepalives reach a deposed
/// leader: mutexes only (as this test runs), release, seeds 0-199 caught it on 41, 44, 64, 108
/// and 120 (lease violations 2, 1, 1, 1, 10), and of the earlier three only 371 still does (50;
/// 23 reached no deposed leader, 80 was not caught).
const RENEW_WITHOUT_QUORUM_SEEDS: [u64; 3] = [371, 120, 41];

#[test]
fn a_planted_renewal_without_quorum_is_caught_in_a_cluster_of_two_groups() {
    let plant = latchkey_server::Plant {
        renew_without_quorum: true,
        ..Default::default()
    };
    assert!(
        caught_by_the_lease_oracle(&RENEW_WITHOUT_QUORUM_SEEDS, 2, plant, |c| {
            c.keepalives_at_deposed_leader > 0
        }),
        "the planted renewal without quorum went unnoticed on seeds {RENEW_WITHOUT_QUORUM_SEEDS:?}"
    );
}

/// The run has teeth: with a bug put in on purpose (the log store acknowledges appends before
/// their fsync, so a crash loses entries a majority acknowledged), a CI seed fails: a checker
/// finds a violation, or a node trips over the lost entries (openraft asserts that its log
/// holds what it committed) and the run ends with that panic as its error.
#[test]
fn a_planted_early_ack_is_caught() {
    let mut config = RunConfig::from_seed(0);
    config.disk.ack_before_fsync = true;
    let report = run(&config);
    assert!(
        !report.ok(),
        "the planted bug went unnoticed; faults: {:#?}",
        report.faults
    );
    println!(
        "planted bug caught: {} violations (first: {:?}), run error: {:?}",
        report.violations.len(),
        report.violations.first().map(|v| v.to_string()),
        report.sim_error
    );
}

/// The seeds that catch the two lease bugs of issue #9 put back (`latchkey_server::Plant`),
/// found by release sweeps with the planted bug (`latchkey-sim --plant stale-mark|resume-early`).
/// Each test runs its seeds until one catches the bug in the state it needs, so that a debug
/// build's slightly different interleaving (see `a_seed_replays_exactly`: one build replays
/// exactly, two builds need not agree) still has one that catches it; so far both builds
/// agree.
/// Stale mark: release, seeds 0-59: 31 leases resumed after an install carried 266 stale
/// marks; seeds 26 and 54 were harmed (a lease resumed to end at once, expired ~2.5 s before
/// its client's deadline). It needs half the seeds to elect fast with a 4-6 s lease: with 2-3 s
/// leases the failover itself outlasted the clients' deadlines and nothing could tell the bug
/// from the rule. Since a leader cut off from its majority answers `no-quorum` at once (issue
/// #34), its clients renew at the new leader sooner and fewer seeds are harmed: release, seeds
/// 0-339, only seeds 20 (314 stale marks, leases cut 1.6 s short) and 334 (1 stale mark, 1.6 s);
/// both catch it in the debug build too.
const STALE_MARK_SEEDS: [u64; 2] = [20, 334];
/// Resume early: needs the renewal-then-failover schedule, which starves the clients (so the
/// leader marks their sessions), lets their keepalives lift the marks through the log, and cuts
/// the leader's messages to its peers as they hold that renewal (so no follower learns it
/// committed).
const RESUME_EARLY_SEEDS: [u64; 2] = [18, 100];

/// Runs `seeds` in turn, in a cluster of `groups` Raft groups, with `plant` until one whose
/// lease oracle reports a violation in the state `reached` asks for; whether any did.
fn caught_by_the_lease_oracle(
    seeds: &[u64],
    groups: u32,
    plant: latchkey_server::Plant,
    reached: impl Fn(&latchkey_sim::coverage::Coverage) -> bool,
) -> bool {
    seeds.iter().any(|&seed| {
        let mut config = RunConfig::from_seed(seed);
        config.groups = groups;
        config.plant = plant;
        // The lease bugs' seeds were found with mutexes only: without the read-write lock and
        // semaphore half the seeds' shapes gained later (issue #32), each runs as it did when
        // it was chosen (seed 100 gained them, and missed the early resume it catches).
        config.primitives = None;
        let report = run(&config);
        let lease = report
            .violations
            .iter()
            .filter(|v| v.checker == "lease")
            .count();
        println!(
            "seed {seed} with {plant:?}: {lease} lease violations, first {:?}; reached: {}",
            report.violations.first().map(|v| v.to_string()),
            report.coverage
        );
        lease > 0 && reached(&report.coverage)
    })
}

/// Bug 1 of issue #9 put back: a follower keeps the lease marks it applied before a snapshot
/// install, then leads and expires live sessions from a stale mark.
#[test]
fn a_planted_stale_mark_after_install_is_caught() {
    let plant = latchkey_server::Plant {
        stale_mark_after_install: true,
        ..Default::default()
    };
    assert!(
        caught_by_the_lease_oracle(&STALE_MARK_SEEDS, 1, plant, |c| c.stale_marks_at_resume > 0),
        "the planted stale mark went unnoticed by the lease oracle on seeds {STALE_MARK_SEEDS:?}"
    );
}

/// Bug 2 of issue #9 put back: a new leader resumes leases before applying the old leader's
/// committed tail, from a mark a logged renewal already lifted.
///
/// The lease oracle judges every resumed lease against the client's deadline at that moment,
/// so a lease cut short is caught even when the client renews before it runs out (which hid
/// this plant from an oracle that judged only expiries: since issue #11 the client finds a new
/// leader fast). Reaching the plant's state is not enough to be harmed by it: the lease is cut
/// short only when the lifted mark is old enough, so few seeds catch it (release, seeds
/// 0-149: 51 reach the state, seeds 18 and 100 are harmed and caught).
#[test]
fn a_planted_resume_before_applied_is_caught() {
    let plant = latchkey_server::Plant {
        resume_before_applied: true,
        ..Default::default()
    };
    assert!(
        caught_by_the_lease_oracle(&RESUME_EARLY_SEEDS, 1, plant, |c| {
            c.resumed_with_renewal_unapplied > 0
        }),
        "the planted early resume went unnoticed by the lease oracle on seeds {RESUME_EARLY_SEEDS:?}"
    );
}

/// One seed, one history: two runs of a (shortened) seed inject the same faults at the same
/// instants and agree on the operations, grants and commits. Needs tokio's select order seeded
/// too (`--cfg tokio_unstable`, set in `.cargo/config.toml`); without it, nothing is compared.
#[test]
fn a_seed_replays_exactly() {
    let mut config = RunConfig::from_seed(3);
    config.safety = std::time::Duration::from_secs(8);
    config.liveness = std::time::Duration::from_secs(4);
    let a = run(&config);
    let b = run(&config);
    assert!(a.ok() && b.ok(), "{:?}\n{:?}", a.violations, b.violations);
    if !cfg!(tokio_unstable) {
        println!("built without --cfg tokio_unstable: interleavings may differ, not compared");
        return;
    }
    assert_eq!(
        a.faults, b.faults,
        "two runs of one seed injected different faults"
    );
    assert_eq!(
        (
            a.operations,
            a.grants,
            a.committed_entries,
            a.hold_checks_near_expiry
        ),
        (
            b.operations,
            b.grants,
            b.committed_entries,
            b.hold_checks_near_expiry
        ),
        "two runs of one seed differ"
    );
}

/// The coverage the tests here assert (issue #9's states in every group, a keepalive at a
/// deposed leader, ...) was reached by their seeds' exact interleavings, which replay only with
/// tokio's select order seeded (`--cfg tokio_unstable`, from `.cargo/config.toml`). A
/// `RUSTFLAGS` variable (a CI runner's, say) replaces that setting: then fail here, by name,
/// not later as a coverage assertion that passes on one machine and fails on another.
#[test]
fn built_with_tokio_unstable() {
    // black_box: the flag is known when this compiles, and a test about the build asserts it.
    assert!(
        std::hint::black_box(cfg!(tokio_unstable)),
        "built without --cfg tokio_unstable (a RUSTFLAGS or CARGO_ENCODED_RUSTFLAGS variable, or \
         a target's rustflags in a cargo config, replaces .cargo/config.toml's build.rustflags): \
         the simulation's seeds do not replay, and their coverage assertions mean nothing"
    );
}

/// A seed of two Raft groups with a read-write lock and a semaphore, as
/// `ci_seeds_of_two_groups_pass_every_checker` once ran it (`latchkey-sim --reproduce 0
/// --groups 2 --primitives`), `safety` seconds of faults long.
fn two_groups_with_primitives(seed: u64, safety: Option<u64>) -> RunConfig {
    let mut config = RunConfig::from_seed(seed);
    config.groups = 2;
    config.primitives = config
        .primitives
        .or(Some(latchkey_sim::config::Primitives::GIVEN));
    if let Some(secs) = safety {
        config.safety = std::time::Duration::from_secs(secs);
        config.liveness = std::time::Duration::from_secs(4);
    }
    config
}

/// Wall time a slowed run stops for at every simulated second: more than h2's 1 s wait on a
/// reset stream (vendor/README.md), the clock that once leaked into runs.
const SLOW_MACHINE_PAUSE: std::time::Duration = std::time::Duration::from_millis(1500);

/// Runs `config` twice in this process, the second time on a machine made slow
/// (`latchkey_sim::run_slowed`), and asserts one trace hash (`latchkey_sim::trace`): a run is
/// a function of its seed alone, or a CI seed chosen for the states it reaches reaches them
/// on one machine and not on another (`ci_seeds_of_two_groups_pass_every_checker` passed here
/// and failed in CI on one commit). The second run differs from the first wherever two
/// machines can: each `HashMap` draws its own keys, the machine's clock runs otherwise.
fn assert_replays_exactly(config: &RunConfig) {
    if !cfg!(tokio_unstable) {
        println!("built without --cfg tokio_unstable: interleavings may differ, not compared");
        return;
    }
    let a = run(config);
    let b = latchkey_sim::run_slowed(config, SLOW_MACHINE_PAUSE);
    println!(
        "seed {} ({} groups): trace hashes {:016x} and {:016x} (slowed); {} and {} committed \
         entries; reached {} / {}",
        config.seed,
        config.groups,
        a.trace_hash,
        b.trace_hash,
        a.committed_entries,
        b.committed_entries,
        a.coverage,
        b.coverage
    );
    assert_eq!(
        a.trace_hash, b.trace_hash,
        "two runs of seed {} differ, the second slowed (LATCHKEY_SIM_TRACE=DIR writes both \
         traces, to diff)",
        config.seed
    );
}

/// Two runs of a shortened seed of two groups with primitives (a snapshot install and
/// failovers within it), the second on a slowed machine, record the same trace.
#[test]
fn a_seed_replays_exactly_on_a_slow_machine() {
    assert_replays_exactly(&two_groups_with_primitives(0, Some(10)));
}

/// The same at full length, both seeds of `ci_seeds_of_two_groups_pass_every_checker`, with
/// primitives and without (about 40 minutes in a debug build on a loaded machine here: by hand, `-- --ignored`).
#[test]
#[ignore]
fn the_two_group_ci_seeds_replay_exactly_on_a_slow_machine() {
    for seed in CI_SEEDS_OF_TWO_GROUPS {
        assert_replays_exactly(&two_groups_with_primitives(seed, None));
        let mut mutexes_only = two_groups_with_primitives(seed, None);
        mutexes_only.primitives = None;
        assert_replays_exactly(&mutexes_only);
    }
}

/// Issue #32's read-write locks and semaphores, in the seeds whose own shape has them
/// (`RunConfig::primitives`: half the seeds; the other CI seeds above have none but seed 4):
/// every checker passes, and each primitive was held across a failover (a new leader resumed
/// the leases while its client believed it held it): a reader, a writer of a read-write lock
/// that also had readers, and a permit. Chosen from a release sweep of seeds 0-39 (see
/// docs/testing.md) for the most of each.
const CI_SEEDS_WITH_PRIMITIVES: [u64; 2] = [19, 33];

#[test]
fn ci_seeds_with_primitives_pass_and_reach_each_under_failover() {
    let mut failures = Vec::new();
    let mut reached = Coverage::default();
    for seed in CI_SEEDS_WITH_PRIMITIVES {
        let config = RunConfig::from_seed(seed);
        assert!(
            config.primitives.is_some(),
            "seed {seed} has no read-write lock or semaphore in its shape"
        );
        let report = latchkey_sim::sweep::run_config(&config);
        if !report.ok() {
            failures.push(failure_text(&report));
        }
        reached.add(&report.coverage);
    }
    println!("the CI seeds with primitives reached: {reached}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for (count, what) in [
        (reached.readers_across_failover, "a reader"),
        (
            reached.writers_across_failover,
            "a writer of a read-write lock with readers",
        ),
        (reached.permits_across_failover, "a semaphore's permit"),
    ] {
        assert!(
            count > 0,
            "the CI seeds never held {what} across a failover: {reached}"
        );
    }
}

/// The seeds that catch issue #32's planted bugs (`latchkey_core::TablePlant`), found by
/// release runs with each (`latchkey-sim --reproduce S --primitives --plant NAME`; seed 0 has no
/// primitives of its own and is given `Primitives::GIVEN`). The second seed of each runs only if
/// the first misses (a debug build may interleave differently).
/// Permit freed twice: release, seeds 0-12: seeds 0 (4 holders violations) and 6 (3) caught,
/// the others never had a release beside another holder with a waiter to take both permits.
const PERMIT_FREED_TWICE_SEEDS: [u64; 2] = [0, 6];
/// Reader past a waiting writer: release, seeds 0-5: caught on 0, 1, 3 and 4 (fifo).
const READER_PAST_WRITER_SEEDS: [u64; 2] = [0, 1];
/// Writer beside readers: release, seeds 0-3: caught on each (holders).
const WRITER_BESIDE_READERS_SEEDS: [u64; 2] = [0, 1];
/// Writer token reused: release, seeds 0-3: caught on each (fencing_order: 28, 22, 17 and 10
/// violations; unique_token too, and on seeds 0 and 1 no_overlap: a stale reader's second read
/// admitted under the token the writer reused, after the writer's write).
const WRITER_TOKEN_REUSED_SEEDS: [u64; 2] = [0, 3];

/// Runs `seeds` in turn, each with a read-write lock and a semaphore (its own, or
/// `Primitives::GIVEN`, as `latchkey-sim --primitives` gives them) and `plant`, until one of
/// whose violations `checker` reported; whether any did.
fn caught_by(seeds: &[u64], plant: latchkey_core::TablePlant, checker: &str) -> bool {
    caught_with(seeds, &format!("{plant:?}"), checker, |config| {
        config.primitives = config
            .primitives
            .or(Some(latchkey_sim::config::Primitives::GIVEN));
        config.plant.table = plant;
    })
}

/// Runs `seeds` in turn, each seed's own configuration changed by `configure` (`what` says
/// how, in the lines it prints), until one of whose violations `checker` reported; whether
/// any did.
fn caught_with(
    seeds: &[u64],
    what: &str,
    checker: &str,
    configure: impl Fn(&mut RunConfig),
) -> bool {
    seeds.iter().any(|&seed| {
        let mut config = RunConfig::from_seed(seed);
        configure(&mut config);
        let report = run(&config);
        let caught: Vec<String> = report
            .violations
            .iter()
            .filter(|v| v.checker == checker)
            .map(|v| v.to_string())
            .collect();
        println!(
            "seed {seed} with {what}: {} {checker} violations, first {:?}; run error {:?}; \
             reached: {}",
            caught.len(),
            caught.first(),
            report.sim_error,
            report.coverage
        );
        !caught.is_empty()
    })
}

/// Runs the CI `seeds`, each seed's own configuration changed by `configure` (`what` says how,
/// in the line it prints): every checker must pass on each; what they reached, together.
fn ci_seeds_pass_with(seeds: &[u64], what: &str, configure: impl Fn(&mut RunConfig)) -> Coverage {
    let mut failures = Vec::new();
    let mut reached = Coverage::default();
    for &seed in seeds {
        let mut config = RunConfig::from_seed(seed);
        configure(&mut config);
        let report = latchkey_sim::sweep::run_config(&config);
        if !report.ok() {
            failures.push(failure_text(&report));
        }
        reached.add(&report.coverage);
    }
    println!("the CI seeds with {what} reached: {reached}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    reached
}

/// A permit's release that frees a second permit (another holder's grant dropped without a
/// word to its session): the semaphore has more than N holders, which the holders checker
/// sees from the clients' own beliefs (the resource's gate refuses the stale holder's write).
#[test]
fn a_planted_permit_freed_twice_is_caught() {
    let plant = latchkey_core::TablePlant {
        permit_freed_twice: true,
        ..Default::default()
    };
    assert!(
        caught_by(&PERMIT_FREED_TWICE_SEEDS, plant, "holders"),
        "the planted double free of a permit went unnoticed on seeds {PERMIT_FREED_TWICE_SEEDS:?}"
    );
}

/// A reader granted at once beside readers though a writer waits: the fifo checker sees a
/// later request granted before the waiting writer's.
#[test]
fn a_planted_reader_past_a_waiting_writer_is_caught() {
    let plant = latchkey_core::TablePlant {
        reader_past_writer: true,
        ..Default::default()
    };
    assert!(
        caught_by(&READER_PAST_WRITER_SEEDS, plant, "fifo"),
        "the planted reader past a waiting writer went unnoticed on seeds {READER_PAST_WRITER_SEEDS:?}"
    );
}

/// A writer granted while readers hold (their grants dropped without a word to their
/// sessions): the holders checker sees a reader beside a writer.
#[test]
fn a_planted_writer_beside_readers_is_caught() {
    let plant = latchkey_core::TablePlant {
        writer_beside_readers: true,
        ..Default::default()
    };
    assert!(
        caught_by(&WRITER_BESIDE_READERS_SEEDS, plant, "holders"),
        "the planted writer beside readers went unnoticed on seeds {WRITER_BESIDE_READERS_SEEDS:?}"
    );
}

/// A writer after readers granted their token instead of its entry's index: fencing_order sees
/// a writer asked for after a reader's grant was answered whose token is not above it.
#[test]
fn a_planted_writer_token_reused_is_caught() {
    let plant = latchkey_core::TablePlant {
        writer_token_reused: true,
        ..Default::default()
    };
    assert!(
        caught_by(&WRITER_TOKEN_REUSED_SEEDS, plant, "fencing_order"),
        "the planted reused writer token went unnoticed on seeds {WRITER_TOKEN_REUSED_SEEDS:?}"
    );
}

/// The batching plant's seeds (`latchkey-sim --coalesce --plant batch-answers-reversed`):
/// the second runs only if the first misses. Chosen again when the leader's gathered writes in
/// flight went from one to two (`limits::GATHER_WRITES_IN_FLIGHT`), which changed every
/// coalescing seed's trace and made batch entries rarer: release, seeds 0-15 with coalescing,
/// caught on 2, 3, 7, 10, 11 and 15 (`holders` on 2, 3, 7, 10, 11 and 15, `unique_token` on
/// all), not on the other ten (the old seeds 1 and 4 among them).
const BATCH_ANSWERS_REVERSED_SEEDS: [u64; 2] = [2, 7];

/// The leader hands a batch entry's answers to its callers in reverse order
/// (`Plant::batch_answers_reversed`, issue #35's coalescing): a caller of a batch of several
/// gets another's outcome, so a client believes it holds a lock granted to another, which the
/// `holders` checker sees.
#[test]
fn a_planted_batch_answered_in_reverse_is_caught() {
    let caught = caught_with(
        &BATCH_ANSWERS_REVERSED_SEEDS,
        "a batch's answers reversed",
        "holders",
        |config| {
            config.coalesce = true;
            config.plant.batch_answers_reversed = true;
        },
    );
    assert!(
        caught,
        "the planted reversal of a batch's answers went unnoticed on seeds \
         {BATCH_ANSWERS_REVERSED_SEEDS:?}"
    );
}

/// The CI seeds with lock-delays (issue #32 item 4, `RunConfig::lock_delay`: half the mutex
/// acquires ask for 1-3 s; off in every seed's own shape, so that the seeds above replay as
/// they were chosen): every checker passes, the `lock_delay` checker included, and a delayed
/// grant was lost to its session's expiry and its name then granted to a waiter that asked
/// during the delay, once across a failover. Chosen from a debug sweep of seeds 0-17 with
/// lock-delays (see docs/testing.md): the 14 that finished (0-11, 16, 17) all passed; 8
/// granted a waiter after a delay, only seed 17 across a failover (2 delays, one across a
/// failover; 76 s in debug with the machine busy).
const CI_SEEDS_WITH_LOCK_DELAY: [u64; 1] = [17];

#[test]
fn ci_seeds_with_lock_delay_pass_and_reach_a_waiter_granted_after_a_delay() {
    let reached = ci_seeds_pass_with(&CI_SEEDS_WITH_LOCK_DELAY, "lock-delays", |config| {
        config.lock_delay = true;
        // Without batch entries, as the seed was chosen: seed 17 is odd, and with the leader's
        // coalescing (`RunConfig::coalesce`) it ran no lock-delay across a failover (debug and
        // release).
        config.coalesce = false;
    });
    assert!(
        reached.delays_then_waiter_granted > 0,
        "the CI seeds never granted a waiter after a lock-delay: {reached}"
    );
    assert!(
        reached.delays_across_failover > 0,
        "the CI seeds never ran a lock-delay across a failover: {reached}"
    );
}

/// The lock-delay plant's seeds (`latchkey-sim --reproduce S --lock-delay --plant
/// delay-ends-early`, debug, seeds 0-2: caught on 0 and 2; seed 1 granted no waiter after a
/// delay): the second runs only if the first misses.
const DELAY_ENDS_EARLY_SEEDS: [u64; 2] = [0, 2];

/// The leader ends each lock-delay at half its length (`Plant::delay_ends_early`): the
/// `lock_delay` checker sees a waiter granted the name before the delay could end.
#[test]
fn a_planted_early_end_of_a_lock_delay_is_caught() {
    let caught = caught_with(
        &DELAY_ENDS_EARLY_SEEDS,
        "the lock-delay ending early",
        "lock_delay",
        |config| {
            config.lock_delay = true;
            config.plant.delay_ends_early = true;
        },
    );
    assert!(
        caught,
        "the planted early end of a lock-delay went unnoticed on seeds {DELAY_ENDS_EARLY_SEEDS:?}"
    );
}

/// The CI seeds with elections (issue #32 item 1, `RunConfig::elections`: the clients also
/// campaign in one election, proclaim, resign or die, and read its leader; off in every seed's
/// own shape, so that the seeds above replay as they were chosen): every checker passes, the
/// `election` checker included, a leader's term was held across a failover (a new Raft leader
/// resumed the leases between the win's answer and the leader's last check that it led), and
/// the server refused a proclaim after its term (the state the planted bug below needs).
/// Chosen from a release sweep of seeds 0-19 with elections (`latchkey-sim --seeds 20
/// --elections`): all passed; terms across a failover in seeds 1 (3), 4, 7 (2), 11, 16, 17 (2)
/// and 18 (2).
const CI_SEEDS_WITH_ELECTIONS: [u64; 1] = [1];

#[test]
fn ci_seeds_with_elections_pass_and_hold_a_term_across_a_failover() {
    let reached = ci_seeds_pass_with(&CI_SEEDS_WITH_ELECTIONS, "elections", |config| {
        config.elections = true;
    });
    assert!(
        reached.elections_across_failover > 0,
        "the CI seeds never held an election's term across a failover: {reached}"
    );
    assert!(
        reached.proclaims_refused > 0,
        "the CI seeds never had a proclaim refused after its term: {reached}"
    );
    assert!(
        reached.reads_after_a_proclaim > 0,
        "the CI seeds never read a term after one of its proclaims: {reached}"
    );
    assert!(
        reached.reads_in_a_lasting_term > 0,
        "the CI seeds never read the leader while a term surely lasted: {reached}"
    );
}

/// The election plant's seeds (`latchkey-sim --reproduce S --elections --plant
/// proclaim-past-term`): the second runs only if the first misses. Release, seeds 0-99: caught
/// on each, by `election` alone; debug, seed 0: 57 violations.
const PROCLAIM_PAST_TERM_SEEDS: [u64; 2] = [0, 1];

/// A proclaim under an ended term's token accepted while another session leads, its value
/// published as the new leader's (`TablePlant::proclaim_past_term`): the `election` checker
/// sees the proclaim acknowledged after its term ended, and reads of the new term returning
/// the old term's value.
#[test]
fn a_planted_proclaim_past_its_term_is_caught() {
    assert_caught_in_elections(&PROCLAIM_PAST_TERM_SEEDS, |p| p.proclaim_past_term = true);
}

/// The seeds of the election plants a read reveals (`latchkey-sim --reproduce S --elections
/// --plant NAME`): the second runs only if the first misses. Debug, seed 1: each caught, by
/// `election` alone (a refused proclaim's value read: 35 violations; a replaced value read:
/// 33; no leader found while a term surely lasted: 70).
const REFUSED_PROCLAIM_APPLIED_SEEDS: [u64; 2] = [1, 0];
const PROCLAIM_KEPT_OLD_VALUE_SEEDS: [u64; 2] = [1, 0];
const LEADER_HIDDEN_WHILE_CONTENDED_SEEDS: [u64; 2] = [1, 0];

/// A proclaim refused after its term whose value still replaced the leader's
/// (`TablePlant::refused_proclaim_applied`): the `election` checker sees a read return the
/// value of a proclaim the server refused.
#[test]
fn a_planted_refused_proclaim_applied_is_caught() {
    assert_caught_in_elections(&REFUSED_PROCLAIM_APPLIED_SEEDS, |p| {
        p.refused_proclaim_applied = true
    });
}

/// An acknowledged proclaim that kept the term's earlier value
/// (`TablePlant::proclaim_kept_old_value`): the `election` checker sees a read invoked after
/// the acknowledgement return the value it replaced.
#[test]
fn a_planted_proclaim_that_kept_the_old_value_is_caught() {
    assert_caught_in_elections(&PROCLAIM_KEPT_OLD_VALUE_SEEDS, |p| {
        p.proclaim_kept_old_value = true
    });
}

/// A read that finds no leader while candidates wait behind one
/// (`TablePlant::leader_hidden_while_contended`): the `election` checker sees a read find no
/// leader while a term surely lasted.
#[test]
fn a_planted_leader_hidden_while_contended_is_caught() {
    assert_caught_in_elections(&LEADER_HIDDEN_WHILE_CONTENDED_SEEDS, |p| {
        p.leader_hidden_while_contended = true
    });
}

/// Asserts that [`caught_in_elections`] catches `plant` on one of `seeds`.
fn assert_caught_in_elections(seeds: &[u64], plant: impl Fn(&mut latchkey_core::TablePlant)) {
    let mut planted = latchkey_core::TablePlant::default();
    plant(&mut planted);
    assert!(
        caught_in_elections(seeds, |p| *p = planted),
        "{planted:?} went unnoticed on seeds {seeds:?}"
    );
}

/// Runs `seeds` with elections and the election plant `plant` sets until the `election`
/// checker catches it on one; whether it did.
fn caught_in_elections(seeds: &[u64], plant: impl Fn(&mut latchkey_core::TablePlant)) -> bool {
    let mut planted = latchkey_core::TablePlant::default();
    plant(&mut planted);
    caught_with(
        seeds,
        &format!("elections, {planted:?}"),
        "election",
        |config| {
            config.elections = true;
            config.plant.table = planted;
        },
    )
}
