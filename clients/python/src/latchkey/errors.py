"""latchkey's exceptions: one class per cause, all under LatchkeyError (crates/client/src/error.rs).

    LatchkeyError
    ├── InvalidArgument      bad input; retrying the same input gets the same answer
    │   └── PermitsOutOfRange  a semaphore of 0 or more than 1,024 permits
    ├── WaitTimeout          the wait for a lock ended without a grant
    │   └── LockHeld         a try-lock (wait=0) found it held; .holder says by whom
    ├── LockLost             the lock may be someone else's now
    │   ├── SessionLost      the session's deadline passed, the server dropped it, or it was closed
    │   └── NotHeld          a release found the grant no longer current
    ├── SessionNotFound      the server does not know the session (surfaces as SessionLost
    │                        from a session's own calls)
    ├── PermissionDenied     access control refused (reason: permission-denied, unauthenticated)
    ├── LimitReached         a server limit (queue full, sessions, locks per session)
    ├── Conflict             the request conflicts with the state (reason says which)
    │   ├── KindConflict     a name in use as a semaphore taken as a lock, or the reverse
    │   ├── PermitsConflict  a semaphore's permit asked with another count than its holders'
    │   └── NotElectionLeader  a proclaim after the leadership's term ended
    ├── Unavailable          nodes answered but none could serve within the retry budget
    ├── TransportError       no node could be reached within the retry budget
    ├── TlsError             TLS mismatch or untrusted certificate: only configuration fixes it
    ├── ProtocolError        the server answered something this client does not understand
    └── ServerError          the server failed (INTERNAL, UNIMPLEMENTED, ...)
"""

from __future__ import annotations

from typing import Optional


class LatchkeyError(Exception):
    """Every error of this library. `reason` is the server's stable kebab-case reason
    (`latchkey-error` metadata) when it gave one."""

    def __init__(self, message: str, *, reason: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


class InvalidArgument(LatchkeyError, ValueError):
    pass


class PermitsOutOfRange(InvalidArgument):
    """A semaphore has 1 to `max` (limits::HOLDERS_PER_LOCK_MAX) permits. Raised before any
    call for the count given; `permits`/`max` are None when only the server's message said it."""

    def __init__(self, permits: Optional[int], max: Optional[int],
                 message: Optional[str] = None) -> None:
        super().__init__(message or f"a semaphore has 1 to {max} permits, not {permits}",
                         reason="permits-out-of-range")
        self.permits = permits
        self.max = max

    @classmethod
    def from_server(cls, message: str) -> "PermitsOutOfRange":
        return cls(None, None, message)


class WaitTimeout(LatchkeyError, TimeoutError):
    def __init__(self, name: str, message: Optional[str] = None) -> None:
        super().__init__(message or f"timed out waiting for lock {name!r}")
        self.name = name


class LockHeld(WaitTimeout):
    """A try-lock found the lock held. `holder` (a latchkey.Holder) is who held it when the
    server refused; it may have changed since."""

    def __init__(self, name: str, holder) -> None:
        super().__init__(name, f"lock {name!r} is held by session {holder.session_id}")
        self.holder = holder


class LockLost(LatchkeyError):
    pass


class SessionLost(LockLost):
    def __init__(self, session_id: int, why: str) -> None:
        super().__init__(f"session {session_id} lost: {why}")
        self.session_id = session_id
        self.why = why


class NotHeld(LockLost):
    def __init__(self, name: str, token: int) -> None:
        super().__init__(f"lock {name!r} with token {token} was not held any more")
        self.name = name
        self.token = token


class SessionNotFound(LatchkeyError):
    pass


class PermissionDenied(LatchkeyError, PermissionError):
    pass


class LimitReached(LatchkeyError):
    pass


class Conflict(LatchkeyError):
    pass


class KindConflict(Conflict):
    """An acquire of a name as a lock (exclusive or shared) while it is held or waited for as
    a semaphore, or the reverse: nothing changed; it can be taken so once it is free."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="kind-conflict")


class PermitsConflict(Conflict):
    """A permit of a semaphore asked with another count than the one its holders and waiters
    use (fixed by the acquire that found the name free): nothing changed."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="permits-conflict")


class NotElectionLeader(Conflict):
    """A proclaim by a leadership whose term has ended (resigned, the session lost, an
    operator force-released it): the published value is unchanged."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="not-election-leader")


class Unavailable(LatchkeyError):
    pass


class TransportError(LatchkeyError, ConnectionError):
    pass


class TlsError(LatchkeyError):
    pass


class ProtocolError(LatchkeyError):
    pass


class ServerError(LatchkeyError):
    pass
