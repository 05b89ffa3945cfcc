//! Health that means something (issue #14): `/healthz` says the process is up, `/readyz` says
//! whether the member can serve. A member of a three-member cluster started alone is up but
//! not ready (no leader can be elected: 503 naming why); once a second member joins it, a
//! leader is elected and both say ready (200). The standard gRPC health service
//! (`grpc.health.v1.Health`, on the client port) says the same: NOT_SERVING, then SERVING.

mod common;

use std::time::{Duration, Instant};

use common::serve::ServeProcess;
use common::{free_port, http_get};

/// Polls `GET path` until it answers `status` (bounded): the last answer.
fn wait_for(addr: &str, path: &str, status: u16) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = http_get(addr, path);
        if let Some((s, body)) = &got {
            if *s == status {
                return (*s, body.clone());
            }
        }
        assert!(
            Instant::now() < deadline,
            "{addr}{path} never answered {status}; last: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The gRPC health status of the whole server ("") at `addr`, or None if it did not answer.
fn grpc_health(addr: &str) -> Option<i32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .ok()?
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .ok()?;
        let mut c = tonic_health::pb::health_client::HealthClient::new(channel);
        c.check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .ok()
        .map(|r| r.into_inner().status)
    })
}

/// Polls the gRPC health check until it answers `status` (bounded).
fn wait_for_grpc(addr: &str, status: tonic_health::pb::health_check_response::ServingStatus) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = grpc_health(addr);
        if got == Some(status as i32) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{addr}: gRPC health never {status:?}; last: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_member_without_a_leader_is_up_but_not_ready_and_ready_once_one_is_elected() {
    let tmp = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let metrics: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let peers = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let start = |i: usize| {
        let mut p = ServeProcess::new(tmp.path().join(format!("n{}.log", i + 1)));
        p.spawn(
            &format!("member {}", i + 1),
            [
                "--id".to_owned(),
                (i + 1).to_string(),
                "--listen".to_owned(),
                format!("127.0.0.1:{}", ports[i]),
                "--data-dir".to_owned(),
                tmp.path().join(format!("n{}", i + 1)).display().to_string(),
                "--peers".to_owned(),
                peers.clone(),
                "--metrics-listen".to_owned(),
                metrics[i].clone(),
            ],
        );
        p
    };

    let mut first = start(0);
    wait_for(&metrics[0], "/healthz", 200);
    let (_, why) = wait_for(&metrics[0], "/readyz", 503);
    assert!(
        why.contains("no leader known") || why.contains("election"),
        "{why}"
    );
    let client_addr = |i: usize| format!("127.0.0.1:{}", ports[i]);
    use tonic_health::pb::health_check_response::ServingStatus;
    wait_for_grpc(&client_addr(0), ServingStatus::NotServing);
    // Still not ready a while later: alone, it cannot be elected.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(http_get(&metrics[0], "/readyz").map(|r| r.0), Some(503));
    assert_eq!(
        grpc_health(&client_addr(0)),
        Some(ServingStatus::NotServing as i32)
    );

    let mut second = start(1);
    wait_for(&metrics[0], "/readyz", 200);
    wait_for(&metrics[1], "/readyz", 200);
    wait_for_grpc(&client_addr(0), ServingStatus::Serving);
    wait_for_grpc(&client_addr(1), ServingStatus::Serving);
    for p in [&mut first, &mut second] {
        p.kill9();
    }
}
