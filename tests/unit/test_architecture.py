"""The layers hold, and a tool proves it (the import-linter contracts in pyproject.toml): the core stands in
layers (rules, store, executors, node, then its face), its rules are pure, it is Qt-free, and the CLI and the app
reach the farm only through what it exports for them, never its store, a node's insides or SQL."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is part of the test extra"
    done = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 kept, 0 broken" in done.stdout
