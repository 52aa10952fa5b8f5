"""The bench harness (bench/common.py `farm`): every bench script goes through it, and it leaves nothing behind.

Each script under bench/ imports the harness (`farm`, or `postgres` for a server several farms share), or says in
one line, `NO_HARNESS = "..."`, why it sets up nothing. The harness itself is tried on a SQLite farm with one real
node process: it starts, joins, and is gone once the block ends, by an exception as well as normally.
"""

import ast
import os
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
HARNESS = {"farm", "postgres"}
NOT_SCRIPTS = {"common.py", "jobs.py"}  # the harness itself; the job functions the benchmarks' nodes run


def scripts() -> list[Path]:
    found = sorted(p for p in BENCH.glob("*.py") if p.name not in NOT_SCRIPTS)
    found += sorted(p for p in BENCH.glob("*/__main__.py"))
    return found


def imports_harness(path: Path) -> bool:
    """Whether `path`, or its package's modules, import farm or postgres from common."""
    files = sorted(path.parent.glob("*.py")) if path.name == "__main__.py" else [path]
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "common":
                if HARNESS & {alias.name for alias in node.names}:
                    return True
    return False


def says_why_not(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "NO_HARNESS" for t in node.targets)
        and isinstance(node.value, ast.Constant)
        and node.value.value.strip()
        for node in tree.body
    )


def test_there_are_bench_scripts():
    assert len(scripts()) >= 24


@pytest.mark.parametrize("path", scripts(), ids=lambda p: str(p.relative_to(BENCH)))
def test_every_bench_script_uses_the_harness_or_says_why_not(path):
    assert imports_harness(path) or says_why_not(path), (
        f"{path.relative_to(BENCH.parent)} neither imports the harness (from common import farm) nor says why it "
        "needs none (NO_HARNESS = '...')"
    )


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def common(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import common

    return common


def test_a_sqlite_farm_with_one_node_starts_and_is_torn_down(common):
    with common.farm(1, backend="sqlite", settings={}) as run:
        [node] = run.nodes
        run.wait_joined(1, timeout=30)
        assert node.alive()
        folder = Path(run.url.removeprefix("sqlite:///")).parent
        assert folder.exists()
        pid = node.pid
    assert gone(pid)
    assert not folder.exists()
    assert node.process.returncode is not None


def test_the_harness_tears_down_on_an_exception(common):
    pids = []
    with pytest.raises(KeyboardInterrupt), common.farm(1, backend="sqlite") as run:
        pids.append(run.nodes[0].pid)
        raise KeyboardInterrupt
    assert pids and all(gone(pid) for pid in pids)


def test_node_options_become_the_clis_flags(common):
    assert common.node_args(capacity=4, allow_module=["a", "b"], push=False, metrics_port=None) == (
        "--capacity",
        "4",
        "--allow-module",
        "a",
        "--allow-module",
        "b",
        "--no-push",
    )


def test_an_unknown_backend_is_refused_in_one_line(common):
    with pytest.raises(ValueError, match="backend must be"), common.farm(backend="oracle"):
        pass
