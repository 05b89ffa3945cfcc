//! The leader's coalescing of client operations into batch entries (issue #35 item 3).
//!
//! Each Raft entry costs the leader CPU (openraft's per-entry work, the log store's framing,
//! replication) whatever it carries, so operations that arrive while this node has
//! `limits::GATHER_WRITES_IN_FLIGHT` writes of gathered operations in flight wait for one of
//! them to end and then go together, as one `Op::Batch` entry (at most
//! `limits::BATCH_OPS_MAX` operations and `BATCH_BYTES_MAX` bytes). A call that finds fewer
//! writes in flight is proposed at once (alone, unless others wait with it): a lone client
//! waits for nothing, and a chain of commits (one lock's handoffs) does not wait behind an
//! unrelated write.
//!
//! There is no task of its own: the callers take turns. A caller that finds a write free
//! takes the head of the queue (its own operation and whatever gathered before it), writes it,
//! hands each caller its operation's answer, and frees its write, waking the others; one of
//! them takes the next batch. Writes in flight at once are proposed in whatever order their
//! callers reach openraft (that order is the log's): their operations were all waiting at
//! once, concurrent calls, between which no order is owed, as between concurrent calls
//! written without coalescing. Every caller keeps its own deadline and quorum check
//! (`Node::propose_applied`); a caller that goes away while it writes drops its batch's answer
//! channels, and the others answer `NoQuorum` (the client re-sends under the same sequence
//! number, so an operation that did commit is answered once). An operation a batch refused
//! `Rejection::BatchConflict` (it would end a grant its own batch made) was not applied: it
//! goes back to the head of the queue to be written alone.

use std::collections::VecDeque;
use std::sync::Mutex;

use latchkey_core::{limits, Applied, Op, Outcome, Rejection};
use tokio::sync::{oneshot, Notify};

use crate::error::ApiError;

/// One operation waiting for an entry, and where its answer goes.
struct Waiting {
    op: Op,
    /// Written alone: a batch refused it (`BatchConflict`).
    alone: bool,
    answer: oneshot::Sender<Result<Applied, ApiError>>,
}

#[derive(Default)]
struct Queue {
    /// Callers writing an entry of gathered operations (at most `writes_max`).
    writing: usize,
    waiting: VecDeque<Waiting>,
}

/// The operations gathered for this node's next entries (see the module comment).
pub struct Gather {
    queue: Mutex<Queue>,
    /// Notified when a write ends.
    free: Notify,
    /// Writes in flight at once (`limits::GATHER_WRITES_IN_FLIGHT`).
    writes_max: usize,
}

impl Default for Gather {
    fn default() -> Gather {
        Gather::new(limits::GATHER_WRITES_IN_FLIGHT)
    }
}

/// What a caller takes to write: the operations of one entry, with their answers' senders.
pub struct Turn<'a> {
    gather: &'a Gather,
    taken: Vec<Waiting>,
}

impl Gather {
    /// A gather of at most `writes_max` writes in flight at once.
    pub fn new(writes_max: usize) -> Gather {
        assert!(writes_max >= 1, "a gather must be able to write");
        Gather {
            queue: Mutex::default(),
            free: Notify::new(),
            writes_max,
        }
    }

    /// Queue `op`; its answer comes on the returned receiver.
    pub fn push(&self, op: Op) -> oneshot::Receiver<Result<Applied, ApiError>> {
        let (answer, rx) = oneshot::channel();
        self.lock().waiting.push_back(Waiting {
            op,
            alone: false,
            answer,
        });
        rx
    }

