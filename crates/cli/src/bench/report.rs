//! The bench's result: one [`Report`], printed as one JSON object (`--json`) or a compact table.
//! Every figure covers the measured window only (warm-up and setup excluded); a figure that
//! cannot be known (server metrics of a cluster the bench did not start and was not told the
//! metrics of) is `null` / "n/a".

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    /// From a histogram of microseconds; `None` when it is empty.
    pub fn of(h: &Histogram<u64>) -> Option<Percentiles> {
        let ms = |us: u64| us as f64 / 1e3;
        (!h.is_empty()).then(|| Percentiles {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        })
    }
}

/// What the servers did in the window, from their `/metrics`.
#[derive(Debug, Clone, Serialize)]
pub struct ServerFigures {
    /// Client gRPC calls received by all members for the workload (the bench's own
    /// `node_status` and `describe` health checks are only in `requests_by_method`).
    pub requests: u64,
    pub requests_by_method: BTreeMap<String, u64>,
    pub requests_per_op: f64,
    /// Entries appended to the leader's log (the highest last log index of all members).
    pub log_entries: u64,
    pub log_entries_per_op: f64,
    /// Operations per log entry with a command (the leader's coalescing into batch entries,
    /// issue #35), from `latchkey_operations_applied_total` / `latchkey_entries_applied_total`;
    /// `None` from servers that do not count them.
    pub operations_per_entry: Option<f64>,
    /// Group commits of all members' log writers (each one `write` and one `fdatasync`;
    /// a member's Raft groups share its writer).
    pub log_commits: u64,
    pub log_commits_per_s: f64,
    pub keepalive_requests_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeCpu {
    pub id: u64,
    pub cpu_s: f64,
    /// CPU seconds per wall second (1.0 = one core busy).
    pub cpu_fraction: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Cpu {
    pub bench_cpu_s: f64,
    pub bench_cpu_fraction: f64,
    /// Empty unless the bench started the cluster (it knows the processes then).
    pub servers: Vec<NodeCpu>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeMemory {
    pub id: u64,
    /// VmRSS before the locks were acquired (sessions open).
    pub rss_before_bytes: u64,
    /// VmRSS at the end of the measured window, every lock held.
    pub rss_after_bytes: u64,
    /// (after - before) / locks.
    pub bytes_per_lock: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct HoldFigures {
    pub locks: u64,
    pub sessions: u64,
    /// Seconds taken to acquire every lock (the acquire latencies are from this phase).
    pub fill_s: f64,
    /// Empty without --cluster (another's processes cannot be measured).
    pub memory: Vec<NodeMemory>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FailoverFigures {
    pub rounds: u32,
    /// From kill -9 of the leader to the first grant of a request sent after the kill.
    pub kill_to_grant_ms: Vec<f64>,
    pub kill_to_grant_min_ms: f64,
    pub kill_to_grant_median_ms: f64,
    pub kill_to_grant_max_ms: f64,
}

/// The election workload's figure: from the SIGKILL of the leading `latchkey elect` process to
/// the start of the next leader's COMMAND (its own timestamp, taken as its first act).
#[derive(Debug, Clone, Serialize)]
pub struct ElectionFigures {
    /// `latchkey elect` processes campaigning at once.
    pub candidates: usize,
    pub rounds: u32,
    /// The candidates' session lease: a killed leader's session, and its leadership, lives until
    /// it expires, so the figure is about this long.
    pub ttl_ms: u64,
    pub kill_to_command: Percentiles,
    /// Each round's, in order.
    pub kill_to_command_ms: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub workload: String,
    pub clients: usize,
    /// The connections (`Client`s) the clients' sessions were spread over (`--connections`).
    pub connections: usize,
    /// The clients sent their operations in `Batch` calls (the default; not with `--no-batch`).
    pub batch: bool,
    /// Members the bench started, `null` for an existing cluster.
    pub cluster: Option<usize>,
    pub warmup_s: f64,
    /// Length of the measured window.
    pub window_s: f64,
    /// What one op is: "pair" (acquire + release), "handoff", "acquire", "grant" (a permit),
    /// "held lock" (hold), "failover" (election: a leader killed and the next one's COMMAND
    /// started).
    pub op: &'static str,
    pub ops: u64,
    pub ops_per_s: f64,
    pub acquire: Option<Percentiles>,
    pub release: Option<Percentiles>,
    /// contended/herd: grants to another client than the previous holder.
    pub handoffs_to_other_client: Option<u64>,
    /// Grants whose fencing token was not above the last acknowledged one of the same lock.
    pub token_violations: u64,
    /// semaphore: its permits, and the grants that found more clients holding one than that
    /// (counted from each grant's answer to its release's request: never more than the
    /// server's holders, so any is a real violation).
    pub permits: Option<u32>,
    pub holders_over_permits: Option<u64>,
    pub errors: BTreeMap<String, u64>,
    pub errors_total: u64,
    pub server: Option<ServerFigures>,
    pub cpu: Cpu,
    pub hold: Option<HoldFigures>,
    pub failover: Option<FailoverFigures>,
    pub election: Option<ElectionFigures>,
    /// Each Raft group's operations in the window (uncontended with `--groups`; empty
    /// otherwise).
    pub groups: Vec<GroupOps>,
}

/// One Raft group's share of the operations.
#[derive(Debug, Clone, Serialize)]
pub struct GroupOps {
    pub group: u32,
    pub ops: u64,
    pub ops_per_s: f64,
}

fn pct(p: &Option<Percentiles>) -> String {
    match p {
        Some(p) => format!(
            "p50 {:.2} ms  p99 {:.2} ms  p999 {:.2} ms  max {:.2} ms  (n={})",
            p.p50_ms, p.p99_ms, p.p999_ms, p.max_ms, p.count
        ),
        None => "n/a".into(),
    }
}

impl Report {
    /// The human form: one `key  value` line per figure.
    pub fn table(&self) -> String {
        let mut rows: Vec<(String, String)> = Vec::new();
        let mut row = |k: &str, v: String| rows.push((k.to_owned(), v));
        row(
            "workload",
            format!(
                "{}, {} clients{}{}, {}",
                self.workload,
                self.clients,
                if self.connections == self.clients {
                    String::new()
                } else {
                    format!(" over {} connections", self.connections)
                },
                if self.batch { ", batching" } else { "" },
                match self.cluster {
                    Some(n) => format!("own cluster of {n}"),
                    None => "existing cluster".into(),
                }
            ),
        );
        row(
            "window",
            format!(
                "{:.1} s after {:.1} s warm-up",
                self.window_s, self.warmup_s
            ),
        );
        row(
            &format!("{}s/s", self.op),
            format!("{:.0} ({} {}s)", self.ops_per_s, self.ops, self.op),
        );
        // On one contended lock, an acquire's latency is its wait in the queue.
        let acquire = if self.op == "handoff" {
            "acquire (wait)"
        } else {
            "acquire"
        };
        for g in &self.groups {
            row(
                &format!("group {}", g.group),
                format!("{:.0} {}s/s ({} {}s)", g.ops_per_s, self.op, g.ops, self.op),
            );
        }
        // The election workload makes no acquire of its own: its candidates' processes do.
        if self.election.is_none() {
            row(acquire, pct(&self.acquire));
            row("release", pct(&self.release));
        }
        if let Some(n) = self.handoffs_to_other_client {
            row("to another client", n.to_string());
        }
        if let (Some(permits), Some(over)) = (self.permits, self.holders_over_permits) {
            row(
                "holders over permits",
                format!("{over} (semaphore of {permits})"),
            );
        }
        row("token violations", self.token_violations.to_string());
        row(
            "errors",
            if self.errors.is_empty() {
                "0".into()
            } else {
                format!("{} {:?}", self.errors_total, self.errors)
            },
        );
        match &self.server {
            Some(s) => {
                row(
                    "requests/op",
                    format!(
                        "{:.2} ({} requests: {})",
                        s.requests_per_op,
                        s.requests,
                        s.requests_by_method
                            .iter()
                            .map(|(m, n)| format!("{m} {n}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
                row(
                    "log entries/op",
                    format!("{:.2} ({} entries)", s.log_entries_per_op, s.log_entries),
                );
                row(
                    "operations/entry",
                    match s.operations_per_entry {
                        Some(n) => format!("{n:.2} (the leader's batch entries)"),
                        None => "n/a (the servers do not count applied operations)".into(),
                    },
                );
                row(
                    "log commits/s",
                    format!(
                        "{:.0} (fdatasyncs, all members: {})",
                        s.log_commits_per_s, s.log_commits
                    ),
                );
                row("keepalives/s", format!("{:.1}", s.keepalive_requests_per_s));
            }
            None => row("server metrics", "n/a (give --metrics-endpoints)".into()),
        }
        let mut cpu = format!(
            "bench {:.2} s ({:.0} %)",
            self.cpu.bench_cpu_s,
            self.cpu.bench_cpu_fraction * 100.0
        );
        for n in &self.cpu.servers {
            cpu.push_str(&format!(
                ", node {} {:.2} s ({:.0} %)",
                n.id,
                n.cpu_s,
                n.cpu_fraction * 100.0
            ));
        }
        row("cpu", cpu);
        if let Some(h) = &self.hold {
            row(
                "held",
                format!(
                    "{} locks in {} sessions, acquired in {:.1} s",
                    h.locks, h.sessions, h.fill_s
                ),
            );
            if h.memory.is_empty() {
                row("memory", "n/a (only with --cluster)".into());
            }
            for m in &h.memory {
                row(
                    &format!("node {} rss", m.id),
                    format!(
                        "{:.1} MiB -> {:.1} MiB, {:.0} B/lock",
                        m.rss_before_bytes as f64 / 1048576.0,
                        m.rss_after_bytes as f64 / 1048576.0,
                        m.bytes_per_lock
                    ),
                );
            }
        }
        if let Some(f) = &self.failover {
            row(
                "kill -> grant",
                format!(
                    "min {:.0} ms  median {:.0} ms  max {:.0} ms  ({} rounds: {:?})",
                    f.kill_to_grant_min_ms,
                    f.kill_to_grant_median_ms,
                    f.kill_to_grant_max_ms,
                    f.rounds,
                    f.kill_to_grant_ms
                        .iter()
                        .map(|ms| ms.round() as u64)
                        .collect::<Vec<_>>()
                ),
            );
        }
        if let Some(e) = &self.election {
            row(
                "kill -> COMMAND",
                format!(
                    "{}  ({} rounds: {:?})",
                    pct(&Some(e.kill_to_command.clone())),
                    e.rounds,
                    e.kill_to_command_ms
                        .iter()
                        .map(|ms| ms.round() as u64)
                        .collect::<Vec<_>>()
                ),
            );
            row(
                "session ttl",
                format!(
                    "{:.1} s ({} candidates; a killed leader leads until its session expires)",
                    e.ttl_ms as f64 / 1e3,
                    e.candidates
                ),
            );
        }
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        rows.iter()
            .map(|(k, v)| format!("{k:<width$}  {v}\n"))
            .collect()
    }
}
