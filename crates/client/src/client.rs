//! [`Client`]: endpoints, leader routing, and the retry loop every RPC goes through.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey_core::limits;
use latchkey_proto::v1::locks_client::LocksClient;
use latchkey_proto::v1::{self as pb};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::env::{ClientClock, ClientEnv};
use crate::error::{classify, transport_message, Error, Failure};
use crate::retry::{Backoff, RetryPolicy};
use crate::session::Session;
use crate::types::{
    AuditEntry, Backup, GroupStatus, GroupVoters, LockInfo, LockList, Member, NodeStatus,
    SessionOptions,
};

/// Settings of a [`Client`]. `Default` is what [`Client::connect`] uses.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Time to open a TCP connection to one endpoint.
    pub connect_timeout: Duration,
    /// Deadline of one attempt of a short RPC (everything but the Acquire long-poll, which gets
    /// its poll time on top of this).
    pub rpc_timeout: Duration,
    /// Retries on UNAVAILABLE and transport errors.
    pub retry: RetryPolicy,
    /// The bearer token sent with every call (`authorization: Bearer TOKEN`), for servers
    /// with access control (`--acl`); the CLI's `--auth-token` / `LATCHKEY_AUTH_TOKEN`.
    pub auth_token: Option<AuthToken>,
    /// Gather the acquires, releases and closes this client's sessions send to one member
    /// while an earlier batch to it is in flight into one `Batch` call (issue #35; `batch.rs`).
    /// Off by default: measured with the leader's coalescing, it cuts the client's CPU and
    /// calls per operation but not the latency or throughput (docs/PERFORMANCE.md,
    /// "Batching"), and a server without the `Batch` call answers it `UNIMPLEMENTED`. A call
    /// made alone is sent at once either way (as a `Batch` of one); with batching an acquire
    /// that must wait long-polls in a call of its own after its first answer.
    pub batch: bool,
    /// With [`ClientConfig::batch`], the `Batch` calls to one member in flight at once: 1 to
    /// `limits::CLIENT_BATCH_CALLS_IN_FLIGHT_MAX` (a value outside is taken as the nearest
    /// bound). The operations sent while that many are in flight go together in the next.
    /// With 1, an operation that just missed a batch waits for its answer before its own
    /// leaves; more overlap them, for smaller batches (docs/PERFORMANCE.md, "Batching").
    pub batch_calls_in_flight: usize,
}

/// A bearer token. Kept out of `Debug` output, so it does not end up in logs.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthToken(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl AuthToken {
    /// Checks that `token` can travel in a header (visible ASCII, no spaces).
    pub fn new(token: &str) -> Result<AuthToken, Error> {
        let invalid = || Error::InvalidArgument {
            message: "the auth token must be printable ASCII without spaces".into(),
        };
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid());
        }
        let mut value: tonic::metadata::MetadataValue<tonic::metadata::Ascii> =
            format!("Bearer {token}").parse().map_err(|_| invalid())?;
        value.set_sensitive(true);
        Ok(AuthToken(value))
    }

    /// Puts the token on `request`.
    pub(crate) fn apply<T>(&self, request: &mut tonic::Request<T>) {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
    }
}

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthToken(..)")
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            // Why these values: see the limits.
            connect_timeout: Duration::from_millis(limits::CLIENT_CONNECT_TIMEOUT_MS_DEFAULT),
            rpc_timeout: Duration::from_millis(limits::CLIENT_RPC_TIMEOUT_MS_DEFAULT),
            retry: RetryPolicy::default(),
            auth_token: None,
            batch: false,
            batch_calls_in_flight: limits::CLIENT_BATCH_CALLS_IN_FLIGHT_DEFAULT,
        }
    }
}

/// How a call goes in a `Batch` call (`Client::call_or_batch`): the batch operation its
/// request makes, and the picker of its answer out of a batch result.
pub(crate) type Batched<Req, Resp> = (
    fn(Req) -> pb::batch_op::Op,
    fn(pb::batch_result::Result) -> Option<Resp>,
);

/// A handle on a latchkey cluster. Cheap to clone; clones share connections and the leader
/// hint.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClientConfig,
    env: ClientEnv,
    /// Jitter of retries, seeded by `env.seed`.
    rng: Mutex<StdRng>,
    /// The endpoints given to `connect`, as URIs.
    seeds: Vec<String>,
    /// The scheme of leader hints and member addresses, which servers give as `host:port`: the
    /// first seed's (a TLS cluster is reached with TLS at every member).
    hint_scheme: &'static str,
    route: Mutex<Route>,
    /// The cluster's Raft group count, asked once (`Client::groups`).
    groups: tokio::sync::OnceCell<u32>,
    /// The keepalives of this client's sessions waiting to go out together.
    keepalives: crate::keepalive::Batcher,
}

/// Where the next attempt goes.
#[derive(Default)]
struct Route {
    /// One lazily connected channel per endpoint URI (seeds and leader hints).
    channels: HashMap<String, Channel>,
    /// With `ClientConfig::batch`, the operations waiting for a `Batch` call, per endpoint URI
    /// (the same keys as `channels`).
    batchers: HashMap<String, Arc<crate::batch::Coalescer>>,
    /// The node believed to lead each Raft group (by group): the last one that answered a
    /// call for it, or the last hint. At most `GROUPS_MAX` entries.
    leaders: HashMap<u32, String>,
    /// Round-robin position in `seeds` when no leader is known.
    next_seed: usize,
    /// The endpoint whose last attempt failed in transport (refused, no answer), and when.
    /// Followers go on naming a dead leader until they vote in a new term; following those
    /// hints wasted every other attempt on it and doubled the backoff each time (issue #11).
    refused: Option<(String, Instant)>,
}

impl Route {
    /// Whether `uri` failed in transport less than `CLIENT_REFUSED_HINT_IGNORE_MS` ago.
    fn recently_refused(&self, uri: &str, now: Instant) -> bool {
        self.refused.as_ref().is_some_and(|(refused, at)| {
            refused == uri
                && now.saturating_duration_since(*at)
                    < Duration::from_millis(limits::CLIENT_REFUSED_HINT_IGNORE_MS)
        })
    }
}

/// `uri` as the user wrote its endpoint: `host:port`, without the `http://` it was given.
fn bare(uri: &str) -> &str {
    uri.strip_prefix("http://").unwrap_or(uri)
}

