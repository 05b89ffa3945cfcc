//! `serve --peer-listen` (issue #13, authenticated members): a real 3-member cluster whose
//! members serve Raft on ports of their own (`--peers ID=CLIENT/PEER,...`). The client port
//! answers no peer RPC and the peer port no client call; leader hints name client ports; the
//! cluster grants locks and carries on after its leader is killed.

mod common;

use std::time::Duration;

use common::cluster::Cluster;
use common::rpc::{pinned, reason, request, runtime};
use common::wait_until;
use latchkey_proto::v1 as pb;
use latchkey_proto::v1::locks_client::LocksClient;
use latchkey_proto::v1::raft_peer_client::RaftPeerClient;
use tonic::transport::Endpoint;
use tonic::Code;

/// Bound for anything that should take a few seconds (elections, catching up).
const T: Duration = Duration::from_secs(20);

fn lock(cluster: &Cluster, name: &str) {
    let out = cluster.cli(&[
        "lock",
        "--endpoints",
        &cluster.endpoints(),
        name,
        "--",
        "true",
    ]);
    assert!(
        out.status.success(),
        "lock {name}: {}\n{}",
        out.stderr,
        cluster.logs()
    );
}

#[test]
fn with_peer_listen_raft_stays_off_the_client_port_and_the_cluster_survives_a_leader_kill() {
    let mut cluster = Cluster::start_with_peer_listen(3, &[]);
    let (leader, term) = cluster.wait_leader(&[], T);
    lock(&cluster, "jobs/before");

    let rt = runtime();
    let peer_addr = |id: u64| {
        cluster.members[(id - 1) as usize]
            .peer_addr
            .clone()
            .unwrap()
    };
    for id in cluster.ids() {
        let (client_port, peer_port) = (cluster.addr(id), peer_addr(id));
        rt.block_on(async {
            let _in_runtime = rt.enter();
            let raft = |addr: &str| {
                RaftPeerClient::new(
                    Endpoint::from_shared(format!("http://{addr}"))
                        .unwrap()
                        .connect_lazy(),
                )
            };
            // A peer RPC on the client port: no such service there.
            let on_client_port = raft(&client_port)
                .vote(pb::PeerMessage { payload: vec![] })
                .await;
            assert_eq!(
                on_client_port.as_ref().map_err(tonic::Status::code).err(),
                Some(Code::Unimplemented),
                "member {id}'s client port {client_port} answered a vote: {on_client_port:?}"
            );
            // The peer port serves it (and refuses an unsigned message, as ever).
            let on_peer_port = raft(&peer_port)
                .vote(pb::PeerMessage { payload: vec![] })
                .await;
            assert_eq!(
                on_peer_port.as_ref().map_err(tonic::Status::code).err(),
                Some(Code::PermissionDenied),
                "member {id}'s peer port {peer_port}: {on_peer_port:?}"
            );
            // And answers no client call.
            let status = LocksClient::new(
                Endpoint::from_shared(format!("http://{peer_port}"))
                    .unwrap()
                    .connect_lazy(),
            )
            .node_status(pb::NodeStatusRequest {})
            .await;
            assert_eq!(
                status.as_ref().map_err(tonic::Status::code).err(),
                Some(Code::Unimplemented),
                "member {id}'s peer port answered a client: {status:?}"
            );
        });
    }

    // A follower sends clients to the leader's client port, never its peer port.
    let follower = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
    let mut raw = pinned(&rt, &cluster.addr(follower));
    let refused = rt
        .block_on(raw.create_session(request(
            pb::CreateSessionRequest {
                ttl_ms: 10_000,
                ..Default::default()
            },
            T,
        )))
        .expect_err("a follower created a session");
    assert_eq!(
        reason(&refused).as_deref(),
        Some("not-leader"),
        "{refused:?}"
    );
    assert_eq!(
        refused
            .metadata()
            .get(latchkey_proto::LEADER_ADDR_KEY)
            .map(|v| v.to_str().unwrap()),
        Some(cluster.addr(leader).as_str()),
        "{refused:?}"
    );

    cluster.kill9(leader);
    let (new_leader, new_term) = cluster.wait_leader(&[leader], T);
    assert!(new_term > term, "{new_term} after {term}");
    assert_ne!(new_leader, leader);
    lock(&cluster, "jobs/after");
    wait_until("cluster status names the new leader", T, || {
        cluster
            .cluster_status()
            .is_some_and(|s| s["leader"].as_u64() == Some(new_leader))
    });
}
