//! Starting a cluster member with a bad configuration is refused at once, with a clear message,
//! and leaves the data dir exactly as it was (or not created at all). Also: a healthy 3-node
//! cluster reports every member in `cluster status`, and a stopped one as unreachable.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::cluster::Cluster;
use common::{free_port, run, Output};

const T: Duration = Duration::from_secs(20);

fn serve(args: &[&str], dir: &Path) -> Output {
    let mut full = vec!["serve".to_string()];
    full.extend(args.iter().map(|s| s.to_string()));
    run(&full, dir, T)
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.insert(
                    path.strip_prefix(dir).unwrap().display().to_string(),
                    std::fs::read(&path).expect("read file"),
                );
            }
        }
    }
    out
}

#[test]
fn bad_member_lists_are_refused_and_create_no_data_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let data_flag = data.display().to_string();
    let a = format!("127.0.0.1:{}", free_port());
    let cases: [(&str, Vec<String>, i32, &str); 5] = [
        (
            "duplicate ids",
            vec![
                "--id".into(),
                "1".into(),
                "--peers".into(),
                format!("1={a},2=127.0.0.1:2,1=127.0.0.1:3"),
            ],
            2,
            "member id 1 appears twice",
        ),
        (
            "unparsable peers",
            vec![
                "--id".into(),
                "1".into(),
                "--peers".into(),
                format!("1={a},two=127.0.0.1:2"),
            ],
            2,
            "the id must be a whole number",
        ),
        (
            "an id not in --peers",
            vec![
                "--id".into(),
                "4".into(),
                "--peers".into(),
                format!("1={a},2=127.0.0.1:2,3=127.0.0.1:3"),
            ],
            1,
            "this node's id 4 is not in --peers (1,2,3)",
        ),
        (
            "id 0",
            vec!["--id".into(), "0".into()],
            1,
            "node id must be at least 1",
        ),
        (
            "election timeout below three heartbeats",
            vec![
                "--heartbeat-ms".into(),
                "500".into(),
                "--election-timeout-ms".into(),
                "1000..2000".into(),
            ],
            1,
            "heartbeat must be non-zero and at most a third of the election timeout",
        ),
    ];
    for (what, args, code, message) in cases {
        let mut all: Vec<&str> = vec!["--listen", &a, "--data-dir", &data_flag];
        all.extend(args.iter().map(String::as_str));
        let out = serve(&all, tmp.path());
        assert_eq!(out.status.code(), Some(code), "{what}: {}", out.stderr);
        assert!(
            out.stderr.contains(message),
            "{what}: stderr {:?}",
            out.stderr
        );
        assert!(!data.exists(), "{what}: the data dir was created");
    }
}

#[test]
fn a_data_dir_from_another_cluster_is_refused_and_left_untouched() {
    let cluster = Cluster::start(3);
    let leader = cluster.wait_leader(&[], T).0;
    // Some state worth keeping in the log.
    let out = cluster.cli(&[
        "lock",
        "--endpoints",
        &cluster.endpoints(),
        "--wait",
        "5s",
        "kept",
        "--",
        "true",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let mut cluster = cluster;
    for id in cluster.ids() {
        cluster.kill9(id);
    }
    // The member's data dir, taken by a node of another cluster (other addresses).
    let dir = cluster.data_dir(leader);
    let before = snapshot(&dir);
    assert!(!before.is_empty());
    let me = format!("127.0.0.1:{}", free_port());
    let other = format!("{leader}={me},9=127.0.0.1:1,8=127.0.0.1:2");
    let out = serve(
        &[
            "--id",
            &leader.to_string(),
            "--listen",
            &me,
            "--data-dir",
            &dir.display().to_string(),
            "--peers",
            &other,
        ],
        &cluster.work_dir(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("belongs to cluster")
            && out.stderr.contains("--peers names cluster")
            && out.stderr.contains("refusing to start"),
        "stderr: {}",
        out.stderr
    );
    assert!(
        snapshot(&dir) == before,
        "the refused start changed the data dir"
    );
}

#[test]
fn cluster_status_shows_every_member_and_an_unreachable_one() {
    let mut cluster = Cluster::start(3);
    let (leader, term) = cluster.wait_leader(&[], T);
    let report = cluster.cluster_status().expect("cluster status");
    assert_eq!(report["leader"], leader);
    let members = report["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{report}");
    for m in members {
        let id = m["id"].as_u64().unwrap();
        assert_eq!(m["addr"], cluster.addr(id).as_str());
        let role = if id == leader { "leader" } else { "follower" };
        assert_eq!(m["role"], role, "{report}");
        assert_eq!(m["term"], term, "{report}");
        assert!(m["last_log_index"].as_u64().unwrap() >= m["applied_index"].as_u64().unwrap());
        assert!(m["applied_index"].as_u64().unwrap() >= 1, "{report}");
    }
    // Given only one endpoint, it finds the others through the membership.
    let out = cluster.cli(&[
        "cluster",
        "status",
        "--json",
        "--endpoints",
        &cluster.addr(leader),
    ]);
    let one: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(one["members"].as_array().unwrap().len(), 3, "{one}");

    let follower = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
    cluster.kill9(follower);
    let report = cluster.cluster_status().expect("cluster status");
    let down = report["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == follower)
        .cloned()
        .unwrap();
    assert_eq!(down["role"], "unreachable", "{report}");
    assert!(down["term"].is_null());
    assert_eq!(report["leader"], leader);
    // The human table names it too.
    let out = cluster.cli(&["cluster", "status", "--endpoints", &cluster.endpoints()]);
    assert!(
        out.stdout.contains("unreachable") && out.stdout.contains(&format!("leader: {leader}")),
        "{}",
        out.stdout
    );
}
