//! Elections (issue #32 item 1, `RunConfig::elections`), judged from what the clients recorded
//! ([`HistoryData::elections`]), per election name:
//!
//! - **One leader at a time.** A term, as its leader believed it, lasts from its campaign's
//!   answer to the leader's last check that found it still led (`ElectionKind::Leading`,
//!   before each proclaim and the resign); two terms of one name never overlap, as two holds of
//!   a mutex never do.
//! - **Tokens rise.** A campaign invoked after another's win was answered wins a higher token;
//!   no two wins share one.
//! - **Proclaims come from the term's leader.** A proclaim the server acknowledged carries a
//!   token its own session won, and was not invoked after that term's resign was acknowledged
//!   nor after a later term's win was answered (the term had ended: the server must refuse it).
//! - **Reads see the current term.** A read of the leader returns a value some operation of
//!   that session sent under the token the read names (a campaign's under its win's token, a
//!   proclaim's under its own), sent before the read returned; and never a term older than one
//!   whose win was answered before the read was invoked.
//! - **A refused proclaim changes nothing.** No read returns the value of a proclaim the server
//!   answered refused (`not-election-leader`), even under its own session and token.
//! - **Reads do not go back within a term.** A read invoked after a proclaim of the term was
//!   acknowledged does not return a value that proclaim replaced: one whose operation was
//!   answered before the proclaim was invoked (real-time order; a read concurrent with the
//!   proclaim may return either).
//! - **A lasting term is seen.** A read does not find "no leader" while a term surely lasted
//!   over its whole interval: won before the read was invoked, its leader's check that it
//!   still led after the read returned, no resign invoked before that.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::{ms, Violation};
use crate::history::{Actor, ElectionKind, ElectionOp, ElectionRet, HistoryData};

const CHECKER: &str = "election";

/// A campaign that won, with the span its leader believed it led.
#[derive(Debug, Clone)]
pub struct Term {
    pub actor: Actor,
    pub session: u64,
    pub token: u64,
    pub invoked: Duration,
    /// When the win was answered.
    pub from: Duration,
    /// The leader's last check that found it led, if it made one after the win.
    pub until: Option<Duration>,
}

/// Every term of every election name, by name, in the order their wins were answered.
pub fn terms(h: &HistoryData) -> BTreeMap<&str, Vec<Term>> {
    let mut out: BTreeMap<&str, Vec<Term>> = BTreeMap::new();
    let mut last_check: BTreeMap<(&str, u64, u64), Duration> = BTreeMap::new();
    for e in &h.elections {
        if let ElectionKind::Leading { token } = e.kind {
            let t = last_check
                .entry((e.name.as_str(), e.session, token))
                .or_default();
            *t = (*t).max(e.invoked);
        }
    }
    for e in &h.elections {
        let (ElectionKind::Campaign { .. }, Some((ElectionRet::Leads { token }, from))) =
            (&e.kind, &e.ret)
        else {
            continue;
        };
        let until = last_check
            .get(&(e.name.as_str(), e.session, *token))
            .copied()
            .filter(|u| u >= from);
        out.entry(e.name.as_str()).or_default().push(Term {
            actor: e.actor,
            session: e.session,
            token: *token,
            invoked: e.invoked,
            from: *from,
            until,
        });
    }
    for terms in out.values_mut() {
        terms.sort_by_key(|t| t.from);
    }
    out
}

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut violation = |message: String| {
        out.push(Violation {
            checker: CHECKER,
            message,
        })
    };
    for (name, terms) in terms(h) {
        let ops: Vec<&ElectionOp> = h.elections.iter().filter(|e| e.name == name).collect();
        check_terms(name, &terms, &mut violation);
        check_proclaims(name, &terms, &ops, &mut violation);
        check_reads(name, &terms, &ops, &mut violation);
    }
    // A read or proclaim of a name nobody won is judged too: a value read must still come
    // from some operation.
    let won: BTreeSet<&str> = terms(h).into_keys().collect();
    let others: BTreeSet<&str> = (h.elections.iter())
        .map(|e| e.name.as_str())
        .filter(|n| !won.contains(n))
        .collect();
    for name in others {
        let ops: Vec<&ElectionOp> = h.elections.iter().filter(|e| e.name == name).collect();
        check_proclaims(name, &[], &ops, &mut violation);
        check_reads(name, &[], &ops, &mut violation);
    }
    out
}

