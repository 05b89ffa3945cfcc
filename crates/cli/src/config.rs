//! `latchkey serve --config FILE`: the serve flags in a TOML file.
//!
//! The file's keys are the serve flags' long names (`listen`, `data-dir`, `peers`, ...), and
//! each value goes through its flag's own parser. clap's definition of `serve` is the one list
//! of settings: a new flag is a new key, with nothing here to change (the sample config's test
//! fails until the sample names it). Each flag has a `LATCHKEY_` environment variable too.
//!
//! Precedence, highest first: flag, environment variable, file, built-in default. The file's
//! values become the flags' defaults ([`apply`]), which clap ranks below the command line and
//! the environment, so the order is clap's own.
//!
//! What the file holds is checked as values only; whether they make a valid node is
//! `ServerConfig::validate`'s job, as for flags.
//!
//! One key is more than a flag: `acl` is either a path, as `--acl` takes, or a table holding
//! the access-control list itself (`[acl.roles.NAME]`, `[acl.identities.NAME]`, the schema of
//! an `--acl` file), checked here and handed to `serve` as [`FileValues::inline_acl`]; `serve`
//! refuses it together with `--acl`/`LATCHKEY_ACL` (one list, from one place).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::builder::ValueHint;
use clap::error::{ContextKind, ContextValue};
use clap::{Arg, Command};
use latchkey_core::limits::CONFIG_FILE_BYTES_MAX;
use toml::Spanned;

/// The serve flag naming the file; it has no key in the file itself.
pub const CONFIG_ARG: &str = "config";

/// A configuration file that cannot be used. Every message names the file, and the key when
/// one is at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read config file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("config file {path} is {len} bytes, the limit is {max}")]
    TooBig { path: String, len: u64, max: u64 },
    #[error("config file {path}: {message}")]
    Syntax { path: String, message: String },
    #[error(
        "config file {path}, line {line}: unknown key `{key}` (the keys are the serve flags' \
         long names: {known})"
    )]
    UnknownKey {
        path: String,
        line: usize,
        key: String,
        known: String,
    },
    #[error("config file {path}, line {line}: key `{key}`: {message}")]
    BadValue {
        path: String,
        line: usize,
        key: String,
        message: String,
    },
}

/// The values of one config file, by flag id, ready to become the flags' defaults.
#[derive(Debug, Default)]
pub struct FileValues {
    flags: Vec<(clap::Id, OsString)>,
    /// The access-control list given inline (`[acl]`), as TOML text in the `--acl` file's
    /// schema, already checked.
    pub inline_acl: Option<String>,
}

/// The serve flag whose key may also hold its file's contents inline.
const ACL_ARG: &str = "acl";

/// The settable flags of `serve`: all but `--config` itself and clap's own.
pub fn keys(serve: &Command) -> impl Iterator<Item = &Arg> {
    serve.get_arguments().filter(|arg| {
        let id = arg.get_id().as_str();
        arg.get_long().is_some() && id != CONFIG_ARG && id != "help"
    })
}

/// Reads the file at `path` and checks it against `serve`'s flags: every key must be one, and
/// every value must parse as that flag's would. Relative paths in it are relative to the file's
/// directory (not to where `serve` was started), so one file works from systemd and a shell.
pub fn load(path: &Path, serve: &Command) -> Result<FileValues, ConfigFileError> {
    let shown = path.display().to_string();
    let read_error = |error| ConfigFileError::Read {
        path: shown.clone(),
        error,
    };
    let len = std::fs::metadata(path).map_err(read_error)?.len();
    if len > CONFIG_FILE_BYTES_MAX {
        return Err(ConfigFileError::TooBig {
            path: shown,
            len,
            max: CONFIG_FILE_BYTES_MAX,
        });
    }
    let text = std::fs::read_to_string(path).map_err(read_error)?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse(&text, &shown, base, serve)
}

