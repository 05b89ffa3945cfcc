//! The book's "Operating a cluster" guide, run as written (issue #14): the shell block between
//! the `operating-a-cluster` markers is taken from docs/operating.md and run by `bash` in an empty
//! directory on free ports (`common::walkthrough`): config files, three members started and
//! waited for through `/readyz`, a fourth added with `--join` and `cluster add`, a backup of the
//! running cluster, a stuck lock found and force-released, the audit record read, the fourth
//! member removed. Each step's output is checked here, so the guide cannot drift from the code.

mod common;

use std::time::Duration;

use common::walkthrough;

#[test]
fn the_operating_a_cluster_guide_runs_as_written() {
    let script = walkthrough::book_block("operating-a-cluster");
    let ran = walkthrough::run(
        &script,
        &["127.0.0.1:743", "127.0.0.1:753"],
        Duration::from_secs(180),
    );
    let members = ran.ports[0].1;
    let logs = [
        "member-1.log",
        "member-2.log",
        "member-3.log",
        "member-4.log",
    ];
    let all = ran.all(&logs);
    let out = &ran.out;
    assert!(ran.status.success(), "the guide failed\n{all}");

    // Step 2: every member said ready, and `cluster status` shows three, one the leader.
    assert_eq!(out.matches("ready").count(), 3, "{all}");
    assert!(out.contains("leader"), "{all}");
    for id in 1..=3 {
        assert!(
            out.contains(&format!("127.0.0.1:{}", members * 10 + id)),
            "cluster status lists member {id}\n{all}"
        );
    }
    // Step 3: member 4 was added and promoted to voter.
    let member_4 = format!("127.0.0.1:{}", members * 10 + 4);
    assert!(
        out.lines()
            .any(|l| l.starts_with(&format!("member 4 at {member_4} added"))
                && l.contains("voters now:")
                && l.contains(&format!("4={member_4}"))),
        "member 4 became a voter\n{all}"
    );
    // Step 4: the backup names its log index and source, and the file is there.
    assert!(
        out.lines()
            .any(|l| l.starts_with("cluster.backup: ") && l.contains("up to log index")),
        "{all}"
    );
    assert!(
        std::fs::metadata(ran.path("cluster.backup")).is_ok_and(|m| m.len() > 0),
        "{all}"
    );
    // Step 5: status names the holder with its owner text; the release is force; the stuck
    // deploy's `latchkey lock` learned it and stopped its COMMAND (exit 4: lock lost).
    assert!(
        out.lines().any(|l| l.starts_with("deploy: held by session")
            && l.contains("nightly deploy")
            && l.contains("with token")),
        "{all}"
    );
    assert!(out.contains("deploy: force-released from session"), "{all}");
    assert!(
        out.contains("the stuck deploy's latchkey lock stopped its command: exit 4"),
        "{all}"
    );
    // Step 6: the audit record says what, which lock, and why.
    assert!(
        out.lines()
            .any(|l| l.contains("force-release deploy from session")
                && l.contains("INC-42: deploy hung")),
        "{all}"
    );
    // Step 7: member 4 is no longer a voter, and `kill $(jobs -p)` stopped every member.
    assert!(
        out.lines().any(|l| l.starts_with("member 4 removed")
            && l.contains("voters now:")
            && !l.contains(&format!("4={member_4}"))),
        "{all}"
    );
    assert!(!ran.left_running, "a member outlived the guide\n{all}");
}