/// One leader at a time, and rising tokens.
fn check_terms(name: &str, terms: &[Term], violation: &mut impl FnMut(String)) {
    for (i, a) in terms.iter().enumerate() {
        for b in &terms[i + 1..] {
            if a.token == b.token {
                violation(format!(
                    "{name}: two wins with token {}: {:?} (answered {}) and {:?} (answered {})",
                    a.token,
                    a.actor,
                    ms(a.from),
                    b.actor,
                    ms(b.from)
                ));
            }
            // `b` was answered after `a` (sorted); one leader at a time.
            if let Some(until) = a.until.filter(|&u| b.from < u) {
                violation(format!(
                    "{name}: two leaders at once: {:?} won token {} (answered {}) while {:?} \
                     still led under token {} (its check at {})",
                    b.actor,
                    b.token,
                    ms(b.from),
                    a.actor,
                    a.token,
                    ms(until)
                ));
            }
        }
        for b in terms {
            if a.from < b.invoked && b.token <= a.token {
                violation(format!(
                    "{name}: {:?} campaigned at {}, after {:?}'s win of token {} was answered \
                     (at {}), and won token {}, not above it",
                    b.actor,
                    ms(b.invoked),
                    a.actor,
                    a.token,
                    ms(a.from),
                    b.token
                ));
            }
        }
    }
}

/// Every acknowledged proclaim came from the leader of its term, while the term lasted.
fn check_proclaims(
    name: &str,
    terms: &[Term],
    ops: &[&ElectionOp],
    violation: &mut impl FnMut(String),
) {
    for p in ops {
        let (ElectionKind::Proclaim { token, value }, Some((ElectionRet::Proclaimed, at))) =
            (&p.kind, &p.ret)
        else {
            continue;
        };
        let own = terms
            .iter()
            .any(|t| t.token == *token && t.session == p.session);
        if !own {
            violation(format!(
                "{name}: {:?}'s proclaim of {value:?} under token {token}, which its session {} \
                 never won, was acknowledged at {}",
                p.actor,
                p.session,
                ms(*at)
            ));
        }
        // At or after: a client invokes its next operation in the instant its last answer
        // came, and its own operations are in order.
        let resigned = ops.iter().find(|r| {
            r.session == p.session
                && r.kind == ElectionKind::Resign { token: *token }
                && matches!(&r.ret, Some((ElectionRet::Resigned, done)) if *done <= p.invoked)
        });
        if let Some(r) = resigned {
            violation(format!(
                "{name}: {:?}'s proclaim of {value:?} under token {token}, invoked at {} after \
                 its resign of that term was acknowledged (at {}), was acknowledged at {}",
                p.actor,
                ms(p.invoked),
                ms(r.ret.as_ref().map_or(Duration::ZERO, |r| r.1)),
                ms(*at)
            ));
        }
        if let Some(later) = terms
            .iter()
            .find(|t| t.token > *token && t.from < p.invoked)
        {
            violation(format!(
                "{name}: {:?}'s proclaim of {value:?} under token {token}, invoked at {} after \
                 {:?} won the later term {} (answered {}), was acknowledged at {}",
                p.actor,
                ms(p.invoked),
                later.actor,
                later.token,
                ms(later.from),
                ms(*at)
            ));
        }
    }
}

/// Where a value came from: the session that sent it, the token it was sent under (`None`: a
/// campaign with no answer, which the server may still have granted under any token), when it
/// was sent, when it was answered and whether the answer refused it.
struct Sent {
    session: u64,
    token: Option<u64>,
    invoked: Duration,
    answered: Option<Duration>,
    refused: bool,
}

/// An acknowledged proclaim: when it was invoked, when acknowledged, its value.
type Acked<'a> = (Duration, Duration, &'a str);

