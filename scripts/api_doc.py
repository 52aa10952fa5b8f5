"""Write the reference part of docs/api.md from the code: every public name of `queueprocessor.__all__` with its
home and first sentence, the options every kind of work takes (rules.job.JobOptions), and every public method of
`Farm` with its signature as written and its first sentence, grouped under the `# -- group --` comments of the
class. Only the marked block is replaced; the guide around it is kept.

    python scripts/api_doc.py          # rewrite the block
    python scripts/api_doc.py --check  # exit 1 if docs/api.md is out of step with the code

tests/unit/test_api_doc.py runs the check.
"""

import ast
import dataclasses
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import queueprocessor  # noqa: E402
from queueprocessor.rules.job import JobOptions, JobSpec  # noqa: E402

DOC = ROOT / "docs" / "api.md"
FARM = ROOT / "queueprocessor" / "farm.py"
BEGIN = "<!-- api:begin (written by scripts/api_doc.py: edit the code, then run it) -->"
END = "<!-- api:end -->"
GROUP = re.compile(r"^    # -- (.+?) -+$")
ABBREVIATIONS = ("e.g.", "i.e.")


def first_sentence(doc: str | None) -> str:
    """The docstring's first sentence, on one line."""
    text = " ".join((doc or "").strip().split("\n\n")[0].split())
    for match in re.finditer(r"\.(\s|$)", text):
        if not text[: match.end()].rstrip().endswith(ABBREVIATIONS):
            return text[: match.end()].strip()
    return text


def farm_groups() -> list[tuple[str, list[tuple[str, str]]]]:
    """Farm's public methods as (group, [(signature, first sentence)]), in the order the class has them."""
    source = FARM.read_text()
    lines = source.splitlines()
    farm = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Farm")
    groups: list[tuple[str, list[tuple[str, str]]]] = []
    for node in farm.body:
        if not isinstance(node, ast.FunctionDef) or (node.name.startswith("_") and node.name != "__init__"):
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        titles = [m.group(1) for line in lines[farm.lineno : first] if (m := GROUP.match(line))]
        if not groups or groups[-1][0] != titles[-1]:
            groups.append((titles[-1], []))
        groups[-1][1].append((signature(node, source), first_sentence(ast.get_docstring(node))))
    return groups


def signature(node: ast.FunctionDef, source: str) -> str:
    """The method's call as written in farm.py (without `self`), its annotations and defaults as the source has them."""
    if any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
        return f"farm.{node.name}"

    def written(tree: ast.expr) -> str:
        text = ast.get_source_segment(source, tree) or ast.unparse(tree)
        return text.strip("\"'") if isinstance(tree, ast.Constant) and isinstance(tree.value, str) else text

    def param(arg: ast.arg, default: ast.expr | None = None, star: str = "") -> str:
        text = star + arg.arg + (f": {written(arg.annotation)}" if arg.annotation else "")
        return text + (f" = {written(default)}" if default else "")

    args = node.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [param(arg, default) for arg, default in zip(positional, defaults, strict=True)][1:]  # not self
    if args.vararg:
        params.append(param(args.vararg, star="*"))
    elif args.kwonlyargs:
        params.append("*")
    params += [param(arg, default) for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg:
        params.append(param(args.kwarg, star="**"))
    returns = f" -> {written(node.returns)}" if node.returns else ""
    name = "Farm" if node.name == "__init__" else f"farm.{node.name}"
    return f"{name}({', '.join(params)}){'' if node.name == '__init__' else returns}"


def public_names() -> list[str]:
    rows = ["| name | from | what |", "| --- | --- | --- |"]
    for name in queueprocessor.__all__:
        value = getattr(queueprocessor, name)
        home = getattr(value, "__module__", "queueprocessor.version")
        doc = inspect.getdoc(value) if inspect.isclass(value) or callable(value) else "The installed version."
        what = first_sentence(doc).replace("|", r"\|")
        rows.append(f"| `{name}` | `{home}` | {what} |")
    return rows


def render() -> str:
    """The marked block, as the code says it now."""
    out = [
        BEGIN,
        "",
        "### Public names",
        "",
        "`from queueprocessor import NAME` for each of `queueprocessor.__all__`:",
        "",
    ]
    out += public_names()
    # A key's terms (key_scope, on_conflict, debounce...) are no field of JobSpec's: each defaults to None.
    defaults = {field.name: field.default for field in dataclasses.fields(JobSpec)}
    options = ", ".join(f"`{name}={defaults.get(name)!r}`" for name in JobOptions.__annotations__)
    out += ["", "### Job options: `**options: Unpack[JobOptions]`", ""]
    out += [f"Every kind of work takes the same options, with the same defaults (None: the default): {options}."]
    for title, methods in farm_groups():
        out += ["", f"### Farm: {title}", ""]
        out += [f"- `{sig}`: {line}" if line else f"- `{sig}`" for sig, line in methods]
    return "\n".join([*out, "", END])


def rewritten(text: str) -> str:
    """`text` with its marked block replaced by render() (appended, under its heading, if it has none yet)."""
    if BEGIN not in text:
        return text.rstrip("\n") + "\n\n## Every public name and Farm method\n\n" + render() + "\n"
    head, rest = text.split(BEGIN, 1)
    return head + render() + rest.split(END, 1)[1]


def main() -> int:
    text = DOC.read_text()
    if "--check" in sys.argv[1:]:
        if rewritten(text) != text:
            print("docs/api.md is out of step with the code: run python scripts/api_doc.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(rewritten(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