/// Why a transport failure happened, in a few words: `no such host` for a name that does not
/// resolve, else the innermost cause (an I/O error as its kind, "connection refused", "timed
/// out"), or the status's message.
fn transport_cause(status: &tonic::Status) -> String {
    use std::error::Error as _;
    let mut innermost: Option<&(dyn std::error::Error + 'static)> = status.source();
    let mut dns = false;
    while let Some(e) = innermost {
        dns |= e.to_string() == "dns error";
        match e.source() {
            Some(next) => innermost = Some(next),
            None => break,
        }
    }
    match innermost {
        // The resolver's own words say why ("Name or service not known"); the I/O kind
        // ("uncategorized error") does not.
        Some(e) if dns => format!("no such host ({e})"),
        Some(e) => match e.downcast_ref::<std::io::Error>() {
            Some(io) if io.kind() != std::io::ErrorKind::Other => io.kind().to_string(),
            _ => e.to_string(),
        },
        None if status.message().is_empty() => format!("{:?}", status.code()),
        None => status.message().to_owned(),
    }
}

/// Whether `status` says the attempt never reached a server: the name did not resolve or the
/// TCP connection was refused or timed out (hyper's connector says "dns error" or "tcp connect
/// error"). An attempt that connected and then failed, or got no answer in time (a paused
/// member), reached one.
fn never_connected(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    let mut source: Option<&(dyn std::error::Error + 'static)> = status.source();
    while let Some(e) = source {
        let text = e.to_string();
        if text == "dns error" || text == "tcp connect error" {
            return true;
        }
        source = e.source();
    }
    false
}

/// What to say when the server at `uri` answered plain HTTP, not gRPC (`transport`: the status
/// and its causes, from a status no latchkey node sent): an HTTP/1.1-only server breaks the
/// HTTP/2 connection; latchkey's own HTTP API (`--http-listen`) answers 404 with a JSON body;
/// its metrics port (`--metrics-listen`) answers 404 without gRPC headers. Not retried: no
/// member will answer differently on that port.
fn not_grpc(uri: &str, transport: &str) -> Option<String> {
    let answered = if transport.contains("h2 protocol error") {
        "HTTP/1.1"
    } else if transport.contains("grpc-status header missing")
        || transport.contains("invalid compression flag")
    {
        "HTTP without gRPC"
    } else {
        return None;
    };
    Some(format!(
        "{} answered {answered}: it is not a latchkey gRPC port (the `--http-listen` and \
         `--metrics-listen` ports serve HTTP; give the port `latchkey serve --listen` serves, \
         7420 by default)",
        bare(uri)
    ))
}

/// Turns `host:port` into `http://host:port`; keeps a URI that already has a scheme.
pub(crate) fn endpoint_uri(endpoint: &str) -> Result<String, Error> {
    let endpoint = endpoint.trim();
    if endpoint.is_empty() {
        return Err(Error::InvalidArgument {
            message: "empty endpoint".into(),
        });
    }
    let uri = if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    };
    Endpoint::from_shared(uri.clone()).map_err(|e| Error::InvalidArgument {
        message: format!("endpoint {endpoint:?}: {e}"),
    })?;
    Ok(uri)
}

/// The route of calls any member answers (`NodeStatus`): kept apart from every group's, so
/// that the member that answered is not taken for a group's leader.
const ANY_MEMBER: u32 = u32::MAX;

/// Options of one logical request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallOpts {
    /// Deadline of each attempt.
    pub attempt_timeout: Duration,
    /// A lower cap on the backoff between attempts than the policy's, for calls that must
    /// keep trying often (renewals racing their lease deadline).
    pub backoff_max: Option<Duration>,
    /// The Raft group the call is for (issue #16): it goes to that group's leader. 0 in a
    /// cluster of one group.
    pub group: u32,
}