/// Every read of the leader names a value sent under the term it names, not refused, not
/// replaced within its term before the read began, and no older term than one already won;
/// and a read while a term surely lasted finds a leader.
fn check_reads(
    name: &str,
    terms: &[Term],
    ops: &[&ElectionOp],
    violation: &mut impl FnMut(String),
) {
    let mut sent: BTreeMap<&str, Sent> = BTreeMap::new();
    for e in ops {
        let (value, token) = match (&e.kind, &e.ret) {
            (ElectionKind::Campaign { value }, Some((ElectionRet::Leads { token }, _))) => {
                (value, Some(*token))
            }
            (ElectionKind::Campaign { value }, _) => (value, None),
            (ElectionKind::Proclaim { token, value }, _) => (value, Some(*token)),
            _ => continue,
        };
        let s = Sent {
            session: e.session,
            token,
            invoked: e.invoked,
            answered: e.ret.as_ref().map(|r| r.1),
            refused: matches!(e.ret, Some((ElectionRet::NotLeader, _))),
        };
        sent.insert(value.as_str(), s);
    }
    // Acknowledged proclaims by (session, token).
    let mut acked: BTreeMap<(u64, u64), Vec<Acked<'_>>> = BTreeMap::new();
    for p in ops {
        if let (ElectionKind::Proclaim { token, value }, Some((ElectionRet::Proclaimed, at))) =
            (&p.kind, &p.ret)
        {
            let v = (p.invoked, *at, value.as_str());
            acked.entry((p.session, *token)).or_default().push(v);
        }
    }
    for r in ops {
        let (ElectionKind::Read, Some((ElectionRet::Leader(leader), at))) = (&r.kind, &r.ret)
        else {
            continue;
        };
        let Some((session, token, value)) = leader else {
            check_no_leader(name, terms, ops, r, *at, violation);
            continue;
        };
        match sent.get(value.as_str()) {
            None => violation(format!(
                "{name}: {:?}'s read at {} returned the value {value:?} (session {session}, \
                 token {token}), which no operation sent",
                r.actor,
                ms(*at)
            )),
            // A refused proclaim changes nothing: its value is never the leader's, under
            // whatever session and token a read names it.
            Some(s) if s.refused => violation(format!(
                "{name}: {:?}'s read at {} returned the value {value:?} (session {session}, \
                 token {token}), which the server refused (answered {})",
                r.actor,
                ms(*at),
                ms(s.answered.unwrap_or_default())
            )),
            Some(s) if s.session != *session || s.token.is_some_and(|t| t != *token) => {
                violation(format!(
                    "{name}: {:?}'s read at {} returned the value {value:?} as session \
                     {session}'s under token {token}, but session {} sent it under {}",
                    r.actor,
                    ms(*at),
                    s.session,
                    s.token
                        .map_or("no answered token".to_owned(), |t| format!("token {t}"))
                ))
            }
            Some(s) if s.invoked > *at => violation(format!(
                "{name}: {:?}'s read at {} returned the value {value:?}, sent only at {}",
                r.actor,
                ms(*at),
                ms(s.invoked)
            )),
            Some(s) => {
                // Real-time order within the term: a proclaim invoked after this value's
                // operation was answered, and acknowledged before the read was invoked,
                // replaced it for good (a value sent with no answer may land any time).
                let newer = s.answered.and_then(|sent_at| {
                    (acked.get(&(*session, *token))?.iter()).find(|&&(inv, done, v)| {
                        v != value.as_str() && inv >= sent_at && done < r.invoked
                    })
                });
                if let Some(&(_, done, v)) = newer {
                    violation(format!(
                        "{name}: {:?}'s read invoked at {} returned {value:?} (token {token}), \
                         after the proclaim of {v:?} under token {token} was acknowledged \
                         (at {}), which replaced it",
                        r.actor,
                        ms(r.invoked),
                        ms(done)
                    ));
                }
            }
        }
        if let Some(later) = terms
            .iter()
            .find(|t| t.token > *token && t.from < r.invoked)
        {
            violation(format!(
                "{name}: {:?}'s read invoked at {} returned term {token} ({value:?}), after {:?} \
                 won the later term {} (answered {})",
                r.actor,
                ms(r.invoked),
                later.actor,
                later.token,
                ms(later.from)
            ));
        }
    }
}

/// A read that found no leader, answered at `at`, while a term surely lasted over its whole
/// interval: the term's win was answered before the read was invoked, its leader found it
/// still led after the read returned (the same evidence "one leader at a time" trusts), and
/// its resign was not invoked before the read returned.
fn check_no_leader(
    name: &str,
    terms: &[Term],
    ops: &[&ElectionOp],
    r: &ElectionOp,
    at: Duration,
    violation: &mut impl FnMut(String),
) {
    if let Some(t) = lasting_term(terms, ops, r.invoked, at) {
        violation(format!(
            "{name}: {:?}'s read (invoked {}, answered {}) found no leader, while {:?} led \
             under token {} (won, answered {}; still led at its check at {})",
            r.actor,
            ms(r.invoked),
            ms(at),
            t.actor,
            t.token,
            ms(t.from),
            ms(t.until.unwrap_or_default())
        ));
    }
}

/// A term that surely lasted from `invoked` to `answered`: won (answered) by `invoked`, its
/// leader's check that it led at or after `answered`, its resign not invoked by then.
fn lasting_term<'a>(
    terms: &'a [Term],
    ops: &[&ElectionOp],
    invoked: Duration,
    answered: Duration,
) -> Option<&'a Term> {
    let resigned_by = |t: &Term| {
        ops.iter().any(|o| {
            o.session == t.session
                && o.kind == (ElectionKind::Resign { token: t.token })
                && o.invoked <= answered
        })
    };
    terms
        .iter()
        .find(|t| t.from <= invoked && t.until.is_some_and(|u| u >= answered) && !resigned_by(t))
}

