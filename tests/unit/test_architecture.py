"""The layers hold, and a tool proves it (the import-linter contracts in pyproject.toml): the core stands in
layers (rules, store, executors, node, then its face), its rules are pure, it is Qt-free, and the CLI and the app
reach the farm only through what it exports for them, never its store, a node's insides or SQL. Imports made for
type hints alone count as much as the others (a circle of them still ties two modules into one piece to read), and no
two modules import each other, however far round. And no part grows past what one reader holds in mind: no module
over 600 lines, no class over 400, no function over 80."""

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 600, 400, 80


def test_the_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is part of the test extra"
    done = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 kept, 0 broken" in done.stdout


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The groups of modules that import one another, directly or round a longer loop (Tarjan's strongly connected
    components of more than one module, or of one that imports itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(group) > 1 or module in graph.find_modules_directly_imported_by(module):
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_modules_import_one_another_however_far_round():
    loops = circles(grimp.build_graph("queueprocessor", "ui"))  # type-checking and late imports included
    assert not loops, "modules that import one another read as one piece; give the shared part its own module:\n" + (
        "\n".join(" <-> ".join(group) for group in loops)
    )


def test_a_circle_is_seen_however_far_round(tmp_path, monkeypatch):
    for name, imports in {"a": "from . import b", "b": "from . import c", "c": "from . import a", "d": ""}.items():
        (tmp_path / "loop").mkdir(exist_ok=True)
        (tmp_path / "loop" / f"{name}.py").write_text(imports + "\n")
    (tmp_path / "loop" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert circles(grimp.build_graph("loop", cache_dir=None)) == [["loop.a", "loop.b", "loop.c"]]


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


def test_no_module_is_over_600_lines():
    long = [
        f"{path.relative_to(ROOT)}: {lines} lines"
        for package in ("queueprocessor", "ui")
        for path in sorted((ROOT / package).rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE
    ]
    assert not long, f"over {MAX_MODULE} lines; split by subject:\n" + "\n".join(long)


def test_no_class_is_over_400_lines_and_no_function_over_80():
    offenders = [
        line
        for package in ("queueprocessor", "ui")
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in oversized(path)
    ]
    assert not offenders, "too long to read as one piece; split by what each part does:\n" + "\n".join(offenders)


def test_every_package_of_the_tree_is_in_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for package in ("queueprocessor", "ui")
        for init in (ROOT / package).rglob("__init__.py")
    }
    assert found <= listed, f"an installed copy would miss {sorted(found - listed)}: list them in pyproject.toml"
