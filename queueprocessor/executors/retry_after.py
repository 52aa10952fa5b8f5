"""Reading a throttled target's Retry-After (RFC 9110 §10.2.3) as a delay in seconds, without the database's clock.

The header is either delay-seconds (`120`: digits only) or an HTTP-date (`Wed, 21 Oct 2015 07:28:00 GMT`, or one
of the two obsolete forms every recipient must read). A date is turned into a delay against the answer's own `Date`
header when it has one that can be read (the target's clock against itself: no skew between its clock and ours),
else against this machine's clock; a date already past is a delay of 0. Anything else cannot be read: the caller
fails the run as an ordinary failure, since a guess could hammer a target that asked for a pause, or idle for
nothing. The cap on one snooze is the Snooze's own (executors.base.Snooze)."""

from datetime import UTC
from email.utils import parsedate_to_datetime

THROTTLED = (429, 503)  # Too Many Requests, Service Unavailable: the answers whose Retry-After snoozes a job


def http_date(text: str) -> float | None:
    """An HTTP-date as epoch seconds (a date without a zone is GMT, as RFC 9110 says every HTTP-date is); None if
    `text` is not one."""
    try:
        when = parsedate_to_datetime(text.strip())
    except (TypeError, ValueError, IndexError):
        return None
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()


def retry_after(value: str | None, date: str | None, now: float) -> float | None:
    """The delay a Retry-After header `value` asks for, in seconds (from 0; the Snooze caps it); None if there is no
    header or it cannot be read. `date`: the answer's Date header, if any; `now`: this machine's clock (epoch
    seconds), used for a date when the answer has no readable Date."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(text)
    when = http_date(text)
    if when is None:
        return None
    sent = http_date(date) if date is not None else None
    return max(0.0, when - (now if sent is None else sent))
