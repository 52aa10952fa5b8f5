"""Named errors. Every error a user can cause says what was wrong and what to do."""


class QPError(Exception):
    """An error meant for a person: the message is one line, no traceback needed."""


class ConfigError(QPError):
    """Bad option, config file or environment variable."""


class DatabaseUnavailable(QPError):
    """The database cannot be reached or refused our credentials."""


class SchemaTooNew(QPError):
    """The database was created by a newer QueueProcessor than this one."""


class NotFound(QPError):
    """A job, machine or schedule named by the user does not exist."""


class InvalidJob(QPError):
    """A job definition (executor, target, payload) is not acceptable."""


class LostLease(QPError):
    """A guarded write matched no row: another machine owns the job now (the fence moved on)."""


class DuplicateKey(InvalidJob):
    """A job with this key already exists: the pair was grabbed (or the occurrence materialised) before."""

    def __init__(self, key: str | None):
        super().__init__(f"a job with key {key!r} already exists")
        self.key = key
