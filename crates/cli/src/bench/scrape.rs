//! What the bench reads from outside itself: the members' Prometheus text (`/metrics`), and
//! CPU time and resident memory from `/proc`.
//!
//! The HTTP client is a dozen lines over a TCP stream (HTTP/1.0, so the body ends with the
//! connection and is never chunked): one GET per member before and after the measured window
//! does not justify an HTTP client dependency.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one scrape may take; a member that does not answer in time is reported as such.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes of one `/metrics` answer read at most (a node's text is a few KiB).
const SCRAPE_BYTES_MAX: u64 = 1 << 20;

/// One member's samples: `name{labels}` (as written in the text) -> value.
#[derive(Debug, Clone, Default)]
pub struct Samples(pub HashMap<String, f64>);

impl Samples {
    pub fn get(&self, key: &str) -> Option<f64> {
        self.0.get(key).copied()
    }

    /// `latchkey_group_last_log_index{group="G"}` by group (a cluster of several groups).
    pub fn group_last_log_index(&self) -> HashMap<u32, f64> {
        const PREFIX: &str = "latchkey_group_last_log_index{group=\"";
        self.0
            .iter()
            .filter_map(|(k, v)| {
                let group = k.strip_prefix(PREFIX)?.strip_suffix("\"}")?;
                Some((group.parse().ok()?, *v))
            })
            .collect()
    }

    /// `latchkey_requests_total{method="M"}` by method.
    pub fn requests(&self) -> HashMap<String, f64> {
        const PREFIX: &str = "latchkey_requests_total{method=\"";
        self.0
            .iter()
            .filter_map(|(k, v)| {
                let method = k.strip_prefix(PREFIX)?.strip_suffix("\"}")?;
                Some((method.to_owned(), *v))
            })
            .collect()
    }
}

/// Parses the Prometheus/OpenMetrics text format (comments skipped, no timestamps expected).
pub fn parse(text: &str) -> Samples {
    Samples(
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let (key, value) = l.rsplit_once(' ')?;
                Some((key.to_owned(), value.parse().ok()?))
            })
            .collect(),
    )
}

/// GET http://`addr`/metrics, parsed.
pub async fn scrape(addr: &str) -> anyhow::Result<Samples> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        stream
            .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut answer = String::new();
        stream
            .take(SCRAPE_BYTES_MAX)
            .read_to_string(&mut answer)
            .await?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(SCRAPE_TIMEOUT, fetch)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {SCRAPE_TIMEOUT:?}"))?
        .with_context(|| format!("scraping http://{addr}/metrics"))?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .with_context(|| format!("http://{addr}/metrics: no HTTP header"))?;
    anyhow::ensure!(
        head.split(' ').nth(1) == Some("200"),
        "http://{addr}/metrics answered {}",
        head.lines().next().unwrap_or_default()
    );
    Ok(parse(body))
}

/// Clock ticks per second of `/proc/*/stat` times.
fn ticks_per_s() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(n)) if n > 0 => n as f64,
        // Linux has used 100 on every architecture for decades.
        _ => 100.0,
    }
}

/// User plus system CPU seconds of process `pid` ("self" for this one), `None` if it is gone.
pub fn cpu_s(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its closing one.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 (utime) and 15 (stime), counted from 1; `after` starts at field 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / ticks_per_s())
}

/// Resident memory of process `pid` in bytes (`VmRSS`), `None` if it is gone.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counters_with_labels_and_skips_comments() {
        let text = "# HELP latchkey_grants Grants applied.\n\
                    # TYPE latchkey_grants counter\n\
                    latchkey_grants_total 12\n\
                    latchkey_requests_total{method=\"acquire\"} 7\n\
                    latchkey_requests_total{method=\"keep_alive\"} 3\n\
                    latchkey_raft_last_log_index 40\n\
                    # EOF\n";
        let s = parse(text);
        assert_eq!(s.get("latchkey_grants_total"), Some(12.0));
        assert_eq!(s.get("latchkey_raft_last_log_index"), Some(40.0));
        let r = s.requests();
        assert_eq!(r.len(), 2);
        assert_eq!(r["acquire"], 7.0);
        assert_eq!(r["keep_alive"], 3.0);
    }

    #[test]
    fn reads_this_process_from_proc() {
        assert!(cpu_s("self").is_some());
        assert!(rss_bytes(std::process::id()).is_some_and(|b| b > 0));
        assert!(cpu_s("0").is_none());
    }
}
