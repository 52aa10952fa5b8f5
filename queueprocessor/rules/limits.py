"""The bounds the farm puts on what it is given, in a module of their own: the API enforces them, and the CLI's
option types name them without loading the engine."""

MAX_PAYLOAD = 64 * 1024
MAX_INT = 2**31 - 1  # priorities and attempts are 32-bit integer columns
MAX_CAPACITY = 10_000  # jobs at once on one machine
MAX_MISSES = 1000
# A lease lasts `misses` heartbeats and our jobs are fenced off a margin before it ends: with 1, every job would be
# stopped between two heartbeats.
MIN_MISSES = 2
MAX_ATTEMPTS = 3  # the tries a job gets unless its enqueue says otherwise
# Work is for dates a person can read (years 1970 to 9999) and waits that make sense: a delay or an interval
# beyond ten years is a typo, and a time past 9999 cannot even be shown.
LATEST = 253402300799.0  # 9999-12-31 23:59:59 UTC
MAX_WAIT = 10 * 365.25 * 86400  # ten years, seconds
PROGRESS_NOTE = 200  # characters of a progress message kept (context.progress); the rest is cut off