impl Client {
    /// A client for the cluster reachable at `endpoints` (`host:port`, or a URI with a scheme),
    /// with [`ClientConfig::default`]. Connections are opened lazily, so this does not fail
    /// when no server is up yet; the first RPC does, after its retries.
    pub async fn connect(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<Client, Error> {
        Client::with_config(endpoints, ClientConfig::default())
    }

    /// Like [`Client::connect`] with explicit settings.
    pub fn with_config(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        config: ClientConfig,
    ) -> Result<Client, Error> {
        Client::with_env(endpoints, config, ClientEnv::default())
    }

    /// Like [`Client::with_config`], reading time, opening connections and drawing jitter
    /// through `env` (the simulation's seams).
    pub fn with_env(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        config: ClientConfig,
        env: ClientEnv,
    ) -> Result<Client, Error> {
        let seeds = endpoints
            .into_iter()
            .map(|e| endpoint_uri(&e.into()))
            .collect::<Result<Vec<_>, _>>()?;
        if seeds.is_empty() {
            return Err(Error::InvalidArgument {
                message: "no endpoints".into(),
            });
        }
        if !env.connector.speaks_tls() {
            if let Some(tls) = seeds.iter().find(|s| s.starts_with("https://")) {
                return Err(Error::InvalidArgument {
                    message: format!(
                        "endpoint {tls} uses TLS: give the CA that signed the servers' \
                         certificates (--ca FILE or LATCHKEY_CA; system roots are not used)"
                    ),
                });
            }
        }
        let hint_scheme = if seeds[0].starts_with("https://") {
            "https"
        } else {
            "http"
        };
        Ok(Client {
            inner: Arc::new(Inner {
                config,
                rng: Mutex::new(match env.seed {
                    Some(seed) => StdRng::seed_from_u64(seed),
                    None => StdRng::from_os_rng(),
                }),
                env,
                seeds,
                hint_scheme,
                route: Mutex::new(Route::default()),
                groups: tokio::sync::OnceCell::new(),
                keepalives: crate::keepalive::Batcher::default(),
            }),
        })
    }

    pub(crate) fn keepalives(&self) -> &crate::keepalive::Batcher {
        &self.inner.keepalives
    }

    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The clock every deadline of this client is measured on.
    pub(crate) fn clock(&self) -> &dyn ClientClock {
        &*self.inner.env.clock
    }

    /// Opens a session with lease `ttl` (1 s to 1 h) and starts its background renewal.
    pub async fn session(&self, ttl: Duration) -> Result<Session, Error> {
        Session::create(self.clone(), ttl, None).await
    }

    /// Opens a session with `options` (its lease, and an owner description that `status` and
    /// `list` show next to its locks and waits).
    pub async fn session_with(&self, options: SessionOptions) -> Result<Session, Error> {
        if let Some(Err(e)) = options.owner.as_ref().map(|o| o.validate()) {
            return Err(Error::InvalidArgument {
                message: e.to_string(),
            });
        }
        Session::create(self.clone(), options.ttl, options.owner).await
    }

    /// Force-releases `name` (an operator's tool; needs the admin permission on it under access
    /// control): the next waiter gets it with a higher token and the holder's client learns it
    /// lost the lock. Answers the (session, token) of the grant taken. Recorded in the audit
    /// log with `reason` and `operator` (who you say you are; the server adds the
    /// authenticated identity).
    ///
    /// Without `token`, the current holder's token is read first and the release made
    /// conditional on it, so that a retry after a lost answer can never take the *next*
    /// holder's grant: such a retry fails with a `token-mismatch` or `lock-not-held`
    /// [`Error::Conflict`] instead. Of a name with several holders (readers, permits), the
    /// token chooses the grant taken (one permit, or the readers granted together); without
    /// one, the first granted holder's is read.
    ///
    /// A release of a holder that asked for a lock-delay starts the delay; a retry of it (the
    /// same token) answers the first attempt's outcome and does not end that delay. A name in
    /// a lock-delay has no holder: this fails with `lock-not-held`; ending the delay is
    /// [`Client::admin_end_delay`].
    pub async fn admin_release(
        &self,
        name: &str,
        token: Option<u64>,
        reason: &str,
        operator: &str,
    ) -> Result<(u64, u64), Error> {
        let token = match token {
            Some(t) => t,
            None => match self.describe(name).await? {
                crate::types::LockInfo {
                    holder: Some(h), ..
                } => h.token,
                crate::types::LockInfo {
                    delay_token: Some(t),
                    ..
                } => {
                    return Err(Error::Conflict {
                        reason: "lock-not-held".into(),
                        message: format!(
                            "lock {name:?} is not held: it is in the lock-delay that began when \
                             its grant {t} was lost (ending the delay is its own request: \
                             `latchkey admin release --end-delay`)"
                        ),
                    })
                }
                _ => {
                    return Err(Error::Conflict {
                        reason: "lock-not-held".into(),
                        message: format!("lock {name:?} is not held"),
                    })
                }
            },
        };
        self.force_release(name, token, false, reason, operator)
            .await
    }

    /// Ends `name`'s running lock-delay now (an operator's tool, as [`Client::admin_release`]):
    /// its first waiter gets the name. Answers the (session, token) of the grant whose loss
    /// started the delay. Without `token`, the running delay's is read first (`status` shows
    /// it), so that a retry never ends a later delay of the name: it fails with a
    /// `no-lock-delay` [`Error::Conflict`], as does a name in no delay.
    pub async fn admin_end_delay(
        &self,
        name: &str,
        token: Option<u64>,
        reason: &str,
        operator: &str,
    ) -> Result<(u64, u64), Error> {
        let token = match token {
            Some(t) => t,
            None => self
                .describe(name)
                .await?
                .delay_token
                .ok_or_else(|| Error::Conflict {
                    reason: "no-lock-delay".into(),
                    message: format!("no lock-delay of {name:?} is running"),
                })?,
        };
        self.force_release(name, token, true, reason, operator)
            .await
    }

    async fn force_release(
        &self,
        name: &str,
        token: u64,
        end_delay: bool,
        reason: &str,
        operator: &str,
    ) -> Result<(u64, u64), Error> {
        let request = pb::AdminReleaseRequest {
            name: name.to_owned(),
            token: Some(token),
            reason: reason.to_owned(),
            operator: operator.to_owned(),
            end_delay,
        };
        let opts = self.for_lock(name).await?;
        let response = self
            .call(
                opts,
                request,
                |mut c, r| async move { c.admin_release(r).await },
            )
            .await?;
        Ok((response.session, response.token))
    }

    /// Ends `session` as an expiry would (an operator's tool; needs the admin permission on
    /// every lock under access control): its locks go to their next waiters. Answers how many
    /// locks it held. Recorded in the audit log.
    pub async fn admin_revoke(
        &self,
        session: u64,
        reason: &str,
        operator: &str,
    ) -> Result<u32, Error> {
        let request = pb::AdminRevokeRequest {
            session,
            reason: reason.to_owned(),
            operator: operator.to_owned(),
        };
        let opts = CallOpts {
            group: latchkey_core::group_of_session(
                latchkey_core::SessionId(session),
                self.groups().await?,
            ),
            ..self.short()
        };
        let response = self
            .call(
                opts,
                request,
                |mut c, r| async move { c.admin_revoke(r).await },
            )
            .await?;
        Ok(response.locks)
    }

    /// The audit log (force-releases and revocations), oldest first, read on the leader.
    ///
    /// In a cluster of several Raft groups each group's log is read at its leader, at once,
    /// and the records merged by time (each names its group; their indexes are of their
    /// group's log).
    pub async fn audit(&self) -> Result<Vec<AuditEntry>, Error> {
        let groups = self.groups().await?;
        let logs = (0..groups).map(|g| {
            let opts = CallOpts {
                group: g,
                ..self.short()
            };
            let request = pb::AuditRequest {
                group: (groups > 1).then_some(g),
            };
            self.call(opts, request, |mut c, r| async move { c.audit(r).await })
        });
        let mut records = Vec::new();
        for answer in futures::future::join_all(logs).await {
            records.extend(answer?.records.into_iter().map(AuditEntry::from_pb));
        }
        // Stable: one group's records stay in log order.
        records.sort_by_key(|r| r.at_ms);
        Ok(records)
    }

    /// A consistent copy of the whole table, read on the leader after a linearizable read and
    /// streamed in chunks (`latchkey snapshot save`). Needs admin on every lock under access
    /// control. One call may take up to `BACKUP_CALL_TIMEOUT_MS`; a failed stream is retried
    /// whole, like any call.
    ///
    /// One copy per Raft group, in group order (one in a cluster of one), each read at its
    /// group's leader: each is consistent in itself; the groups are independent, so the copies
    /// are of slightly different moments.
    pub async fn backup(&self) -> Result<Vec<Backup>, Error> {
        let groups = self.groups().await?;
        let mut images = Vec::with_capacity(groups as usize);
        // One group at a time, one stream in flight. Every image stays in the answer (each at
        // most `BACKUP_TABLE_BYTES_MAX`): the caller holds the whole cluster's table.
        for group in 0..groups {
            images.push(self.backup_group(group, groups).await?);
        }
        Ok(images)
    }

    /// The copy of group `group`'s table, at its leader.
    async fn backup_group(&self, group: u32, groups: u32) -> Result<Backup, Error> {
        let opts = CallOpts {
            attempt_timeout: self
                .inner
                .config
                .rpc_timeout
                .max(Duration::from_millis(limits::BACKUP_CALL_TIMEOUT_MS)),
            backoff_max: None,
            group,
        };
        let request = pb::BackupRequest {
            group: (groups > 1).then_some(group),
        };
        let chunks = self
            .call(opts, request, |mut c, r| async move {
                let mut stream = c.backup(r).await?.into_inner();
                let mut chunks = Vec::new();
                let mut bytes = 0u64;
                while let Some(chunk) = stream.message().await? {
                    bytes += chunk.data.len() as u64;
                    if bytes > limits::BACKUP_TABLE_BYTES_MAX {
                        return Err(tonic::Status::resource_exhausted(format!(
                            "backup stream exceeds {} bytes",
                            limits::BACKUP_TABLE_BYTES_MAX
                        )));
                    }
                    chunks.push(chunk);
                }
                Ok(tonic::Response::new(chunks))
            })
            .await?;
        let mut chunks = chunks.into_iter();
        let header = chunks
            .next()
            .and_then(|c| c.header.map(|h| (h, c.data)))
            .ok_or_else(|| Error::Protocol("Backup answered without a header".into()))?;
        let (header, first) = header;
        let mut table = first;
        for chunk in chunks {
            if chunk.header.is_some() {
                return Err(Error::Protocol("Backup sent a second header".into()));
            }
            table.extend_from_slice(&chunk.data);
        }
        if table.len() as u64 != header.table_bytes {
            return Err(Error::Protocol(format!(
                "Backup sent {} bytes of table, its header says {}",
                table.len(),
                header.table_bytes
            )));
        }
        Ok(Backup {
            group,
            applied_index: header.applied_index,
            members: header.members,
            fingerprint: header.fingerprint,
            table_sha256: header.table_sha256,
            table,
        })
    }

    /// One lock's holder and queue length, read on the leader.
    pub async fn describe(&self, name: &str) -> Result<LockInfo, Error> {
        Ok(self.describe_read(name).await?.0)
    }

    /// [`Client::describe`], with the index of the last log entry the member had applied when
    /// it read the lock (`DescribeResponse.read_index`): every watch event at or below it is
    /// reflected in the answer.
    pub(crate) async fn describe_read(&self, name: &str) -> Result<(LockInfo, u64), Error> {
        latchkey_core::validate_name(name).map_err(|e| Error::InvalidArgument {
            message: e.to_string(),
        })?;
        let request = pb::DescribeRequest {
            name: name.to_owned(),
        };
        let opts = self.for_lock(name).await?;
        let response = self
            .call(opts, request, |mut c, r| async move { c.describe(r).await })
            .await?;
        let lock = response
            .lock
            .ok_or_else(|| Error::Protocol("Describe answered without a lock".into()))?;
        Ok((LockInfo::from_pb(lock), response.read_index))
    }

    /// The held locks whose names start with `prefix` (all with an empty prefix), read on the
    /// leader, at most the server's maximum.
    ///
    /// In a cluster of several Raft groups each group is listed at its leader, at once, and
    /// the answers merged in name order, at most the server's maximum in all.
    pub async fn list(&self, prefix: &str) -> Result<LockList, Error> {
        let groups = self.groups().await?;
        let lists = (0..groups).map(|g| {
            let request = pb::ListRequest {
                prefix: prefix.to_owned(),
                limit: 0,
                group: (groups > 1).then_some(g),
            };
            let opts = CallOpts {
                group: g,
                ..self.short()
            };
            self.call(opts, request, |mut c, r| async move { c.list(r).await })
        });
        let mut locks = Vec::new();
        let mut truncated = false;
        // A truncated group's answer ends at its last name: the merged list stops there too,
        // or it would skip that group's names after it and still look like a sorted prefix.
        let mut cut: Option<String> = None;
        for answer in futures::future::join_all(lists).await {
            let answer = answer?;
            if answer.truncated {
                truncated = true;
                if let Some(last) = answer.locks.iter().map(|l| &l.name).max() {
                    if cut.as_ref().is_none_or(|c| last < c) {
                        cut = Some(last.clone());
                    }
                }
            }
            locks.extend(answer.locks.into_iter().map(LockInfo::from_pb));
        }
        if let Some(cut) = &cut {
            locks.retain(|l| &l.name <= cut);
        }
        locks.sort_by(|a, b| a.name.cmp(&b.name));
        if locks.len() > limits::LIST_RESULTS_MAX {
            locks.truncate(limits::LIST_RESULTS_MAX);
            truncated = true;
        }
        Ok(LockList { locks, truncated })
    }

    /// The cluster's Raft group count (issue #16), asked of any member once and kept; 1 for a
    /// server from before groups.
    pub async fn groups(&self) -> Result<u32, Error> {
        self.inner
            .groups
            .get_or_try_init(|| async {
                let opts = CallOpts {
                    group: ANY_MEMBER,
                    ..self.short()
                };
                let status = self
                    .call(opts, pb::NodeStatusRequest {}, |mut c, r| async move {
                        c.node_status(r).await
                    })
                    .await?;
                let groups = status.groups.max(1);
                latchkey_core::groups::check_groups(groups)
                    .map_err(|e| Error::Protocol(format!("NodeStatus: {e}")))?;
                Ok(groups)
            })
            .await
            .copied()
    }

    /// The group count a server answered with something else (`CreateSession`'s `groups`; 0
    /// from a server before groups: one): remembered as [`Client::groups`]' answer, which
    /// must not change.
    pub(crate) fn learned_groups(&self, answered: u32) -> Result<u32, Error> {
        let groups = answered.max(1);
        latchkey_core::groups::check_groups(groups)
            .map_err(|e| Error::Protocol(format!("CreateSession: {e}")))?;
        // While `NodeStatus` is being asked the cell cannot be set: this answer stands for
        // the caller, and the two come from the same cluster.
        let _ = self.inner.groups.set(groups);
        match self.known_groups() {
            Some(known) if known != groups => Err(Error::Protocol(format!(
                "the cluster answered {groups} Raft groups, and {known} before"
            ))),
            _ => Ok(groups),
        }
    }

    /// The group count, if it was asked already.
    pub(crate) fn known_groups(&self) -> Option<u32> {
        self.inner.groups.get().copied()
    }

    /// The options of a short call about the lock `name`: to its group's leader.
    async fn for_lock(&self, name: &str) -> Result<CallOpts, Error> {
        let groups = self.groups().await?;
        Ok(CallOpts {
            group: latchkey_core::group_of(name, groups),
            ..self.short()
        })
    }

    /// Adds member `id` at `addr` (a `latchkey serve --join` process): it catches up as a
    /// learner, then becomes a voter. Answers the voters after the change. Needs `admin` on
    /// every lock under access control.
    ///
    /// In a cluster of several Raft groups the member is added to each group in turn, at
    /// that group's leader (a `serve --join` member runs every group); a failure part way is
    /// [`Error::MembershipIncomplete`], and the same call again finishes it.
    pub async fn add_member(&self, id: u64, addr: &str) -> Result<Vec<Member>, Error> {
        self.add_member_in(id, addr, None).await.map(last_voters)
    }

    /// [`Client::add_member`] in the Raft groups `groups` only (every group when `None`): with
    /// replica subsets (`serve --replicas`), the groups a new member is to replicate, e.g. those
    /// of the member it replaces. Answers each changed group's voters, in group order.
    pub async fn add_member_in(
        &self,
        id: u64,
        addr: &str,
        groups: Option<&[u32]>,
    ) -> Result<Vec<GroupVoters>, Error> {
        self.change_groups(
            groups,
            |group| pb::AddMemberRequest {
                id,
                addr: addr.to_owned(),
                group,
            },
            |mut c, r| async move { c.add_member(r).await },
        )
        .await
        .map(group_voters)
    }

    /// Removes member `id` (the leader too), from every Raft group in turn. Answers the voters
    /// after the change.
    pub async fn remove_member(&self, id: u64) -> Result<Vec<Member>, Error> {
        self.remove_member_from(id, None).await.map(last_voters)
    }

    /// [`Client::remove_member`] from the Raft groups `groups` only (every group when `None`).
    /// Answers each changed group's voters, in group order.
    pub async fn remove_member_from(
        &self,
        id: u64,
        groups: Option<&[u32]>,
    ) -> Result<Vec<GroupVoters>, Error> {
        self.change_groups(
            groups,
            |group| pb::RemoveMemberRequest { id, group },
            |mut c, r| async move { c.remove_member(r).await },
        )
        .await
        .map(group_voters)
    }

    /// Records `addr` as member `id`'s new address, in every Raft group in turn. Answers the
    /// voters after the change. With replica subsets a group without the member answers its
    /// members unchanged; a member that no group has as a voter or a learner is refused (a
    /// mistyped id moves nothing).
    pub async fn move_member(&self, id: u64, addr: &str) -> Result<Vec<Member>, Error> {
        let answers = self
            .change_groups(
                None,
                |group| pb::MoveMemberRequest {
                    id,
                    addr: addr.to_owned(),
                    group,
                },
                |mut c, r| async move { c.move_member(r).await },
            )
            .await?;
        let moved = answers
            .iter()
            .flat_map(|(_, a)| a.members.iter().chain(&a.learners))
            .any(|m| m.id == id);
        if !moved {
            return Err(Error::Conflict {
                reason: "membership".into(),
                message: format!(
                    "member {id} is in no Raft group; `latchkey cluster add {id}={addr}` adds it"
                ),
            });
        }
        Ok(last_voters(group_voters(answers)))
    }

    /// Sends the membership change `request(group)` to the leader of each Raft group of
    /// `which` (every group when `None`) in turn, in group order (`group` unset in a cluster of
    /// one), and answers each group's members after its change, in that order. In turn, not at once: each change
    /// waits for a catch-up and two commits on every member, and a failure stops before the
    /// later groups, so that what was changed is a prefix of them, which the error names.
    async fn change_groups<Req, F, Fut>(
        &self,
        which: Option<&[u32]>,
        request: impl Fn(Option<u32>) -> Req,
        mut send: F,
    ) -> Result<Vec<(u32, pb::MembersResponse)>, Error>
    where
        Req: Clone,
        F: FnMut(LocksClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<pb::MembersResponse>, tonic::Status>>,
    {
        self.find_a_member().await?;
        let groups = self.groups().await?;
        let chosen: Vec<u32> = match which {
            None => (0..groups).collect(),
            Some(which) => {
                if which.is_empty() {
                    return Err(Error::InvalidArgument {
                        message: "no Raft group named for the membership change".into(),
                    });
                }
                if let Some(bad) = which.iter().find(|g| **g >= groups) {
                    return Err(Error::InvalidArgument {
                        message: format!("group {bad}: this cluster has {groups} Raft groups"),
                    });
                }
                which
                    .iter()
                    .copied()
                    .collect::<std::collections::BTreeSet<u32>>()
                    .into_iter()
                    .collect()
            }
        };
        let mut voters = Vec::with_capacity(chosen.len());
        for (done, &group) in chosen.iter().enumerate() {
            let opts = CallOpts {
                group,
                ..Self::membership_opts()
            };
            let answer = self
                .call(opts, request((groups > 1).then_some(group)), &mut send)
                .await;
            match answer {
                Ok(response) => voters.push((group, response)),
                Err(e) if done == 0 => return Err(e),
                Err(e) => {
                    return Err(Error::MembershipIncomplete {
                        group,
                        groups,
                        done: chosen[..done].to_vec(),
                        source: Box::new(e),
                    })
                }
            }
        }
        Ok(voters)
    }

    /// Routes the next call to a member that answers, with the short deadline: a membership
    /// call's own deadline is long (it waits for a catch-up and two commits), and an endpoint
    /// that accepts connections but never answers (a paused process) would hold it that long.
    /// The member that answers sends the membership call on to the leader if it is not one.
    async fn find_a_member(&self) -> Result<(), Error> {
        self.call(
            self.short(),
            pb::NodeStatusRequest {},
            |mut c, r| async move { c.node_status(r).await },
        )
        .await
        .map(|_| ())
    }

    /// A membership change waits for a learner to catch up and for two commits.
    fn membership_opts() -> CallOpts {
        CallOpts {
            attempt_timeout: Duration::from_millis(limits::CLIENT_MEMBERSHIP_RPC_TIMEOUT_MS),
            backoff_max: None,
            group: 0,
        }
    }

    /// What the node at `endpoint` says about itself and its group. Asks that node only, once
    /// (a status probe must report an unreachable node rather than retry elsewhere).
    pub async fn node_status(&self, endpoint: &str) -> Result<NodeStatus, Error> {
        let uri = self.hint_uri(endpoint)?;
        let start = self.clock().now();
        let timeout = self.inner.config.rpc_timeout;
        let mut client = self.locks_client(&uri);
        let mut request = tonic::Request::new(pb::NodeStatusRequest {});
        request.set_timeout(timeout);
        if let Some(token) = &self.inner.config.auth_token {
            token.apply(&mut request);
        }
        let result = tokio::time::timeout(timeout, client.node_status(request)).await;
        let failure = match result {
            Ok(Ok(response)) => {
                let s = response.into_inner();
                return Ok(NodeStatus {
                    id: s.id,
                    role: s.role,
                    term: s.term,
                    last_log_index: s.last_log_index,
                    applied_index: s.applied_index,
                    leader_id: (s.leader_id != 0).then_some(s.leader_id),
                    members: members(s.members),
                    learners: members(s.learners),
                    cluster_id: s.cluster_id,
                    sessions: s.sessions,
                    locks: s.locks,
                    groups: s.groups.max(1),
                    group_status: s
                        .group_status
                        .into_iter()
                        .map(|g| GroupStatus {
                            group: g.group,
                            role: g.role,
                            term: g.term,
                            last_log_index: g.last_log_index,
                            applied_index: g.applied_index,
                            leader_id: (g.leader_id != 0).then_some(g.leader_id),
                            sessions: g.sessions,
                            locks: g.locks,
                            voters: members(g.voters),
                        })
                        .collect(),
                });
            }
            Ok(Err(status)) => self.classify(&uri, &status)?,
            Err(_) => Failure::Transport {
                message: format!("{} did not answer within {timeout:?}", bare(&uri)),
            },
        };
        Err(give_up(failure, 1, self.clock().now() - start))
    }

    /// `addr` as a URI: a server's `host:port` (a leader hint, a member) gets the seeds' scheme.
    fn hint_uri(&self, addr: &str) -> Result<String, Error> {
        if addr.contains("://") {
            endpoint_uri(addr)
        } else {
            endpoint_uri(&format!("{}://{}", self.inner.hint_scheme, addr.trim()))
        }
    }

    /// [`classify`], with a protocol or certificate mismatch at `uri` made a fatal error: no
    /// retry can fix it, and its message says what will.
    fn classify(&self, uri: &str, status: &tonic::Status) -> Result<Failure, Error> {
        // Only statuses that did not come from a latchkey node (it names a reason on every
        // one): tonic makes the refusal's GOAWAY a PERMISSION_DENIED, its TLS errors UNKNOWN.
        if status
            .metadata()
            .get(latchkey_proto::ERROR_REASON_KEY)
            .is_none()
        {
            let transport = transport_message(status);
            if let Some(message) = crate::tls::mismatch(uri, &transport) {
                return Err(Error::Tls { message });
            }
            if let Some(message) = not_grpc(uri, &transport) {
                return Err(Error::Protocol(message));
            }
        }
        Ok(match classify(status) {
            // The endpoint and the cause, once, not tonic's chain of wrappers ("transport
            // error: tcp connect error: tcp connect error: Connection refused").
            Failure::Transport { .. } => Failure::Transport {
                message: format!("cannot reach {}: {}", bare(uri), transport_cause(status)),
            },
            failure => failure,
        })
    }

    fn short(&self) -> CallOpts {
        CallOpts {
            attempt_timeout: self.inner.config.rpc_timeout,
            backoff_max: None,
            group: 0,
        }
    }

    /// The batches to `uri` (`ClientConfig::batch`), on its channel, made on first use.
    pub(crate) fn batcher(&self, uri: &str) -> Arc<crate::batch::Coalescer> {
        let existing = {
            let route = self.inner.route.lock().expect("route lock poisoned");
            route.batchers.get(uri).cloned()
        };
        if let Some(b) = existing {
            return b;
        }
        let client = self.locks_client(uri);
        let mut route = self.inner.route.lock().expect("route lock poisoned");
        route
            .batchers
            .entry(uri.to_owned())
            .or_insert_with(|| {
                Arc::new(crate::batch::Coalescer::new(
                    client,
                    self.inner.config.rpc_timeout,
                    self.inner.config.auth_token.clone(),
                    self.inner
                        .config
                        .batch_calls_in_flight
                        .clamp(1, limits::CLIENT_BATCH_CALLS_IN_FLIGHT_MAX),
                    self.inner.env.batch_sent.clone(),
                ))
            })
            .clone()
    }

    /// [`Client::call_traced`] of one operation in the next `Batch` call to the endpoint each
    /// attempt goes to (`ClientConfig::batch`): `answer` picks the operation's own answer out of
    /// its batch result. Retried, rerouted and classified as its own call would be.
    pub(crate) async fn call_batched<Resp>(
        &self,
        opts: CallOpts,
        op: pb::batch_op::Op,
        answer: fn(pb::batch_result::Result) -> Option<Resp>,
    ) -> Result<(Resp, Answered), Error> {
        self.call_traced_at(opts, op, |uri, request| {
            let batcher = self.batcher(uri);
            async move {
                let result = batcher.send(request.into_inner()).await?;
                answer(result).map(tonic::Response::new).ok_or_else(|| {
                    tonic::Status::internal(
                        "a Batch call answered an operation with another call's result",
                    )
                })
            }
        })
        .await
    }

    /// [`Client::call`] of `request`, or with `ClientConfig::batch` [`Client::call_batched`] of
    /// it as the batch operation `batched.0` makes, whose answer `batched.1` picks.
    pub(crate) async fn call_or_batch<Req, Resp, F, Fut>(
        &self,
        opts: CallOpts,
        request: Req,
        batched: Batched<Req, Resp>,
        send: F,
    ) -> Result<Resp, Error>
    where
        Req: Clone,
        F: FnMut(LocksClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        if self.inner.config.batch {
            let (op, answer) = batched;
            return self
                .call_batched(opts, op(request), answer)
                .await
                .map(|(response, _)| response);
        }
        self.call(opts, request, send).await
    }

    /// A gRPC client on the channel for `uri`, created on first use.
    fn locks_client(&self, uri: &str) -> LocksClient<Channel> {
        let channel = {
            let mut route = self.inner.route.lock().expect("route lock poisoned");
            route
                .channels
                .entry(uri.to_owned())
                .or_insert_with(|| self.inner.env.connector.channel(uri, &self.inner.config))
                .clone()
        };
        LocksClient::new(channel)
            .max_decoding_message_size(limits::CLIENT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(limits::CLIENT_MESSAGE_BYTES_MAX)
    }

    /// The endpoint the next attempt for `group` goes to.
    pub(crate) fn pick(&self, group: u32) -> String {
        let route = self.inner.route.lock().expect("route lock poisoned");
        match route.leaders.get(&group) {
            Some(leader) => leader.clone(),
            None => self.inner.seeds[route.next_seed % self.inner.seeds.len()].clone(),
        }
    }

    fn answered(&self, group: u32, uri: &str) {
        let mut route = self.inner.route.lock().expect("route lock poisoned");
        if route.refused.as_ref().is_some_and(|(r, _)| r == uri) {
            route.refused = None;
        }
        if route.leaders.get(&group).map(String::as_str) != Some(uri) {
            route.leaders.insert(group, uri.to_owned());
        }
    }

    /// `uri` is not the leader of `group`: go to the hint, unless it names a member that just
    /// refused us, or to the next seed. Says whether it follows a hint.
    pub(crate) fn reroute(&self, group: u32, uri: &str, hint: Option<&str>) -> bool {
        let now = self.clock().now();
        let mut route = self.inner.route.lock().expect("route lock poisoned");
        match hint.map(|h| self.hint_uri(h)) {
            // The member names itself: it leads but cannot answer yet (a leader that has not
            // resumed its leases). Stay, after the backoff; another member would only send us
            // back here.
            Some(Ok(h)) if h == uri => {
                route.leaders.insert(group, h);
                false
            }
            Some(Ok(h)) if !route.recently_refused(&h, now) => {
                route.leaders.insert(group, h);
                true
            }
            _ => {
                route.leaders.remove(&group);
                self.next_seed(&mut route, uri, now);
                false
            }
        }
    }

    /// `uri` failed in transport: forget it as every group's leader, go to the next seed, and
    /// leave hints naming `uri` alone for a while (see [`Route::refused`]).
    pub(crate) fn unreachable(&self, uri: &str) {
        let now = self.clock().now();
        let mut route = self.inner.route.lock().expect("route lock poisoned");
        route.refused = Some((uri.to_owned(), now));
        route.leaders.retain(|_, leader| leader != uri);
        self.next_seed(&mut route, uri, now);
    }

    /// Move the seed round-robin off `uri` (if it is the seed we are on) and off a seed that
    /// just refused us, unless that is every seed.
    fn next_seed(&self, route: &mut Route, uri: &str, now: Instant) {
        let seeds = &self.inner.seeds;
        if seeds[route.next_seed % seeds.len()] == uri {
            route.next_seed = route.next_seed.wrapping_add(1);
        }
        if seeds.len() > 1 && route.recently_refused(&seeds[route.next_seed % seeds.len()], now) {
            route.next_seed = route.next_seed.wrapping_add(1);
        }
    }

    /// The next delay of `backoff`, jittered with this client's seeded generator.
    pub(crate) fn backoff_delay(&self, backoff: &mut Backoff) -> Duration {
        let mut rng = self.inner.rng.lock().expect("rng lock poisoned");
        backoff.next_delay(&mut *rng)
    }

    /// Runs one logical request: the same `request` (same sequence number, if it has one) is
    /// sent on every attempt, until an answer, a non-retryable error, or the end of the retry
    /// budget. Each attempt has its own deadline, sent to the server as `grpc-timeout` too.
    pub(crate) async fn call<Req, Resp, F, Fut>(
        &self,
        opts: CallOpts,
        request: Req,
        send: F,
    ) -> Result<Resp, Error>
    where
        Req: Clone,
        F: FnMut(LocksClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.call_traced(opts, request, send)
            .await
            .map(|(response, _)| response)
    }

    /// [`Client::call`], also saying which endpoint answered and after how many failed
    /// attempts (the session's failover signal is built on it).
    pub(crate) async fn call_traced<Req, Resp, F, Fut>(
        &self,
        opts: CallOpts,
        request: Req,
        mut send: F,
    ) -> Result<(Resp, Answered), Error>
    where
        Req: Clone,
        F: FnMut(LocksClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.call_traced_at(opts, request, |uri, r| send(self.locks_client(uri), r))
            .await
    }

    /// [`Client::call_traced`], with `send` given the endpoint URI each attempt goes to.
    async fn call_traced_at<Req, Resp, F, Fut>(
        &self,
        opts: CallOpts,
        request: Req,
        mut send: F,
    ) -> Result<(Resp, Answered), Error>
    where
        Req: Clone,
        F: FnMut(&str, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let policy = &self.inner.config.retry;
        let clock = self.clock();
        let start = clock.now();
        let mut backoff = match opts.backoff_max {
            Some(max) => Backoff::new(&RetryPolicy {
                backoff_initial: policy.backoff_initial.min(max),
                backoff_max: policy.backoff_max.min(max),
                ..policy.clone()
            }),
            None => Backoff::new(policy),
        };
        let mut attempts = 0u32;
        // Whether any attempt of this call reached a server. Until one has, the call gives up
        // after `policy.unreachable_max`: a dead or misspelled endpoint is not an election.
        let mut reached = false;
        // The seeds this call has tried. The fail-fast budget ends a call only once every
        // seed was tried: one dead member whose connection times out (a host down, a cut link)
        // took the whole budget in one attempt, and the call gave up without trying the live
        // ones (the nemesis's `isolate-leader`: "cannot reach 10.88.0.1:7420: timed out (1
        // attempts in 2.0s)"). At most the seeds: bounded by the endpoints given.
        let mut untried: Vec<&str> = self.inner.seeds.iter().map(String::as_str).collect();
        loop {
            attempts += 1;
            let mut hint_group = opts.group;
            let uri = self.pick(opts.group);
            untried.retain(|s| *s != uri);
            let mut req = tonic::Request::new(request.clone());
            req.set_timeout(opts.attempt_timeout);
            if let Some(token) = &self.inner.config.auth_token {
                token.apply(&mut req);
            }
            let result = tokio::time::timeout(opts.attempt_timeout, send(&uri, req)).await;
            let failure = match result {
                Ok(Ok(response)) => {
                    self.answered(opts.group, &uri);
                    let answered = Answered {
                        endpoint: uri,
                        failed_attempts: attempts - 1,
                    };
                    return Ok((response.into_inner(), answered));
                }
                Ok(Err(status)) => {
                    // An error of a group names it: its leader hint is for that group (a
                    // keepalive carries sessions of several).
                    if let Some(group) = status
                        .metadata()
                        .get(latchkey_proto::GROUP_KEY)
                        .and_then(|v| v.to_str().ok()?.parse::<u32>().ok())
                        // Only a group the cluster has: the route map stays within
                        // `GROUPS_MAX` entries whatever a server sends.
                        .filter(|g| self.known_groups().is_some_and(|n| *g < n))
                    {
                        hint_group = group;
                    }
                    reached |= !never_connected(&status);
                    self.classify(&uri, &status)?
                }
                Err(_) => {
                    // Connected (a connection that cannot be made fails sooner, at the
                    // connect timeout) but unanswered: a busy or paused member, which may yet
                    // answer, not a dead address.
                    reached = true;
                    Failure::Transport {
                        message: format!(
                            "{} did not answer within {:?}",
                            bare(&uri),
                            opts.attempt_timeout
                        ),
                    }
                }
            };
            let hinted = match &failure {
                Failure::Fatal(e) => return Err(e.clone()),
                Failure::Unavailable { leader_addr, .. } => {
                    self.reroute(hint_group, &uri, leader_addr.as_deref())
                }
                Failure::Transport { .. } => {
                    self.unreachable(&uri);
                    false
                }
            };
            let elapsed = clock.now() - start;
            let budget = if !reached && untried.is_empty() {
                policy.elapsed_max.min(policy.unreachable_max)
            } else {
                policy.elapsed_max
            };
            if attempts >= policy.attempts_max || elapsed >= budget {
                return Err(give_up(failure, attempts, elapsed));
            }
            tracing::debug!(attempt = attempts, ?failure, "retrying");
            // A fresh leader hint is worth trying at once, but only the first time in a row:
            // hints that bounce between nodes during an election get the backoff.
            if !(hinted && attempts == 1) {
                let delay = {
                    let mut rng = self.inner.rng.lock().expect("rng lock poisoned");
                    backoff.next_delay(&mut *rng)
                };
                let budget_left = budget.saturating_sub(clock.now() - start);
                tokio::time::sleep(clock.timer_duration(delay.min(budget_left))).await;
            }
        }
    }
}

/// The voters the last group changed answered (`Client::change_groups` changes at least one).
fn last_voters(mut changed: Vec<GroupVoters>) -> Vec<Member> {
    changed.pop().map(|g| g.voters).unwrap_or_default()
}

fn group_voters(answers: Vec<(u32, pb::MembersResponse)>) -> Vec<GroupVoters> {
    answers
        .into_iter()
        .map(|(group, a)| GroupVoters {
            group,
            voters: members(a.members),
        })
        .collect()
}

fn members(members: Vec<pb::Member>) -> Vec<Member> {
    members
        .into_iter()
        .map(|m| Member {
            id: m.id,
            addr: m.addr,
        })
        .collect()
}

/// Who answered a request, and after how many failed attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answered {
    /// The endpoint URI that answered.
    pub endpoint: String,
    /// Attempts that failed (UNAVAILABLE, not the leader, transport) before the answer.
    pub failed_attempts: u32,
}

fn give_up(failure: Failure, attempts: u32, elapsed: Duration) -> Error {
    match failure {
        Failure::Fatal(e) => e,
        Failure::Unavailable { message, .. } => Error::Unavailable {
            attempts,
            elapsed,
            last: message,
        },
        Failure::Transport { message } => Error::Transport {
            attempts,
            elapsed,
            last: message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_a_scheme() {
        assert_eq!(
            endpoint_uri("127.0.0.1:7420").unwrap(),
            "http://127.0.0.1:7420"
        );
        assert_eq!(
            endpoint_uri(" http://h:1 ").unwrap(),
            "http://h:1".to_string()
        );
        assert!(matches!(
            endpoint_uri(""),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            endpoint_uri("bad host:1"),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[tokio::test]
    async fn routing_follows_hints_and_rotates_seeds() {
        let client = Client::connect(["a:1", "b:2"]).await.unwrap();
        assert_eq!(client.pick(0), "http://a:1");
        client.reroute(0, "http://a:1", None);
        assert_eq!(client.pick(0), "http://b:2");
        client.reroute(0, "http://b:2", Some("c:3"));
        assert_eq!(client.pick(0), "http://c:3");
        // The hinted node failing sends us back to the seeds, where we left off.
        client.reroute(0, "http://c:3", None);
        assert_eq!(client.pick(0), "http://b:2");
        client.answered(0, "http://b:2");
        assert_eq!(client.pick(0), "http://b:2");
    }

    /// Each Raft group has a leader of its own (issue #16): a hint for one group moves that
    /// group only, and a member that is unreachable is forgotten as every group's leader.
    #[tokio::test]
    async fn each_group_routes_to_its_own_leader() {
        let client = Client::connect(["a:1", "b:2", "c:3"]).await.unwrap();
        client.answered(0, "http://a:1");
        assert!(client.reroute(1, "http://a:1", Some("b:2")));
        client.answered(2, "http://a:1");
        assert_eq!(client.pick(0), "http://a:1");
        assert_eq!(client.pick(1), "http://b:2");
        assert_eq!(client.pick(2), "http://a:1");
        client.unreachable("http://a:1");
        assert_eq!(client.pick(1), "http://b:2");
        assert_eq!(
            client.pick(0),
            "http://b:2",
            "a seed, off the refused member"
        );
        assert_eq!(client.pick(2), "http://b:2");
    }

    /// A leader that cannot answer yet names itself (leases not resumed, issue #9): the client
    /// stays there (after its backoff) instead of asking a follower that would send it back.
    #[tokio::test]
    async fn a_member_naming_itself_keeps_the_client_there() {
        let client = Client::connect(["a:1", "b:2"]).await.unwrap();
        client.answered(0, "http://b:2");
        assert!(!client.reroute(0, "http://b:2", Some("b:2")));
        assert_eq!(client.pick(0), "http://b:2");
    }

    /// Regression (issue #11): after the leader was killed, followers went on naming it, and
    /// the client followed their hint back to the dead member on every other attempt, doubling
    /// its backoff each time, instead of asking the other members.
    #[tokio::test]
    async fn a_hint_naming_a_member_that_just_refused_is_not_followed() {
        let client = Client::connect(["a:1", "b:2", "c:3"]).await.unwrap();
        client.answered(0, "http://a:1");
        assert_eq!(client.pick(0), "http://a:1");
        // The leader dies: its connection is refused.
        client.unreachable("http://a:1");
        assert_eq!(client.pick(0), "http://b:2");
        // b has not heard of an election yet and still names a.
        assert!(!client.reroute(0, "http://b:2", Some("a:1")));
        assert_eq!(client.pick(0), "http://c:3");
        // c has voted for b in the meantime: that hint is followed.
        assert!(client.reroute(0, "http://c:3", Some("b:2")));
        assert_eq!(client.pick(0), "http://b:2");
        // b still a follower, naming a: the seeds go round without the refused member.
        assert!(!client.reroute(0, "http://b:2", Some("a:1")));
        assert_eq!(client.pick(0), "http://c:3");
        assert!(!client.reroute(0, "http://c:3", None));
        assert_eq!(client.pick(0), "http://b:2");
        // Once a answers again, hints naming it are followed again.
        client.answered(0, "http://a:1");
        assert!(client.reroute(0, "http://b:2", Some("a:1")));
        assert_eq!(client.pick(0), "http://a:1");
    }

    /// A member that refused us is trusted again after a while: it may have restarted and been
    /// re-elected, and hints are then the only way to it when it is not a seed.
    #[tokio::test(start_paused = true)]
    async fn a_refused_member_is_trusted_again_later() {
        // Tokio's clock, which the paused runtime advances.
        let env = ClientEnv {
            clock: Arc::new(crate::env::SystemClock),
            ..ClientEnv::default()
        };
        let client = Client::with_env(["b:2", "c:3"], ClientConfig::default(), env).unwrap();
        client.unreachable("http://a:1");
        assert!(!client.reroute(0, "http://b:2", Some("a:1")));
        tokio::time::advance(Duration::from_millis(limits::CLIENT_REFUSED_HINT_IGNORE_MS)).await;
        assert!(client.reroute(0, "http://c:3", Some("a:1")));
        assert_eq!(client.pick(0), "http://a:1");
    }

    #[tokio::test]
    async fn no_server_is_a_bounded_transport_error() {
        // Port 1 on localhost refuses connections at once.
        let config = ClientConfig {
            retry: RetryPolicy {
                attempts_max: 3,
                elapsed_max: Duration::from_secs(5),
                unreachable_max: Duration::from_secs(5),
                backoff_initial: Duration::from_millis(1),
                backoff_max: Duration::from_millis(2),
            },
            ..ClientConfig::default()
        };
        let client = Client::with_config(["127.0.0.1:1"], config).unwrap();
        match client.list("").await {
            Err(Error::Transport { attempts, .. }) => assert_eq!(attempts, 3),
            other => panic!("{other:?}"),
        }
    }
}
