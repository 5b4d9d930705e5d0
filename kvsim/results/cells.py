"""Cells of the CSV files kvsim writes, safe to open in a spreadsheet.

Text from a user (a policy name, a swept value from a points file) that starts with `=`, `+`, `-`,
`@`, a tab or a carriage return would run as a formula in Excel, LibreOffice or Google Sheets
(`=HYPERLINK(...)`, `@SUM(...)`); such a cell is written with a leading `'`, which spreadsheets show
as text (OWASP's advice for CSV injection); so is text that already starts with quotes before such a
character, so that `csv_value` reads every cell back as it was. Numbers are never text here, so a
negative number keeps its sign.
"""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _guarded(text: str) -> bool:
    return text.lstrip("'").startswith(FORMULA_STARTS)


def csv_cell(value):
    """`value`, with a leading `'` when it is text a spreadsheet would take for a formula."""
    return "'" + value if isinstance(value, str) and _guarded(value) else value


def csv_value(cell: str) -> str:
    """A text cell as kvsim wrote it, read back: the inverse of `csv_cell`."""
    return cell[1:] if cell.startswith("'") and _guarded(cell) else cell
