//! What the server reads from an X.509 certificate: the names it gives its holder. Client
//! identities (`access/acl.rs`), member identities (`cluster/peer_auth.rs`) and the server's own
//! certificate (`access/tls.rs`) are all told by them. A leaf: it depends on nothing of the
//! crate, so that the cluster's peer authentication needs nothing of access control.

use rustls_pki_types::CertificateDer;

/// The names a client certificate gives its holder: the subject's common name, then the first
/// DNS subject alternative name.
pub fn cert_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok(parsed) = webpki::EndEntityCert::try_from(cert) else {
        return Vec::new();
    };
    let mut names: Vec<String> = common_name(parsed.subject()).into_iter().collect();
    names.extend(parsed.valid_dns_names().next().map(str::to_owned));
    names
}

/// The first common name (OID 2.5.4.3) in a DER-encoded X.509 Name (the contents of its
/// SEQUENCE, as webpki gives it). Names are SET { SEQUENCE { OID, string } }*; a full ASN.1
/// parser is not needed to find one attribute.
fn common_name(mut name: &[u8]) -> Option<String> {
    /// One TLV: (tag, contents, rest).
    fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let tag = *b.first()?;
        let first = *b.get(1)? as usize;
        let (len, header) = if first < 0x80 {
            (first, 2)
        } else {
            let n = first & 0x7f;
            if n == 0 || n > 2 {
                return None;
            }
            let mut len = 0usize;
            for i in 0..n {
                len = (len << 8) | *b.get(2 + i)? as usize;
            }
            (len, 2 + n)
        };
        let end = header.checked_add(len)?;
        Some((tag, b.get(header..end)?, b.get(end..)?))
    }
    const CN_OID: &[u8] = &[0x55, 0x04, 0x03];
    while !name.is_empty() {
        let (_set_tag, mut set, rest) = tlv(name)?;
        name = rest;
        while !set.is_empty() {
            let (_seq_tag, attr, rest) = tlv(set)?;
            set = rest;
            let (oid_tag, oid, value) = tlv(attr)?;
            if oid_tag == 0x06 && oid == CN_OID {
                let (_string_tag, text, _) = tlv(value)?;
                return std::str::from_utf8(text).ok().map(str::to_owned);
            }
        }
    }
    None
}
