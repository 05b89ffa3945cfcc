"""The keepalive batcher's failure paths, without a server (the batching itself is tested against
real servers in test_sync.py and test_aio.py): a batch that cannot be sent must fail its
renewals at once and leave no queue behind, or every later renewal of the client would wait
out its deadline."""

import asyncio
import threading
import time

import pytest

from latchkey import _core as core
from latchkey import aio, client, errors


class _Session:
    """What the batcher reads of a session: its key, id and lost signal."""

    def __init__(self, signal) -> None:
        self.id = 1
        self._key = core.pb.Session(id=1, secret=7)
        self._lost = signal


class _UnreachableClient:
    """A client whose calls get no answer until their time is up (a server cut off)."""

    def _call(self, method, request, *, not_after, **_):
        time.sleep(max(min(not_after - core.now(), 3.0), 0.0))
        raise errors.TransportError("no answer")


def test_a_batch_whose_thread_cannot_start_fails_its_renewal_at_once(monkeypatch):
    batcher = client._KeepAlives(_UnreachableClient())
    session = _Session(client._Signal())

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    started = time.monotonic()
    with pytest.raises(errors.ServerError):
        batcher.renew(session, attempt_timeout=1.0, backoff_max=0.1, not_after=core.now() + 30)
    # Not sent on the session's own thread, where it would block until the call gave up.
    assert time.monotonic() - started < 1.0
    assert len(batcher._queue) == 0


class _SilentAioClient:
    async def _call(self, method, request, **_):
        await asyncio.sleep(3600)


def test_a_cancelled_gatherer_leaves_no_renewal_waiting():
    async def main():
        batcher = aio._KeepAlives(_SilentAioClient())
        session = _Session(aio._Signal())
        renewal = asyncio.ensure_future(batcher.renew(
            session, attempt_timeout=1.0, backoff_max=0.1, not_after=core.now() + 30))
        await asyncio.sleep(0)  # the renewal joined; the gatherer waits out its window
        assert len(batcher._queue) == 1 and batcher._tasks
        for task in list(batcher._tasks):
            task.cancel()  # a shutdown that cancels every task while the client lives on
        with pytest.raises(errors.ServerError):
            await asyncio.wait_for(renewal, 2.0)
        assert len(batcher._queue) == 0
        # The next renewal starts a gatherer again.
        second = asyncio.ensure_future(batcher.renew(
            session, attempt_timeout=1.0, backoff_max=0.1, not_after=core.now() + 30))
        await asyncio.sleep(0)
        assert batcher._tasks
        for task in list(batcher._tasks):
            task.cancel()
        with pytest.raises(errors.ServerError):
            await asyncio.wait_for(second, 2.0)

    asyncio.run(main())
