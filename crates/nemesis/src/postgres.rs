//! A real PostgreSQL as a second fenced resource (issue #34), written through the SQL recipe of
//! `docs/fencing.md` exactly as the book gives it: the statements are read from the book's
//! text (compiled in), so the recipe users copy is what runs under the faults.
//!
//! The server: Debian's PostgreSQL, `initdb` and `pg_ctl` in the run's directory as the
//! unprivileged user `nobody` (PostgreSQL refuses to run as root), listening on the bridge's
//! root address, trust authentication for the workers' addresses only (the harness itself on
//! the Unix socket in the data dir, which only root and `nobody` can reach), fsync on; stopped when the
//! [`Postgres`] is dropped. Its one addition to the recipe's table is the harness's audit
//! trigger: every row the recipe writes is also appended to `fenced_log` under a sequence
//! number taken while the row is locked, so the log orders the writes of each row as they
//! happened ([`Postgres::accepted`]).
//!
//! The workers write with `psql` (Debian's client), one process per statement group: the
//! recipe's `UPDATE`; when it changes no row, its diagnostic `SELECT`; for a missing row, its
//! fenced upsert ([`write`]).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{bail, ensure, Context};
use serde::{Deserialize, Serialize};

/// The book's page with the recipe.
const FENCING_MD: &str = include_str!("../../../docs/fencing.md");

/// The recipe's statements, as `docs/fencing.md` gives them (trailing `;` removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    pub create: String,
    /// `UPDATE ... WHERE id = $1 AND fence <= $3` (parameters id, value, fence).
    pub update: String,
    /// `SELECT fence FROM fenced_kv WHERE id = $1`.
    pub select: String,
    /// The fenced upsert (parameters id, value, fence).
    pub upsert: String,
}

/// The statements of the `### PostgreSQL` section's two SQL blocks.
pub fn recipe() -> anyhow::Result<Recipe> {
    let section = FENCING_MD
        .split("### PostgreSQL")
        .nth(1)
        .context("docs/fencing.md has no PostgreSQL section")?;
    let blocks: Vec<&str> = section
        .split("```sql")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .take(2)
        .collect();
    ensure!(
        blocks.len() == 2,
        "the PostgreSQL section has fewer than two SQL blocks"
    );
    let statements = |block: &str| -> Vec<String> {
        let code: String = block
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        code.split(';')
            .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|s| !s.is_empty())
            .collect()
    };
    let first = statements(blocks[0]);
    let find = |prefix: &str| {
        first
            .iter()
            .find(|s| s.starts_with(prefix))
            .cloned()
            .with_context(|| format!("the recipe has no {prefix} statement"))
    };
    let upsert = statements(blocks[1])
        .into_iter()
        .find(|s| s.starts_with("INSERT"))
        .context("the second block has no INSERT")?;
    Ok(Recipe {
        create: find("CREATE TABLE")?,
        update: find("UPDATE")?,
        select: find("SELECT")?,
        upsert,
    })
}