    /// Completes when a write may be free (then try [`Gather::take`] again). Enabled
    /// before the caller looks, so a release between the look and the wait is not missed.
    pub fn freed(&self) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut notified = Box::pin(self.free.notified());
        notified.as_mut().enable();
        notified
    }

    /// Become a writer, if fewer than `writes_max` write and something waits: the head of the
    /// queue, up to the batch limits (an operation to be written alone, alone). Callers that
    /// went away are dropped from the queue unwritten.
    pub fn take(&self) -> Option<Turn<'_>> {
        let mut queue = self.lock();
        if queue.writing >= self.writes_max {
            return None;
        }
        queue.waiting.retain(|w| !w.answer.is_closed());
        let mut taken = Vec::new();
        let mut bytes = 0;
        while let Some(next) = queue.waiting.front() {
            let fits = taken.len() < limits::BATCH_OPS_MAX
                && bytes + next.op.bytes_max() <= limits::BATCH_BYTES_MAX
                && (taken.is_empty() || !next.alone);
            if !fits {
                break;
            }
            bytes += next.op.bytes_max();
            let next = queue.waiting.pop_front().expect("looked at");
            let alone = next.alone;
            taken.push(next);
            if alone {
                break;
            }
        }
        if taken.is_empty() {
            return None;
        }
        queue.writing += 1;
        Some(Turn {
            gather: self,
            taken,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().expect("gather queue poisoned")
    }
}

impl Turn<'_> {
    /// The command to propose: the operation alone, or a batch of them.
    pub fn op(&self) -> Op {
        match &self.taken[..] {
            [one] => one.op.clone(),
            many => Op::Batch(many.iter().map(|w| w.op.clone()).collect()),
        }
    }

    /// Answer every caller of the entry from what it produced (or how it failed). An
    /// operation its batch refused `BatchConflict` goes back to the head of the queue, alone.
    pub fn answer(mut self, written: Result<Applied, ApiError>) {
        let taken = std::mem::take(&mut self.taken);
        let mut again = Vec::new();
        match written {
            Err(e) => {
                for w in taken {
                    let _ = w.answer.send(Err(e.clone()));
                }
            }
            Ok(applied) if taken.len() == 1 => {
                let w = taken.into_iter().next().expect("one");
                let _ = w.answer.send(Ok(applied));
            }
            Ok(applied)
                if applied.outcome == Outcome::Batch && applied.ops.len() == taken.len() =>
            {
                for (mut w, answer) in taken.into_iter().zip(applied.ops) {
                    if let Outcome::Rejected(Rejection::BatchConflict { .. }) = answer.outcome {
                        w.alone = true;
                        again.push(w);
                    } else {
                        let _ = w.answer.send(Ok(answer));
                    }
                }
            }
            Ok(applied) => {
                let e = ApiError::Raft(format!("a batch answered {:?}", applied.outcome));
                for w in taken {
                    let _ = w.answer.send(Err(e.clone()));
                }
            }
        }
        let mut queue = self.gather.lock();
        for w in again.into_iter().rev() {
            queue.waiting.push_front(w);
        }
    }
}

