"""Finished spans to OTLP protobuf bytes, written straight to the wire format.

The official encoder (``opentelemetry.exporter.otlp.proto.common.trace_encoder``) builds a tree of
protobuf message objects for every batch and then serializes it: ~56 µs of CPU per gateway span in
the export thread. ``SpanEncoder`` writes the same ``ExportTraceServiceRequest`` directly, setting
the fields its 1.45.2 ``encode_spans`` sets, in field-number order as protobuf does, and remembers
what repeats from batch to batch: the resource and scope blocks, and the attributes whose
(key, value) recur (operation, provider, model, server address, route...).

Field numbers are those of ``opentelemetry/proto/trace/v1/trace.proto`` and
``opentelemetry/proto/common/v1/common.proto``.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import ItemsView, Mapping, Sequence
from types import MappingProxyType

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode
from opentelemetry.util.types import AnyValue, Attributes

__all__ = ["SpanEncoder"]

log = logging.getLogger(__name__)

# The most attributes remembered; past it the memo starts over. Gateway spans repeat a few dozen
# (key, value) pairs, and the unique ones (response ids, token counts) must not grow it for ever.
MAX_CACHED_ATTRIBUTES = 4096
# Longer attributes are encoded every time: they rarely repeat (a captured prompt), and the bound
# keeps the memo's memory small.
MAX_CACHED_BYTES = 256
# Distinct resources and scopes remembered; a process has a handful.
MAX_CACHED_BLOCKS = 32

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_UINT64_MASK = (1 << 64) - 1

_fixed32 = struct.Struct("<I").pack
_fixed64 = struct.Struct("<Q").pack
_double = struct.Struct("<d").pack
_ONE_BYTE = tuple(bytes((n,)) for n in range(0x80))


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    if n < 0x4000:  # a span's length, a token count
        return bytes((n & 0x7F | 0x80, n >> 7))
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return tag + _varint(len(payload)) + payload


# ExportTraceServiceRequest
_REQUEST_RESOURCE_SPANS = _tag(1, _LEN)
# ResourceSpans
_RESOURCE_SPANS_RESOURCE = _tag(1, _LEN)
_RESOURCE_SPANS_SCOPE_SPANS = _tag(2, _LEN)
_RESOURCE_SPANS_SCHEMA_URL = _tag(3, _LEN)
# Resource
_RESOURCE_ATTRIBUTES = _tag(1, _LEN)
# ScopeSpans
_SCOPE_SPANS_SCOPE = _tag(1, _LEN)
_SCOPE_SPANS_SPANS = _tag(2, _LEN)
_SCOPE_SPANS_SCHEMA_URL = _tag(3, _LEN)
# InstrumentationScope
_SCOPE_NAME = _tag(1, _LEN)
_SCOPE_VERSION = _tag(2, _LEN)
_SCOPE_ATTRIBUTES = _tag(3, _LEN)
# Span; the ids are fixed-size, so their length goes into the tag constant.
_SPAN_TRACE_ID = _tag(1, _LEN) + _varint(16)
_SPAN_SPAN_ID = _tag(2, _LEN) + _varint(8)
_SPAN_TRACE_STATE = _tag(3, _LEN)
_SPAN_PARENT_SPAN_ID = _tag(4, _LEN) + _varint(8)
_SPAN_NAME = _tag(5, _LEN)
_SPAN_START_TIME = _tag(7, _I64)
_SPAN_END_TIME = _tag(8, _I64)
_SPAN_ATTRIBUTES = _tag(9, _LEN)
_SPAN_DROPPED_ATTRIBUTES = _tag(10, _VARINT)
_SPAN_EVENTS = _tag(11, _LEN)
_SPAN_DROPPED_EVENTS = _tag(12, _VARINT)
_SPAN_LINKS = _tag(13, _LEN)
_SPAN_DROPPED_LINKS = _tag(14, _VARINT)
_SPAN_STATUS = _tag(15, _LEN)
# The SDK's SpanKind counts from INTERNAL = 0, the proto enum from SPAN_KIND_UNSPECIFIED = 0.
_SPAN_KIND = {kind: _tag(6, _VARINT) + _varint(kind.value + 1) for kind in SpanKind}
# SpanFlags: the official encoder always sets CONTEXT_HAS_IS_REMOTE (0x100), adds
# CONTEXT_IS_REMOTE (0x200) for a remote parent, and leaves the W3C trace flags (0xFF) out.
_SPAN_FLAGS_LOCAL = _tag(16, _I32) + _fixed32(0x100)
_SPAN_FLAGS_REMOTE = _tag(16, _I32) + _fixed32(0x300)
# Span.Event
_EVENT_TIME = _tag(1, _I64)
_EVENT_NAME = _tag(2, _LEN)
_EVENT_ATTRIBUTES = _tag(3, _LEN)
_EVENT_DROPPED_ATTRIBUTES = _tag(4, _VARINT)
# Span.Link; the official encoder writes no trace_state (field 3) for links.
_LINK_TRACE_ID = _tag(1, _LEN) + _varint(16)
_LINK_SPAN_ID = _tag(2, _LEN) + _varint(8)
_LINK_ATTRIBUTES = _tag(4, _LEN)
_LINK_DROPPED_ATTRIBUTES = _tag(5, _VARINT)
_LINK_FLAGS_LOCAL = _tag(6, _I32) + _fixed32(0x100)
_LINK_FLAGS_REMOTE = _tag(6, _I32) + _fixed32(0x300)
# Status
_STATUS_MESSAGE = _tag(2, _LEN)
_STATUS_CODES = {
    code: _tag(3, _VARINT) + _varint(code.value) if code.value else b"" for code in StatusCode
}
_SPAN_STATUSES = {code: _field(_SPAN_STATUS, field) for code, field in _STATUS_CODES.items()}
# KeyValue, KeyValueList, ArrayValue
_KEY_VALUE_KEY = _tag(1, _LEN)
_KEY_VALUE_VALUE = _tag(2, _LEN)
_LIST_VALUES = _tag(1, _LEN)
# AnyValue: a oneof, so a default (False, 0, "") is written, unlike a plain proto3 field.
_ANY_STRING = _tag(1, _LEN)
_ANY_TRUE = _tag(2, _VARINT) + _varint(1)
_ANY_FALSE = _tag(2, _VARINT) + _varint(0)
_ANY_INT = _tag(3, _VARINT)
_ANY_DOUBLE = _tag(4, _I64)
_ANY_ARRAY = _tag(5, _LEN)
_ANY_KVLIST = _tag(6, _LEN)
_ANY_BYTES = _tag(7, _LEN)


def _any_value(value: object) -> bytes:
    """The fields of an AnyValue, as the official ``_encode_value`` sets them.

    Checked most common first; only bool must come before int, and str and bytes before Sequence.
    """
    if isinstance(value, str):
        encoded = value.encode()
        return _ANY_STRING + _varint(len(encoded)) + encoded
    if isinstance(value, float):
        return _ANY_DOUBLE + _double(value)
    if isinstance(value, bool):
        return _ANY_TRUE if value else _ANY_FALSE
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"Value out of range: {value}")  # what protobuf raises
        return _ANY_INT + _varint(value & _UINT64_MASK)  # two's complement: 10 bytes if negative
    if value is None:
        return b""
    if isinstance(value, bytes):
        return _field(_ANY_BYTES, value)
    if isinstance(value, Sequence):
        return _field(_ANY_ARRAY, b"".join(_field(_LIST_VALUES, _any_value(v)) for v in value))
    if isinstance(value, Mapping):
        items = b"".join(_field(_LIST_VALUES, _key_value(str(k), v)) for k, v in value.items())
        return _field(_ANY_KVLIST, items)
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def _key_value(key: str, value: object) -> bytes:
    encoded_key = key.encode()
    encoded_value = _any_value(value)
    # The value is a message the official encoder always sets, so even None writes it (empty).
    key_value = _KEY_VALUE_VALUE + _varint(len(encoded_value)) + encoded_value
    if encoded_key:
        key_value = _KEY_VALUE_KEY + _varint(len(encoded_key)) + encoded_key + key_value
    return key_value


def _items(attributes: Mapping[str, AnyValue]) -> ItemsView[str, AnyValue]:
    # The SDK's BoundedAttributes (also behind a span's MappingProxyType) iterates key by key in
    # Python; its copy() is one dict copy in C, and iterating that costs a third as much.
    if isinstance(attributes, (MappingProxyType, BoundedAttributes)):
        return attributes.copy().items()
    return attributes.items()


def _memo_key(key: str, value: AnyValue) -> tuple[str, AnyValue, type] | None:
    """The attribute's key in the memo, if it may be remembered: values whose equality is exact.

    True == 1 == 1.0 with equal hashes, so the type keeps bools apart from ints, and floats and
    arrays of anything but strings are left out.
    """
    if isinstance(value, str):
        # A longer string would not be kept: spare hashing it.
        return (key, value, str) if len(value) <= MAX_CACHED_BYTES else None
    if isinstance(value, int):
        return (key, value, type(value))
    if isinstance(value, tuple) and all(isinstance(item, str) for item in value):
        return (key, value, tuple)
    return None


def _status(status: Status) -> bytes:
    """The span's ``status`` field."""
    if not status.description:
        return _SPAN_STATUSES[status.status_code]
    message = _field(_STATUS_MESSAGE, status.description.encode())
    return _field(_SPAN_STATUS, message + _STATUS_CODES[status.status_code])


