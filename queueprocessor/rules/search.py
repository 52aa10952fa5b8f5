"""Which jobs: the one filter shape the store, the API, the CLI and the app pick jobs by (a list's filter, a bulk
action's), and the grammar of its search expression (docs/cli.md#searching-jobs).

A search is terms separated by spaces, all of which a job must match:
`field=value` and `field.sub=value` (a value in its JSON payload), `queue:NAME`, `key:KEY` (its order key or its
unique key), and any other word: text its id, target, machine or last error contains, ignoring case. Double
quotes keep spaces in a term (city="New York"). A value matches the field stored as that string, or as the
number, true, false or null it spells: `n=12` matches {"n": 12} and {"n": "12"}. Text with none of these terms
is one piece of text, searched as typed.
"""

import json
import math
import re
from dataclasses import dataclass, fields
from enum import StrEnum

from .errors import InputError, QPError, echoed
from .queues import check_name
from .states import JobState

# A payload field's name: letters, digits, _ and -, the parts of a nested one joined by dots.
_PART = re.compile(r"[A-Za-z0-9_-]+\Z")
_PATHLIKE = re.compile(r"[A-Za-z0-9_.-]*\Z")
SEARCH_HELP = "field=value, field.sub=value, queue:NAME, key:KEY or plain text"

JsonScalar = str | int | float | bool | None


class BulkAction(StrEnum):
    """What a bulk action does to the jobs a filter picks (store/bulk.py)."""

    RETRY = "retry"
    CANCEL = "cancel"
    DELETE = "delete"


class BadSearch(InputError):
    """A search expression that says nothing this grammar knows."""


@dataclass(frozen=True)
class Terms:
    """A search expression, parsed: every part must match."""

    text: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    # (path, the JSON values it may hold): the value as a string, and what it spells if it spells a JSON scalar.
    fields: tuple[tuple[tuple[str, ...], tuple[JsonScalar, ...]], ...] = ()


@dataclass(frozen=True)
class JobFilter:
    """Which jobs: every field given must hold (an empty filter is every job). `older_than`: seconds since the job
    finished, or was enqueued if it has not; `ids`: these jobs only (the app's selection)."""

    state: str | None = None
    queue: str | None = None
    target: str | None = None
    older_than: float | None = None
    search: str | None = None
    ids: tuple[int, ...] = ()

    def is_empty(self) -> bool:
        return not any(getattr(self, f.name) not in (None, "", ()) for f in fields(self))

    def terms(self) -> Terms:
        """The search, parsed (BadSearch if it cannot be), with the other fields checked too."""
        if self.state is not None and self.state not in tuple(JobState):
            raise QPError(f"unknown job state {echoed(self.state)}: use one of {', '.join(JobState)}")
        if self.older_than is not None and not self.older_than >= 0:
            raise InputError.out_of("older_than", self.older_than, "0 or more seconds")
        if self.queue is not None:
            check_name(self.queue)
        return parse_search(self.search or "")

    def describe(self) -> str:
        """The filter in words, for a confirmation or a log line: "state=failed queue=reports"."""
        said = [f"{f.name}={getattr(self, f.name)}" for f in fields(self) if f.name not in ("search", "ids")]
        said = [part for part in said if not part.endswith("=None")]
        if self.search:
            said.append(f"search={self.search!r}")
        if self.ids:
            said.append(f"{len(self.ids)} selected")
        return " ".join(said) or "every job"


def parse_search(expression: str) -> Terms:
    """The terms of a search expression, or BadSearch naming the term it could not read. Text with no term of
    this grammar in it is searched as typed, spaces, quotes and all (as the text search always was)."""
    if not any(_special(word) for word in expression.split()):
        return Terms(text=(expression.strip(),) if expression.strip() else ())
    text: list[str] = []
    queues: list[str] = []
    keys: list[str] = []
    found: list[tuple[tuple[str, ...], tuple[JsonScalar, ...]]] = []
    for term in _split(expression):
        if term.startswith("queue:"):
            queues.append(_queue(term))
        elif term.startswith("key:"):
            keys.append(_after(term, "key:"))
        elif _special(term):
            found.append(_field(term))
        else:
            text.append(term)
    return Terms(tuple(text), tuple(queues), tuple(keys), tuple(found))


def _special(word: str) -> bool:
    """Whether `word` (as split at spaces) is a term of this grammar rather than plain text."""
    return word.startswith(("queue:", "key:")) or ("=" in word and bool(_PATHLIKE.match(word.partition("=")[0])))


def _split(expression: str) -> list[str]:
    """Terms split at spaces; a double-quoted stretch keeps its spaces (the quotes go)."""
    if expression.count('"') % 2:
        raise _bad(expression, 'a double quote is not closed: put the other " after the quoted text')
    terms, quoted = [""], False
    for char in expression:
        if char == '"':
            quoted = not quoted
        elif char.isspace() and not quoted:
            terms.append("")
        else:
            terms[-1] += char
    return [term for term in terms if term]


def _queue(term: str) -> str:
    try:
        return check_name(_after(term, "queue:"))
    except BadSearch:
        raise
    except QPError as error:
        raise _bad(term, str(error)) from None


def _after(term: str, prefix: str) -> str:
    value = term[len(prefix) :]
    if not value:
        raise _bad(term, f"give a name after {prefix}")
    return value


def _field(term: str) -> tuple[tuple[str, ...], tuple[JsonScalar, ...]]:
    name, _, value = term.partition("=")
    path = tuple(name.split("."))
    if not all(_PART.match(part) for part in path):
        raise _bad(term, "a field is letters, digits, _ or -, and a nested one joins its parts by dots (a.b=1)")
    if not value:
        raise _bad(term, f"give a value after {name}=")
    return path, spelt(value)


def spelt(value: str) -> tuple[JsonScalar, ...]:
    """The JSON values `value` matches: itself as a string, and the scalar it spells (12, 1.5, true, null)."""
    try:
        scalar = json.loads(value)
    except ValueError:
        return (value,)
    if isinstance(scalar, (dict, list, str)) or (isinstance(scalar, float) and not math.isfinite(scalar)):
        return (value,)
    return (value, scalar)


def _bad(term: str, why: str) -> BadSearch:
    return BadSearch(
        "{0} term {value} is not understood: {part}; a search is {limit}",
        "search",
        value=term,
        limit=SEARCH_HELP,
        part=why,
    )
