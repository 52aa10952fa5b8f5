"""Database time as SQL: the one clock every machine agrees on (docs/design.md §1).

Times are stored as epoch seconds (double precision) produced by the database
itself, so arithmetic and comparisons are the same on every backend and no
machine's wall clock ever reaches a row.
"""

from typing import Any

from sqlalchemy import Float
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement


class db_now(FunctionElement[float]):
    """The database's current time, epoch seconds, sub-millisecond precision.

    PostgreSQL uses clock_timestamp() (now() is frozen at transaction start);
    SQLite uses julianday('now') (CURRENT_TIMESTAMP has whole seconds);
    SQL Server uses SYSUTCDATETIME().
    """

    type = Float(precision=53)
    inherit_cache = True
    name = "db_now"


@compiles(db_now, "postgresql")
def _pg(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_now, "sqlite")
def _sqlite(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


@compiles(db_now, "mssql")
def _mssql(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "(CAST(DATEDIFF_BIG(microsecond, '19700101', SYSUTCDATETIME()) AS FLOAT) / 1000000.0)"
