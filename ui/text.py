"""How times, durations and offsets read in the app (database time shown in the local time zone)."""

from datetime import datetime


def clock(epoch: float | None, millis: bool = True) -> str:
    if epoch is None:
        return "–"
    text = datetime.fromtimestamp(epoch).strftime("%H:%M:%S.%f")
    return text[:-3] if millis else text[:-7]


def stamp(epoch: float | None) -> str:
    """Date and time to the millisecond, for details panes."""
    if epoch is None:
        return "–"
    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


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
