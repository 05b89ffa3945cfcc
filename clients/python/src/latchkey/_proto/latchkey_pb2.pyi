from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LockMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOCK_MODE_EXCLUSIVE: _ClassVar[LockMode]
    LOCK_MODE_SHARED: _ClassVar[LockMode]
    LOCK_MODE_PERMITS: _ClassVar[LockMode]

class AcquireResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACQUIRE_RESULT_UNSPECIFIED: _ClassVar[AcquireResult]
    ACQUIRE_RESULT_GRANTED: _ClassVar[AcquireResult]
    ACQUIRE_RESULT_NOT_GRANTED: _ClassVar[AcquireResult]
    ACQUIRE_RESULT_PENDING: _ClassVar[AcquireResult]
LOCK_MODE_EXCLUSIVE: LockMode
LOCK_MODE_SHARED: LockMode
LOCK_MODE_PERMITS: LockMode
ACQUIRE_RESULT_UNSPECIFIED: AcquireResult
ACQUIRE_RESULT_GRANTED: AcquireResult
ACQUIRE_RESULT_NOT_GRANTED: AcquireResult
ACQUIRE_RESULT_PENDING: AcquireResult

class BatchRequest(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[BatchOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[BatchOp, _Mapping]]] = ...) -> None: ...

class BatchOp(_message.Message):
    __slots__ = ("acquire", "release", "close_session", "keep_alive")
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_SESSION_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_FIELD_NUMBER: _ClassVar[int]
    acquire: AcquireRequest
    release: ReleaseRequest
    close_session: CloseSessionRequest
    keep_alive: KeepAliveRequest
    def __init__(self, acquire: _Optional[_Union[AcquireRequest, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequest, _Mapping]] = ..., close_session: _Optional[_Union[CloseSessionRequest, _Mapping]] = ..., keep_alive: _Optional[_Union[KeepAliveRequest, _Mapping]] = ...) -> None: ...

class BatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchResult, _Mapping]]] = ...) -> None: ...

class BatchResult(_message.Message):
    __slots__ = ("acquire", "release", "close_session", "keep_alive", "error")
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_SESSION_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    acquire: AcquireResponse
    release: ReleaseResponse
    close_session: CloseSessionResponse
    keep_alive: KeepAliveResponse
    error: BatchError
    def __init__(self, acquire: _Optional[_Union[AcquireResponse, _Mapping]] = ..., release: _Optional[_Union[ReleaseResponse, _Mapping]] = ..., close_session: _Optional[_Union[CloseSessionResponse, _Mapping]] = ..., keep_alive: _Optional[_Union[KeepAliveResponse, _Mapping]] = ..., error: _Optional[_Union[BatchError, _Mapping]] = ...) -> None: ...

