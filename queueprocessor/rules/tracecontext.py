"""The W3C trace context a job keeps (docs/design.md §12): its `traceparent`, checked for form. Pure text: what
makes and reads spans is queueprocessor/tracing.py, with the `otel` extra."""

import re

from .errors import BadJobInput

# version 00, a trace id and a parent span id (neither all zeros), flags; lower-case hex (the W3C's own form).
TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}\Z")
FORM = "00-<32 hex trace id>-<16 hex span id>-<2 hex flags>"
TRACEPARENT_SAID = f"a traceparent is {FORM} (W3C Trace Context), or NULL for none"


def check_traceparent(text: str | None) -> str | None:
    """`text` as a job keeps it (lower case), or None for none (an empty one too, as an empty TRACEPARENT gives);
    a malformed one is refused in one line."""
    if text is None or not text.strip():
        return None
    said = text.strip().lower()
    if not TRACEPARENT.match(said):
        raise BadJobInput("{0} {value} is not a W3C traceparent: give " + FORM, "traceparent", value=text)
    return said
