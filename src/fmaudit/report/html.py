"""HTML pages of the report: ``index.html`` (the home page, the same content as ``index.md``) and the reliability
cards' HTML, without a Markdown dependency.

The report's Markdown is written by the report itself, so it uses a small subset, which :func:`markdown_to_html`
renders: ATX headings, pipe tables (a header row and a ``---`` row), images ``![alt](src)``, links
``[text](href)``, ``**bold**``, ``*italic*``, ``` `code` ```, bullet lists (``- ``) and paragraphs. Everything
else is escaped text, so a table cell can never inject markup.
"""

from __future__ import annotations

import html
import re
from typing import Sequence

__all__ = ["PAGE_STYLE", "inline", "markdown_to_html", "page"]

PAGE_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5rem auto; max-width: 78rem;
       padding: 0 1rem; color: #1d1d1f; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.6rem 0 1rem; font-size: 0.88rem; }
th, td { border: 1px solid #c8c8cc; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f2f2f5; }
td.sep { background: #fde8e8; }
td.best { background: #e6f4ea; }
img { max-width: 100%; }
code { background: #f2f2f5; padding: 0 0.2rem; }
.advice li { margin: 0.2rem 0; }
.limits { color: #6b4d00; }
.rule { color: #6e6e73; font-size: 0.8rem; }
.caption { color: #3a3a3c; font-size: 0.9rem; }
"""

_LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_BULLET = re.compile(r"^[-*]\s+")
_ITALIC = re.compile(r"(?<![*\w])\*(?!\s)(.+?)(?<!\s)\*(?![*\w])")


def _safe_href(href: str) -> str:
    return href if not re.match(r"^\s*javascript:", href, re.I) else "#"


def inline(text: str) -> str:
    """One line of the Markdown subset as HTML (escaped, then links, images, code, bold, italic).

    Parameters
    ----------
    text : str
        One line of Markdown (no block structure); a backslash-escaped pipe reads as a literal pipe, and
        ``javascript:`` links become ``#``.

    Returns
    -------
    str
        The HTML, every text escaped.
    """
    parts, last = [], 0
    for m in _LINK.finditer(text):
        parts.append(_emphasis(text[last : m.start()]))
        label, href = html.escape(m.group(1)), html.escape(_safe_href(m.group(2)), quote=True)
        parts.append(
            f'<img src="{href}" alt="{label}">' if m.group(0).startswith("!") else f'<a href="{href}">{label}</a>'
        )
        last = m.end()
    parts.append(_emphasis(text[last:]))
    return "".join(parts)


def _emphasis(text: str) -> str:
    codes: list[str] = []

    def keep(m: re.Match) -> str:
        codes.append(f"<code>{html.escape(m.group(1))}</code>")
        return f"\x00{len(codes) - 1}\x00"

    text = _CODE.sub(keep, text.replace("\\|", "|"))
    text = html.escape(text, quote=False)
    text = _BOLD.sub(r"<strong>\1</strong>", text)
    text = _ITALIC.sub(r"<em>\1</em>", text)
    return re.sub(r"\x00(\d+)\x00", lambda m: codes[int(m.group(1))], text)


def _cells(line: str) -> list[str]:
    body = line.strip().strip("|")
    return [c.strip() for c in re.split(r"(?<!\\)\|", body)]


def markdown_to_html(text: str) -> str:
    """The report's Markdown subset (module doc) as an HTML fragment.

    Parameters
    ----------
    text : str
        Markdown of the report's subset: headings (``#`` to ``######``), pipe tables, ``-``/``*`` bullets and
        paragraphs, with the inline forms of :func:`inline`.

    Returns
    -------
    str
        The HTML fragment, one block per line; headings carry an ``id`` made from their text.
    """
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            out.append(f"<p>{inline(' '.join(paragraph))}</p>")
            paragraph.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            flush()
            i += 1
            continue
        heading = re.match(r"^(#{1,6})\s+(.*)$", stripped)
        if heading:
            flush()
            level = len(heading.group(1))
            anchor = re.sub(r"[^a-z0-9]+", "-", heading.group(2).lower()).strip("-")
            out.append(f'<h{level} id="{anchor}">{inline(heading.group(2))}</h{level}>')
            i += 1
            continue
        if (
            stripped.startswith("|")
            and i + 1 < len(lines)
            and re.match(r"^\|\s*(-{3,}\s*\|\s*)+$", lines[i + 1].strip())
        ):
            flush()
            header = _cells(stripped)
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            head = "".join(f"<th>{inline(c)}</th>" for c in header)
            body = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in rows)
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            continue
        if re.match(r"^[-*]\s+", stripped):
            flush()
            items = []
            while i < len(lines) and re.match(r"^[-*]\s+", lines[i].strip()):
                item = _BULLET.sub("", lines[i].strip())
                items.append(f"<li>{inline(item)}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
            continue
        paragraph.append(stripped)
        i += 1
    flush()
    return "\n".join(out)


def page(title: str, body: str, extra_style: str = "") -> str:
    """A complete, self-contained HTML page.

    Parameters
    ----------
    title : str
        The page's ``<title>`` (escaped).
    body : str
        The HTML of the page's body, inserted as is.
    extra_style : str, default ""
        CSS appended to the report's stylesheet.

    Returns
    -------
    str
        The HTML document, UTF-8, with its stylesheet inline (no external file).
    """
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{PAGE_STYLE}{extra_style}</style>\n</head>\n"
        f"<body>\n{body}\n</body>\n</html>\n"
    )


def table_html(header: Sequence[str], rows: Sequence[Sequence[tuple[str, str]]]) -> str:
    """A table from plain-text cells: ``rows`` of (text, css class) pairs, every text escaped.

    Parameters
    ----------
    header : sequence of str
        The column titles.
    rows : sequence of sequence of (str, str)
        One sequence per row of (text, css class) cells; an empty class writes a plain ``<td>``.

    Returns
    -------
    str
        One ``<table>`` element.
    """
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{c}">{html.escape(t)}</td>' if c else f"<td>{html.escape(t)}</td>" for t, c in r)
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
