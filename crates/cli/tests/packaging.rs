//! The packaging in `packaging/` (issue #14 item 10), exercised as far as this machine allows:
//! the systemd unit passes `systemd-analyze verify` (when systemd's tools are installed), and
//! the command lines the unit and the container image run are run here, on the real binary
//! with the paths and ports moved: each member becomes ready, survives the unit's reload
//! signal, and stops cleanly (exit 0) on the stop signal both name. The image itself is not
//! built: there is no container daemon or base image on this machine.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::serve::ServeProcess;
use common::{bin, free_port, http_get, signal};
use nix::sys::signal::Signal;

fn packaging(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../packaging")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The value of the unit's `KEY=` line (the only one of that key).
fn unit_value<'a>(unit: &'a str, key: &str) -> &'a str {
    let mut values = unit
        .lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='));
    let value = values
        .next()
        .unwrap_or_else(|| panic!("the unit has no {key}="));
    assert!(values.next().is_none(), "the unit has two {key}= lines");
    value
}

/// Runs `serve ARGS` until `/readyz` on `metrics` says ready (bounded); then the unit's reload
/// signal must leave it serving, and SIGTERM must stop it with exit 0.
fn serve_until_ready_then_stop(dir: &Path, who: &str, args: &[String], metrics: &str) {
    let mut member = ServeProcess::new(dir.join(format!("{who}.log")));
    member.spawn(who, args);
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(metrics, "/readyz").map(|r| r.0) != Some(200) {
        assert!(
            member.exited().is_none(),
            "{who} exited:\n{}",
            member.log_tail(20)
        );
        assert!(
            Instant::now() < deadline,
            "{who} never became ready:\n{}",
            member.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // ExecReload: SIGHUP reloads certificates; without TLS it must be harmless (it killed the
    // process: SIGHUP's default action, before serve handled it whether or not TLS was on).
    signal(member.pid(), Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(member.log_path())
        .unwrap_or_default()
        .contains("SIGHUP")
    {
        assert!(
            member.exited().is_none(),
            "{who} died of SIGHUP:\n{}",
            member.log_tail(20)
        );
        assert!(
            Instant::now() < deadline,
            "{who} never logged the SIGHUP:\n{}",
            member.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        http_get(metrics, "/readyz").map(|r| r.0),
        Some(200),
        "{who} after SIGHUP:\n{}",
        member.log_tail(20)
    );
    let status = member
        .sigterm(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{who}: {e}\n{}", member.log_tail(20)))
        .expect("it was running");
    assert!(
        status.success(),
        "{who} stopped with {status}:\n{}",
        member.log_tail(20)
    );
}

#[test]
fn the_systemd_unit_verifies_and_its_exec_start_serves() {
    let unit = packaging("latchkey.service");
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(unit_value(&unit, "ExecReload"), "/bin/kill -HUP $MAINPID");
    assert_eq!(unit_value(&unit, "KillSignal"), "SIGTERM");
    // A usage error (exit 2) is not restarted; a storage failure (exit 1) is.
    assert_eq!(unit_value(&unit, "Restart"), "on-failure");
    assert_eq!(unit_value(&unit, "RestartPreventExitStatus"), "2");

    let exec = unit_value(&unit, "ExecStart");
    let installed = "/usr/bin/latchkey";
    assert!(exec.starts_with(installed), "{exec}");
    let local = unit.replace(installed, bin());
    if Path::new("/usr/bin/systemd-analyze").exists() {
        let path = dir.path().join("latchkey.service");
        std::fs::write(&path, &local).unwrap();
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "systemd-analyze verify: {stderr}");
        assert!(
            !stderr.contains("latchkey.service"),
            "systemd-analyze warns about the unit: {stderr}"
        );
    } else {
        eprintln!("systemd-analyze is not installed: the unit's syntax is not verified");
    }

    // ExecStart as systemd would run it, with a config file of the kind docs/configuration.md
    // shows (the data dir is the StateDirectory).
    assert_eq!(unit_value(&unit, "StateDirectory"), "latchkey");
    let (listen, metrics) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let data = dir.path().join("state");
    let config = dir.path().join("latchkey.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"{listen}\"\ndata-dir = \"{}\"\nmetrics-listen = \"{metrics}\"\n",
            data.display()
        ),
    )
    .unwrap();
    let args: Vec<String> = exec
        .split_whitespace()
        .skip(1)
        .map(|word| match word {
            "/etc/latchkey/latchkey.toml" => config.display().to_string(),
            w => w.to_owned(),
        })
        .collect();
    assert!(args.contains(&config.display().to_string()), "{exec}");
    assert_eq!(args.first().map(String::as_str), Some("serve"), "{exec}");
    // A usage error in the member's flags exits 2, which the unit does not restart.
    let bad = Command::new(bin())
        .args(&args)
        .arg("--no-such-flag")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    serve_until_ready_then_stop(dir.path(), "the unit's member", &args[1..], &metrics);
    assert!(
        data.join("raft-log").is_dir(),
        "the log is in the StateDirectory"
    );
}

#[test]
fn the_container_images_command_serves() {
    let file = packaging("Containerfile");
    // The final stage runs the binary the build stage made (or, with `BINARY=prebuilt`, the
    // one given), as an unprivileged user. The image itself is built and run by
    // packaging/container/check.sh (in `.ci/run`); this runs its command on the binary.
    assert!(file.contains("cargo build --release --locked -p latchkey"));
    assert!(file.contains("\nARG BINARY=source\n"));
    assert!(file.contains("COPY --from=binary /latchkey /usr/local/bin/latchkey"));
    assert!(file.contains("\nUSER latchkey\n"));
    assert!(file.contains("\nSTOPSIGNAL SIGTERM\n"));
    let json = |key: &str| -> Vec<String> {
        let line = file
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {key}"));
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{key} {line}: {e}"))
    };
    assert_eq!(
        json("ENTRYPOINT"),
        vec!["/usr/local/bin/latchkey".to_owned()]
    );
    let dir = tempfile::tempdir().unwrap();
    let data: PathBuf = dir.path().join("volume");
    let metrics = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> = json("CMD")
        .into_iter()
        .map(|a| match a.as_str() {
            "0.0.0.0:7420" => format!("127.0.0.1:{}", free_port()),
            "0.0.0.0:9420" => metrics.clone(),
            "/var/lib/latchkey" => data.display().to_string(),
            _ => a,
        })
        .collect();
    assert_eq!(args.first().map(String::as_str), Some("serve"));
    serve_until_ready_then_stop(dir.path(), "the image's member", &args[1..], &metrics);
    assert!(data.join("raft-log").is_dir(), "the log is in the volume");
}
