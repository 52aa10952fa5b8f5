"""Printing for the CLI: aligned tables for people, stable JSON for programs."""

import json
import math
from datetime import UTC, datetime
from typing import Any

import click


def format_time(epoch: float | None) -> str:
    """Database time (epoch seconds, UTC) as a readable UTC timestamp with milliseconds; a time no date can
    show (a row written by SQL, years past 9999) as its epoch seconds."""
    if epoch is None or (isinstance(epoch, float) and math.isnan(epoch)):
        return "-"
    try:
        return dated(datetime.fromtimestamp(epoch, UTC), "milliseconds")
    except (OverflowError, OSError, ValueError):
        return f"{epoch:g}"


def dated(shown: datetime, timespec: str) -> str:
    """Date and time, to `timespec` (isoformat's); isoformat, not strftime, whose %Y leaves years before 1000
    unpadded on glibc ("999-12-31")."""
    return shown.replace(tzinfo=None).isoformat(" ", timespec)


def machine_label(name: str | None, machine_id: int | None) -> str:
    """A machine as operators know it: by name, with the id that tells two of the same name apart."""
    return "-" if machine_id is None else f"{name} ({machine_id})"


def print_json(document: object) -> None:
    """Keys sorted, times kept as epoch seconds (database time): stable across versions and locales."""
    click.echo(json.dumps(document, sort_keys=True, indent=2, default=str))


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if n == 0:
            click.echo("  ".join("-" * width for width in widths))
    if not rows:
        click.echo("(none)")


def progress_text(fraction: float | None, message: str | None) -> str:
    """A run's progress as people read it: "42% row 420 of 1000"; "-" for a run that reported none."""
    if fraction is None:
        return "-"
    return f"{fraction:.0%} {message}" if message else f"{fraction:.0%}"
