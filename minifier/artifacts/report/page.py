"""Page assembly and the small HTML pieces every section is made of (escaping, tables, fields,
code panes, an SVG line chart). Everything is inlined: the page needs no network and no other
file, so it opens from disk anywhere."""
from __future__ import annotations

import html
import os
from typing import Iterable, Optional

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")


def h(value) -> str:
    """Escaped text ('' for None)."""
    return "" if value is None else html.escape(str(value), quote=True)


def asset(name: str) -> str:
    with open(os.path.join(ASSETS, name)) as f:
        return f.read()


def fields(rows: Iterable[tuple], css: str = "fields") -> str:
    """A <dl> of (label, value[, id]) rows; rows whose value is empty are left out."""
    items = []
    for row in rows:
        label, value = row[0], row[1]
        if value in (None, "", [], ()):
            continue
        ident = f' id="{h(row[2])}"' if len(row) > 2 and row[2] else ""
        items.append(f"<dt>{h(label)}</dt><dd{ident}>{h(value)}</dd>")
    return f'<dl class="{css}">{"".join(items)}</dl>' if items else ""


def table(headers: list, rows: list, numeric: Iterable[int] = (), ident: Optional[str] = None) -> str:
    """A table of escaped cells; columns in `numeric` are right-aligned. Cells given as
    ("html", text) are inserted as they are (already built from escaped pieces)."""
    numeric = set(numeric)

    def cell(i, value):
        css = ' class="num"' if i in numeric else ""
        if isinstance(value, tuple) and value and value[0] == "html":
            return f"<td{css}>{value[1]}</td>"
        return f"<td{css}>{h(value)}</td>"

    head = "".join(f"<th>{h(x)}</th>" for x in headers)
    body = "".join("<tr>" + "".join(cell(i, v) for i, v in enumerate(row)) + "</tr>" for row in rows)
    ident = f' id="{h(ident)}"' if ident else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def pre(text, ident: Optional[str] = None) -> str:
    ident = f' id="{h(ident)}"' if ident else ""
    return f"<pre{ident}>{h(text)}</pre>"


def code_lines(lines: list, line_nodes: dict, culprit_lines: set) -> str:
    """One pane's lines: each a div with its 1-based number, the FX nodes it belongs to
    (data-nodes, what the click handler links by) and the culprit mark."""
    out = []
    for n, text in enumerate(lines, 1):
        nodes = line_nodes.get(n)
        attrs = f' data-nodes="{h(" ".join(sorted(nodes)))}"' if nodes else ""
        css = "ln culprit" if n in culprit_lines else "ln"
        out.append(f'<div class="{css}" data-n="{n}"{attrs}>{h(text)}</div>')
    return "".join(out)


def line_chart(series: dict, xs: list, *, x_label: str, width: int = 520, height: int = 200,
               ident: Optional[str] = None) -> str:
    """A step chart of one or more integer series over the same xs (inline SVG, no script):
    series name -> (colour, values). Axis ticks at the first and last x and at 0 and the maximum."""
    if not xs:
        return ""
    left, right, top, bottom = 44, 110, 10, 34
    top_value = max([max(values) for _colour, values in series.values() if values] + [1])
    x0, x1 = min(xs), max(xs)
    span = (x1 - x0) or 1

    def px(x):
        return left + (x - x0) / span * (width - left - right)

    def py(y):
        return top + (1 - y / top_value) * (height - top - bottom)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img"'
             + (f' id="{h(ident)}"' if ident else "") + ">",
             f'<line x1="{left}" y1="{py(0):.1f}" x2="{width - right}" y2="{py(0):.1f}" stroke="#888"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{py(0):.1f}" stroke="#888"/>',
             f'<text x="{left - 6}" y="{py(0) + 4:.1f}" text-anchor="end">0</text>',
             f'<text x="{left - 6}" y="{py(top_value) + 4:.1f}" text-anchor="end">{top_value}</text>',
             f'<text x="{px(x0):.1f}" y="{height - 18}" text-anchor="middle">{x0}</text>',
             f'<text x="{px(x1):.1f}" y="{height - 18}" text-anchor="middle">{x1}</text>',
             f'<text x="{(left + width - right) / 2:.1f}" y="{height - 4}" text-anchor="middle">{h(x_label)}</text>']
    for row, (name, (colour, values)) in enumerate(series.items()):
        points = []
        for i, (x, y) in enumerate(zip(xs, values)):
            if i:
                points.append(f"{px(x):.1f},{py(values[i - 1]):.1f}")
            points.append(f"{px(x):.1f},{py(y):.1f}")
        parts.append(f'<polyline class="series" data-series="{h(name)}" fill="none" stroke="{colour}" '
                     f'stroke-width="2" points="{" ".join(points)}"/>')
        parts.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>' for x, y in zip(xs, values))
        parts.append(f'<text x="{width - right + 8}" y="{top + 14 + row * 16}" style="fill: {colour}">{h(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def assemble(title: str, command_line: str, sections: list) -> str:
    """The whole page: sections are (id, title, html) in order; a nav bar links them."""
    nav = "".join(f'<a href="#{h(sid)}">{h(stitle)}</a>' for sid, stitle, _ in sections)
    body = "".join(f'<section id="{h(sid)}"><h2>{h(stitle)}</h2>{content}</section>'
                   for sid, stitle, content in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
            f"<title>{h(title)}</title><style>{asset('report.css')}</style></head><body>"
            f"<header><h1>{h(title)}</h1><div class=\"cmd\">{h(command_line)}</div></header>"
            f"<nav>{nav}</nav><main>{body}</main><script>{asset('report.js')}</script></body></html>\n")
