//! [`LatchkeyRuntime`]: openraft's tokio runtime with a seedable RNG, the seam that lets the
//! simulation replay openraft's random choices from its seed.
//!
//! openraft 0.10 draws its randomness only through `AsyncRuntime::thread_rng()`:
//! - the election timeout, sampled from `[election_timeout_min, election_timeout_max)` each time
//!   the election timer is reset (`EngineConfig::resample_election_timeout`, and
//!   `Config::new_rand_election_timeout`);
//! - the phase of each periodic ticker (`Tick::sample_first_wait`): its first wait is drawn from
//!   `[period, 2 * period)`.
//!
//! For `openraft_rt_tokio::TokioRuntime` that is `rand::rng()`, seeded from the OS, so a
//! simulation seed alone does not fix which node times out first. [`LatchkeyRuntime`] delegates
//! everything (tasks, timers, channels, mutex, select, blocking) to `TokioRuntime` and changes
//! only `thread_rng()`: it returns a handle to this thread's RNG, which is `rand::rng()` (exactly
//! what `TokioRuntime` uses) until [`seed_thread_rng`] is called on the thread, and a `StdRng`
//! seeded from that `u64` afterwards.
//!
//! Production never calls [`seed_thread_rng`], so its randomness stays OS-seeded. The simulation
//! calls it at the start of every run; turmoil polls every simulated host on the test's one
//! thread, so that one thread-local generator serves all simulated nodes, and their draws come
//! in the (deterministic) order the simulation polls them.

use std::cell::RefCell;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::marker::PhantomData;
use std::time::Duration;

use openraft::rt::{AsyncRuntime, Mpsc, OptionalSend, Select2, Select3, Select4, TryRecvError};
use openraft_rt_tokio::TokioRuntime;
use rand_openraft::rngs::StdRng;
use rand_openraft::{Rng, SeedableRng, TryRng};

thread_local! {
    /// `None` until [`seed_thread_rng`] is called on this thread: then `thread_rng()` is
    /// `rand::rng()`, OS-seeded.
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Makes every later `thread_rng()` draw of [`LatchkeyRuntime`] on the calling thread come from a
/// generator seeded with `seed`, replacing any earlier seeding. For the simulation and tests
/// only: a node that never calls it keeps OS-seeded randomness.
///
/// Two runs that call this with the same seed and then poll openraft in the same order get the
/// same election timeouts and ticker phases.
pub fn seed_thread_rng(seed: u64) {
    SEEDED.with_borrow_mut(|rng| *rng = Some(StdRng::seed_from_u64(seed)));
}

/// Runs `f` on this thread's RNG: the seeded one if [`seed_thread_rng`] was called, else
/// `rand::rng()`.
fn with_thread_rng<T>(f: impl FnOnce(&mut dyn Rng) -> T) -> T {
    SEEDED.with_borrow_mut(|seeded| match seeded {
        Some(rng) => f(rng),
        None => f(&mut rand_openraft::rng()),
    })
}

/// [`LatchkeyRuntime`]'s `ThreadLocalRng`: a handle to the calling thread's RNG (see
/// [`seed_thread_rng`]). Like `rand::rngs::ThreadRng` it is neither `Send` nor `Sync`.
#[derive(Debug, Default, Clone)]
pub struct LatchkeyThreadRng {
    _not_send: PhantomData<*const ()>,
}

impl TryRng for LatchkeyThreadRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(with_thread_rng(|rng| rng.next_u32()))
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(with_thread_rng(|rng| rng.next_u64()))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        with_thread_rng(|rng| rng.fill_bytes(dst));
        Ok(())
    }
}

/// openraft's `TokioRuntime` with the RNG replaced by [`LatchkeyThreadRng`] (see the module
/// docs). Every other type and function is `TokioRuntime`'s.
#[derive(Debug)]
pub struct LatchkeyRuntime(TokioRuntime);

