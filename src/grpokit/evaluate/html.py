"""Self-contained HTML pieces for the report and the comparison: no scripts, fonts or fetches.

Every text that comes from a run (completions, prompts, config values, messages) goes through
:func:`esc`; completions are model output and may contain markup.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "Noto Sans", "Noto Sans CJK JP",
       sans-serif; margin: 0 auto; max-width: 1160px; padding: 0 16px 40px; color: #222; }
h1 { font-size: 22px; margin: 18px 0 4px; }
h2 { font-size: 17px; margin: 26px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 3px; }
section { margin-bottom: 8px; }
.muted { color: #666; }
.warn { background: #fff4e5; border-left: 4px solid #f0a020; padding: 6px 10px; margin: 8px 0; }
.alert { background: #fdecea; border-left: 4px solid #d62728; padding: 6px 10px; margin: 8px 0; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f5f5f5; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
img.plot { max-width: 100%; height: auto; display: block; }
pre { background: #f7f7f7; padding: 8px; overflow: auto; white-space: pre-wrap;
      word-break: break-word; margin: 4px 0; }
pre.config { max-height: 340px; }
.cols { display: grid; grid-template-columns: 1fr 1fr; gap: 14px; }
.sample { border: 1px solid #ddd; border-radius: 4px; padding: 6px 8px; margin-bottom: 8px; }
.sample pre { max-height: 220px; }
.sample .meta { font-size: 12px; color: #555; }
.transcript { display: flex; flex-direction: column; gap: 4px; }
.transcript .msg { border-left: 4px solid #bbb; padding: 2px 6px; }
.transcript .msg .who { font-size: 11px; font-weight: 600; color: #555; }
.transcript .msg pre { margin: 2px 0; max-height: 220px; border: 0; }
.tool-call, .tool-call pre { border-left-color: #9467bd; background: #f5f0fa; }
.tool-result, .tool-result pre { border-left-color: #2ca02c; background: #eef8ee; }
.tool-error, .tool-error pre { border-left-color: #d62728; background: #fdecea; }
"""


def esc(text: object) -> str:
    """HTML-escape any value (quotes too, so it is safe inside attributes)."""
    return html.escape(str(text), quote=True)


def img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img class="plot" alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def fmt(value: object, digits: int = 3) -> str:
    """A number for a table cell; other values as text."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.{digits}e}"
        return f"{value:.{digits}g}" if abs(value) >= 1 else f"{value:.{digits}f}"
    return esc(value)


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *, numeric: bool = True) -> str:
    """An HTML table; numbers right-aligned and formatted, text escaped."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            if numeric and isinstance(cell, int | float) and not isinstance(cell, bool):
                cells.append(f'<td class="num">{fmt(cell)}</td>')
            else:
                cells.append(f"<td>{fmt(cell) if cell is None else esc(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def section(anchor: str, title: str, content: str) -> str:
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>{content}</section>'
