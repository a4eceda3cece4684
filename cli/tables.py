"""Summary tables that stay readable on an 80-column terminal.

Name columns (agent specs, buyer groups) are as wide as their longest name and never cut; value columns are at
least as wide as their longest word and wrap at spaces rather than end in an ellipsis, so headers wrap first.
When even that does not fit the terminal, the columns a command marks optional are left out, in its order,
rather than letting the terminal crop the table. Light borders leave the width to the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.table import Table
from rich.text import Text

GAP = 2
"""Characters between two columns (one of padding, one of the borderless box's separator)."""


@dataclass(frozen=True)
class Layout:
    """Headers and rows of cells (strings); the first ``names`` columns hold names."""

    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    names: int = 1

    @classmethod
    def of(cls, headers: Sequence[str], rows: Sequence[Sequence[str]], names: int = 1) -> Layout:
        return cls(tuple(headers), tuple(tuple(r) for r in rows), names)

    def least_widths(self) -> list[int]:
        """Per column, the width below which it would have to cut a name or a word."""
        out = []
        for i, header in enumerate(self.headers):
            texts = [header, *(row[i] for row in self.rows)]
            if i < self.names:
                out.append(max(len(t) for t in texts))
            else:
                out.append(max(len(word) for t in texts for word in [*t.split(), ""]))
        return out

    def least_width(self) -> int:
        widths = self.least_widths()
        return sum(widths) + GAP * len(widths)

    def fit(self, width: int, optional: Sequence[str] = ()) -> Layout:
        """This layout without the ``optional`` columns (dropped in that order) that would not fit ``width``."""
        layout = self
        for header in optional:
            if layout.least_width() <= width or header not in layout.headers:
                continue
            i = layout.headers.index(header)
            layout = Layout(
                layout.headers[:i] + layout.headers[i + 1 :],
                tuple(row[:i] + row[i + 1 :] for row in layout.rows),
                layout.names - (i < layout.names),
            )
        return layout

    def table(self, title: str, indices: Sequence[int] | None = None, **options: object) -> Table:
        """A table with a header rule and no borders, its columns sized for all of this layout's rows, holding the
        rows at ``indices`` (default: all; a subset prints several tables with the same column widths). Cells and title
        are printed as they are (a spec or a name may hold square brackets, which rich would read as markup)."""
        heading = Text(title, style="table.title")
        table = Table(title=heading, box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0), **options)  # type: ignore[arg-type]
        for i, (header, least) in enumerate(zip(self.headers, self.least_widths(), strict=True)):
            if i < self.names:
                table.add_column(header, justify="left", no_wrap=True, min_width=least)
                continue
            most = max(len(t) for t in [header, *(row[i] for row in self.rows)])
            # a column that cannot get narrower is marked unwrappable, so that rich takes the width it needs from
            # the columns that can (rich would otherwise narrow it, then widen it back past the terminal)
            table.add_column(header, justify="right", overflow="fold", min_width=least, no_wrap=least == most)
        for i in range(len(self.rows)) if indices is None else indices:
            table.add_row(*map(Text, self.rows[i]))
        return table
