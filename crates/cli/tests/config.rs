//! `latchkey serve --config FILE` (issue #14) on the real binary: a node starts from a file
//! alone, flags win over `LATCHKEY_*` variables, which win over the file; an unknown key or a
//! value of the wrong type is refused (exit 2) naming the key and the file; the sample config in
//! the repository starts a node.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::serve::ServeProcess;
use common::{free_port, wait_until, Output, Proc, CLI_TIMEOUT, READY_TIMEOUT};

/// `latchkey ARGS` in `dir` with extra environment variables, to completion.
fn run_with_env(args: &[&str], env: &[(&str, &str)], dir: &Path) -> Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let mut proc = Proc::spawn_with(&args, dir, |command: &mut Command| {
        for (key, value) in env {
            command.env(key, value);
        }
    });
    let status = proc.wait(CLI_TIMEOUT);
    Output {
        status,
        stdout: proc.stdout(),
        stderr: proc.stderr(),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("writing the config file");
    path
}

/// Waits (bounded) until `cluster status` at `addr` names member 1 the leader.
fn wait_leader(addr: &str, serve: &mut ServeProcess, dir: &Path) {
    wait_until(&format!("a leader at {addr}"), READY_TIMEOUT, || {
        assert!(
            serve.exited().is_none(),
            "the server exited:\n{}",
            serve.log_tail(40)
        );
        let out = run_with_env(
            &["cluster", "status", "--json", "--endpoints", addr],
            &[],
            dir,
        );
        out.status.success() && out.stdout.contains("\"leader\":1")
    });
}

#[test]
fn a_node_starts_from_a_config_file_with_paths_relative_to_it() {
    let tmp = tempfile::tempdir().unwrap();
    let etc = tmp.path().join("etc");
    std::fs::create_dir(&etc).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let file = write(
        &etc,
        "latchkey.toml",
        &format!("listen = \"{addr}\"\ndata-dir = \"data\"\nheartbeat-ms = 50\n"),
    );
    let mut serve = ServeProcess::new(tmp.path().join("server.log"));
    serve.spawn(
        "the configured server",
        ["--config".as_ref(), file.as_os_str()],
    );
    wait_leader(&addr, &mut serve, tmp.path());
    // `data` is beside the file, not in the directory serve was started in.
    assert!(
        etc.join("data").is_dir(),
        "no data dir next to the config file"
    );
    serve
        .sigterm(Duration::from_secs(10))
        .expect("a clean stop");
}

/// The member id is in the refusal of an id that is not among the peers, before anything
/// binds or touches the data dir: which source won shows in the message.
#[test]
fn a_flag_wins_over_the_environment_which_wins_over_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write(
        tmp.path(),
        "latchkey.toml",
        "id = 11\npeers = [\"1=127.0.0.1:1\"]\n",
    );
    let file = file.to_str().unwrap();
    let config = ["--config", file];
    // The id in the refusal of `serve ARGS` with the environment `env`.
    let refused_id = |args: &[&str], env: &[(&str, &str)]| {
        let args = [&["serve"], args].concat();
        let out = run_with_env(&args, env, tmp.path());
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?} {env:?}: {}",
            out.stderr
        );
        let (_, rest) = out
            .stderr
            .split_once("this node's id ")
            .unwrap_or_else(|| panic!("{args:?} {env:?}: {}", out.stderr));
        rest.split(' ').next().unwrap().to_owned()
    };
    assert_eq!(refused_id(&config, &[]), "11", "the file");
    assert_eq!(
        refused_id(&config, &[("LATCHKEY_ID", "12")]),
        "12",
        "the environment over the file"
    );
    assert_eq!(
        refused_id(
            &[&config[..], &["--id", "13"]].concat(),
            &[("LATCHKEY_ID", "12")]
        ),
        "13",
        "a flag over the environment"
    );
    // The config file itself can come from the environment.
    assert_eq!(
        refused_id(&[], &[("LATCHKEY_CONFIG", file)]),
        "11",
        "LATCHKEY_CONFIG"
    );
    assert!(
        !tmp.path().join("latchkey-data").exists(),
        "a refused start touched the data dir"
    );
}

#[test]
fn an_unknown_key_or_a_wrong_type_is_refused_naming_the_key_and_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    for (text, expect) in [
        (
            "id = 1\nliste = \"127.0.0.1:7420\"\n",
            "line 2: unknown key `liste`",
        ),
        (
            "heartbeat-ms = \"fast\"\n",
            "line 1: key `heartbeat-ms`: \"fast\"",
        ),
        ("id = \"one\"\n", "key `id`"),
        ("listen = 7420\n", "key `listen`"),
    ] {
        let file = write(tmp.path(), "bad.toml", text);
        let out = run_with_env(
            &["serve", "--config", file.to_str().unwrap()],
            &[],
            tmp.path(),
        );
        assert_eq!(out.status.code(), Some(2), "{text}: {}", out.stderr);
        assert!(
            out.stderr.contains(expect) && out.stderr.contains(file.to_str().unwrap()),
            "{text}: want {expect:?} and the file in\n{}",
            out.stderr
        );
    }
    let out = run_with_env(&["serve", "--config", "no-such-file.toml"], &[], tmp.path());
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("no-such-file.toml"), "{}", out.stderr);
}

/// The commented sample in the repository starts a node (its address and data dir overridden
/// by flags, which win).
#[test]
fn the_sample_config_starts_a_node() {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../latchkey.example.toml");
    let tmp = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let data = tmp.path().join("data");
    let mut serve = ServeProcess::new(tmp.path().join("server.log"));
    serve.spawn(
        "the sample-configured server",
        [
            "--config".as_ref(),
            sample.as_os_str(),
            "--listen".as_ref(),
            addr.as_ref(),
            "--data-dir".as_ref(),
            data.as_os_str(),
        ],
    );
    wait_leader(&addr, &mut serve, tmp.path());
    assert!(data.is_dir());
    serve
        .sigterm(Duration::from_secs(10))
        .expect("a clean stop");
}
