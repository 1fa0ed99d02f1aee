"""`ProcedureMessage`: byte-exact with GreptimeDB's serde JSON, strict and clear on bad input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procstore import ProcedureId
from procstore.store.message import MessageDecodeError, ProcedureMessage

PARENT = ProcedureId.parse("9f805a1f-05f7-490c-9f91-bd56e3cc54c1")


def test_vectors_are_byte_exact() -> None:
    message = ProcedureMessage("TestMessage", "no parent id", None, 4)
    assert message.encode() == b'{"type_name":"TestMessage","data":"no parent id","parent_id":null,"step":4}'
    message = ProcedureMessage("TestMessage", "no parent id", PARENT, 4)
    assert message.encode() == (
        b'{"type_name":"TestMessage","data":"no parent id","parent_id":"9f805a1f-05f7-490c-9f91-bd56e3cc54c1","step":4}'
    )


def test_error_goes_last_and_only_when_set() -> None:
    message = ProcedureMessage("T", "d", None, 1, error="boom")
    assert message.encode() == b'{"type_name":"T","data":"d","parent_id":null,"step":1,"error":"boom"}'


def test_readers_keep_unknown_fields_and_accept_a_missing_error() -> None:
    """GreptimeDB's `context` (and any field procstore does not know) is kept, and written
    back after the known fields."""
    raw = b'{"type_name":"T","data":"{\\"a\\":1}","parent_id":null,"step":7,"context":{"x":1}}'
    message = ProcedureMessage.decode(raw)
    assert message == ProcedureMessage("T", '{"a":1}', None, 7, extra=b'"context":{"x":1}')
    assert message.encode() == raw


def test_an_unknown_field_named_like_a_python_attribute_is_kept_as_it_was() -> None:
    raw = b'{"type_name":"T","data":"d","parent_id":null,"step":1,"extra":"eA==","run":2}'
    message = ProcedureMessage.decode(raw)
    assert (message.run, message.extra) == (2, b'"extra":"eA=="')


@given(
    type_name=st.text(),
    data=st.text(),
    parent=st.none() | st.uuids().map(lambda u: ProcedureId.parse(str(u))),
    step=st.integers(0, 2**32 - 1),
    error=st.none() | st.text(),
)
def test_round_trip(type_name: str, data: str, parent: ProcedureId | None, step: int, error: str | None) -> None:
    message = ProcedureMessage(type_name, data, parent, step, error)
    assert ProcedureMessage.decode(message.encode()) == message


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"", "empty"),
        (b'{"type_name":"T","da', "not JSON"),
        (b"[1,2]", "Expected `object`, got `array`"),
        (b'{"data":"d","parent_id":null,"step":1}', "missing required field `type_name`"),
        (b'{"type_name":1,"data":"d","parent_id":null,"step":1}', r"Expected `str`, got `int` - at `\$.type_name`"),
        (b'{"type_name":"T","data":"d","parent_id":null,"step":-1}', r"\$.step"),
        (b'{"type_name":"T","data":"d","parent_id":null,"step":true}', r"\$.step"),
        (b'{"type_name":"T","data":"d","parent_id":null,"step":4294967296}', r"\$.step"),
        (b'{"type_name":"T","data":"d","parent_id":"xyz","step":1}', r"\$.parent_id"),
        (b'{"type_name":"T","data":"d","parent_id":null,"step":1,"error":3}', r"\$.error"),
        # Invalid UTF-8 inside a JSON string: msgspec raises UnicodeDecodeError for it.
        (b'{"type_name":"T","data":"\xff\xfe","parent_id":null,"step":1}', "not JSON .*utf-8"),
        # Nested past msgspec's depth: a `RecursionError`, where the field is kept or skipped.
        (b'{"type_name":"T","data":"d","parent_id":' + b"[" * 2000 + b"]" * 2000 + b',"step":1}', r"\$.parent_id"),
        (
            b'{"type_name":"T","data":"d","parent_id":null,"step":1,"context":' + b"[" * 2000 + b"]" * 2000 + b"}",
            "too deeply",
        ),
    ],
)
def test_bad_values_say_what_is_wrong(raw: bytes, fragment: str) -> None:
    with pytest.raises(MessageDecodeError, match=fragment):
        ProcedureMessage.decode(raw)


def test_unknown_fields_come_back_byte_for_byte_whatever_they_hold() -> None:
    """A number no float holds, text beyond ASCII, nesting: written back exactly as stored,
    never read into Python values and written again (which would turn `1e400` into
    `Infinity`, no JSON at all)."""
    fields = b'"context":{"n":1e400,"big":123456789012345678901234567890,"who":"\xc3\xa9 \\ud83d\\ude00"},"x":[1, 2]'
    raw = b'{"type_name":"T","data":"d","parent_id":null,"step":1,' + fields + b"}"
    message = ProcedureMessage.decode(raw)
    assert message.extra == fields
    assert message.encode() == raw
    assert ProcedureMessage.decode(message.encode()) == message
