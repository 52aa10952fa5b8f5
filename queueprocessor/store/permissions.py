"""May this connection change the farm? Asked once when a Farm opens, and every refusal said the same way.

An operator may be given a database user that can only read (docs/operations.md
has the GRANTs): the app then shows everything with its actions disabled, and
the CLI answers a command that changes something with one line. The question is
asked of the database, not guessed from a failure, so the app can say it before
anyone clicks:

- PostgreSQL: has_table_privilege(INSERT, UPDATE, DELETE) on each of the farm's tables;
- SQL Server: HAS_PERMS_BY_NAME on the same;
- SQLite: a URL that opens the file read-only (mode=ro, immutable=1), or a file this
  process may not write.

A database without the farm's tables yet cannot be asked: it counts as writable,
and creating them fails like any other refused write. Whatever the answer, a
write the database refuses for want of a privilege (a GRANT taken away later, a
table left out) raises the same ReadOnly line rather than the driver's words.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import bindparam, event, text
from sqlalchemy.engine import URL, Engine, ExceptionContext

from ..rules.errors import ReadOnly
from . import schema

# What each dialect says when a privilege is missing (SQLSTATE, SQLite's error name, SQL Server's words).
_PG_DENIED = "42501"  # insufficient_privilege
_SQLITE_DENIED = "SQLITE_READONLY"
_MSSQL_DENIED = re.compile(r"permission was denied|\((?:229|230|262)\)")

# Both written out whole, as every statement is (tests/acceptance/test_security.py): the table names are bound.
_PG_ASK = text(
    "SELECT current_user, bool_and(has_table_privilege(c.oid, 'INSERT') AND has_table_privilege(c.oid, 'UPDATE') "
    "AND has_table_privilege(c.oid, 'DELETE')) "
    "FROM pg_class c WHERE c.oid IN (SELECT to_regclass(t) FROM unnest(CAST(:tables AS text[])) AS t)"
)
_MSSQL_ASK = text(
    "SELECT USER_NAME(), MIN("
    "HAS_PERMS_BY_NAME(QUOTENAME(SCHEMA_NAME()) + '.' + QUOTENAME(t.name), 'OBJECT', 'INSERT') "
    "* HAS_PERMS_BY_NAME(QUOTENAME(SCHEMA_NAME()) + '.' + QUOTENAME(t.name), 'OBJECT', 'UPDATE') "
    "* HAS_PERMS_BY_NAME(QUOTENAME(SCHEMA_NAME()) + '.' + QUOTENAME(t.name), 'OBJECT', 'DELETE')"
    ") FROM sys.tables t WHERE t.name IN :tables"
).bindparams(bindparam("tables", expanding=True))


@dataclass(frozen=True)
class Access:
    """What this connection may do: `user` (the database's name for it; None for SQLite), `where` (the SQLite
    file) and whether it `may_write`."""

    may_write: bool
    user: str | None = None
    where: str | None = None

    def refusal(self) -> ReadOnly:
        return ReadOnly(user=self.user, where=self.where)


def check(engine: Engine) -> Access:
    """Ask once what `engine`'s user may do, and from now on turn a refused write into that user's ReadOnly."""
    access = _ask(engine)
    event.listen(engine, "handle_error", lambda context: _refused(context, access))
    return access


def _ask(engine: Engine) -> Access:
    dialect, tables = engine.dialect.name, sorted(schema.metadata.tables)
    if dialect == "sqlite":
        return Access(may_write=sqlite_writable(engine.url), where=sqlite_path(engine.url))
    statement = _PG_ASK if dialect == "postgresql" else _MSSQL_ASK
    with engine.connect() as conn:
        user, allowed = conn.execute(statement, {"tables": tables}).one()
        conn.rollback()
    return Access(may_write=allowed is None or bool(allowed), user=user)  # None: no farm tables yet


def _refused(context: ExceptionContext, access: Access) -> None:
    error = context.original_exception
    if (
        getattr(error, "sqlstate", None) == _PG_DENIED
        or str(getattr(error, "sqlite_errorname", "")).startswith(_SQLITE_DENIED)
        or (context.dialect.name == "mssql" and _MSSQL_DENIED.search(str(error)))
    ):
        raise access.refusal() from None


def sqlite_path(url: URL) -> str | None:
    """The file a SQLite URL names (its path alone for a `file:` URI with `uri=true`); None in memory."""
    name = url.database
    if not name or name == ":memory:":
        return None
    if url.query.get("uri") == "true" and name.startswith("file:"):
        name = name.removeprefix("file:").split("?")[0]
    return name


def sqlite_writable(url: URL) -> bool:
    """False for a URL that opens the file read-only, or a file that this process may not write."""
    if url.query.get("uri") == "true" and (url.query.get("mode") == "ro" or url.query.get("immutable") == "1"):
        return False
    path = sqlite_path(url)
    return path is None or not Path(path).expanduser().exists() or os.access(Path(path).expanduser(), os.W_OK)