/// [`load`] of a file's text; `shown` names it in errors, `base` anchors relative paths.
pub fn parse(
    text: &str,
    shown: &str,
    base: &Path,
    serve: &Command,
) -> Result<FileValues, ConfigFileError> {
    // Values without spans: toml 0.8 cannot deserialize a nested table (the inline `[acl]`)
    // into a `Spanned<Value>`. A value's errors name its key's line, where it starts.
    let table: BTreeMap<Spanned<String>, toml::Value> =
        toml::from_str(text).map_err(|e| ConfigFileError::Syntax {
            path: shown.to_owned(),
            message: e.to_string(),
        })?;
    let line = |span: std::ops::Range<usize>| {
        1 + text.as_bytes()[..span.start.min(text.len())]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
    };
    let mut values = Vec::new();
    let mut inline_acl = None;
    for (key, value) in &table {
        let Some(arg) = keys(serve).find(|a| a.get_long() == Some(key.get_ref().as_str())) else {
            return Err(ConfigFileError::UnknownKey {
                path: shown.to_owned(),
                line: line(key.span()),
                key: key.get_ref().clone(),
                known: keys(serve)
                    .filter(|a| !a.is_hide_set())
                    .filter_map(Arg::get_long)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let bad = |message: String| ConfigFileError::BadValue {
            path: shown.to_owned(),
            line: line(key.span()),
            key: key.get_ref().clone(),
            message,
        };
        if let (ACL_ARG, toml::Value::Table(acl)) = (arg.get_id().as_str(), value) {
            let text = toml::to_string(acl).map_err(|e| bad(e.to_string()))?;
            latchkey_server::acl::Acl::parse(&text)
                .map_err(|e| bad(format!("the inline access-control list: {e}")))?;
            inline_acl = Some(text);
            continue;
        }
        let text = as_flag_text(value, arg).map_err(bad)?;
        check_value(arg, &text).map_err(bad)?;
        let text = match arg.get_value_hint() {
            ValueHint::AnyPath | ValueHint::FilePath | ValueHint::DirPath => {
                base.join(&text).into_os_string()
            }
            _ => OsString::from(text),
        };
        values.push((arg.get_id().clone(), text));
    }
    Ok(FileValues {
        flags: values,
        inline_acl,
    })
}

/// `serve` with the file's values as its flags' defaults (see the module comment).
pub fn apply(serve: Command, values: &FileValues) -> Command {
    values.flags.iter().fold(serve, |serve, (id, value)| {
        serve.mut_arg(id, |arg| arg.default_value(value.clone()))
    })
}

/// A TOML value as the text its flag would be given: strings as they are, numbers and booleans
/// written out, an array of strings as a comma-separated list (`peers = ["1=a:7420", ...]`).
fn as_flag_text(value: &toml::Value, arg: &Arg) -> Result<String, String> {
    let takes_value = arg.get_action().takes_values();
    match value {
        toml::Value::Boolean(b) if !takes_value => Ok(b.to_string()),
        _ if !takes_value => Err(format!("expected true or false, found {}", kind(value))),
        // A flag that takes `true` or `false` (`coalesce`, on by default).
        toml::Value::Boolean(b) if takes_bool(arg) => Ok(b.to_string()),
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Array(items) => items
            .iter()
            .map(|item| match item {
                toml::Value::String(s) => Ok(s.as_str()),
                other => Err(format!(
                    "expected an array of strings, found an array with {}",
                    kind(other)
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|items| items.join(",")),
        other => Err(format!("expected a string, found {}", kind(other))),
    }
}

/// The flag's value is `true` or `false` (clap's `bool` parser).
fn takes_bool(arg: &Arg) -> bool {
    let names: Vec<_> = arg
        .get_possible_values()
        .iter()
        .map(|v| v.get_name().to_owned())
        .collect();
    names == ["true", "false"]
}

fn kind(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

/// Parses `text` with `arg`'s own value parser, as the flag `--NAME=text` would be: the error
/// is the parser's message, without clap's flag-centred framing.
fn check_value(arg: &Arg, text: &str) -> Result<(), String> {
    let Some(long) = arg.get_long() else {
        return Ok(());
    };
    // The flag alone: its parser and value count, none of its relations to other flags or its
    // environment variable.
    let probe = Arg::new(arg.get_id().clone())
        .long(long.to_owned())
        .action(arg.get_action().clone())
        .value_delimiter(arg.get_value_delimiter())
        .value_parser(arg.get_value_parser().clone());
    let given = if arg.get_action().takes_values() {
        format!("--{long}={text}")
    } else if text == "true" {
        format!("--{long}")
    } else {
        return Ok(());
    };
    let result = Command::new("latchkey-config")
        .no_binary_name(true)
        .disable_help_flag(true)
        .arg(probe)
        .try_get_matches_from([given]);
    let Err(e) = result else {
        return Ok(());
    };
    if let Some(source) = std::error::Error::source(&e) {
        return Err(format!("{text:?}: {source}"));
    }
    let valid: Vec<String> = match e.get(ContextKind::ValidValue) {
        Some(ContextValue::Strings(values)) => values.clone(),
        _ => Vec::new(),
    };
    if valid.is_empty() {
        Err(format!("{text:?}: {}", e.kind()))
    } else {
        Err(format!("{text:?} is not one of {}", valid.join(", ")))
    }
}

/// The file named by `--config`/`LATCHKEY_CONFIG` on this command line, if it is a `serve`
/// command line. Read before the real parse, because the file's values take part in it.
pub fn path_in(cli: &Command, argv: &[OsString]) -> Option<PathBuf> {
    let matches = cli
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(argv)
        .ok()?;
    let (name, serve) = matches.subcommand()?;
    if name != "serve" {
        return None;
    }
    serve.get_one::<PathBuf>(CONFIG_ARG).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn serve() -> Command {
        crate::Cli::command()
            .find_subcommand("serve")
            .expect("a serve subcommand")
            .clone()
    }

    fn parse_text(text: &str) -> Result<FileValues, ConfigFileError> {
        parse(text, "test.toml", Path::new("/etc/latchkey"), &serve())
    }

    #[test]
    fn values_become_the_flags_text() {
        let values = parse_text(
            "id = 2\nlisten = \"127.0.0.1:7421\"\npeers = [\"1=a:1\", \"2=b:2\"]\n\
             data-dir = \"data\"\nelection-timeout-ms = \"800..1600\"\ncoalesce = false\n",
        )
        .unwrap();
        let by_id: BTreeMap<&str, &OsString> = values
            .flags
            .iter()
            .map(|(id, v)| (id.as_str(), v))
            .collect();
        assert_eq!(by_id["id"], "2");
        assert_eq!(by_id["peers"], "1=a:1,2=b:2");
        // Relative to the file's directory.
        assert_eq!(by_id["data_dir"], "/etc/latchkey/data");
        assert_eq!(by_id["election_timeout_ms"], "800..1600");
        // A flag that takes true or false takes a TOML boolean.
        assert_eq!(by_id["coalesce"], "false");
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        let e = parse_text("id = 1\n\nliste = \"127.0.0.1:1\"\n").unwrap_err();
        let message = e.to_string();
        assert!(
            message.contains("test.toml, line 3: unknown key `liste`"),
            "{message}"
        );
        assert!(message.contains("listen"), "{message}");
        // A table is not a setting either.
        let e = parse_text("[server]\nlisten = \"127.0.0.1:1\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown key `server`"), "{e}");
    }

    #[test]
    fn a_wrong_type_or_value_names_the_key() {
        for (text, expect) in [
            ("heartbeat-ms = \"soon\"", "key `heartbeat-ms`: \"soon\":"),
            (
                "heartbeat-ms = 1.5",
                "key `heartbeat-ms`: expected a string, found a float",
            ),
            (
                "log-format = \"xml\"",
                "key `log-format`: \"xml\" is not one of text, json",
            ),
            (
                "peers = \"1=a:1,1=b:2\"",
                "key `peers`: \"1=a:1,1=b:2\": member id 1 appears twice",
            ),
            (
                "peers = [1, 2]",
                "key `peers`: expected an array of strings",
            ),
            (
                "listen = true",
                "key `listen`: expected a string, found a boolean",
            ),
        ] {
            let e = parse_text(text).unwrap_err().to_string();
            assert!(e.contains(expect), "{text}: {e}");
        }
    }

    /// The sample in the repository loads through the same code as `serve --config` and makes
    /// a valid configuration; its keys, set or commented out, name every visible serve flag,
    /// and its commented values parse too.
    #[test]
    fn the_sample_config_loads_and_names_every_serve_flag() {
        let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../latchkey.example.toml");
        let values = load(&sample, &serve()).expect("the sample loads");
        let command = crate::Cli::command().mut_subcommand("serve", |serve| apply(serve, &values));
        let matches = command
            .try_get_matches_from(["latchkey", "serve"])
            .expect("the sample's values parse");
        let cli = <crate::Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
        let crate::Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(args.data_dir, Path::new("/var/lib/latchkey"));
        crate::serve::config(&args).expect("the sample is a valid configuration");

        // The commented-out settings, uncommented.
        let text = std::fs::read_to_string(&sample).unwrap();
        let uncommented: String = text
            .lines()
            .filter_map(|line| line.strip_prefix("# "))
            .filter(|line| {
                line.split_once(" = ").is_some_and(|(key, _)| {
                    !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                })
            })
            .map(|line| format!("{line}\n"))
            .collect();
        parse(
            &uncommented,
            "sample, uncommented",
            Path::new("/"),
            &serve(),
        )
        .expect("the commented values parse");
        let all = format!("{text}\n{uncommented}");
        let named: Vec<&str> = all
            .lines()
            .filter_map(|line| line.split_once(" = ").map(|(key, _)| key.trim()))
            .collect();
        let serve = serve();
        for arg in keys(&serve).filter(|arg| !arg.is_hide_set()) {
            let key = arg.get_long().unwrap();
            assert!(
                named.contains(&key),
                "latchkey.example.toml does not name the serve flag --{key}"
            );
        }
    }

    /// Each serve flag has its environment variable, named after it.
    #[test]
    fn every_serve_flag_has_its_environment_variable() {
        let serve = serve();
        for arg in serve.get_arguments().filter(|a| a.get_long().is_some()) {
            let long = arg.get_long().unwrap();
            let want = format!("LATCHKEY_{}", long.to_uppercase().replace('-', "_"));
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(want.as_str()),
                "--{long}"
            );
        }
    }

    /// The access-control list inline: `[acl.roles.*]` and `[acl.identities.*]`, the schema of
    /// an `--acl` file, checked at load with the key's line in its errors.
    #[test]
    fn an_inline_acl_is_loaded_and_checked() {
        use latchkey_server::acl::{Acl, Need, Permission};
        use sha2::Digest;
        let hash: String = sha2::Sha256::digest(b"ci-token")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let values = parse_text(&format!(
            "listen = \"127.0.0.1:7420\"\n\
             [acl.roles.deployer]\nlock = [\"deploy/\"]\nread = [\"deploy/\"]\n\
             [acl.identities.ci]\ntoken_sha256 = \"{hash}\"\nroles = [\"deployer\"]\n"
        ))
        .unwrap();
        let acl = Acl::parse(values.inline_acl.as_deref().expect("an inline ACL")).unwrap();
        let ci = acl
            .authenticate(Some(&b"Bearer ci-token"[..]), None)
            .expect("the token names ci");
        assert_eq!(ci.name, "ci");
        assert!(ci
            .allows(Need::Lock("deploy/web", Permission::Lock))
            .is_ok());
        assert!(ci.allows(Need::Lock("other/x", Permission::Lock)).is_err());
        assert!(ci
            .allows(Need::Lock("deploy/web", Permission::Admin))
            .is_err());
        assert!(acl.authenticate(Some(&b"Bearer other"[..]), None).is_err());
        // No `acl` flag default: the file's list is not a path.
        assert!(!values.flags.iter().any(|(id, _)| id.as_str() == "acl"));
        // `acl` as a path still works.
        let values = parse_text("acl = \"acl.toml\"\n").unwrap();
        assert!(values.inline_acl.is_none());
        assert_eq!(values.flags[0].1, "/etc/latchkey/acl.toml");

        // A bad list names the key, its line and what is wrong.
        let e = parse_text("id = 1\n[acl.identities.ci]\nroles = [\"nobody\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `acl`"), "{e}");
        assert!(e.contains("\"nobody\", which is not defined"), "{e}");
        let e = parse_text("[acl.identities.ci]\nrole = [\"x\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("inline access-control list"), "{e}");
    }

    #[test]
    fn the_toml_syntax_error_names_the_file() {
        let e = parse_text("listen = ").unwrap_err().to_string();
        assert!(e.starts_with("config file test.toml:"), "{e}");
    }
}
