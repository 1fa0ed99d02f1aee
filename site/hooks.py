"""mkdocs hook: `<!-- include: PATH -->` pastes a file of the repository into a page, so
that the benchmark tables and CONTRIBUTING.md are never copied by hand."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_INCLUDE = re.compile(r"<!-- include: (\S+) -->")


def on_page_markdown(markdown: str, **_: Any) -> str:
    def paste(match: re.Match[str]) -> str:
        text = (ROOT / match.group(1)).read_text()
        # The included file's own title would be a second one on the page.
        return re.sub(r"\A# .*\n", "", text)

    return _INCLUDE.sub(paste, markdown)
