"""The console the commands print to: rich's, built when a command first prints, with what a terminal
can throw at it handled.

- `LazyConsole` is what a command's handler gets: `print`, `is_terminal`, `width` and `progress_bar`.
  Whatever hands a console to rich (a progress bar's Live display enters it as a context manager and
  redirects stderr through it) takes the real one, `.rich`; the lazy object never poses as a Console.
- Size: rich reads COLUMNS and LINES when they are digits, so `COLUMNS=0` prints nothing at all and a
  digit that is not ASCII (`²`) raises. A value that is not a positive decimal integer is left out, and
  the terminal's own size (or rich's 80 x 25) is used instead.
- Tables: a table whose words cannot fit the terminal's width is not squeezed into columns of `…`
  (rich's way): it is drawn transposed, one column per row, in as many tables as it takes.
- Control and bidirectional-override characters in anything printed (policy names...) are escaped.
"""

from __future__ import annotations

import os
import sys

from kvsim import guard

PIPE_WIDTH = 1000  # the console's width when stdout is not a terminal
DEFAULT_SIZE = (80, 25)  # rich's, for a terminal that does not say its size
UNLIMITED = 1_000_000  # the width a table is measured at for its own widest and narrowest forms


class LazyConsole:
    """The terminal's console (`safe_console`), built (and rich imported) when a command first prints: a
    quiet run needs neither."""

    def __init__(self, **options):
        self._options, self._console = options, None

    @property
    def rich(self):
        """The real rich Console (built on first use)."""
        if self._console is None:
            self._console = safe_console(**self._options)
        return self._console

    @property
    def is_terminal(self) -> bool:
        return self.rich.is_terminal

    @property
    def width(self) -> int:
        return self.rich.width

    def print(self, *objects, **options) -> None:
        """rich's print, with each table fitted to the width (`fit_table`)."""
        from rich.table import Table

        console = self.rich
        fitted = [part for obj in objects
                  for part in (fit_table(obj, console) if isinstance(obj, Table) else [obj])]
        console.print(*fitted, **options)

    def progress_bar(self):
        """A started transient rich progress bar drawing on this console (stop it when done)."""
        from rich.progress import Progress

        bar = Progress(console=self.rich, transient=True)
        bar.start()
        return bar


def safe_console(**options):
    """rich's Console with control and bidirectional-override characters in anything printed escaped."""
    from rich.console import Console

    class SafeConsole(Console):
        def _render_buffer(self, buffer):
            return super()._render_buffer(s if s.control else s._replace(text=guard.escape_terminal(s.text))
                                          for s in buffer)

        def on_broken_pipe(self):  # rich's own exits 1; the guard's ends quietly with 141
            raise BrokenPipeError(32, "Broken pipe")
    return SafeConsole(**options)


def stdout_console() -> LazyConsole:
    """The console for standard output: a terminal's size (`terminal_size_options`); pipes and logs: wide,
    no truncated table."""
    return LazyConsole(**terminal_size_options()) if sys.stdout.isatty() else LazyConsole(width=PIPE_WIDTH)


def terminal_size_options(environ=None) -> dict:
    """Console options replacing a COLUMNS or LINES that rich would misread: one that is set but not a
    positive decimal integer gives way to the terminal's own size. (Both are given: rich reads the
    environment again for a size it was not given.)"""
    environ = os.environ if environ is None else environ
    texts = [environ.get("COLUMNS"), environ.get("LINES")]
    given = [int(t) if t is not None and t.isascii() and t.isdigit() and int(t) > 0 else None for t in texts]
    if all(t is None or n is not None for t, n in zip(texts, given)):
        return {}
    own = _own_size()
    return {"width": given[0] or own[0], "height": given[1] or own[1]}


def _own_size() -> tuple[int, int]:
    """The terminal's size as the kernel reports it, or DEFAULT_SIZE (not a terminal, or a size of 0)."""
    for stream in (sys.__stdout__, sys.__stderr__, sys.__stdin__):
        try:
            columns, lines = os.get_terminal_size(stream.fileno())
        except (AttributeError, ValueError, OSError):
            continue
        return columns or DEFAULT_SIZE[0], lines or DEFAULT_SIZE[1]
    return DEFAULT_SIZE


def fit_table(table, console) -> list:
    """`table`, its columns sized so that no word is cut, if its words fit the console's width; else the
    table transposed (its first column's cells head one column each, its other columns' headers label the
    rows), as many of its rows per table as fit (one row's words too long for the terminal: folded)."""
    width = console.width
    if not table.columns or table.row_count == 0:
        return [table]
    sized = _sized(table, console, width)
    if sized is not None:
        return [sized]
    tables, rows = [], []
    for i in range(table.row_count):
        if rows and _sized(_transposed(table, rows + [i], title=not tables), console, width) is None:
            tables.append(_transposed(table, rows, title=not tables))
            rows = []
        rows.append(i)
    tables.append(_transposed(table, rows, title=not tables))
    return [_sized(t, console, width) or _folded(t) for t in tables]


def _sized(table, console, width: int):
    """`table` as it is if it fits `width` unwrapped; a copy with each column's width fixed between its
    longest word and its longest line if its words fit; else None. (rich's own narrowing shrinks the widest
    columns first, below their longest word, and cuts it with `…`.)"""
    import copy
    import dataclasses

    from rich.measure import Measurement
    from rich.padding import Padding

    options = console.options.update_width(UNLIMITED)
    _, right, _, left = Padding.unpack(table.padding)
    spans = []
    for column in table.columns:
        cells = ([column.header] if table.show_header else []) + list(column.cells)
        sizes = [Measurement.get(console, options, cell) for cell in cells] or [Measurement(1, 1)]
        low, high = max(m.minimum for m in sizes), max(m.maximum for m in sizes)
        if column.width is not None or column.no_wrap:
            low = high = column.width if column.width is not None else high
        spans.append((low, high))
    borders = (2 if table.box and table.show_edge else 0) + (len(spans) - 1 if table.box else 0)
    room = width - borders - len(spans) * (left + right)
    lows, highs = sum(lo for lo, _ in spans), sum(hi for _, hi in spans)
    if highs <= room:
        return table
    if lows > room:
        return None
    widths = [lo + (room - lows) * (hi - lo) // (highs - lows) for lo, hi in spans]
    for j in sorted(range(len(spans)), key=lambda j: spans[j][0] - spans[j][1]):  # what flooring left over
        if sum(widths) < room and widths[j] < spans[j][1]:
            widths[j] += 1
    out = copy.copy(table)
    out.columns = [dataclasses.replace(column, width=w) for column, w in zip(table.columns, widths)]
    return out


def _folded(table):
    """A copy of `table` whose words too long for their column go on over the next lines instead of ending
    in `…` (the last resort: a terminal too narrow for one row's words)."""
    import copy
    import dataclasses

    out = copy.copy(table)
    out.columns = [dataclasses.replace(column, overflow="fold") for column in table.columns]
    return out


def _transposed(table, rows: list[int], title: bool):
    """Rows `rows` of `table` as columns."""
    from rich.table import Table

    cells = [list(column.cells) for column in table.columns]
    out = Table(title=table.title if title else None, caption=table.caption if rows[-1] == table.row_count - 1
                else None, box=table.box)
    out.add_column(table.columns[0].header, justify="left")
    for i in rows:
        out.add_column(cells[0][i], justify="right", style=table.rows[i].style)
    for column, values in zip(table.columns[1:], cells[1:]):
        out.add_row(column.header, *(values[i] for i in rows))
    return out
