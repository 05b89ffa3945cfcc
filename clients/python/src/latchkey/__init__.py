"""latchkey: a Python client for the latchkey distributed lock service (gRPC through grpcio).

    import latchkey
    client = latchkey.Client(["127.0.0.1:7420"])
    with client.lock("reports/nightly", ttl=15, wait=30) as guard:
        requests.post(url, headers=guard.fencing_headers(), ...)   # stop when guard.lost is set
    with client.lock("config/app.toml", shared=True) as guard: ...   # a reader
    with client.lock("batch/nightly", permits=3) as guard: ...       # one of 3 permits
    with client.campaign("svc/leader", "10.0.0.1:80") as leadership: ...  # lead an election
    for leader in client.observe("svc/leader"): ...                  # each leader and value

The blocking API is here; `latchkey.aio` is the asyncio one. Errors: `latchkey.errors`.
"""

from . import errors
from ._core import AuditEntry, ForceReleased, Holder, Leader, LockInfo, NodeStatus, RetryPolicy
from ._core import group_of, group_of_session, safety_margin
from ._core import now as now
from .client import Client, Leadership, LockGuard, LostSignal, Observe, Session
from .errors import (
    Conflict,
    InvalidArgument,
    KindConflict,
    LatchkeyError,
    LimitReached,
    LockHeld,
    LockLost,
    NotElectionLeader,
    NotHeld,
    PermissionDenied,
    PermitsConflict,
    PermitsOutOfRange,
    ProtocolError,
    ServerError,
    SessionLost,
    SessionNotFound,
    TlsError,
    TransportError,
    Unavailable,
    WaitTimeout,
)

__version__ = "0.1.0"

__all__ = [
    "Client", "Session", "LockGuard", "LostSignal", "Leadership", "Leader", "Observe", "LockInfo", "Holder", "NodeStatus",
    "RetryPolicy", "AuditEntry", "ForceReleased", "safety_margin", "now", "errors",
    "group_of", "group_of_session",
    "LatchkeyError", "InvalidArgument", "WaitTimeout", "LockHeld", "LockLost", "SessionLost",
    "NotHeld", "SessionNotFound", "PermissionDenied", "LimitReached", "Conflict", "Unavailable",
    "TransportError", "TlsError", "ProtocolError", "ServerError",
    "KindConflict", "PermitsConflict", "PermitsOutOfRange", "NotElectionLeader",
]
