"""How commands report errors: ``error: ...`` lines, and the exit status of a command that plays negotiations (1 when
none of them succeeded, saying why; a warning with the count when only some failed).

What a command prints from outside nego (exception messages, scenario text, model replies, names, paths) is printed as
it is: rich reads a word in square brackets as markup, so unescaped ``add a [seller] table`` would print as ``add a
table`` and a stray ``[/bold]`` would raise instead of printing. :func:`plain` escapes a piece of it for a line that
also holds nego's own markup; table cells are :class:`rich.text.Text`, which rich never reads as markup."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    import polars as pl

SHOWN_MESSAGES = 3
MESSAGE_CHARS = 300


def plain(value: object) -> str:
    """``value`` as text that a rich markup string prints as it is."""
    return escape(str(value))


def print_error(console: Console, message: str, **print_options: Any) -> None:
    """``error: message`` in red, the message printed as it is (exception messages name TOML tables such as
    ``[seller]``). Soft-wrapped: a long path in it stays in one piece, so it can be copied, whatever the terminal's
    width."""
    console.print(f"[red]error:[/] {plain(message)}", soft_wrap=True, **print_options)


def error_messages(negotiations: pl.DataFrame) -> list[tuple[str, int]]:
    """Distinct error messages of the negotiations that ended in an error, most frequent first (then by text)."""
    import polars as pl

    failed = negotiations.filter(pl.col("end_reason") == "error")
    counts = failed.group_by(pl.col("error").fill_null("(no message)")).len()
    return [(m, n) for m, n in counts.sort(["len", "error"], descending=[True, False]).iter_rows()]


def exit_for_errors(negotiations: pl.DataFrame, console: Console, what: str = "negotiations") -> None:
    """Exit with status 1 if every one of ``negotiations`` (latest attempts) ended in an error, naming the first
    distinct messages with their counts; print a warning with the count if some did."""
    messages = error_messages(negotiations)
    failed, total = sum(n for _, n in messages), negotiations.height
    if not failed:
        return
    lines = [f"  {n} x {plain(_short(m))}" for m, n in messages[:SHOWN_MESSAGES]]
    if len(messages) > SHOWN_MESSAGES:
        lines.append(f"  ... and {len(messages) - SHOWN_MESSAGES} other message(s)")
    detail = "\n".join(lines)
    if failed == total:
        console.print(f"[red]error:[/] all {total} {plain(what)} ended in an error; nothing succeeded:\n{detail}")
        raise typer.Exit(1)
    console.print(
        f"[yellow]warning:[/] {failed} of {total} {plain(what)} ended in an error (rerun the same command to play them "
        f"again):\n{detail}"
    )


def _short(message: str) -> str:
    flat = " ".join(message.split())
    return flat if len(flat) <= MESSAGE_CHARS else flat[: MESSAGE_CHARS - 1] + "…"
