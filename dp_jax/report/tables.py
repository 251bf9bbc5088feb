"""Terminal tables that never cut a name or a value: a cell too long for its column folds onto
the next line instead of ending in an ellipsis (rich's default), and the key column is as wide
as its longest entry (up to KEY_WIDTH)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

KEY_WIDTH = 48  # the widest a key column grows before it folds too


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *,
          left: Iterable[str] = (), caption: str | None = None):
  """A rich Table of `rows` (cells shown with str()); the first column is the key: no cell of
  it is cut, and it is as wide as its longest entry up to KEY_WIDTH. `left`: the columns
  aligned left (the key always is), the rest right."""
  from rich.table import Table  # rich: only to print (its import is not free)

  rows = [[str(v) for v in r] for r in rows]
  left = {columns[0], *left}
  out = Table(title=title, caption=caption)
  key = max((len(r[0]) for r in rows), default=0)
  for i, c in enumerate(columns):
    out.add_column(c, justify="left" if c in left else "right", overflow="fold",
                   min_width=min(KEY_WIDTH, max(key, len(c))) if i == 0 else None)
  for r in rows:
    out.add_row(*r)
  return out