impl Drop for Turn<'_> {
    /// However the turn ends (answered, or its caller went away mid-write, dropping the
    /// unanswered senders), its write is free again and the waiting callers look.
    fn drop(&mut self) {
        self.gather.lock().writing -= 1;
        self.gather.free.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_core::{SessionId, SessionKey};

    fn release(seq: u64) -> Op {
        Op::Release {
            session: SessionKey {
                id: SessionId(1),
                secret: 2,
            },
            seq,
            name: format!("n{seq}"),
            token: 1,
        }
    }

    /// Up to `GATHER_WRITES_IN_FLIGHT` writes at once: an operation that finds one free is
    /// proposed at once, alone (a release in a chain of handoffs does not wait behind an
    /// unrelated write); what arrives while all are busy gathers, and goes in one batch when
    /// one ends.
    #[test]
    fn an_operation_passes_a_write_in_flight_and_the_rest_gather() {
        assert_eq!(limits::GATHER_WRITES_IN_FLIGHT, 2);
        let gather = Gather::default();
        let _first = gather.push(release(1));
        let first = gather.take().expect("a write is free");
        assert_eq!(first.op(), release(1));
        let mut second = gather.push(release(2));
        let turn = gather
            .take()
            .expect("a second write passes the one in flight");
        assert_eq!(turn.op(), release(2), "proposed at once, alone");
        let _third = gather.push(release(3));
        let _fourth = gather.push(release(4));
        assert!(
            gather.take().is_none(),
            "two writes in flight: the rest wait"
        );
        turn.answer(Ok(Applied::just(Outcome::Released)));
        assert_eq!(
            second.try_recv().unwrap().unwrap().outcome,
            Outcome::Released,
            "answered while the first is still in flight"
        );
        let turn = gather.take().expect("one write ended");
        assert_eq!(turn.op(), Op::Batch(vec![release(3), release(4)]));
        assert!(gather.take().is_none());
        drop(first);
        assert!(gather.take().is_none(), "nothing left");
        drop(turn);
    }

    /// With two writes in flight, an operation one batch refused `BatchConflict` goes back to
    /// the head of the queue and is written next, alone, while the other write is still in
    /// flight; the other callers of that batch get their answers.
    #[test]
    fn a_refused_operation_is_written_alone_while_another_write_is_in_flight() {
        let gather = Gather::new(2);
        let mut first = gather.push(release(1));
        let mut second = gather.push(release(2));
        let turn = gather.take().expect("a write is free");
        assert_eq!(turn.op(), Op::Batch(vec![release(1), release(2)]));
        let _third = gather.push(release(3));
        let other = gather.take().expect("a second write");
        assert_eq!(other.op(), release(3));
        let mut fourth = gather.push(release(4));
        let conflict = Outcome::Rejected(Rejection::BatchConflict { name: "n2".into() });
        let mut batch = Applied::just(Outcome::Batch);
        batch.ops = vec![Applied::just(Outcome::Released), Applied::just(conflict)];
        turn.answer(Ok(batch));
        assert_eq!(
            first.try_recv().unwrap().unwrap().outcome,
            Outcome::Released
        );
        assert!(second.try_recv().is_err(), "refused: not answered yet");
        let again = gather.take().expect("a write freed");
        assert_eq!(
            again.op(),
            release(2),
            "the refused one, alone, ahead of the rest"
        );
        assert!(gather.take().is_none(), "two writes in flight again");
        again.answer(Ok(Applied::just(Outcome::NotHolder)));
        assert_eq!(
            second.try_recv().unwrap().unwrap().outcome,
            Outcome::NotHolder
        );
        let last = gather.take().expect("a write freed");
        assert_eq!(last.op(), release(4));
        last.answer(Ok(Applied::just(Outcome::Released)));
        assert_eq!(
            fourth.try_recv().unwrap().unwrap().outcome,
            Outcome::Released
        );
        drop(other);
    }

    /// What gathered behind a write goes in one batch; an operation the batch refused
    /// `BatchConflict` is written next, alone, and its caller gets that answer; a caller
    /// that went away is not written.
    #[test]
    fn a_refused_operation_is_written_again_alone() {
        let gather = Gather::new(1);
        let mut first = gather.push(release(1));
        let turn = gather.take().expect("the writer is free");
        assert_eq!(turn.op(), release(1), "a lone operation is proposed alone");
        let mut second = gather.push(release(2));
        let mut third = gather.push(release(3));
        drop(gather.push(release(4)));
        assert!(gather.take().is_none(), "one write at a time");
        turn.answer(Ok(Applied::just(Outcome::Released)));
        assert_eq!(
            first.try_recv().unwrap().unwrap().outcome,
            Outcome::Released
        );

        let turn = gather.take().expect("freed");
        assert_eq!(turn.op(), Op::Batch(vec![release(2), release(3)]));
        let conflict = Outcome::Rejected(Rejection::BatchConflict { name: "n3".into() });
        let mut batch = Applied::just(Outcome::Batch);
        batch.ops = vec![Applied::just(Outcome::Released), Applied::just(conflict)];
        turn.answer(Ok(batch));
        assert_eq!(
            second.try_recv().unwrap().unwrap().outcome,
            Outcome::Released
        );
        assert!(third.try_recv().is_err(), "not answered yet");
        let mut fifth = gather.push(release(5));

        let turn = gather.take().expect("freed");
        assert_eq!(turn.op(), release(3), "alone");
        turn.answer(Ok(Applied::just(Outcome::NotHolder)));
        assert_eq!(
            third.try_recv().unwrap().unwrap().outcome,
            Outcome::NotHolder
        );
        let turn = gather.take().expect("freed");
        assert_eq!(turn.op(), release(5));
        drop(turn);
        assert!(
            fifth.try_recv().is_err(),
            "a writer that went away answers nobody"
        );
        assert!(gather.take().is_none(), "nothing left");
    }
}
