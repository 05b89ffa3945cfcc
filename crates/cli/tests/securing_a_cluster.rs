//! The book's "Securing a cluster" walkthrough, run as written (issue #13): the shell block
//! between the `securing-a-cluster` markers is taken from docs/securing.md and run by `bash` in an
//! empty directory, with `latchkey` on the PATH and its fixed ports moved to free ones
//! (`common::walkthrough`). Every claim the walkthrough makes in its comments is checked against
//! what it printed, so the book cannot drift from the code.

mod common;

use std::time::Duration;

use common::walkthrough;

#[test]
fn the_securing_a_cluster_walkthrough_runs_as_written() {
    let script = walkthrough::book_block("securing-a-cluster");
    let ran = walkthrough::run(&script, &["127.0.0.1:742"], Duration::from_secs(120));
    let prefix = ran.ports[0].1;
    let (out, err) = (&ran.out, &ran.err);
    let all = ran.all(&["member-1.log", "member-2.log", "member-3.log"]);
    let logs = ["member-1.log", "member-2.log", "member-3.log"]
        .map(|f| ran.file(f))
        .concat();
    assert!(ran.status.success(), "the walkthrough failed\n{all}");

    // Step 4: the deployer locks deploy/web, and its COMMAND sees the fencing token.
    let token = out
        .lines()
        .find_map(|l| l.strip_prefix("deploying under token "))
        .unwrap_or_else(|| panic!("no grant of deploy/web\n{all}"));
    assert!(
        token.trim().parse::<u64>().is_ok(),
        "token {token:?}\n{all}"
    );
    // ... but not other/x: permission denied, exit 5, naming the lock and the permission.
    assert!(out.contains("other/x refused: exit 5"), "{all}");
    assert!(
        err.contains("other/x") && err.contains("lock"),
        "the denial names the lock and the permission\n{all}"
    );
    // `cluster status` shows three members, one of them the leader.
    assert!(out.contains("leader"), "{all}");
    for id in 1..=3 {
        assert!(
            out.contains(&format!("127.0.0.1:{}", prefix * 10 + id)),
            "cluster status lists member {id}\n{all}"
        );
    }
    // Step 5: no certificate fails the TLS handshake (exit 1), a certificate naming no identity
    // is unauthenticated (exit 5), plaintext against TLS is told so (exit 1).
    assert!(out.contains("no certificate: exit 1"), "{all}");
    assert!(out.contains("unknown identity: exit 5"), "{all}");
    assert!(out.contains("plaintext: exit 1"), "{all}");
    assert!(
        err.contains("intruder"),
        "the refusal names the certificate's name\n{all}"
    );

    // The members formed one cluster over mTLS and never refused one another.
    assert!(
        !logs.contains("refused a peer message"),
        "a member refused another\n{all}"
    );
    // `kill $(jobs -p)` stopped them.
    assert!(
        !ran.left_running,
        "the members outlived the walkthrough\n{all}"
    );
}
