"""The public API is listed once (`queueprocessor.__all__`) and docs/api.md shows all of it as the code has it:
every public name, the job options, and every public method of Farm with its signature and first sentence."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import queueprocessor

ROOT = Path(__file__).resolve().parents[2]


def api_doc():
    spec = importlib.util.spec_from_file_location("api_doc", ROOT / "scripts" / "api_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_api_md_is_in_step_with_the_code():
    doc = api_doc()
    assert doc.rewritten(doc.DOC.read_text()) == doc.DOC.read_text(), "run python scripts/api_doc.py"


def test_every_public_method_of_farm_is_on_the_page():
    from queueprocessor.farm import Farm

    page = (ROOT / "docs" / "api.md").read_text()
    public = [name for name in vars(Farm) if not name.startswith("_")]
    assert len(public) > 50
    assert [name for name in public if f"`farm.{name}" not in page] == []


def test_every_public_name_resolves_and_a_bare_import_loads_no_engine():
    done = subprocess.run(
        [sys.executable, "-c", "import sys, queueprocessor; print('sqlalchemy' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "False"
    for name in queueprocessor.__all__:
        assert getattr(queueprocessor, name) is not None
    assert len(set(queueprocessor.__all__)) == len(queueprocessor.__all__)


def test_what_a_type_checker_sees_is_the_public_list():
    """The imports under TYPE_CHECKING in queueprocessor/__init__.py name exactly `__all__` (but __version__)."""
    tree = ast.parse((ROOT / "queueprocessor" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    typed = [alias.asname or alias.name for node in block.body for alias in node.names]
    assert sorted(typed) == sorted(set(queueprocessor.__all__) - {"__version__"})
