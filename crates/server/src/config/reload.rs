//! What an operator changes without a restart (issue #31 item 6): the TLS certificate and key,
//! the client CA (`tls.rs`), and the access-control list (`acl.rs`), each reloaded on SIGHUP
//! ([`Reloadable::reload`], which `latchkey serve` calls) and when its file's modification time
//! changes ([`Reloadable::watch`], polled every `RELOAD_POLL_MS`, which [`crate::run`] runs).
//!
//! A file that does not load is refused with a log line and what was in force stays; it is not
//! read again until it changes again (or the next SIGHUP). What each reload reaches: a new pair
//! and a new CA the handshakes that begin after it (a connection already open keeps its
//! verified client until it closes); a new list every call that arrives after it.

use std::sync::Arc;
use std::time::Duration;

use latchkey_core::limits;
use tokio_util::sync::CancellationToken;

use crate::access::acl::AclPolicy;
use crate::access::tls::ServerTls;
use crate::config::ServerConfig;

/// The reloadable parts of a member's configuration.
#[derive(Debug, Clone)]
pub struct Reloadable {
    tls: Option<Arc<ServerTls>>,
    acl: Option<Arc<AclPolicy>>,
}

impl Reloadable {
    pub fn of(config: &ServerConfig) -> Reloadable {
        Reloadable {
            tls: config.tls.clone(),
            acl: config.acl.clone(),
        }
    }

    /// Reloads everything now and logs the outcome of each; `why` says what asked for it.
    /// Blocks on file reads: call it off the runtime's workers.
    pub fn reload(&self, why: &str) {
        if self.tls.is_none() && self.acl.is_none() {
            tracing::info!("{why}: nothing to reload (no TLS, no access-control list)");
        }
        if let Some(tls) = &self.tls {
            tls.reload_logged(why);
        }
        if let Some(acl) = &self.acl {
            acl.reload_logged(why);
        }
    }

    /// Reloads, logged, what changed on disk since it was last read.
    fn reload_changed(&self) {
        if let Some(tls) = &self.tls {
            tls.reload_if_changed();
        }
        if let Some(acl) = self.acl.as_ref().filter(|acl| acl.changed()) {
            acl.reload_logged("the access-control file changed");
        }
    }

    /// Polls the files' modification times until `stop` is cancelled.
    pub(crate) async fn watch(self, stop: CancellationToken) {
        if self.tls.is_none() && self.acl.is_none() {
            return;
        }
        let mut tick = tokio::time::interval(Duration::from_millis(limits::RELOAD_POLL_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let files = self.clone();
            // `stat` and the file reads block; keep them off the runtime's workers.
            let _ = tokio::task::spawn_blocking(move || files.reload_changed()).await;
        }
    }
}
