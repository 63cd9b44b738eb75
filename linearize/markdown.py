"""Markdown tables, written one way by every report, model card, benchmark and comparison."""

from __future__ import annotations

#: the separator cell of each alignment name
ALIGN_MARKS = {"left": ":--", "right": "--:", "center": ":-:", "none": "---"}


def markdown_table(header, rows, align=None):
    """A Markdown table (lines joined by newlines, no trailing newline): ``header``'s cells, the
    separator line, then one line per row of ``rows`` (cells written with ``str``, unescaped).

    ``align``: per column, a name of :data:`ALIGN_MARKS` (``"left"``, ``"right"``, ``"center"``,
    ``"none"``) or a separator cell as it is written (``"---:"``); default: the first column left,
    the others right.
    """
    align = align or ["left"] + ["right"] * (len(header) - 1)
    if len(align) != len(header):
        raise ValueError(f"{len(align)} alignments for {len(header)} columns")
    lines = [_table_line(header), "|" + "|".join(ALIGN_MARKS.get(mark, mark) for mark in align) + "|"]
    return "\n".join(lines + [_table_line(row) for row in rows])


def _table_line(cells):
    return "| " + " | ".join(str(cell) for cell in cells) + " |"
