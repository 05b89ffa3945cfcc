"""Test hooks: documented, for conformance tests only, not for applications.

`resend_acquire` sends one Acquire request (one sequence number of the session) more than once,
as the client's own retry after a lost answer does, and returns every answer's token: the
server's exactly-once rule (session, seq) must give the same outcome each time and hold the
lock once. The grant is returned as a normal LockGuard.
"""

from __future__ import annotations

from typing import List, Tuple

from . import _core as core
from . import errors
from ._proto import latchkey_pb2 as pb
from .client import LockGuard, Session


def resend_acquire(session: Session, name: str, times: int = 2) -> Tuple[LockGuard, List[int]]:
    """Try-locks `name` in `session`, sending the same request (same seq) `times` times.
    Raises LockHeld/WaitTimeout if the first answer is not a grant."""
    core.validate_name(name)
    if not 2 <= times <= 8:
        raise errors.InvalidArgument("times must be 2..8")
    session = session._for_lock(name)  # the lock's group session (several Raft groups)
    seq = session._begin()
    try:
        request = pb.AcquireRequest(session=session._key, seq=seq, name=name, wait_timeout_ms=0)
        tokens: List[int] = []
        results = []
        for _ in range(times):
            try:
                response, _, _ = session._client._call(
                    "Acquire", request, attempt_timeout=session._client._rpc_timeout,
                    session=session, group=session._group)
            except errors.LatchkeyError as e:
                raise session._checked(e) from None
            results.append(response.result)
            tokens.append(response.token)
    finally:
        session._end(seq)
    if results[0] != pb.ACQUIRE_RESULT_GRANTED:
        raise errors.WaitTimeout(name)
    if any(r != results[0] for r in results):
        raise errors.ProtocolError(f"the same request got different results: {results}")
    return LockGuard(session, name, tokens[0]), tokens