/// What the reads gave the last two checks to judge, for the coverage: `(reads that returned
/// a term after one of its proclaims was acknowledged, reads answered while a term surely
/// lasted over their whole interval)`.
pub fn reads_judged(h: &HistoryData) -> (usize, usize) {
    let terms = terms(h);
    let (mut after_proclaim, mut in_lasting_term) = (0, 0);
    for r in &h.elections {
        let (ElectionKind::Read, Some((ElectionRet::Leader(leader), at))) = (&r.kind, &r.ret)
        else {
            continue;
        };
        let ops: Vec<&ElectionOp> = h.elections.iter().filter(|e| e.name == r.name).collect();
        let name_terms = terms.get(r.name.as_str()).map_or(&[][..], Vec::as_slice);
        if lasting_term(name_terms, &ops, r.invoked, *at).is_some() {
            in_lasting_term += 1;
        }
        let Some((session, token, _)) = leader else {
            continue;
        };
        let acked_before = ops.iter().any(|p| {
            p.session == *session
                && matches!(&p.kind, ElectionKind::Proclaim { token: t, .. } if t == token)
                && matches!(p.ret, Some((ElectionRet::Proclaimed, done)) if done < r.invoked)
        });
        if acked_before {
            after_proclaim += 1;
        }
    }
    (after_proclaim, in_lasting_term)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::testkit::{actor, messages, t};

    /// Builds an election history of the name "e"; session `c` is client `c`'s.
    #[derive(Default)]
    struct Elect {
        h: HistoryData,
    }

    impl Elect {
        fn op(
            &mut self,
            c: u32,
            kind: ElectionKind,
            invoked: u64,
            ret: Option<(ElectionRet, u64)>,
        ) {
            self.h.elections.push(ElectionOp {
                actor: actor(c),
                session: u64::from(c),
                name: "e".into(),
                kind,
                invoked: t(invoked),
                ret: ret.map(|(r, at)| (r, t(at))),
            });
        }

        fn won(&mut self, c: u32, value: &str, invoked: u64, token: u64, at: u64) {
            let kind = ElectionKind::Campaign {
                value: value.into(),
            };
            self.op(c, kind, invoked, Some((ElectionRet::Leads { token }, at)));
        }

        fn leading(&mut self, c: u32, token: u64, at: u64) {
            let kind = ElectionKind::Leading { token };
            self.op(c, kind, at, Some((ElectionRet::Leading, at)));
        }

        fn proclaim(
            &mut self,
            c: u32,
            token: u64,
            value: &str,
            invoked: u64,
            ret: ElectionRet,
            at: u64,
        ) {
            let kind = ElectionKind::Proclaim {
                token,
                value: value.into(),
            };
            self.op(c, kind, invoked, Some((ret, at)));
        }

        fn resigned(&mut self, c: u32, token: u64, invoked: u64, at: u64) {
            let kind = ElectionKind::Resign { token };
            self.op(c, kind, invoked, Some((ElectionRet::Resigned, at)));
        }

        fn read(&mut self, c: u32, invoked: u64, leader: Option<(u64, u64, &str)>, at: u64) {
            let leader = leader.map(|(s, tk, v)| (s, tk, v.to_owned()));
            self.op(
                c,
                ElectionKind::Read,
                invoked,
                Some((ElectionRet::Leader(leader), at)),
            );
        }

        /// 1 leads under 10 (values a, a2), resigns; 2, waiting since 150, leads under 20; the
        /// late proclaim of 1 under 10 is refused; reads see each term.
        fn correct() -> Elect {
            let mut e = Elect::default();
            e.won(1, "a", 0, 10, 100);
            e.leading(1, 10, 200);
            e.proclaim(1, 10, "a2", 210, ElectionRet::Proclaimed, 250);
            e.read(3, 260, Some((1, 10, "a2")), 270);
            e.op(
                2,
                ElectionKind::Campaign { value: "b".into() },
                150,
                Some((ElectionRet::Leads { token: 20 }, 420)),
            );
            e.leading(1, 10, 300);
            e.resigned(1, 10, 310, 425);
            e.proclaim(1, 10, "a3", 425, ElectionRet::NotLeader, 450);
            e.read(3, 430, Some((2, 20, "b")), 440);
            e.leading(2, 20, 500);
            e
        }
    }

    #[test]
    fn a_correct_election_passes() {
        let e = Elect::correct();
        assert!(check(&e.h).is_empty(), "{:?}", check(&e.h));
    }

    /// The planted proclaim past its term: 1's late proclaim under 10 acknowledged, its value
    /// then read as 2's under 20.
    #[test]
    fn a_proclaim_after_its_term_ended_and_its_value_read_under_the_next_are_caught() {
        let mut e = Elect::correct();
        let late =
            e.h.elections
                .iter_mut()
                .find(|o| matches!(&o.kind, ElectionKind::Proclaim { value, .. } if value == "a3"))
                .expect("the late proclaim");
        late.ret = Some((ElectionRet::Proclaimed, t(450)));
        e.read(3, 460, Some((2, 20, "a3")), 470);
        let m = messages(&check(&e.h), CHECKER);
        assert_eq!(m.len(), 3, "{m:#?}");
        assert!(
            m[0].contains("after its resign of that term was acknowledged"),
            "{}",
            m[0]
        );
        assert!(m[1].contains("won the later term 20"), "{}", m[1]);
        assert!(
            m[2].contains("but session 1 sent it under token 10"),
            "{}",
            m[2]
        );
    }

    /// A refused proclaim must change nothing: the leader's own proclaim, answered refused,
    /// read back as the leader's value (issue #32's review: the read named the right session
    /// and token, so no earlier check saw it).
    #[test]
    fn a_refused_proclaim_read_back_as_the_leaders_value_is_caught() {
        let mut e = Elect::correct();
        e.proclaim(2, 20, "b2", 510, ElectionRet::NotLeader, 520);
        e.read(3, 530, Some((2, 20, "b2")), 540);
        let m = messages(&check(&e.h), CHECKER);
        assert_eq!(m.len(), 1, "{m:#?}");
        assert!(m[0].contains("which the server refused"), "{}", m[0]);
    }

    /// Reads do not go back within a term: once a proclaim of the term was acknowledged, a
    /// read invoked after that returns it or a later value, not the one it replaced. A read
    /// concurrent with the proclaim may return either.
    #[test]
    fn a_read_of_a_value_replaced_by_an_acknowledged_proclaim_is_caught() {
        let mut e = Elect::correct();
        e.proclaim(2, 20, "b2", 510, ElectionRet::Proclaimed, 520);
        e.read(3, 515, Some((2, 20, "b")), 525);
        e.read(4, 530, Some((2, 20, "b")), 540);
        let m = messages(&check(&e.h), CHECKER);
        assert_eq!(m.len(), 1, "{m:#?}");
        assert!(m[0].contains("Actor { client: 4"), "{}", m[0]);
        assert!(
            m[0].contains("after the proclaim of \"b2\" under token 20 was acknowledged"),
            "{}",
            m[0]
        );
    }

    /// A read answering "no leader" while a term surely lasted (its win answered before the
    /// read was invoked, its leader found it led after the read returned) is caught; one at a
    /// time nobody surely led is not.
    #[test]
    fn a_read_of_no_leader_while_a_term_surely_lasted_is_caught() {
        let mut e = Elect::correct();
        e.read(3, 305, None, 315);
        e.read(4, 450, None, 460);
        let m = messages(&check(&e.h), CHECKER);
        assert_eq!(m.len(), 1, "{m:#?}");
        assert!(m[0].contains("Actor { client: 4"), "{}", m[0]);
        assert!(m[0].contains("found no leader"), "{}", m[0]);
    }

    #[test]
    fn two_leaders_at_once_and_a_token_not_above_an_earlier_win_are_caught() {
        let mut e = Elect::default();
        e.won(1, "a", 0, 10, 100);
        e.leading(1, 10, 300);
        e.won(2, "b", 150, 20, 200);
        e.won(3, "c", 250, 15, 260);
        let m = messages(&check(&e.h), CHECKER);
        assert!(
            m.iter().any(|m| m.contains("two leaders at once")),
            "{m:#?}"
        );
        assert!(
            m.iter().any(|m| m.contains("won token 15, not above it")),
            "{m:#?}"
        );
    }

    #[test]
    fn a_read_of_an_older_term_or_of_a_value_never_sent_is_caught() {
        let mut e = Elect::correct();
        e.read(3, 500, Some((1, 10, "a2")), 510);
        e.read(3, 520, Some((2, 20, "zz")), 530);
        let m = messages(&check(&e.h), CHECKER);
        assert_eq!(m.len(), 2, "{m:#?}");
        assert!(m[0].contains("won the later term 20"), "{}", m[0]);
        assert!(m[1].contains("which no operation sent"), "{}", m[1]);
    }
}
