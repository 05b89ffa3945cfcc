//! Who a client is and what it may do: the access-control list ([`acl`]: identities from
//! bearer tokens and client certificates, permissions on lock-name prefixes, quotas) and TLS
//! ([`tls`]: the certificate, the client CA, the accept loop shared by gRPC and HTTP, and the
//! members' mTLS dialer). Both reload without a restart (`crate::reload`).
//!
//! Refusals are counted and logged in `crate::observe::refusals`. Must not depend on the
//! node or the APIs.

pub mod acl;
pub mod tls;
