//! A member's address as the Raft membership records it: where clients reach the member, and,
//! when it serves the peer service on a port of its own (`--peer-listen`), where members do.
//!
//! Written `CLIENT` or `CLIENT/PEER` (`10.0.0.1:7420/10.0.0.1:7520`), in `--peers`, in
//! `cluster add`/`move`, and in openraft's `BasicNode::addr`. The membership stays a string
//! per member, so the log's and the snapshots' encoding is unchanged and a data dir written
//! before `--peer-listen` existed reads as it did; a member without a peer part is dialed at
//! its client address, as before. Leader hints and `own_addr` name the client part only.

use latchkey_core::limits;

/// The separator of the client and the peer address: in no `HOST:PORT`, and needs no quoting
/// in a shell.
const SEPARATOR: char = '/';

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberAddr<'a> {
    /// Where clients reach the member; what leader hints name.
    pub client: &'a str,
    /// Where members reach it (its `--peer-listen`), if not at `client`.
    pub peer: Option<&'a str>,
}

impl<'a> MemberAddr<'a> {
    /// Splits a recorded address. Never fails: a malformed one was refused when it was given
    /// (`check`), and an address without a separator is a client address alone.
    pub fn split(recorded: &'a str) -> MemberAddr<'a> {
        match recorded.split_once(SEPARATOR) {
            Some((client, peer)) => MemberAddr {
                client,
                peer: Some(peer),
            },
            None => MemberAddr {
                client: recorded,
                peer: None,
            },
        }
    }

    /// Where members dial it.
    pub fn peer(&self) -> &'a str {
        self.peer.unwrap_or(self.client)
    }

    /// Checks an address given by an operator: `HOST:PORT` or `HOST:PORT/HOST:PORT`, each with a
    /// port above 0, at most `MEMBER_ADDR_BYTES_MAX` bytes in all.
    pub fn check(text: &str) -> Result<MemberAddr<'_>, String> {
        if text.len() > limits::MEMBER_ADDR_BYTES_MAX {
            return Err(format!(
                "member address {text:?} is longer than {} bytes",
                limits::MEMBER_ADDR_BYTES_MAX
            ));
        }
        let addr = MemberAddr::split(text);
        for part in [Some(addr.client), addr.peer].into_iter().flatten() {
            let port = part.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
            if part.contains(SEPARATOR) || !matches!(port, Some(Ok(p)) if p > 0) {
                return Err(format!(
                    "member address {text:?} is not HOST:PORT or CLIENT_HOST:PORT/PEER_HOST:PORT"
                ));
            }
        }
        Ok(addr)
    }

    /// The recorded form: `CLIENT` or `CLIENT/PEER`.
    pub fn join(client: &str, peer: Option<&str>) -> String {
        match peer {
            Some(peer) => format!("{client}{SEPARATOR}{peer}"),
            None => client.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_splits_into_client_and_peer_parts_and_reads_back() {
        let a = MemberAddr::split("10.0.0.1:7420");
        assert_eq!(
            (a.client, a.peer, a.peer()),
            ("10.0.0.1:7420", None, "10.0.0.1:7420")
        );
        let b = MemberAddr::split("h:7420/[::1]:7520");
        assert_eq!((b.client, b.peer()), ("h:7420", "[::1]:7520"));
        assert_eq!(MemberAddr::join(b.client, b.peer), "h:7420/[::1]:7520");
        assert_eq!(MemberAddr::join(a.client, a.peer), "10.0.0.1:7420");
    }

    #[test]
    fn a_malformed_address_is_refused() {
        for ok in ["h:1", "h:1/h:2", "[::1]:7420/10.0.0.1:7520"] {
            assert!(MemberAddr::check(ok).is_ok(), "{ok}");
        }
        for bad in [
            "h",
            "h:0",
            "h:1/",
            "/h:1",
            "h:1/h:2/h:3",
            "h:1/h",
            &"h".repeat(600),
        ] {
            assert!(MemberAddr::check(bad).is_err(), "{bad}");
        }
    }
}
