import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from offcut.v1 import decision_pb2 as _decision_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeEvent(_message.Message):
    __slots__ = ("time", "source", "seq", "idle", "preempted")
    TIME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    source: str
    seq: int
    idle: _containers.RepeatedScalarFieldContainer[str]
    preempted: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source: _Optional[str] = ..., seq: _Optional[int] = ..., idle: _Optional[_Iterable[str]] = ..., preempted: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeSnapshot(_message.Message):
    __slots__ = ("time", "source", "seq", "idle", "kinds")
    TIME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    source: str
    seq: int
    idle: _containers.RepeatedScalarFieldContainer[str]
    kinds: _containers.RepeatedCompositeFieldContainer[NodeKind]
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source: _Optional[str] = ..., seq: _Optional[int] = ..., idle: _Optional[_Iterable[str]] = ..., kinds: _Optional[_Iterable[_Union[NodeKind, _Mapping]]] = ...) -> None: ...

class NodeKind(_message.Message):
    __slots__ = ("node", "gpus", "features")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpus: int
    features: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node: _Optional[str] = ..., gpus: _Optional[int] = ..., features: _Optional[_Iterable[str]] = ...) -> None: ...