/// A PostgreSQL binary: on the `PATH`, else Debian's versioned directory.
fn binary(name: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let debian = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|d| d.path().join("bin").join(name));
    on_path
        .into_iter()
        .chain(debian)
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("{what}: cannot run {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{what}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// The running server; stopped (immediate mode) when dropped.
pub struct Postgres {
    data: PathBuf,
    host: String,
    port: u16,
    uid: u32,
    gid: u32,
}

impl Postgres {
    /// `initdb` a new cluster under `dir`, start it on `host:port` (an address of the root
    /// namespace on the bridge), and create the recipe's table and the audit log.
    pub fn start(
        dir: &Path,
        host: &str,
        port: u16,
        workers: &[std::net::Ipv4Addr],
    ) -> anyhow::Result<Postgres> {
        let user = nix::unistd::User::from_name("nobody")?
            .context("no user nobody to run PostgreSQL as")?;
        let (uid, gid) = (user.uid.as_raw(), user.gid.as_raw());
        // `nobody` must reach the data dir through the run's directory.
        let mut perms = std::fs::metadata(dir)?.permissions();
        perms.set_mode(perms.mode() | 0o011);
        std::fs::set_permissions(dir, perms)?;
        let data = dir.join("postgres");
        std::fs::create_dir_all(&data)?;
        nix::unistd::chown(&data, Some(user.uid), Some(user.gid))?;
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700))?;
        run(
            Command::new(binary("initdb"))
                .args(["--auth=trust", "--username=postgres", "--no-sync", "-D"])
                .arg(data.join("db"))
                .uid(uid)
                .gid(gid),
            "initdb",
        )?;
        let hba = data.join("db/pg_hba.conf");
        let mut rules = std::fs::read_to_string(&hba)?;
        // Each worker's address alone: not the bridge's subnet, which holds the root
        // namespace's own address, where any local user could then connect as superuser.
        for addr in workers {
            rules.push_str(&format!("host all all {addr}/32 trust\n"));
        }
        std::fs::write(&hba, rules)?;
        let options = format!(
            "-c listen_addresses={host} -p {port} -k {} -c fsync=on -c max_connections=64",
            data.display()
        );
        let pg = Postgres {
            data,
            host: host.to_owned(),
            port,
            uid,
            gid,
        };
        run(
            Command::new(binary("pg_ctl"))
                .arg("-D")
                .arg(pg.data.join("db"))
                .arg("-l")
                .arg(pg.data.join("server.log"))
                .args(["-o", &options, "-w", "-t", "30", "start"])
                .uid(uid)
                .gid(gid),
            "pg_ctl start",
        )
        .with_context(|| pg.log_tail())?;
        let recipe = recipe()?;
        pg.psql(&[
            &recipe.create,
            "CREATE TABLE fenced_log (seq bigserial PRIMARY KEY, id text NOT NULL, \
             fence bigint NOT NULL, value text NOT NULL)",
            "CREATE FUNCTION fenced_log() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN INSERT INTO fenced_log (id, fence, value) \
             VALUES (NEW.id, NEW.fence, NEW.value); RETURN NEW; END $$",
            "CREATE TRIGGER fenced_log AFTER INSERT OR UPDATE ON fenced_kv \
             FOR EACH ROW EXECUTE FUNCTION fenced_log()",
        ])?;
        Ok(pg)
    }

    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.data.join("server.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// The harness's own statements, on the Unix socket (`psql -h DIR`).
    fn psql(&self, statements: &[&str]) -> anyhow::Result<String> {
        let socket = format!("{}:{}", self.data.display(), self.port);
        let out = run(&mut psql(&socket, statements)?, "psql")?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Every write the recipe let through, in the order each row was written: (id, fence).
    pub fn accepted(&self) -> anyhow::Result<Vec<(String, u64)>> {
        let out = self.psql(&["SELECT id, fence FROM fenced_log ORDER BY seq"])?;
        // Command tags (`SET`) come before the rows.
        out.lines()
            .filter(|l| !l.is_empty() && *l != "SET")
            .map(|l| {
                let (id, fence) = l.split_once('|').context("a row without a |")?;
                Ok((id.to_owned(), fence.parse()?))
            })
            .collect()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new(binary("pg_ctl"))
            .arg("-D")
            .arg(self.data.join("db"))
            .args(["-m", "immediate", "-w", "stop"])
            .uid(self.uid)
            .gid(self.gid)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// `psql` at `addr` (HOST:PORT) running `statements` in one session, unaligned, no headers,
/// stopping at the first error, bounded in connection and statement time.
fn psql(addr: &str, statements: &[&str]) -> anyhow::Result<Command> {
    let (host, port) = addr.rsplit_once(':').context("HOST:PORT")?;
    let mut cmd = Command::new("psql");
    cmd.args([
        "-X",
        "-At",
        "-v",
        "ON_ERROR_STOP=1",
        "-U",
        "postgres",
        "-d",
        "postgres",
    ])
    .args(["-h", host, "-p", port])
    .env("PGCONNECT_TIMEOUT", "3")
    .args(["-c", "SET statement_timeout = 5000"]);
    for s in statements {
        cmd.args(["-c", s]);
    }
    Ok(cmd)
}

/// What a fenced write through the recipe came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Written {
    /// The row now has the value and this fence.
    Written,
    /// A higher fence was there: the writer must stop acting as the holder.
    Stale,
    /// No answer (the database could not be reached, a timeout): unknown.
    Failed,
}

/// A SQL string literal.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Writes `value` to row `id` under `fence`, as the book says: its `UPDATE`; if that changed no
/// row, its `SELECT` decides: no row, the fenced upsert; a higher fence, stale; else retry
/// (a concurrent write came in between; bounded).
pub fn write(addr: &str, id: &str, value: &str, fence: u64) -> Written {
    // Parsed from the page once per worker, not on every critical section.
    static RECIPE: std::sync::OnceLock<Option<Recipe>> = std::sync::OnceLock::new();
    let Some(recipe) = RECIPE.get_or_init(|| recipe().ok()) else {
        return Written::Failed;
    };
    let args = format!("{}, {}, {fence}", literal(id), literal(value));
    let tag = |out: &str, tag: &str| -> Option<u64> {
        out.lines()
            .find_map(|l| l.strip_prefix(tag))
            .and_then(|n| n.trim().rsplit(' ').next()?.parse().ok())
    };
    for _ in 0..crate::limits::POSTGRES_WRITE_ATTEMPTS_MAX {
        let update = format!(
            "PREPARE fenced_update (text, text, bigint) AS {}",
            recipe.update
        );
        let execute = format!("EXECUTE fenced_update ({args})");
        let Some(out) = run_psql(addr, &[&update, "BEGIN", &execute, "COMMIT"]) else {
            return Written::Failed;
        };
        match tag(&out, "UPDATE ") {
            Some(1) => return Written::Written,
            Some(_) => {}
            None => return Written::Failed,
        }
        let select = format!("PREPARE fenced_select (text) AS {}", recipe.select);
        let execute = format!("EXECUTE fenced_select ({})", literal(id));
        let Some(out) = run_psql(addr, &[&select, &execute]) else {
            return Written::Failed;
        };
        let current: Option<u64> = out
            .lines()
            .filter(|l| !l.starts_with("SET") && !l.starts_with("PREPARE"))
            .find_map(|l| l.trim().parse().ok());
        match current {
            None => {
                let upsert = format!(
                    "PREPARE fenced_upsert (text, text, bigint) AS {}",
                    recipe.upsert
                );
                let execute = format!("EXECUTE fenced_upsert ({args})");
                let Some(out) = run_psql(addr, &[&upsert, &execute]) else {
                    return Written::Failed;
                };
                return match tag(&out, "INSERT ") {
                    Some(1) => Written::Written,
                    Some(_) => Written::Stale,
                    None => Written::Failed,
                };
            }
            Some(current) if current > fence => return Written::Stale,
            Some(_) => continue,
        }
    }
    Written::Failed
}

fn run_psql(addr: &str, statements: &[&str]) -> Option<String> {
    let mut cmd = psql(addr, statements).ok()?;
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Rows whose fence went down: a write the recipe let through with a lower fence than an
/// earlier write of the same row.
pub fn fence_went_down(accepted: &[(String, u64)]) -> Vec<String> {
    let mut highest: std::collections::BTreeMap<&str, (u64, usize)> = Default::default();
    let mut out = Vec::new();
    for (i, (id, fence)) in accepted.iter().enumerate() {
        match highest.get(id.as_str()) {
            Some(&(h, at)) if *fence < h => out.push(format!(
                "row {id:?}: write {i} with fence {fence} after write {at} with fence {h}"
            )),
            _ => {
                highest.insert(id, (*fence, i));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recipe_is_read_from_the_book() {
        let r = recipe().unwrap();
        assert!(
            r.create.starts_with("CREATE TABLE fenced_kv ("),
            "{}",
            r.create
        );
        assert_eq!(
            r.update,
            "UPDATE fenced_kv SET value = $2, fence = $3 WHERE id = $1 AND fence <= $3"
        );
        assert_eq!(r.select, "SELECT fence FROM fenced_kv WHERE id = $1");
        assert!(
            r.upsert.starts_with("INSERT INTO fenced_kv"),
            "{}",
            r.upsert
        );
        assert!(
            r.upsert
                .ends_with("WHERE fenced_kv.fence <= EXCLUDED.fence"),
            "{}",
            r.upsert
        );
    }

    #[test]
    fn a_fence_that_goes_down_is_reported() {
        let w = |id: &str, f: u64| (id.to_owned(), f);
        assert!(fence_went_down(&[w("a", 3), w("b", 1), w("a", 3), w("a", 9)]).is_empty());
        let down = fence_went_down(&[w("a", 3), w("a", 9), w("b", 1), w("a", 4)]);
        assert_eq!(down.len(), 1, "{down:?}");
        assert!(
            down[0].contains("fence 4 after write 1 with fence 9"),
            "{down:?}"
        );
    }
}
