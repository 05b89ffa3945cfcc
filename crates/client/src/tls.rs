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
        let identity_paths = identity;
        let identity = match identity {
            None => None,
            Some((cert, key)) => Some((read("certificate", cert)?, read("key", key)?)),
        };
        let flags = match &identity_paths {
            Some((cert, key)) => format!(", --cert {}, --key {}", cert.display(), key.display()),
            None => String::new(),
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
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| invalid(format!("the client key holds no private key: {e}")))?;
            check_identity(certs, key).map_err(invalid)?;
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

/// Whether this client's certificate is one TLS accepts and its key fits it: a version-1
/// certificate (what `openssl x509 -req` makes without extensions) or a key of another
/// certificate each get their own sentence, not tonic's "transport error".
fn check_identity(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<(), String> {
    use tokio_rustls::rustls;
    if let Err(e) = webpki::EndEntityCert::try_from(&certs[0]) {
        return Err(match e {
            webpki::Error::UnsupportedCertVersion => "the client certificate is an X.509 \
                 version 1 certificate, which TLS (rustls) refuses: issue a version 3 one (with \
                 openssl, give `x509 -req` an `-extfile` with a subjectAltName)"
                .to_owned(),
            e => format!("the client certificate cannot be used for TLS: {e:?}"),
        });
    }
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(certs, key, &provider)
        .map(|_| ())
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => "the client key does not fit the client \
                 certificate: give the key made with that certificate"
                .to_owned(),
            e => format!("the client key cannot be used with the client certificate: {e}"),
        })
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
    if let Some((_, rest)) = transport.split_once("invalid peer certificate: ") {
        // rustls's reason, once: tonic repeats the chain ("... UnknownIssuer: transport error:
        // invalid peer certificate: UnknownIssuer: ...").
        let reason = rest.split(':').next().unwrap_or(rest).trim();
        let what = match reason {
            "UnknownIssuer" => "is not signed by the CA given with --ca: give the CA that signed \
                 the server's certificate"
                .to_owned(),
            "Expired" => "has expired".to_owned(),
            "NotValidYet" => "is not valid yet (check the clocks)".to_owned(),
            r if r.starts_with("NotValidForName") => format!(
                "does not name {}: connect by a name or address the certificate lists",
                server.rsplit_once(':').map_or(server, |(host, _)| host)
            ),
            _ => "is not trusted by --ca".to_owned(),
        };
        return Some(format!(
            "the certificate of the server at {server} {what} ({reason})"
        ));
    }
    if transport.contains("CertificateRequired") {
        return Some(format!(
            "the server at {server} requires a client certificate: give --cert FILE and --key FILE"
        ));
    }
    for alert in ["BadCertificate", "UnknownCA", "DecryptError"] {
        if transport.contains(&format!("received fatal alert: {alert}")) {
            return Some(format!(
                "the server at {server} refused this client's certificate (received fatal \
                 alert: {alert}): give --cert a certificate signed by the CA the server trusts \
                 (its --tls-ca), and --key its key"
            ));
        }
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

    /// Issue #33: a wrong CA printed `UnknownIssuer` three times; the reason comes once, with
    /// what to do.
    #[test]
    fn an_untrusted_server_certificate_is_said_once_with_what_to_do() {
        let said = mismatch(
            "https://127.0.0.1:7420",
            "Unavailable: invalid peer certificate: UnknownIssuer: transport error: invalid \
             peer certificate: UnknownIssuer: invalid peer certificate: UnknownIssuer",
        )
        .unwrap();
        assert_eq!(said.matches("UnknownIssuer").count(), 1, "{said}");
        assert!(
            said.contains("is not signed by the CA given with --ca"),
            "{said}"
        );
        let name = mismatch(
            "https://db1:7420",
            "Unavailable: invalid peer certificate: NotValidForNameContext { expected: .. }",
        )
        .unwrap();
        assert!(name.contains("does not name db1"), "{name}");
    }

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("{}/fixtures/tls/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Issue #33: a version-1 certificate and a key of another certificate both said
    /// `TLS configuration: transport error`; each gets its own sentence.
    #[test]
    fn a_version_1_certificate_and_a_key_that_does_not_fit_are_named() {
        let ca = fixture("ca.pem");
        let v1 = ClientTls::from_pem(ca.clone(), Some((fixture("v1.pem"), fixture("v1.key"))))
            .unwrap_err()
            .to_string();
        assert!(v1.contains("X.509 version 1 certificate"), "{v1}");
        let other =
            ClientTls::from_pem(ca.clone(), Some((fixture("v3.pem"), fixture("other.key"))))
                .unwrap_err()
                .to_string();
        assert!(
            other.contains("the client key does not fit the client certificate"),
            "{other}"
        );
        ClientTls::from_pem(ca, Some((fixture("v3.pem"), fixture("v3.key"))))
            .expect("a version 3 certificate with its own key");
    }
}
