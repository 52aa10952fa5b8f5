"""The kinds of work are named in one place, rules/kinds.py: every other reader takes them from its table, so adding
a kind is a row there (with its executor and its allow-list), not a hunt for the places that type out the others."""

import ast
from pathlib import Path

from queueprocessor.executors import AllowLists, make_executors
from queueprocessor.rules.kinds import KINDS
from queueprocessor.store.sqlfunctions import HINTS, mssql_procedure, postgresql_function

ROOT = Path(__file__).resolve().parents[2]
HOME = "queueprocessor/rules/kinds.py"
# Where the same letters mean something else, the one constant that spells them there, and what they mean.
OTHER_MEANINGS = {
    ("queueprocessor/rules/urls.py", "HTTP_SCHEMES"): "the URL schemes http and https",
    ("queueprocessor/fencing.py", "ASGI_HTTP"): "the ASGI scope type of an HTTP request",
}


def constants_of(tree: ast.Module, name: str) -> set[int]:
    """The ids of the string constants in the module-level assignment of `name`."""
    return {
        id(node)
        for statement in tree.body
        if isinstance(statement, ast.Assign) and any(getattr(t, "id", None) == name for t in statement.targets)
        for node in ast.walk(statement.value)
        if isinstance(node, ast.Constant)
    }


def test_no_kind_name_is_typed_out_outside_the_table():
    typed, named = [], set()
    for package in ("queueprocessor", "ui"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            if where == HOME:
                continue
            tree = ast.parse(path.read_text(), where)
            meant_otherwise: set[int] = set()
            for file, constant in OTHER_MEANINGS:
                if file == where and (found := constants_of(tree, constant)):
                    meant_otherwise |= found
                    named.add((file, constant))
            typed += [
                f"{where}:{node.lineno}: {node.value!r}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and node.value in KINDS and id(node) not in meant_otherwise
            ]
    assert typed == [], "take the kind from queueprocessor.rules.kinds (KINDS, HTTP.name...):\n" + "\n".join(typed)
    assert named == set(OTHER_MEANINGS), "an allowed other meaning is no longer where this test says"


def test_every_kind_has_an_executor_built_for_it():
    executors = make_executors(AllowLists())
    assert list(executors) == list(KINDS)
    assert all(executor.kind is KINDS[name] for name, executor in executors.items())


def test_every_kind_has_its_own_refusals_at_the_sql_door():
    postgresql, mssql = postgresql_function("public"), mssql_procedure()
    for kind in KINDS.values():
        assert HINTS[kind.name] == kind.hint
        assert kind.postgresql.refusals and kind.mssql.refusals
        assert postgresql.count(f"IF v_executor = '{kind.name}' AND ") == len(kind.postgresql.refusals)
        assert mssql.count(f"IF @executor = N'{kind.name}' AND ") == len(kind.mssql.refusals)
        assert f"'{kind.name}'" in postgresql.split("NOT IN (", 1)[1].split(")", 1)[0]
