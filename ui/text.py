"""How times, durations and offsets read in the app (database time shown in the local time zone)."""

from datetime import datetime

from queueprocessor.rules.output import dated


def local(epoch: float) -> datetime | None:
    """A database time as a local datetime; None for one no calendar holds (year 10000, say, written by SQL)."""
    try:
        return datetime.fromtimestamp(epoch)
    except (ValueError, OverflowError, OSError):
        return None


def raw(epoch: float) -> str:
    """A time no calendar holds, as the epoch seconds it is stored as."""
    return f"epoch {epoch:.3f} s"


def clock(epoch: float | None, millis: bool = True) -> str:
    """Time of day for today's times; other days with their date (to the second)."""
    return _when(epoch, "milliseconds" if millis else "seconds", "seconds")


def stamp(epoch: float | None) -> str:
    """Time to the millisecond, for details panes, with the date unless it is today."""
    return _when(epoch, "milliseconds", "milliseconds")


def _when(epoch: float | None, today: str, other_days: str) -> str:
    """A time of today as the time of day, of another day with its date, each to its isoformat timespec
    (cut, not rounded); a time no calendar holds as epoch seconds."""
    if epoch is None:
        return "–"
    shown = local(epoch)
    if shown is None:
        return raw(epoch)
    if shown.date() != datetime.now().date():
        return dated(shown, other_days)
    return shown.time().isoformat(today)


def ms(seconds: float | None, signed: bool = False) -> str:
    if seconds is None:
        return "–"
    value = seconds * 1000
    if abs(value) >= 10_000:
        return f"{seconds:+.1f} s" if signed else f"{seconds:.1f} s"
    return f"{value:+.1f} ms" if signed else f"{value:.1f} ms"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def ago(seconds: float) -> str:
    return "just now" if seconds < 0.05 else f"{duration(seconds)} ago"
