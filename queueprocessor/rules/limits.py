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
# A run may end by asking to be put back later without spending an attempt (a snooze: Retry-After, context.snooze,
# a command's exit code 75). One snooze waits at most SNOOZE_CAP seconds (a longer ask is cut, and its run's record
# says so); a job snoozes at most MAX_SNOOZES times (counted on its row, qp_jobs.snoozes): the next one is an ordinary
# failure. A constant, not a node option: the finish enforces it in the store, and two nodes of one farm must not
# judge the same job by different bounds. 50 snoozes of a minute is most of an hour of a target's refusals.
SNOOZE_CAP = 86400.0
MAX_SNOOZES = 50
