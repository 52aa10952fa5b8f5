"""The same SQL on every dialect: the smallest and largest of several values, and a name among a list (one
array on PostgreSQL)."""

import functools
from typing import Any

from sqlalchemy import String, any_, bindparam, case, cast, func, literal


def least(dialect: str, *values: Any) -> Any:
    """The smallest of `values`, none of them NULL: SQLite's many-argument min(), PostgreSQL's least(); SQL
    Server has least() only from 2022 on, so there nested CASEs, which 2017 and 2019 run too."""
    if dialect == "mssql":
        return functools.reduce(lambda a, b: case((a <= b, a), else_=b), values)
    return (func.min if dialect == "sqlite" else func.least)(*values)


def greatest(dialect: str, *values: Any) -> Any:
    """The largest of `values`, none of them NULL (see least)."""
    if dialect == "mssql":
        return functools.reduce(lambda a, b: case((a >= b, a), else_=b), values)
    return (func.max if dialect == "sqlite" else func.greatest)(*values)


def json_text(dialect: str, document: Any, field: Any) -> Any:
    """Top-level `field` of JSON text `document` as text (NULL if it has none): PostgreSQL's ->>, SQLite's
    json_extract, SQL Server's JSON_VALUE."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import JSONB  # PostgreSQL's own: loaded only by a farm on it

        return cast(document, JSONB).op("->>")(field)
    path = literal("$.", String) + field
    if dialect == "mssql":
        return func.json_value(document, path)
    return cast(func.json_extract(document, path), String)


def among(dialect: str, column: Any, name: str) -> Any:
    """`column` is one of the names in list parameter `name` (PostgreSQL: one array, so one statement text
    whatever the list's length)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import ARRAY  # PostgreSQL's own: loaded only by a farm on it

        return column == any_(cast(bindparam(name), ARRAY(String)))
    return column.in_(bindparam(name, expanding=True))
