"""The docs a newcomer reads first stay short, none of their links point nowhere, and docs/design.md's map of the
house (its layers diagram and its tables of modules) is the house as the code has it."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(path: Path) -> str:
    return re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a link inside a code block is an example


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation dropped, spaces as hyphens,
    a repeated heading numbered."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.*)$", _prose(path), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_the_readme_is_at_most_200_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_every_relative_link_and_anchor_in_the_docs_resolves():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page)):
            if re.match(r"[a-z]+:", target):  # a web address: not this repository's to check
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links that point nowhere:\n" + "\n".join(broken)


DESIGN = ROOT / "docs" / "design.md"


def _section(heading: str) -> str:
    text = DESIGN.read_text()
    start = text.index(f"## {heading}\n")
    return text[start : text.index("\n## ", start + 1)]


def test_the_layers_diagram_is_the_layers_contract():
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contract if c["type"] == "layers" and c["containers"] == ["queueprocessor"]]
    diagram = re.search(r"```text\n(.*?)```", _section("The layers"), flags=re.S).group(1)
    floors = []
    for line in diagram.splitlines():
        names = re.split(r" {2,}", line.strip())[0]
        if names and not line.startswith(" " * 10) and "─" not in names and names != "ui/":
            floors.append(" | ".join(name.strip().rstrip("/") for name in names.split("|")))
    assert floors == [" | ".join(name.strip() for name in layer.split("|")) for layer in layers]


def test_every_module_of_the_core_has_its_row_in_design_md():
    section = _section("The modules")
    missing = []
    for path in sorted((ROOT / "queueprocessor").rglob("*.py")):
        folder = path.parent.relative_to(ROOT).as_posix()
        table = re.search(rf"\*\*(?:The face: )?`{re.escape(folder)}/`.*?\*\*\n(.*?)(?:\n\n|$)", section, flags=re.S)
        inside = path.parent.relative_to(ROOT / "queueprocessor").parts
        if table is None and inside:  # a subfolder of a floor's folder (cli/, store/sql/) has one row in its parent's
            if f"`{inside[-1]}/`" not in section:
                missing.append(f"{folder}/")
            continue
        if path.name in ("__init__.py", "__main__.py") and path.parent != ROOT / "queueprocessor":
            continue
        if table is None or f"`{path.name}`" not in table.group(1):
            missing.append(path.relative_to(ROOT).as_posix())
    assert not missing, "docs/design.md's tables of modules name no row for:\n" + "\n".join(missing)
