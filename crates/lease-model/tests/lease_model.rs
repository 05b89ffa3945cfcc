//! The lease model checks (issue #10): the fixed code satisfies every property in each bounded
//! configuration, and each planted bug of issue #9 is found with a readable counterexample.
//! Every check prints how many states it explored.

use std::collections::BTreeSet;
use std::time::Instant;

use latchkey_lease_model::*;
use latchkey_server::Plant;
use stateright::{Checker, HasDiscoveries, Model};

/// Two members whose clocks both run fast (leases end soonest in true time), two clients, the
/// lock held by client 0 with client 1 queued: the configuration both bugs of issue #9 need.
fn two_members(time_max: u32, plant: Plant) -> Config {
    Config {
        members: 2,
        clients: 2,
        time_max,
        elections_max: 1,
        installs_max: 1,
        acquires_max: 1,
        warm_start: true,
        urgent_leader: true,
        releases: false,
        rates_ppm: Some(vec![FAST_PPM, FAST_PPM]),
        plant,
    }
}

/// Run one BFS to the end (or to `stop`), print its counts, return the checker.
fn run(name: &str, config: Config, stop: Option<&'static str>) -> impl Checker<LeaseModel> {
    let started = Instant::now();
    let mut builder = LeaseModel::new(config).checker();
    if let Some(p) = stop {
        builder = builder.finish_when(HasDiscoveries::AnyOf(BTreeSet::from([p])));
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "{name}: {} states ({} unique), depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker
}

/// Check the fixed code; `must_reach` are the states (of [`COVERAGE`]) the bounds must reach.
fn assert_fixed_code_passes(name: &str, config: Config, must_reach: &[&str]) {
    let model = LeaseModel::new(config.clone());
    let checker = run(name, config, None);
    for property in SAFETY {
        if let Some(path) = checker.discovery(property) {
            panic!("{name}: {property} broken:\n{}", model.trace(&path));
        }
    }
    for reached in COVERAGE {
        let found = checker.discovery(reached).is_some();
        println!("{name}: {reached}: {}", if found { "yes" } else { "no" });
        assert!(
            found || !must_reach.contains(&reached),
            "{name}: never {reached}; the bounds are too small to judge the lease rules"
        );
    }
}

#[test]
fn fixed_code_satisfies_every_property() {
    // Every clock-rate assignment (both edges of the drift bound per member), shorter horizon.
    assert_fixed_code_passes(
        "2 members, every rate, 2 clients, 4 ticks",
        Config {
            rates_ppm: None,
            ..two_members(4, Plant::default())
        },
        &[],
    );
    // The bounds under which the planted bugs are found below.
    assert_fixed_code_passes(
        "2 members fast, 2 clients, 6 ticks",
        two_members(6, Plant::default()),
        &COVERAGE,
    );
    // Three members, two elections: a lagging member elected after another failover.
    assert_fixed_code_passes(
        "3 members, 2 elections, 1 client, 4 ticks",
        Config {
            members: 3,
            clients: 1,
            elections_max: 2,
            rates_ppm: Some(vec![SLOW_PPM, FAST_PPM, FAST_PPM]),
            ..two_members(4, Plant::default())
        },
        &[REACHES_ELECTED_BEHIND],
    );
}

/// Find a double grant with `plant` and print the shortest trace to it.
fn assert_planted_bug_found(name: &str, plant: Plant) {
    let config = two_members(6, plant);
    let model = LeaseModel::new(config.clone());
    let checker = run(name, config, Some(NO_DOUBLE_GRANT));
    let path = checker
        .discovery(NO_DOUBLE_GRANT)
        .unwrap_or_else(|| panic!("{name}: the checker missed the planted bug"));
    println!("{name}: {NO_DOUBLE_GRANT} broken:\n{}", model.trace(&path));
    let early = checker
        .discovery(NO_EARLY_EXPIRY)
        .unwrap_or_else(|| panic!("{name}: no early expiry found"));
    println!("{name}: {NO_EARLY_EXPIRY} broken:\n{}", model.trace(&early));
}

/// Issue #9, bug 1: a follower's mark survives a snapshot install whose table lifted it.
#[test]
fn planted_bug_1_is_found() {
    assert_planted_bug_found(
        "bug 1 (stale mark after install)",
        Plant {
            stale_mark_after_install: true,
            ..Plant::default()
        },
    );
}

/// Issue #9, bug 2: a new leader resumes leases before applying the old leader's tail.
#[test]
fn planted_bug_2_is_found() {
    assert_planted_bug_found(
        "bug 2 (resume before applied)",
        Plant {
            resume_before_applied: true,
            ..Plant::default()
        },
    );
}