class BatchError(_message.Message):
    __slots__ = ("code", "message", "reason", "leader_id", "leader_addr", "group")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDR_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    reason: str
    leader_id: int
    leader_addr: str
    group: int
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ..., leader_id: _Optional[int] = ..., leader_addr: _Optional[str] = ..., group: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("prefix", "after_index", "group")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    AFTER_INDEX_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    after_index: int
    group: int
    def __init__(self, prefix: _Optional[str] = ..., after_index: _Optional[int] = ..., group: _Optional[int] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("index", "ordinal", "kind", "lock", "session", "token", "mode", "permits", "value")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ORDINAL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    index: int
    ordinal: int
    kind: str
    lock: str
    session: int
    token: int
    mode: LockMode
    permits: int
    value: bytes
    def __init__(self, index: _Optional[int] = ..., ordinal: _Optional[int] = ..., kind: _Optional[str] = ..., lock: _Optional[str] = ..., session: _Optional[int] = ..., token: _Optional[int] = ..., mode: _Optional[_Union[LockMode, str]] = ..., permits: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...

class WatchMissed(_message.Message):
    __slots__ = ("after_index", "through_index")
    AFTER_INDEX_FIELD_NUMBER: _ClassVar[int]
    THROUGH_INDEX_FIELD_NUMBER: _ClassVar[int]
    after_index: int
    through_index: int
    def __init__(self, after_index: _Optional[int] = ..., through_index: _Optional[int] = ...) -> None: ...

class WatchProgress(_message.Message):
    __slots__ = ("index",)
    INDEX_FIELD_NUMBER: _ClassVar[int]
    index: int
    def __init__(self, index: _Optional[int] = ...) -> None: ...

class WatchMessage(_message.Message):
    __slots__ = ("event", "missed", "progress")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    MISSED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    event: WatchEvent
    missed: WatchMissed
    progress: WatchProgress
    def __init__(self, event: _Optional[_Union[WatchEvent, _Mapping]] = ..., missed: _Optional[_Union[WatchMissed, _Mapping]] = ..., progress: _Optional[_Union[WatchProgress, _Mapping]] = ...) -> None: ...

class Owner(_message.Message):
    __slots__ = ("host", "pid", "user", "text")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    host: str
    pid: int
    user: str
    text: str
    def __init__(self, host: _Optional[str] = ..., pid: _Optional[int] = ..., user: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("id", "secret")
    ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    id: int
    secret: int
    def __init__(self, id: _Optional[int] = ..., secret: _Optional[int] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("ttl_ms", "owner", "group")
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ttl_ms: int
    owner: Owner
    group: int
    def __init__(self, ttl_ms: _Optional[int] = ..., owner: _Optional[_Union[Owner, _Mapping]] = ..., group: _Optional[int] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session", "ttl_ms", "groups")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    session: Session
    ttl_ms: int
    groups: int
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., ttl_ms: _Optional[int] = ..., groups: _Optional[int] = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[Session]
    def __init__(self, sessions: _Optional[_Iterable[_Union[Session, _Mapping]]] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ("leases", "refused")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[SessionLease]
    refused: _containers.RepeatedCompositeFieldContainer[GroupRefusal]
    def __init__(self, leases: _Optional[_Iterable[_Union[SessionLease, _Mapping]]] = ..., refused: _Optional[_Iterable[_Union[GroupRefusal, _Mapping]]] = ...) -> None: ...

class GroupRefusal(_message.Message):
    __slots__ = ("group", "reason", "message", "leader_id", "leader_addr")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDR_FIELD_NUMBER: _ClassVar[int]
    group: int
    reason: str
    message: str
    leader_id: int
    leader_addr: str
    def __init__(self, group: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., leader_id: _Optional[int] = ..., leader_addr: _Optional[str] = ...) -> None: ...

class SessionLease(_message.Message):
    __slots__ = ("id", "alive", "ttl_ms", "revoked_tokens", "revoked_through", "contended", "contended_truncated")
    ID_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_THROUGH_FIELD_NUMBER: _ClassVar[int]
    CONTENDED_FIELD_NUMBER: _ClassVar[int]
    CONTENDED_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    id: int
    alive: bool
    ttl_ms: int
    revoked_tokens: _containers.RepeatedScalarFieldContainer[int]
    revoked_through: int
    contended: _containers.RepeatedScalarFieldContainer[str]
    contended_truncated: bool
    def __init__(self, id: _Optional[int] = ..., alive: _Optional[bool] = ..., ttl_ms: _Optional[int] = ..., revoked_tokens: _Optional[_Iterable[int]] = ..., revoked_through: _Optional[int] = ..., contended: _Optional[_Iterable[str]] = ..., contended_truncated: _Optional[bool] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("session", "seq", "name", "wait_timeout_ms", "mode", "permits", "value", "lock_delay_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    session: Session
    seq: int
    name: str
    wait_timeout_ms: int
    mode: LockMode
    permits: int
    value: bytes
    lock_delay_ms: int
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., seq: _Optional[int] = ..., name: _Optional[str] = ..., wait_timeout_ms: _Optional[int] = ..., mode: _Optional[_Union[LockMode, str]] = ..., permits: _Optional[int] = ..., value: _Optional[bytes] = ..., lock_delay_ms: _Optional[int] = ...) -> None: ...

class ProclaimRequest(_message.Message):
    __slots__ = ("session", "seq", "name", "token", "value")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    session: Session
    seq: int
    name: str
    token: int
    value: bytes
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., seq: _Optional[int] = ..., name: _Optional[str] = ..., token: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...

class ProclaimResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("result", "token", "position", "held_by")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    HELD_BY_FIELD_NUMBER: _ClassVar[int]
    result: AcquireResult
    token: int
    position: int
    held_by: LockInfo
    def __init__(self, result: _Optional[_Union[AcquireResult, str]] = ..., token: _Optional[int] = ..., position: _Optional[int] = ..., held_by: _Optional[_Union[LockInfo, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session", "seq", "name", "token")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    session: Session
    seq: int
    name: str
    token: int
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., seq: _Optional[int] = ..., name: _Optional[str] = ..., token: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class LockInfo(_message.Message):
    __slots__ = ("name", "held", "session", "token", "held_for_ms", "waiters", "owner", "queue", "mode", "permits", "holders", "value", "lock_delay_ms", "delay_remaining_ms", "delay_token")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    HELD_FOR_MS_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_REMAINING_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    held: bool
    session: int
    token: int
    held_for_ms: int
    waiters: int
    owner: Owner
    queue: _containers.RepeatedCompositeFieldContainer[Waiter]
    mode: LockMode
    permits: int
    holders: _containers.RepeatedCompositeFieldContainer[Holder]
    value: bytes
    lock_delay_ms: int
    delay_remaining_ms: int
    delay_token: int
    def __init__(self, name: _Optional[str] = ..., held: _Optional[bool] = ..., session: _Optional[int] = ..., token: _Optional[int] = ..., held_for_ms: _Optional[int] = ..., waiters: _Optional[int] = ..., owner: _Optional[_Union[Owner, _Mapping]] = ..., queue: _Optional[_Iterable[_Union[Waiter, _Mapping]]] = ..., mode: _Optional[_Union[LockMode, str]] = ..., permits: _Optional[int] = ..., holders: _Optional[_Iterable[_Union[Holder, _Mapping]]] = ..., value: _Optional[bytes] = ..., lock_delay_ms: _Optional[int] = ..., delay_remaining_ms: _Optional[int] = ..., delay_token: _Optional[int] = ...) -> None: ...

class Holder(_message.Message):
    __slots__ = ("session", "token", "held_for_ms", "owner", "value")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    HELD_FOR_MS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    session: int
    token: int
    held_for_ms: int
    owner: Owner
    value: bytes
    def __init__(self, session: _Optional[int] = ..., token: _Optional[int] = ..., held_for_ms: _Optional[int] = ..., owner: _Optional[_Union[Owner, _Mapping]] = ..., value: _Optional[bytes] = ...) -> None: ...

class Waiter(_message.Message):
    __slots__ = ("session", "waited_ms", "owner", "mode")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    WAITED_MS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    session: int
    waited_ms: int
    owner: Owner
    mode: LockMode
    def __init__(self, session: _Optional[int] = ..., waited_ms: _Optional[int] = ..., owner: _Optional[_Union[Owner, _Mapping]] = ..., mode: _Optional[_Union[LockMode, str]] = ...) -> None: ...

class AdminReleaseRequest(_message.Message):
    __slots__ = ("name", "token", "reason", "operator", "end_delay")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    END_DELAY_FIELD_NUMBER: _ClassVar[int]
    name: str
    token: int
    reason: str
    operator: str
    end_delay: bool
    def __init__(self, name: _Optional[str] = ..., token: _Optional[int] = ..., reason: _Optional[str] = ..., operator: _Optional[str] = ..., end_delay: _Optional[bool] = ...) -> None: ...

class AdminReleaseResponse(_message.Message):
    __slots__ = ("session", "token")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    session: int
    token: int
    def __init__(self, session: _Optional[int] = ..., token: _Optional[int] = ...) -> None: ...

class AdminRevokeRequest(_message.Message):
    __slots__ = ("session", "reason", "operator")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    session: int
    reason: str
    operator: str
    def __init__(self, session: _Optional[int] = ..., reason: _Optional[str] = ..., operator: _Optional[str] = ...) -> None: ...

class AdminRevokeResponse(_message.Message):
    __slots__ = ("locks",)
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    locks: int
    def __init__(self, locks: _Optional[int] = ...) -> None: ...

class AuditRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: int
    def __init__(self, group: _Optional[int] = ...) -> None: ...

class AuditRecord(_message.Message):
    __slots__ = ("index", "at_ms", "action", "lock", "session", "token", "next_token", "locks", "identity", "operator", "reason", "group")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    index: int
    at_ms: int
    action: str
    lock: str
    session: int
    token: int
    next_token: int
    locks: int
    identity: str
    operator: str
    reason: str
    group: int
    def __init__(self, index: _Optional[int] = ..., at_ms: _Optional[int] = ..., action: _Optional[str] = ..., lock: _Optional[str] = ..., session: _Optional[int] = ..., token: _Optional[int] = ..., next_token: _Optional[int] = ..., locks: _Optional[int] = ..., identity: _Optional[str] = ..., operator: _Optional[str] = ..., reason: _Optional[str] = ..., group: _Optional[int] = ...) -> None: ...

class AuditResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[AuditRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[AuditRecord, _Mapping]]] = ...) -> None: ...

class BackupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: int
    def __init__(self, group: _Optional[int] = ...) -> None: ...

class BackupHeader(_message.Message):
    __slots__ = ("applied_index", "members", "fingerprint", "table_bytes", "table_sha256")
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TABLE_SHA256_FIELD_NUMBER: _ClassVar[int]
    applied_index: int
    members: str
    fingerprint: str
    table_bytes: int
    table_sha256: bytes
    def __init__(self, applied_index: _Optional[int] = ..., members: _Optional[str] = ..., fingerprint: _Optional[str] = ..., table_bytes: _Optional[int] = ..., table_sha256: _Optional[bytes] = ...) -> None: ...

class BackupChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: BackupHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[BackupHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("lock", "read_index")
    LOCK_FIELD_NUMBER: _ClassVar[int]
    READ_INDEX_FIELD_NUMBER: _ClassVar[int]
    lock: LockInfo
    read_index: int
    def __init__(self, lock: _Optional[_Union[LockInfo, _Mapping]] = ..., read_index: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("prefix", "limit", "group")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    limit: int
    group: int
    def __init__(self, prefix: _Optional[str] = ..., limit: _Optional[int] = ..., group: _Optional[int] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("locks", "truncated")
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    locks: _containers.RepeatedCompositeFieldContainer[LockInfo]
    truncated: bool
    def __init__(self, locks: _Optional[_Iterable[_Union[LockInfo, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class NodeStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Member(_message.Message):
    __slots__ = ("id", "addr")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    id: int
    addr: str
    def __init__(self, id: _Optional[int] = ..., addr: _Optional[str] = ...) -> None: ...

class NodeStatusResponse(_message.Message):
    __slots__ = ("id", "role", "term", "last_log_index", "applied_index", "leader_id", "members", "sessions", "locks", "cluster_id", "learners", "groups", "group_status")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    GROUP_STATUS_FIELD_NUMBER: _ClassVar[int]
    id: int
    role: str
    term: int
    last_log_index: int
    applied_index: int
    leader_id: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    sessions: int
    locks: int
    cluster_id: str
    learners: _containers.RepeatedCompositeFieldContainer[Member]
    groups: int
    group_status: _containers.RepeatedCompositeFieldContainer[GroupStatus]
    def __init__(self, id: _Optional[int] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., last_log_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., leader_id: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., sessions: _Optional[int] = ..., locks: _Optional[int] = ..., cluster_id: _Optional[str] = ..., learners: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., groups: _Optional[int] = ..., group_status: _Optional[_Iterable[_Union[GroupStatus, _Mapping]]] = ...) -> None: ...

class GroupStatus(_message.Message):
    __slots__ = ("group", "role", "term", "last_log_index", "applied_index", "leader_id", "sessions", "locks", "voters")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    group: int
    role: str
    term: int
    last_log_index: int
    applied_index: int
    leader_id: int
    sessions: int
    locks: int
    voters: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, group: _Optional[int] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., last_log_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., leader_id: _Optional[int] = ..., sessions: _Optional[int] = ..., locks: _Optional[int] = ..., voters: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class AddMemberRequest(_message.Message):
    __slots__ = ("id", "addr", "group")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    id: int
    addr: str
    group: int
    def __init__(self, id: _Optional[int] = ..., addr: _Optional[str] = ..., group: _Optional[int] = ...) -> None: ...

class RemoveMemberRequest(_message.Message):
    __slots__ = ("id", "group")
    ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    id: int
    group: int
    def __init__(self, id: _Optional[int] = ..., group: _Optional[int] = ...) -> None: ...

class MoveMemberRequest(_message.Message):
    __slots__ = ("id", "addr", "group")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    id: int
    addr: str
    group: int
    def __init__(self, id: _Optional[int] = ..., addr: _Optional[str] = ..., group: _Optional[int] = ...) -> None: ...

class MembersResponse(_message.Message):
    __slots__ = ("members", "learners")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    learners: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., learners: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class PeerMessage(_message.Message):
    __slots__ = ("payload",)
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class PeerChunk(_message.Message):
    __slots__ = ("payload", "data", "mac")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    data: bytes
    mac: bytes
    def __init__(self, payload: _Optional[bytes] = ..., data: _Optional[bytes] = ..., mac: _Optional[bytes] = ...) -> None: ...
