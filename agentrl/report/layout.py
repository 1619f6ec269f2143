"""Terminal tables that fit the console's width without losing a column.

A table wider than the terminal is split by columns into several tables, each repeating the identifying
(key) columns, so a number is never shown without the row it belongs to, and a number is never cut or
wrapped. Only the key columns fold, up to a share of the width. Headers wrap between words. The full
tables are in the markdown and CSV files; this is only how they are printed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: a key column never takes more than this share of the width while other columns wait to be shown
KEY_SHARE = 0.4
#: ... and never folds narrower than this
KEY_MIN = 16
#: the width a folded text column (overrides, reasons) takes
FOLD_WIDTH = 30


def _text_width(text: str) -> int:
    return max((len(line) for line in text.split("\n")), default=0)


def _header_words(text: str) -> list[str]:
    """A header's unbreakable pieces: words, and the parts of a snake_case name after each `_`."""
    return [piece for word in text.split() for piece in re.findall(r"[^_]*_|[^_]+", word)]


def _word_width(text: str) -> int:
    return max((len(word) for word in _header_words(text)), default=0)


def wrap_header(text: str, width: int) -> str:
    """`text` on lines of at most `width` (a longer piece alone on its line), broken between words or
    after a `_`."""
    lines: list[str] = []
    for word in text.split():
        for k, piece in enumerate(re.findall(r"[^_]*_|[^_]+", word)):
            joiner = "" if k else " "
            if lines and len(lines[-1]) + len(joiner) + len(piece) <= width:
                lines[-1] += joiner + piece
            else:
                lines.append(piece)
    return "\n".join(lines)


def column_width(header: str, cells: Sequence[str]) -> int:
    """A non-key column's width: its widest cell, or its header's longest word when wider."""
    return max([_word_width(header), *(_text_width(c) for c in cells)])


def _table_width(widths: Sequence[int]) -> int:
    """Rendered width of a `box.SIMPLE` table with `pad_edge=False`: an edge each side, and between two
    columns a separator with a padding space each side of it."""
    return sum(widths) + 3 * len(widths) - 1


def split_columns(
    widths: Sequence[int], width: int, keys: int = 1, together: Sequence[Sequence[int]] = ()
) -> list[list[int]]:
    """Column indices per printed table: every table starts with the `keys` key columns, then as many
    of the other columns (in order, each `together` block as a whole) as fit in `width`; a block that
    fits nowhere gets a table of its own."""
    blocks: list[list[int]] = []
    grouped = {i: list(block) for block in together for i in block}
    seen: set[int] = set()
    for i in range(keys, len(widths)):
        if i in seen:
            continue
        block = grouped.get(i, [i])
        seen.update(block)
        blocks.append(block)
    key_cols = list(range(keys))
    tables: list[list[int]] = []
    current: list[int] = []
    for block in blocks:
        candidate = key_cols + current + block
        if current and _table_width([widths[i] for i in candidate]) > width:
            tables.append(key_cols + current)
            current = []
        current += block
    if current or not tables:
        tables.append(key_cols + current)
    return tables


def print_fitted(
    console: Any,
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    keys: int = 1,
    together: Sequence[Sequence[int]] = (),
    right: Sequence[int] = (),
    fold: Sequence[int] = (),
    show_lines: bool = False,
) -> None:
    """Print `rows` under `headers` as one table, or as several when they do not fit `console.width`
    (`split_columns`): the first `keys` columns (they identify a row) repeat in every table and fold;
    every other column keeps its cells whole, except the text columns in `fold` (folded at
    `FOLD_WIDTH`). `right`: indices of right-justified columns."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    n = len(headers)
    natural = [column_width(headers[i], [r[i] for r in rows]) for i in range(n)]
    # a key column's header, and a text column's up to FOLD_WIDTH, stay on one line when there is room
    natural = [max(w, len(headers[i])) if i < keys else w for i, w in enumerate(natural)]
    natural = [max(w, min(len(headers[i]), FOLD_WIDTH)) if i in fold else w for i, w in enumerate(natural)]
    budget = max(KEY_MIN, int(console.width * KEY_SHARE) // max(1, keys))
    widths = [min(w, max(budget, _word_width(headers[i]))) if i < keys else w for i, w in enumerate(natural)]
    widths = [
        min(w, max(FOLD_WIDTH, _word_width(headers[i]))) if i in fold else w for i, w in enumerate(widths)
    ]
    # the key columns may use what the others leave over (a narrow table folds its keys less)
    parts = split_columns(widths, console.width, keys, together)
    for k, columns in enumerate(parts):
        spare = console.width - _table_width([widths[i] for i in columns])
        suffix = f" ({k + 1}/{len(parts)})" if len(parts) > 1 else ""
        table = Table(
            title=escape(title + suffix),
            title_justify="left",
            box=box.SIMPLE,
            show_lines=show_lines,
            pad_edge=False,
        )
        shown = dict.fromkeys(columns)
        for i in columns:  # a header the spare width can hold on one line is not wrapped
            grow = len(headers[i]) - widths[i]
            if i >= keys and i not in fold and 0 < grow <= spare:
                shown[i], spare = grow, spare - grow
        for i in (i for i in columns if i in fold):  # then folded text unfolds as far as it can
            shown[i] = max(0, min(natural[i] - widths[i], spare))
            spare -= shown[i]
        for i in columns:
            if i < keys:
                extra = max(0, spare) // keys
                table.add_column(
                    escape(headers[i]), overflow="fold", max_width=min(natural[i], widths[i] + extra)
                )
            elif i in fold:
                table.add_column(escape(headers[i]), overflow="fold", max_width=widths[i] + shown[i])
            else:
                table.add_column(
                    escape(wrap_header(headers[i], widths[i] + (shown[i] or 0))),
                    justify="right" if i in right else "left",
                    no_wrap=True,
                )
        for row in rows:
            table.add_row(*(escape(row[i]) for i in columns))
        console.print(table)


def print_paths(console: Any, lead: str, paths: Sequence[Path | str]) -> None:
    """`lead` and then one path per line, never cut or folded (soft wrap: a terminal wraps a long line
    itself and a copied path stays one line)."""
    console.print(lead, markup=False, highlight=False, soft_wrap=True)
    for path in paths:
        console.print(f"  {path}", markup=False, highlight=False, soft_wrap=True)
