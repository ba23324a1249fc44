from fanout._google.api import annotations_pb2 as _annotations_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

BUDGET_PERIOD_DAY: BudgetPeriod
BUDGET_PERIOD_MONTH: BudgetPeriod
BUDGET_PERIOD_NONE: BudgetPeriod
BUDGET_PERIOD_UNSPECIFIED: BudgetPeriod
DESCRIPTOR: _descriptor.FileDescriptor

class ApiKey(_message.Message):
    __slots__ = ["create_time", "created_by", "expire_time", "key_id", "name", "requests_per_minute", "revoke_time", "revoked_by", "scopes", "tenant_id"]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    REVOKED_BY_FIELD_NUMBER: _ClassVar[int]
    REVOKE_TIME_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    create_time: _timestamp_pb2.Timestamp
    created_by: str
    expire_time: _timestamp_pb2.Timestamp
    key_id: str
    name: str
    requests_per_minute: int
    revoke_time: _timestamp_pb2.Timestamp
    revoked_by: str
    scopes: _containers.RepeatedScalarFieldContainer[str]
    tenant_id: str
    def __init__(self, key_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., name: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ..., requests_per_minute: _Optional[int] = ..., create_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., created_by: _Optional[str] = ..., expire_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., revoke_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., revoked_by: _Optional[str] = ...) -> None: ...

class CreateKeyRequest(_message.Message):
    __slots__ = ["expire_time", "name", "requests_per_minute", "scopes", "tenant_id"]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    expire_time: _timestamp_pb2.Timestamp
    name: str
    requests_per_minute: int
    scopes: _containers.RepeatedScalarFieldContainer[str]
    tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., name: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ..., requests_per_minute: _Optional[int] = ..., expire_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateKeyResponse(_message.Message):
    __slots__ = ["key", "token"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    key: ApiKey
    token: str
    def __init__(self, key: _Optional[_Union[ApiKey, _Mapping]] = ..., token: _Optional[str] = ...) -> None: ...

class CreateTenantRequest(_message.Message):
    __slots__ = ["quotas", "tenant_id"]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    quotas: TenantQuotas
    tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., quotas: _Optional[_Union[TenantQuotas, _Mapping]] = ...) -> None: ...

class CreateTenantResponse(_message.Message):
    __slots__ = ["tenant"]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class GetTenantRequest(_message.Message):
    __slots__ = ["tenant_id"]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ...) -> None: ...

class GetTenantResponse(_message.Message):
    __slots__ = ["tenant"]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ["tenant_id"]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ...) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ["keys"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[ApiKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[ApiKey, _Mapping]]] = ...) -> None: ...

class RevokeKeyRequest(_message.Message):
    __slots__ = ["key_id"]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    def __init__(self, key_id: _Optional[str] = ...) -> None: ...

class RevokeKeyResponse(_message.Message):
    __slots__ = ["key"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: ApiKey
    def __init__(self, key: _Optional[_Union[ApiKey, _Mapping]] = ...) -> None: ...

class Tenant(_message.Message):
    __slots__ = ["budget", "create_time", "quotas", "tenant_id", "update_time"]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    budget: TenantBudgetState
    create_time: _timestamp_pb2.Timestamp
    quotas: TenantQuotas
    tenant_id: str
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, tenant_id: _Optional[str] = ..., quotas: _Optional[_Union[TenantQuotas, _Mapping]] = ..., budget: _Optional[_Union[TenantBudgetState, _Mapping]] = ..., create_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class TenantBudget(_message.Message):
    __slots__ = ["limit_tokens", "period"]
    LIMIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    limit_tokens: int
    period: BudgetPeriod
    def __init__(self, limit_tokens: _Optional[int] = ..., period: _Optional[_Union[BudgetPeriod, str]] = ...) -> None: ...

class TenantBudgetState(_message.Message):
    __slots__ = ["available_tokens", "limit_tokens", "period", "period_end", "spent_in_period"]
    AVAILABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PERIOD_END_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    SPENT_IN_PERIOD_FIELD_NUMBER: _ClassVar[int]
    available_tokens: int
    limit_tokens: int
    period: BudgetPeriod
    period_end: _timestamp_pb2.Timestamp
    spent_in_period: int
    def __init__(self, limit_tokens: _Optional[int] = ..., period: _Optional[_Union[BudgetPeriod, str]] = ..., period_end: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., available_tokens: _Optional[int] = ..., spent_in_period: _Optional[int] = ...) -> None: ...

class TenantQuotas(_message.Message):
    __slots__ = ["headroom", "key_requests_per_minute", "max_concurrent_runs", "max_run_tokens", "max_tasks_in_flight"]
    HEADROOM_FIELD_NUMBER: _ClassVar[int]
    KEY_REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_RUNS_FIELD_NUMBER: _ClassVar[int]
    MAX_RUN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TASKS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    headroom: float
    key_requests_per_minute: int
    max_concurrent_runs: int
    max_run_tokens: int
    max_tasks_in_flight: int
    def __init__(self, max_run_tokens: _Optional[int] = ..., max_concurrent_runs: _Optional[int] = ..., max_tasks_in_flight: _Optional[int] = ..., key_requests_per_minute: _Optional[int] = ..., headroom: _Optional[float] = ...) -> None: ...

class UpdateTenantRequest(_message.Message):
    __slots__ = ["budget", "quotas", "tenant_id"]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    budget: TenantBudget
    quotas: TenantQuotas
    tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., quotas: _Optional[_Union[TenantQuotas, _Mapping]] = ..., budget: _Optional[_Union[TenantBudget, _Mapping]] = ...) -> None: ...

class UpdateTenantResponse(_message.Message):
    __slots__ = ["tenant"]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class BudgetPeriod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
