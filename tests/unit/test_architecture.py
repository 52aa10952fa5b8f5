"""The layers hold, and a tool proves it (the import-linter contracts in pyproject.toml): the core stands in
layers (rules, store, executors, node, then its face), its rules are pure, it is Qt-free, and the CLI and the app
reach the farm only through what it exports for them, never its store, a node's insides or SQL. And no part grows
past what one reader holds in mind: no class over 400 lines, no function over 80."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_CLASS, MAX_FUNCTION = 400, 80


def test_the_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is part of the test extra"
    done = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 kept, 0 broken" in done.stdout


def oversized(path: Path) -> list[str]:
    """Each class over MAX_CLASS lines and each function (or method) over MAX_FUNCTION in one module, as
    `path:line kind name: n lines`; a definition's lines run from its first decorator to its last line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ClassDef):
            kind, limit = "class", MAX_CLASS
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            kind, limit = "function", MAX_FUNCTION
        else:
            continue
        first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
        length = node.end_lineno - first + 1
        if length > limit:
            found.append(f"{path.relative_to(ROOT)}:{first} {kind} {node.name}: {length} lines (at most {limit})")
    return found


def test_no_class_is_over_400_lines_and_no_function_over_80():
    offenders = [
        line
        for package in ("queueprocessor", "ui")
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in oversized(path)
    ]
    assert not offenders, "too long to read as one piece; split by what each part does:\n" + "\n".join(offenders)
