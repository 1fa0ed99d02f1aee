"""Links to procedure pages, built only from ids that parse as canonical procedure ids.

An id or parent id comes from the store, and anyone who can write the bucket writes it:
`javascript:...` or `https:evil.example` in an `href` would run script on, or leave, this
server's origin with one click. So an `href` is never stored text: it is this app's own
path, `p/` and the id as `ProcedureId` prints it, and anything else is shown as text.
"""

from __future__ import annotations

from markupsafe import Markup, escape

from procstore._text import terminal_text
from procstore.ids import ProcedureId


def procedure_path(text: object) -> str | None:
    """`p/{id}` (relative to the app's root) for a canonical procedure id; None for anything else."""
    pid = ProcedureId.parse_canonical(text) if isinstance(text, str) else None
    return None if pid is None else f"p/{pid}"


def procedure_link(text: object, label: object, root: str, css_class: str = "") -> Markup:
    """An `<a>` to the page of procedure `text` showing `label`, or `label` alone (escaped)
    when `text` is not a procedure id."""
    path = procedure_path(text)
    if path is None:  # shown as the terminal shows stored text: controls escaped
        return escape(terminal_text(label) if isinstance(label, str) else label)
    classes = Markup(' class="{}"').format(css_class) if css_class else Markup("")
    shown = terminal_text(label) if isinstance(label, str) else label
    return Markup('<a{} href="{}{}">{}</a>').format(classes, root, path, shown)
