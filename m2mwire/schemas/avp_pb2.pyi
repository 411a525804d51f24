from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PayloadType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HIDDEN_STATE: _ClassVar[PayloadType]
    KV_CACHE: _ClassVar[PayloadType]

class CommunicationMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LATENT: _ClassVar[CommunicationMode]
    JSON_MODE: _ClassVar[CommunicationMode]

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FLOAT32: _ClassVar[DataType]
    FLOAT16: _ClassVar[DataType]
    BFLOAT16: _ClassVar[DataType]
    INT8: _ClassVar[DataType]
HIDDEN_STATE: PayloadType
KV_CACHE: PayloadType
LATENT: CommunicationMode
JSON_MODE: CommunicationMode
FLOAT32: DataType
FLOAT16: DataType
BFLOAT16: DataType
INT8: DataType

class Metadata(_message.Message):
    __slots__ = ("session_id", "source_agent_id", "target_agent_id", "model_id", "hidden_dim", "num_layers", "payload_type", "dtype", "tensor_shape", "mode", "compression", "avp_map_id", "extra", "payload_checksum")
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_DIM_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_TYPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_SHAPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    AVP_MAP_ID_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    source_agent_id: str
    target_agent_id: str
    model_id: str
    hidden_dim: int
    num_layers: int
    payload_type: PayloadType
    dtype: DataType
    tensor_shape: _containers.RepeatedScalarFieldContainer[int]
    mode: CommunicationMode
    compression: str
    avp_map_id: str
    extra: _containers.ScalarMap[str, str]
    payload_checksum: int
    def __init__(self, session_id: _Optional[str] = ..., source_agent_id: _Optional[str] = ..., target_agent_id: _Optional[str] = ..., model_id: _Optional[str] = ..., hidden_dim: _Optional[int] = ..., num_layers: _Optional[int] = ..., payload_type: _Optional[_Union[PayloadType, str]] = ..., dtype: _Optional[_Union[DataType, str]] = ..., tensor_shape: _Optional[_Iterable[int]] = ..., mode: _Optional[_Union[CommunicationMode, str]] = ..., compression: _Optional[str] = ..., avp_map_id: _Optional[str] = ..., extra: _Optional[_Mapping[str, str]] = ..., payload_checksum: _Optional[int] = ...) -> None: ...

class TransmitResponse(_message.Message):
    __slots__ = ("success", "message", "request_id", "extra")
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: str
    request_id: str
    extra: _containers.ScalarMap[str, str]
    def __init__(self, success: _Optional[bool] = ..., message: _Optional[str] = ..., request_id: _Optional[str] = ..., extra: _Optional[_Mapping[str, str]] = ...) -> None: ...
