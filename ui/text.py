"""How times, durations and offsets read in the app (database time shown in the local time zone)."""

from datetime import datetime

from queueprocessor.output import dated


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
    """Time of day for today's times; other days with their date; out-of-calendar times as epoch seconds."""
    if epoch is None:
        return "–"
    shown = local(epoch)
    if shown is None:
        return raw(epoch)
    if shown.date() != datetime.now().date():
        return dated(shown, "seconds")
    text = shown.strftime("%H:%M:%S.%f")
    return text[:-3] if millis else text[:-7]


def stamp(epoch: float | None) -> str:
    """Time to the millisecond, for details panes, with the date unless it is today."""
    if epoch is None:
        return "–"
    shown = local(epoch)
    if shown is None:
        return raw(epoch)
    if shown.date() == datetime.now().date():
        return shown.strftime("%H:%M:%S.%f")[:-3]
    return dated(shown, "milliseconds")


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
