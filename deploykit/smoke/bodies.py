"""An HTTP body that is not the JSON an OpenAI-compatible server answers, in a few words for a one-line
diagnosis: a proxy's error page or a web server's HTML must never scroll through a terminal or fill a row.
"""

from __future__ import annotations

import html
import re

_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_MARKUP = re.compile(r"^\s*<(!doctype|html|head|body|\?xml|[a-z][a-z0-9]*[\s>/])", re.IGNORECASE)


def is_markup(text: str) -> bool:
    """HTML (or XML): a page, not a message."""
    return bool(_MARKUP.match(text))


def describe_body(text: str, content_type: str = "") -> str:
    """`an HTML page titled 'Bad Gateway' (text/html)`, `an empty body`, `123 bytes of text/plain, not JSON`:
    the body's kind and an HTML page's title, never the page itself."""
    kind = f" ({content_type.split(';', 1)[0].strip()})" if content_type.strip() else ""
    if not text.strip():
        return f"an empty body{kind}"
    title = _TITLE.search(text)
    if title or is_markup(text):
        words = " ".join(html.unescape(title.group(1)).split())[:80] if title else ""
        return f"an HTML page titled {words!r}{kind}" if words else f"an HTML page{kind}"
    return f"{len(text.encode())} bytes of {content_type.split(';', 1)[0].strip() or 'text'}, not JSON"


def excerpt(text: str, limit: int) -> str:
    """A body as a diagnosis shows it: a message's first `limit` characters on one line, a page described."""
    if is_markup(text):
        return describe_body(text)
    return " ".join(text.split())[:limit]
