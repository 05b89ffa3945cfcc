//! TLS for clients (issue #13): the CA that vouches for the servers and, for servers that require
//! one, this client's certificate; [`TlsConnector`] dials `https://` endpoints with them.
//!
//! A client speaking the wrong protocol fails at once with advice, never after a retry loop:
//! [`mismatch`] recognises, in a transport error, a TLS server refusing a plaintext client (it
//! answers with `latchkey_core::TLS_REQUIRED_MESSAGE`), a plaintext server answering a TLS client
//! (not a TLS record: "InvalidContentType"), and certificates refused either way.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::client::ClientConfig;
use crate::env::{ClientConnector, TcpConnector};
use crate::error::Error;

/// PEM bytes, shared by every channel of a client.
type Pem = Arc<Vec<u8>>;

/// The PEM a client needs for TLS: the CA, and optionally its own certificate and key.
#[derive(Clone)]
pub struct ClientTls {
    ca_pem: Pem,
    /// This client's certificate chain and key.
    identity: Option<(Pem, Pem)>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("client_certificate", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidArgument { message }
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, Error> {
    let len = std::fs::metadata(path)
        .map_err(|e| {
            invalid(format!(
                "cannot read the {what} file {}: {e}",
                path.display()
            ))
        })?
        .len();
    if len > latchkey_core::limits::TLS_PEM_FILE_BYTES_MAX {
        return Err(invalid(format!(
            "the {what} file {} has {len} bytes, too many for PEM certificates or a key",
            path.display()
        )));
    }
    std::fs::read(path).map_err(|e| {
        invalid(format!(
            "cannot read the {what} file {}: {e}",
            path.display()
        ))
    })
}

impl ClientTls {
    /// Reads and checks the CA file and, if given, this client's certificate and key files.
    pub fn from_files(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<ClientTls, Error> {
        let ca_pem = read("CA", ca)?;
        let identity = match identity {
            None => None,
            Some((cert, key)) => Some((read("certificate", cert)?, read("key", key)?)),
        };
        let flags = if identity.is_some() {
            ", --cert, --key"
        } else {
            ""
        };
        ClientTls::from_pem(ca_pem, identity).map_err(|e| match e {
            Error::InvalidArgument { message } => {
                invalid(format!("{message} (--ca {}{flags})", ca.display()))
            }
            other => other,
        })
    }

    /// The same from PEM held in memory.
    pub fn from_pem(
        ca_pem: Vec<u8>,
        identity: Option<(Vec<u8>, Vec<u8>)>,
    ) -> Result<ClientTls, Error> {
        let cas = CertificateDer::pem_slice_iter(&ca_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(format!("the CA is not PEM: {e}")))?;
        if cas.is_empty() {
            return Err(invalid("the CA file holds no certificate".into()));
        }
        if let Some((cert, key)) = &identity {
            let certs = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(format!("the client certificate is not PEM: {e}")))?;
            if certs.is_empty() {
                return Err(invalid("the client certificate file holds none".into()));
            }
            PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| invalid(format!("the client key holds no private key: {e}")))?;
        }
        let tls = ClientTls {
            ca_pem: Arc::new(ca_pem),
            identity: identity.map(|(c, k)| (Arc::new(c), Arc::new(k))),
        };
        // tonic checks the rest (the key's type) when it builds its connector: once here, so
        // that `channel` cannot fail later.
        Endpoint::from_static("https://localhost")
            .tls_config(tls.tonic_config())
            .map_err(|e| invalid(format!("TLS configuration: {e}")))?;
        Ok(tls)
    }

    fn tonic_config(&self) -> ClientTlsConfig {
        let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&*self.ca_pem));
        match &self.identity {
            Some((cert, key)) => config.identity(Identity::from_pem(&**cert, &**key)),
            None => config,
        }
    }
}

/// TCP with TLS for `https://` endpoints (verified against the CA of its [`ClientTls`]), plain
/// TCP for `http://` ones.
#[derive(Debug, Clone)]
pub struct TlsConnector {
    tls: ClientTls,
}

impl TlsConnector {
    pub fn new(tls: ClientTls) -> TlsConnector {
        TlsConnector { tls }
    }
}

impl ClientConnector for TlsConnector {
    fn channel(&self, uri: &str, config: &ClientConfig) -> Channel {
        if !uri.starts_with("https://") {
            return TcpConnector.channel(uri, config);
        }
        TcpConnector::endpoint(uri, config)
            .tls_config(self.tls.tonic_config().timeout(config.connect_timeout))
            .expect("the TLS configuration was checked in ClientTls::from_pem")
            .connect_lazy()
    }

    fn speaks_tls(&self) -> bool {
        true
    }
}

/// Whether a transport failure at `uri` is a protocol or certificate mismatch that retrying
/// cannot fix, and if so, what to tell the user.
pub(crate) fn mismatch(uri: &str, transport: &str) -> Option<String> {
    let server = uri.split_once("://").map_or(uri, |(_, rest)| rest);
    if transport.contains(latchkey_core::TLS_REQUIRED_MESSAGE) {
        return Some(format!(
            "the server at {server} speaks TLS: use https://{server} and --ca FILE"
        ));
    }
    if transport.contains("InvalidContentType") {
        return Some(format!(
            "the server at {server} does not speak TLS: use http://{server} (or its TLS port)"
        ));
    }
    if transport.contains("invalid peer certificate") {
        return Some(format!(
            "the certificate of the server at {server} is not trusted by --ca ({transport})"
        ));
    }
    if transport.contains("CertificateRequired") {
        return Some(format!(
            "the server at {server} requires a client certificate: give --cert FILE and --key FILE"
        ));
    }
    if transport.contains("received fatal alert: BadCertificate")
        || transport.contains("received fatal alert: UnknownCA")
        || transport.contains("received fatal alert: DecryptError")
    {
        return Some(format!(
            "the server at {server} refused this client's certificate ({transport})"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatches_are_named_and_other_failures_are_not() {
        let plain = mismatch(
            "http://h:1",
            &format!(
                "Unavailable: error trying to connect: connection error received: \
                 INADEQUATE_SECURITY (b\"{}\")",
                latchkey_core::TLS_REQUIRED_MESSAGE
            ),
        )
        .unwrap();
        assert!(plain.contains("speaks TLS: use https://h:1"), "{plain}");
        let tls = mismatch(
            "https://h:1",
            "Unavailable: received corrupt message of type InvalidContentType",
        )
        .unwrap();
        assert!(tls.contains("does not speak TLS: use http://h:1"), "{tls}");
        assert_eq!(
            mismatch("http://h:1", "Unavailable: connection refused"),
            None
        );
    }
}
