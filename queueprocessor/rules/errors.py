"""Named errors. Every error a user can cause says what was wrong and what to do.

The core says it in the API's own terms (max_attempts, not --max-attempts) and carries the parts as fields, so
the CLI and the app can each say it in theirs: `say(name)` words the message with `name(keyword)` for each input
it is about, and NotFound says what was looked for, for a front end to add where to look.
"""

from collections.abc import Callable

# Characters of a user's input that an error repeats: enough to recognise it, and the message still fits a line.
ECHO_LIMIT = 60


def echoed(value: object, *, quote: bool = True) -> str:
    """A user's input as an error repeats it: repr() for text (unless `quote` is false), and anything longer than
    ECHO_LIMIT cut there and followed by its length, so a 5,000-character name does not bury the message in it."""
    if not isinstance(value, str):
        value, quote = str(value), False
    if len(value) <= ECHO_LIMIT:
        return repr(value) if quote else value
    start = value[:ECHO_LIMIT]
    return f"{start!r}... ({len(value)} characters)" if quote else f"{start}... ({len(value)} characters)"


class QPError(Exception):
    """An error meant for a person: the message is one line, no traceback needed."""

    def say(self, name: Callable[[str], str] = str) -> str:
        """The message, naming each input it is about as `name(keyword)` does (the CLI: --max-attempts)."""
        return str(self)


class InputError(QPError):
    """A value the caller gave is refused. Fields: `inputs`, the API keywords it is about (max_attempts; two for
    options that exclude each other); `value`, what was given; `limit`, what it must be ("from 1 to 10"); and
    `parts`, any other text the message shows. The template names them {0}, {1}..., {value}, {limit}, {part}:
    what comes from outside (a value, a driver's words) is a field, never part of the template."""

    def __init__(self, template: str, *inputs: str, value: object = None, limit: str | None = None, **parts: str):
        self.template, self.inputs, self.value, self.limit, self.parts = template, inputs, value, limit, parts
        super().__init__(self.say())

    def say(self, name: Callable[[str], str] = str) -> str:
        value = f"{self.value:g}" if isinstance(self.value, float) else echoed(self.value)
        return self.template.format(*map(name, self.inputs), value=value, limit=self.limit, **self.parts)

    @property
    def what(self) -> str | None:
        """The input it is about (the first, for options that exclude each other)."""
        return self.inputs[0] if self.inputs else None

    @classmethod
    def out_of(cls, what: str, value: object, limit: str) -> "InputError":
        """`what` must be `limit` (got `value`)."""
        return cls("{0} must be {limit} (got {value})", what, value=value, limit=limit)


class ConfigError(QPError):
    """Bad option, config file or environment variable."""


class DatabaseUnavailable(QPError):
    """The database cannot be reached or refused our credentials."""


class UnusableDatabase(InputError, DatabaseUnavailable):
    """DatabaseUnavailable, naming the database (`parts`: url, masked; reason) and, for a file, the input to change."""


class SchemaTooNew(QPError):
    """The database was created by a newer QueueProcessor than this one."""


class NotFound(QPError):
    """A job, machine, schedule, singleton or farm named by the user does not exist. Fields: `what` (that word)
    and `ref` (the id or name asked for)."""

    def __init__(self, message: str, *, what: str, ref: object = None):
        super().__init__(message)
        self.what, self.ref = what, ref


class InvalidJob(QPError):
    """A job definition (executor, target, payload) is not acceptable."""


class BadJobInput(InputError, InvalidJob):
    """An option of a job or schedule is refused (see InputError for its fields)."""


class BadQueueInput(InputError):
    """A queue name, order key, limit, rate or served-queue list is refused (see InputError for its fields)."""


class BadSetting(InputError, ConfigError):
    """A node's or the farm's setting is refused (see InputError for its fields)."""


class NotAllowed(InvalidJob):
    """Work outside a node's allow-lists, worded as its kind of work says (rules/kinds.py). Fields: `kind` (what the
    list holds: host, module or command), `value` (the refused one), `allowed` (the list), `option` (the Farm.node
    keyword that extends it), `target` (the job's, masked) and `where` (on this machine; on any live machine at an
    enqueuer's door check); `refusal`, the wording, a template of them, and `unlisted`, what it says of an empty
    list."""

    def __init__(
        self,
        kind: str,
        value: str,
        allowed: tuple[str, ...],
        option: str,
        *,
        refusal: str,
        unlisted: str = "",
        target: str | None = None,
        where: str = "on this machine",
    ):
        self.kind, self.value, self.allowed, self.option = kind, value, allowed, option
        self.refusal, self.unlisted, self.target, self.where = refusal, unlisted, target, where
        super().__init__(self.say())

    def elsewhere(self) -> "NotAllowed":
        """The same refusal by every live machine."""
        return NotAllowed(
            self.kind,
            self.value,
            self.allowed,
            self.option,
            refusal=self.refusal,
            unlisted=self.unlisted,
            target=self.target,
            where="on any live machine",
        )

    def say(self, name: Callable[[str], str] = str) -> str:
        option = name(self.option)
        return self.refusal.format(
            target=echoed(self.target),
            value=echoed(self.value),
            where=self.where,
            allowed=", ".join(self.allowed) or self.unlisted.format(option=option),
            option=option,
        )


class LostLease(QPError):
    """A guarded write matched no row: another machine owns the job now (the fence moved on)."""


class DuplicateKey(InvalidJob):
    """A job with this key already exists: the pair was grabbed (or the occurrence materialised) before."""

    def __init__(self, key: str | None):
        super().__init__(f"a job with key {echoed(key)} already exists")
        self.key = key


GRANTS = "docs/operations.md"  # where the GRANTs for an operator who may change the farm are written


class ReadOnly(QPError):
    """The database lets this user (or this SQLite file) only read the farm. Fields: `user` (the database's name
    for it; None for SQLite) and `where` (the SQLite file)."""

    def __init__(self, *, user: str | None = None, where: str | None = None):
        self.user, self.where = user, where
        if user is not None:
            super().__init__(
                f"the database user {echoed(user)} may only read: ask for a role with the GRANTs in {GRANTS}"
            )
        else:
            super().__init__(
                f"{where} may only be read here: open it without mode=ro, as a user who may write the file"
            )
