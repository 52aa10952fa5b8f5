"""Errors in the command line's words: one line each, options named as flags, what was not found with the command
that lists what there is, a long input cut short, and a database failure said without SQLAlchemy's traceback."""

import os

import click

from ..nodeoptions import flag_of
from ..rules.errors import NotFound, QPError, echoed
from ..rules.urls import mask
from .context import Context

# Where to look for what was not found (errors.NotFound.what).
SEE = {
    "job": "see `queueprocessor jobs`",
    "machine": "see `queueprocessor status`",
    "schedule": "see `queueprocessor schedule list`",
    "queue": "see `queueprocessor queue list`",
    "singleton": "see `queueprocessor singleton list`",
    "farm": "or run `queueprocessor init-db`",
}


def in_cli_words(error: QPError) -> str:
    """The core words an error in the API's terms: here the inputs are options (--max-attempts for max_attempts),
    and what was not found comes with the command that lists what there is."""
    text = error.say(flag_of)
    if isinstance(error, NotFound) and error.what in SEE:
        text += (", " if error.what == "farm" else ": ") + SEE[error.what]
    return text


def qp_variables() -> list[str]:
    return [value for name, value in os.environ.items() if name.startswith("QP_")]


def cut_inputs(message: str, inputs: list[str]) -> str:
    """Click repeats a refused argument or QP_* value whole: cut each long one as every other error does."""
    for given in inputs:
        message = message.replace(repr(given), echoed(given)).replace(given, echoed(given, quote=False))
    return message


def database_failure(error: Exception, ctx: click.Context | None) -> str:
    """A database error in one line; anything else goes on up. SQLAlchemy is loaded here, on the way out: if it
    was not loaded before, the error is not its own."""
    from sqlalchemy import exc

    from ..store.database import describe_failure

    if isinstance(error, exc.DBAPIError):
        return str(describe_failure(error, ctx.obj.url if ctx is not None and isinstance(ctx.obj, Context) else ""))
    if isinstance(error, exc.SQLAlchemyError):
        return f"database problem: {mask(str(error).splitlines()[0])}"
    raise error
