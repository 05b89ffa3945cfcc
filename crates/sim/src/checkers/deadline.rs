//! The client never believes it holds a lock past the moment the cluster could grant the lock
//! to another: every time a client found, on its own drifting clock, that it still held its
//! session's locks, no expiry of that session had been proposed yet (the leader appended the
//! expiry entry later, in true time).

use super::{ms, Violation};
use crate::history::{Event, HistoryData};

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let ends = h.committed_session_ends();
    let mut out = Vec::new();
    for e in &h.events {
        let Event::HoldCheck {
            actor,
            session,
            lock,
            token,
            at,
        } = e
        else {
            continue;
        };
        for end in ends.iter().filter(|end| end.sessions.contains(session)) {
            if end.first_at <= *at {
                out.push(Violation {
                    checker: "deadline",
                    message: format!(
                        "{actor:?} believed at {} that it held lock {lock:?} (token {token}) but \
                         the end of session {session} was proposed at {} (entry {})",
                        ms(*at),
                        ms(end.first_at),
                        end.index
                    ),
                });
            }
        }
    }
    out
}
