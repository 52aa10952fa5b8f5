"""A job's key on its own terms (docs/design.md §6): how long the job holds it (its scope), what a second enqueue of
the key does while it is held (on_conflict), and debounce, which moves the one waiting job of a key later with each
enqueue. Checked here, for form, before anything reaches the database; store/key_holds.py settles a conflict.

The scope is the holding job's own, stored on its row, so every later enqueue of the key agrees on whether it is
still held, whatever options that enqueue gives:
- kept (the default, NULL on the row): held while the job's row is kept, as keys always were;
- waiting: held until the job starts (while it is queued, or waits for its parents);
- unfinished: held until it ends;
- until a time: held until it ends and, if it succeeded, until that time (row: scope "until", hold the time);
- for a period: held until it ends and, if it succeeded, for that long after (row: scope "after", hold the seconds).
A job that failed for good or was cancelled gives a scoped key up as it ends: the work may be enqueued again.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from .errors import BadJobInput
from .limits import LATEST, MAX_WAIT


class KeyScope(StrEnum):
    """How long a job holds its key: the scope a user names (`key_scope`), and the two a window makes."""

    KEPT = "kept"
    WAITING = "waiting"
    UNFINISHED = "unfinished"
    UNTIL = "until"  # with key_until: the time
    AFTER = "after"  # with key_for: the seconds after success


class OnConflict(StrEnum):
    """What an enqueue does when its key is held by another job."""

    REJECT = "reject"  # refused, naming the holder (as always)
    EXISTING = "existing"  # the holder's id is returned; nothing is written
    REPLACE = "replace"  # a waiting holder takes the new payload and time, under its row's lock


NAMED = (KeyScope.KEPT, KeyScope.WAITING, KeyScope.UNFINISHED)  # the scopes `key_scope` may name


@dataclass(frozen=True)
class KeyTerms:
    """A job's key terms as its row and its enqueue take them: `scope` None is kept (nothing on the row)."""

    scope: str | None = None
    hold: float | None = None  # scope "until": the time; scope "after": the seconds
    on_conflict: str | None = None  # None: reject, or with debounce replace
    debounce: float | None = None
    max_delay: float | None = None

    @property
    def settles(self) -> str:
        """What a conflict with a job still holding the key does."""
        return self.on_conflict or (OnConflict.REPLACE if self.debounce is not None else OnConflict.REJECT)

    @property
    def alone(self) -> str | None:
        """The option that lets only an enqueue of one job carry these terms (a conflict's answer is one job):
        debounce or on_conflict; None if neither is given."""
        return "debounce" if self.debounce is not None else "on_conflict" if self.on_conflict is not None else None


def key_terms(
    key: str | None,
    *,
    key_scope: str | None = None,
    key_until: float | None = None,
    key_for: float | None = None,
    on_conflict: str | None = None,
    debounce: float | None = None,
    max_delay: float | None = None,
) -> KeyTerms:
    """The terms these options give, each checked, or BadJobInput saying what was wrong (None: not given)."""
    given = dict(
        key_scope=key_scope,
        key_until=key_until,
        key_for=key_for,
        on_conflict=on_conflict,
        debounce=debounce,
        max_delay=max_delay,
    )
    named = [name for name, value in given.items() if value is not None]
    if not named:
        return KeyTerms()
    if key is None:
        raise BadJobInput("{0} needs {1}: the key it is about", named[0], "key")
    if key_scope is not None and key_scope not in NAMED:
        raise BadJobInput.out_of("key_scope", key_scope, ", ".join(NAMED))
    if on_conflict is not None and on_conflict not in tuple(OnConflict):
        raise BadJobInput.out_of("on_conflict", on_conflict, ", ".join(OnConflict))
    scope, hold = _scope(key_scope, key_until, key_for)
    if debounce is not None:
        scope = _debounced(scope, on_conflict, debounce, max_delay)
    elif max_delay is not None:
        raise BadJobInput("{0} needs {1}: it bounds how far debounce moves the job", "max_delay", "debounce")
    return KeyTerms(scope, hold, on_conflict, debounce, max_delay)


def _scope(key_scope: str | None, key_until: float | None, key_for: float | None) -> tuple[str | None, float | None]:
    """The row's scope and hold: a window (until a time, for a period after success) holds the key while the job is
    unfinished, then for the window."""
    if key_until is not None and key_for is not None:
        raise BadJobInput("give {0} or {1}, not both", "key_until", "key_for")
    window = "key_until" if key_until is not None else "key_for" if key_for is not None else None
    if window is not None and key_scope not in (None, KeyScope.UNFINISHED):
        raise BadJobInput(
            "{0} holds the key until the job ends and then for its window: give no {1} with it", window, "key_scope"
        )
    if key_until is not None:
        if not 0 <= key_until <= LATEST:
            raise BadJobInput.out_of("key_until", key_until, "a time from 1970 to 9999")
        return KeyScope.UNTIL, float(key_until)
    if key_for is not None:
        if not (0 < key_for <= MAX_WAIT and math.isfinite(key_for)):
            raise BadJobInput.out_of("key_for", key_for, f"seconds after success, up to {MAX_WAIT:.0f}")
        return KeyScope.AFTER, float(key_for)
    return (None if key_scope in (None, KeyScope.KEPT) else key_scope), None


def _debounced(scope: str | None, on_conflict: str | None, debounce: float, max_delay: float | None) -> str:
    """Debounce moves the one job of its key that has not started: its key is held while waiting."""
    if scope not in (None, KeyScope.WAITING):
        raise BadJobInput(
            "{0} moves a job that has not started: its key is held while waiting; give no other {1}",
            "debounce",
            "key_scope",
        )
    if on_conflict == OnConflict.REJECT:
        raise BadJobInput(
            "{0} moves the waiting job; {1} reject would refuse it: give replace (the last payload) or existing "
            "(the first)",
            "debounce",
            "on_conflict",
        )
    if not (0 < debounce <= MAX_WAIT and math.isfinite(debounce)):
        raise BadJobInput.out_of("debounce", debounce, f"a positive number of seconds up to {MAX_WAIT:.0f}")
    if max_delay is not None and not (debounce <= max_delay <= MAX_WAIT and math.isfinite(max_delay)):
        raise BadJobInput.out_of(
            "max_delay", max_delay, f"seconds from the debounce ({debounce:g}) up to {MAX_WAIT:.0f}"
        )
    return KeyScope.WAITING


def check_enqueue(terms: KeyTerms, *, count: int, delay: float, at: float | None) -> None:
    """Refuse what these terms cannot go with in one enqueue: copies (a conflict's answer is one job), or a time of
    its own beside debounce's."""
    if terms.alone and count != 1:
        raise BadJobInput("{0} answers an enqueue of one job: give no {1} with it", terms.alone, "count")
    if terms.debounce is not None and (delay or at is not None):
        raise BadJobInput(
            "{0} sets the job's time: give no {1} with it", "debounce", "at" if at is not None else "delay"
        )


def check_together(terms: Iterable[KeyTerms]) -> None:
    """Refuse on_conflict and debounce in jobs enqueued together (a workflow's steps, a group's members), which go in
    all or none: a conflict's answer is one job's."""
    for each in terms:
        if each.alone:
            raise BadJobInput(
                "{0} answers an enqueue of one job: give it to no step of a workflow or member of a group", each.alone
            )
