from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Entry(_message.Message):
    __slots__ = ("value", "version")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    value: str
    version: int
    def __init__(self, value: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("space", "key")
    SPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    space: str
    key: str
    def __init__(self, space: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class GetReply(_message.Message):
    __slots__ = ("entry",)
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    entry: Entry
    def __init__(self, entry: _Optional[_Union[Entry, _Mapping]] = ...) -> None: ...

class SetRequest(_message.Message):
    __slots__ = ("space", "key", "value", "ttl", "request_id")
    SPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    space: str
    key: str
    value: str
    ttl: float
    request_id: str
    def __init__(self, space: _Optional[str] = ..., key: _Optional[str] = ..., value: _Optional[str] = ..., ttl: _Optional[float] = ..., request_id: _Optional[str] = ...) -> None: ...

class SetReply(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class CompareAndSetRequest(_message.Message):
    __slots__ = ("space", "key", "value", "version", "ttl", "request_id")
    SPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    space: str
    key: str
    value: str
    version: int
    ttl: float
    request_id: str
    def __init__(self, space: _Optional[str] = ..., key: _Optional[str] = ..., value: _Optional[str] = ..., version: _Optional[int] = ..., ttl: _Optional[float] = ..., request_id: _Optional[str] = ...) -> None: ...

class CompareAndSetReply(_message.Message):
    __slots__ = ("written", "entry")
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    written: bool
    entry: Entry
    def __init__(self, written: _Optional[bool] = ..., entry: _Optional[_Union[Entry, _Mapping]] = ...) -> None: ...

class AddRequest(_message.Message):
    __slots__ = ("space", "key", "amount", "request_id")
    SPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    space: str
    key: str
    amount: int
    request_id: str
    def __init__(self, space: _Optional[str] = ..., key: _Optional[str] = ..., amount: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class AddReply(_message.Message):
    __slots__ = ("total",)
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    total: int
    def __init__(self, total: _Optional[int] = ...) -> None: ...

class CreateAndAddRequest(_message.Message):
    __slots__ = ("space", "key", "value", "counter", "amount", "request_id")
    SPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    space: str
    key: str
    value: str
    counter: str
    amount: int
    request_id: str
    def __init__(self, space: _Optional[str] = ..., key: _Optional[str] = ..., value: _Optional[str] = ..., counter: _Optional[str] = ..., amount: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateAndAddReply(_message.Message):
    __slots__ = ("created", "entry", "total")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    created: bool
    entry: Entry
    total: int
    def __init__(self, created: _Optional[bool] = ..., entry: _Optional[_Union[Entry, _Mapping]] = ..., total: _Optional[int] = ...) -> None: ...

class CheckInRequest(_message.Message):
    __slots__ = ("space", "prefix", "counter", "unless", "claim_key", "claim_value", "request_id")
    SPACE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    UNLESS_FIELD_NUMBER: _ClassVar[int]
    CLAIM_KEY_FIELD_NUMBER: _ClassVar[int]
    CLAIM_VALUE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    space: str
    prefix: str
    counter: str
    unless: str
    claim_key: str
    claim_value: str
    request_id: str
    def __init__(self, space: _Optional[str] = ..., prefix: _Optional[str] = ..., counter: _Optional[str] = ..., unless: _Optional[str] = ..., claim_key: _Optional[str] = ..., claim_value: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class CheckInReply(_message.Message):
    __slots__ = ("entries", "count", "claimed")
    class EntriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Entry
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Entry, _Mapping]] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.MessageMap[str, Entry]
    count: int
    claimed: Entry
    def __init__(self, entries: _Optional[_Mapping[str, Entry]] = ..., count: _Optional[int] = ..., claimed: _Optional[_Union[Entry, _Mapping]] = ...) -> None: ...

class SetManyRequest(_message.Message):
    __slots__ = ("space", "items", "request_id")
    class ItemsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SPACE_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    space: str
    items: _containers.ScalarMap[str, str]
    request_id: str
    def __init__(self, space: _Optional[str] = ..., items: _Optional[_Mapping[str, str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class SetManyReply(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("space", "key", "version", "request_id")
    SPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    space: str
    key: str
    version: int
    request_id: str
    def __init__(self, space: _Optional[str] = ..., key: _Optional[str] = ..., version: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class DeleteReply(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("space", "prefix")
    SPACE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    space: str
    prefix: str
    def __init__(self, space: _Optional[str] = ..., prefix: _Optional[str] = ...) -> None: ...

class ListReply(_message.Message):
    __slots__ = ("entries",)
    class EntriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Entry
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Entry, _Mapping]] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.MessageMap[str, Entry]
    def __init__(self, entries: _Optional[_Mapping[str, Entry]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("space", "key", "prefix", "version", "versions", "timeout", "also")
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    ALSO_FIELD_NUMBER: _ClassVar[int]
    space: str
    key: str
    prefix: bool
    version: int
    versions: _containers.ScalarMap[str, int]
    timeout: float
    also: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, space: _Optional[str] = ..., key: _Optional[str] = ..., prefix: _Optional[bool] = ..., version: _Optional[int] = ..., versions: _Optional[_Mapping[str, int]] = ..., timeout: _Optional[float] = ..., also: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("changed", "entry", "also")
    class AlsoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Entry
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Entry, _Mapping]] = ...) -> None: ...
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    ALSO_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    entry: Entry
    also: _containers.MessageMap[str, Entry]
    def __init__(self, changed: _Optional[bool] = ..., entry: _Optional[_Union[Entry, _Mapping]] = ..., also: _Optional[_Mapping[str, Entry]] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("id", "get", "set", "compare_and_set", "add", "create_and_add", "check_in", "set_many", "delete", "list", "watch", "cancel")
    ID_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    COMPARE_AND_SET_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    CREATE_AND_ADD_FIELD_NUMBER: _ClassVar[int]
    CHECK_IN_FIELD_NUMBER: _ClassVar[int]
    SET_MANY_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    WATCH_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    id: int
    get: GetRequest
    set: SetRequest
    compare_and_set: CompareAndSetRequest
    add: AddRequest
    create_and_add: CreateAndAddRequest
    check_in: CheckInRequest
    set_many: SetManyRequest
    delete: DeleteRequest
    list: ListRequest
    watch: WatchRequest
    cancel: int
    def __init__(self, id: _Optional[int] = ..., get: _Optional[_Union[GetRequest, _Mapping]] = ..., set: _Optional[_Union[SetRequest, _Mapping]] = ..., compare_and_set: _Optional[_Union[CompareAndSetRequest, _Mapping]] = ..., add: _Optional[_Union[AddRequest, _Mapping]] = ..., create_and_add: _Optional[_Union[CreateAndAddRequest, _Mapping]] = ..., check_in: _Optional[_Union[CheckInRequest, _Mapping]] = ..., set_many: _Optional[_Union[SetManyRequest, _Mapping]] = ..., delete: _Optional[_Union[DeleteRequest, _Mapping]] = ..., list: _Optional[_Union[ListRequest, _Mapping]] = ..., watch: _Optional[_Union[WatchRequest, _Mapping]] = ..., cancel: _Optional[int] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class SessionReply(_message.Message):
    __slots__ = ("id", "get", "set", "compare_and_set", "add", "create_and_add", "check_in", "set_many", "delete", "list", "watch", "failure")
    ID_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    COMPARE_AND_SET_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    CREATE_AND_ADD_FIELD_NUMBER: _ClassVar[int]
    CHECK_IN_FIELD_NUMBER: _ClassVar[int]
    SET_MANY_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    WATCH_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    id: int
    get: GetReply
    set: SetReply
    compare_and_set: CompareAndSetReply
    add: AddReply
    create_and_add: CreateAndAddReply
    check_in: CheckInReply
    set_many: SetManyReply
    delete: DeleteReply
    list: ListReply
    watch: WatchEvent
    failure: Failure
    def __init__(self, id: _Optional[int] = ..., get: _Optional[_Union[GetReply, _Mapping]] = ..., set: _Optional[_Union[SetReply, _Mapping]] = ..., compare_and_set: _Optional[_Union[CompareAndSetReply, _Mapping]] = ..., add: _Optional[_Union[AddReply, _Mapping]] = ..., create_and_add: _Optional[_Union[CreateAndAddReply, _Mapping]] = ..., check_in: _Optional[_Union[CheckInReply, _Mapping]] = ..., set_many: _Optional[_Union[SetManyReply, _Mapping]] = ..., delete: _Optional[_Union[DeleteReply, _Mapping]] = ..., list: _Optional[_Union[ListReply, _Mapping]] = ..., watch: _Optional[_Union[WatchEvent, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ...) -> None: ...