def _span_flags(parent: SpanContext | None, local: bytes, remote: bytes) -> bytes:
    return remote if parent is not None and parent.is_remote else local


class SpanEncoder:
    """Encodes batches of spans, keeping bounded memos: one lives as long as its exporter.

    Not locked: the batch processor exports one batch at a time, and the memos are plain dicts, so
    two threads at once would at worst encode a value twice.
    """

    __slots__ = ("_attributes", "_float_keys", "_resources", "_scopes")

    def __init__(self) -> None:
        # (key, value, type(value)) -> the KeyValue, length-prefixed. The type keeps True apart
        # from 1, which compare and hash equal.
        self._attributes: dict[tuple[str, AnyValue, type], bytes] = {}
        # key -> a float KeyValue but its last 8 bytes: floats (durations, costs) seldom repeat,
        # their keys do.
        self._float_keys: dict[str, bytes] = {}
        # id(object) -> (the object, its block). Holding the object keeps its id from being
        # reused; resources and scopes are immutable, so a block encoded once stays right.
        self._resources: dict[int, tuple[Resource, bytes, bytes]] = {}
        self._scopes: dict[int, tuple[InstrumentationScope | None, bytes, bytes]] = {}

    def encode_spans(self, spans: Sequence[ReadableSpan]) -> bytes:
        """``trace_encoder.encode_spans(spans).SerializePartialToString()``, only faster."""
        # Grouped by resource, then scope, in order of first appearance, with the same equality
        # the official encoder's dicts use; the ids spare hashing a Resource (a JSON dump) per span.
        groups: dict[Resource, dict[InstrumentationScope | None, list[bytes]]] = {}
        by_ids: dict[tuple[int, int], list[bytes]] = {}
        for span in spans:
            resource, scope = span.resource, span.instrumentation_scope
            ids = (id(resource), id(scope))
            bodies = by_ids.get(ids)
            if bodies is None:
                bodies = by_ids[ids] = groups.setdefault(resource, {}).setdefault(scope, [])
            bodies.append(self._span(span))
        request: list[bytes] = []
        for resource, scopes in groups.items():
            resource_block, resource_schema = self._resource_block(resource)
            resource_spans = [resource_block]
            for scope, bodies in scopes.items():
                scope_block, scope_schema = self._scope_block(scope)
                scope_spans = [scope_block]
                scope_spans.extend(_field(_SCOPE_SPANS_SPANS, body) for body in bodies)
                scope_spans.append(scope_schema)
                resource_spans.append(_field(_RESOURCE_SPANS_SCOPE_SPANS, b"".join(scope_spans)))
            resource_spans.append(resource_schema)
            request.append(_field(_REQUEST_RESOURCE_SPANS, b"".join(resource_spans)))
        return b"".join(request)

    def _resource_block(self, resource: Resource) -> tuple[bytes, bytes]:
        """The ResourceSpans ``resource`` field, and its ``schema_url`` field (or nothing)."""
        cached = self._resources.get(id(resource))
        if cached is not None and cached[0] is resource:
            return cached[1], cached[2]
        parts: list[bytes] = []
        self._encode_attributes(_RESOURCE_ATTRIBUTES, resource.attributes, parts)
        block = _field(_RESOURCE_SPANS_RESOURCE, b"".join(parts))
        url = resource.schema_url
        schema = _field(_RESOURCE_SPANS_SCHEMA_URL, url.encode()) if url else b""
        if len(self._resources) >= MAX_CACHED_BLOCKS:
            self._resources.clear()
        self._resources[id(resource)] = (resource, block, schema)
        return block, schema

    def _scope_block(self, scope: InstrumentationScope | None) -> tuple[bytes, bytes]:
        """The ScopeSpans ``scope`` field (written even when empty), and its ``schema_url``."""
        cached = self._scopes.get(id(scope))
        if cached is not None and cached[0] is scope:
            return cached[1], cached[2]
        parts: list[bytes] = []
        schema = b""
        if scope is not None:
            if scope.name:
                parts.append(_field(_SCOPE_NAME, scope.name.encode()))
            if scope.version:
                parts.append(_field(_SCOPE_VERSION, scope.version.encode()))
            self._encode_attributes(_SCOPE_ATTRIBUTES, scope.attributes, parts)
            if scope.schema_url:
                schema = _field(_SCOPE_SPANS_SCHEMA_URL, scope.schema_url.encode())
        block = _field(_SCOPE_SPANS_SCOPE, b"".join(parts))
        if len(self._scopes) >= MAX_CACHED_BLOCKS:
            self._scopes.clear()
        self._scopes[id(scope)] = (scope, block, schema)
        return block, schema

    def _span(self, span: ReadableSpan) -> bytes:
        context = span.get_span_context()
        if context is None:
            raise ValueError(f"span {span.name!r} has no context")
        parts = [
            _SPAN_TRACE_ID,
            context.trace_id.to_bytes(16, "big"),
            _SPAN_SPAN_ID,
            context.span_id.to_bytes(8, "big"),
        ]
        if context.trace_state:
            state = ",".join([f"{key}={value}" for key, value in context.trace_state.items()])
            parts.append(_field(_SPAN_TRACE_STATE, state.encode()))
        parent = span.parent
        if parent is not None:
            parts += (_SPAN_PARENT_SPAN_ID, parent.span_id.to_bytes(8, "big"))
        if span.name:
            parts.append(_field(_SPAN_NAME, span.name.encode()))
        parts.append(_SPAN_KIND[span.kind])
        if span.start_time:
            parts += (_SPAN_START_TIME, _fixed64(span.start_time))
        if span.end_time:
            parts += (_SPAN_END_TIME, _fixed64(span.end_time))
        self._encode_attributes(_SPAN_ATTRIBUTES, span.attributes, parts)
        if span.dropped_attributes:
            parts += (_SPAN_DROPPED_ATTRIBUTES, _varint(span.dropped_attributes))
        for event in span.events:
            event_parts: list[bytes] = []
            if event.timestamp:
                event_parts += (_EVENT_TIME, _fixed64(event.timestamp))
            if event.name:
                event_parts.append(_field(_EVENT_NAME, event.name.encode()))
            self._encode_attributes(_EVENT_ATTRIBUTES, event.attributes, event_parts)
            if event.dropped_attributes:
                event_parts += (_EVENT_DROPPED_ATTRIBUTES, _varint(event.dropped_attributes))
            parts.append(_field(_SPAN_EVENTS, b"".join(event_parts)))
        if span.dropped_events:
            parts += (_SPAN_DROPPED_EVENTS, _varint(span.dropped_events))
        for link in span.links:
            link_parts = [
                _LINK_TRACE_ID,
                link.context.trace_id.to_bytes(16, "big"),
                _LINK_SPAN_ID,
                link.context.span_id.to_bytes(8, "big"),
            ]
            self._encode_attributes(_LINK_ATTRIBUTES, link.attributes, link_parts)
            if link.dropped_attributes:
                link_parts += (_LINK_DROPPED_ATTRIBUTES, _varint(link.dropped_attributes))
            link_parts.append(_span_flags(link.context, _LINK_FLAGS_LOCAL, _LINK_FLAGS_REMOTE))
            parts.append(_field(_SPAN_LINKS, b"".join(link_parts)))
        if span.dropped_links:
            parts += (_SPAN_DROPPED_LINKS, _varint(span.dropped_links))
        if span.status is not None:  # written even when empty, as the official encoder does
            parts.append(_status(span.status))
        parts.append(_span_flags(parent, _SPAN_FLAGS_LOCAL, _SPAN_FLAGS_REMOTE))
        return b"".join(parts)

    def _encode_attributes(self, tag: bytes, attributes: Attributes, parts: list[bytes]) -> None:
        """Append each attribute as a ``tag`` field; one that fails is logged and left out."""
        if not attributes:
            return
        memo, float_keys = self._attributes, self._float_keys
        for key, value in _items(attributes):
            # The common cases inline: a function call costs as much as a memo hit.
            memo_key: tuple[str, AnyValue, type] | None = None
            if type(value) is str and len(value) <= MAX_CACHED_BYTES:
                memo_key = (key, value, str)
            elif type(value) is float:
                prefix = float_keys.get(key)
                if prefix is not None:
                    parts += (tag, prefix, _double(value))
                    continue
            else:
                memo_key = _memo_key(key, value)
            if memo_key is not None:
                encoded = memo.get(memo_key)
                if encoded is not None:
                    parts += (tag, encoded)
                    continue
            try:
                key_value = _key_value(key, value)
            except Exception as error:  # the official encoder's choice: drop the one attribute
                log.exception("Failed to encode key %s: %s", key, error)
                continue
            encoded = _varint(len(key_value)) + key_value
            if len(encoded) <= MAX_CACHED_BYTES:
                if memo_key is not None:
                    if len(memo) >= MAX_CACHED_ATTRIBUTES:
                        memo.clear()
                    memo[memo_key] = encoded
                elif type(value) is float:
                    if len(float_keys) >= MAX_CACHED_ATTRIBUTES:
                        float_keys.clear()
                    float_keys[key] = encoded[:-8]  # all but the double
            parts += (tag, encoded)