impl AsyncRuntime for LatchkeyRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = LatchkeyThreadRng;

    type Mpsc = <TokioRuntime as AsyncRuntime>::Mpsc;
    type Watch = <TokioRuntime as AsyncRuntime>::Watch;
    type Oneshot = <TokioRuntime as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::Mutex<T>;

    #[inline]
    fn thread_rng() -> Self::ThreadLocalRng {
        LatchkeyThreadRng::default()
    }

    #[inline]
    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    #[inline]
    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    #[inline]
    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    #[inline]
    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    #[inline]
    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn select2<A, B>(
        a: A,
        b: B,
    ) -> impl Future<Output = Select2<A::Output, B::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
    {
        TokioRuntime::select2(a, b)
    }

    fn select3<A, B, C>(
        a: A,
        b: B,
        c: C,
    ) -> impl Future<Output = Select3<A::Output, B::Output, C::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
        C: Future + OptionalSend,
    {
        TokioRuntime::select3(a, b, c)
    }

    fn select4<A, B, C, D>(
        a: A,
        b: B,
        c: C,
        d: D,
    ) -> impl Future<Output = Select4<A::Output, B::Output, C::Output, D::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
        C: Future + OptionalSend,
        D: Future + OptionalSend,
    {
        TokioRuntime::select4(a, b, c, d)
    }

    #[inline]
    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn new(threads: usize) -> Self {
        LatchkeyRuntime(TokioRuntime::new(threads))
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.0.block_on(future)
    }

    fn spawn_blocking<F, T>(f: F) -> impl Future<Output = Result<T, io::Error>> + Send
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        TokioRuntime::spawn_blocking(f)
    }

    fn mpsc_recv_deadline<T: OptionalSend>(
        receiver: &mut <Self::Mpsc as Mpsc>::Receiver<T>,
        deadline: Self::Instant,
    ) -> impl Future<Output = Result<T, TryRecvError>> + OptionalSend {
        TokioRuntime::mpsc_recv_deadline(receiver, deadline)
    }
}

#[cfg(test)]
mod tests {
    use openraft::rt::testing::Suite;
    use rand_openraft::RngExt;

    use super::*;

    fn draws() -> Vec<u64> {
        (0..16)
            .map(|_| LatchkeyRuntime::thread_rng().random_range(150..300))
            .collect()
    }

    #[test]
    fn seeded_thread_rng_replays() {
        seed_thread_rng(7);
        let first = draws();
        seed_thread_rng(7);
        assert_eq!(draws(), first, "the same seed gives the same draws");
        seed_thread_rng(8);
        assert_ne!(draws(), first, "another seed gives other draws");
    }

    /// The path openraft itself takes for election timeouts.
    #[test]
    fn seeded_election_timeouts_replay() {
        let config = openraft::Config {
            election_timeout_min: 150,
            election_timeout_max: 300,
            ..Default::default()
        };
        let timeouts = |seed| {
            seed_thread_rng(seed);
            (0..16)
                .map(|_| config.new_rand_election_timeout::<LatchkeyRuntime>())
                .collect::<Vec<_>>()
        };
        let first = timeouts(42);
        assert!(first.iter().all(|t| (150..300).contains(t)));
        assert_eq!(timeouts(42), first);
    }

    /// Unseeded threads (production) draw from the OS-seeded `rand::rng()`.
    #[test]
    fn unseeded_thread_rng_works() {
        std::thread::spawn(|| {
            let values = draws();
            assert!(values.iter().all(|v| (150..300).contains(v)));
            assert!(values.iter().any(|v| *v != values[0]));
        })
        .join()
        .unwrap();
    }

    /// openraft-rt's conformance suite for runtimes, as `openraft-rt-tokio` runs it for
    /// `TokioRuntime`.
    #[test]
    fn runtime_conformance() {
        Suite::<LatchkeyRuntime>::test_all();
    }
}
