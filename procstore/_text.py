"""Stored text made safe to show: anyone who can write the bucket chooses every value and
key name, so a view prints them as inert text.

- `valid_unicode`: a key name that is not UTF-8 (a local file `bad\\xff.txt`, which Python
  names with a lone surrogate) or a JSON string with a lone surrogate, with the bad code
  points escaped (`\\xff`, `\\ud800`): every encoder (UTF-8 pages, JSON, YAML) takes it.
- `terminal_text`: also every control character (C0, DEL, C1: ESC starts the sequences that
  set a window title, clear the screen or make a hyperlink) and the bidirectional overrides
  escaped as `\\x1b`, `\\u202e`..., so a terminal shows them and obeys none.
- `json_inert`: JSON or YAML text with those characters escaped as `\\u009b`, `\\u202e`...:
  the same value, read back, and nothing a terminal obeys.
- `bounded`: at most `limit` characters, then how many more there are.

And the other way, text given to be stored: `storable` refuses a lone surrogate, which
UTF-8 cannot store (Python names an argument's undecodable byte with one).
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_RAW_IN_JSON = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""The characters of `_CONTROL` that JSON writes raw (it escapes C0 itself)."""
_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}

TEXT_LIMIT = 2_000
"""Characters of one value a table, tree or page shows (`show -o json` gives them all)."""


def valid_unicode(text: str) -> str:
    """`text`, with each lone surrogate escaped (`\\xff` for an undecodable byte of a name)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            raw = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return text.encode("utf-8", "backslashreplace").decode("utf-8")
        return raw.decode("utf-8", "backslashreplace")
    return text


def storable(text: str, what: str) -> str:
    """`text`, if UTF-8 can store it; else `ValueError` naming `what` and its first lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} must be valid Unicode text: it has a lone surrogate {text[e.start : e.end]!r} at "
            f"character {e.start}, which the store's UTF-8 cannot hold"
        ) from None
    return text


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def terminal_text(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with lone surrogates and every control character escaped (newlines kept if
    `keep_newlines`: for text this program lays out over several lines)."""
    text = valid_unicode(text)
    if keep_newlines:
        return "\n".join(_CONTROL.sub(_escape, line) for line in text.split("\n"))
    return _CONTROL.sub(_escape, text)


def json_inert(text: str) -> str:
    """JSON (or a YAML document whose strings holding them are double-quoted) with the
    control characters JSON leaves raw (DEL, C1, the bidirectional overrides: a terminal
    obeys `\x9b`, and U+202E shows the rest of the line reversed) as `\u009b`, `\u202e`.
    Outside strings such text holds none, and inside one the escape reads back the same."""
    return _RAW_IN_JSON.sub(_json_escape, text)


def has_control(text: str) -> bool:
    """Whether `text` holds a character `json_inert` escapes."""
    return _RAW_IN_JSON.search(text) is not None


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def bounded(text: str, limit: int = TEXT_LIMIT) -> str:
    """`text` cut to `limit` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return cut_text(text[:limit], len(text))


def cut_text(head: str, length: int) -> str:
    """The first characters of a text `length` characters long, saying how many more there
    are (`bounded`'s form, for a text never made whole)."""
    return head if length <= len(head) else f"{head}… {length - len(head)} more characters"
