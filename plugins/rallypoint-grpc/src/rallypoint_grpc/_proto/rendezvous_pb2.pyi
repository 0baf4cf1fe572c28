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
