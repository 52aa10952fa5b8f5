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


def json_text(dialect: str, document: Any, field: Any, valid: bool = False) -> Any:
    """Top-level `field` of JSON text `document` as text, NULL if it has none or is not JSON (`valid`: it is, by
    construction): PostgreSQL's ->> (of the farm's qp_payload_json, which makes text that is not JSON NULL: a cast
    would fail, at planning already for a bound value), SQLite's json_extract, SQL Server's JSON_VALUE."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import JSONB  # PostgreSQL's own: loaded only by a farm on it

        parsed = cast(document, JSONB) if valid else func.qp_payload_json(document, type_=JSONB)
        return parsed.op("->>")(field)
    path = literal("$.", String) + field
    if dialect == "mssql":
        return case((func.isjson(document) > 0, func.json_value(document, path)), else_=None)
    return case((func.json_valid(document) == 1, cast(func.json_extract(document, path), String)), else_=None)


def among(dialect: str, column: Any, name: str) -> Any:
    """`column` is one of the names in list parameter `name` (PostgreSQL: one array, so one statement text
    whatever the list's length)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import ARRAY  # PostgreSQL's own: loaded only by a farm on it

        return column == any_(cast(bindparam(name), ARRAY(String)))
    return column.in_(bindparam(name, expanding=True))
