"""Wall-clock and CPU time of whole `queueprocessor` commands (a CLI should answer at once), before and
after, in the same run.

"Before" is a git ref (default 04b0f48, the code the issue was filed against) unpacked into a temporary
folder; "after" is this working tree. Each side runs `--help`, `enqueue http /x` and `status` as the installed
script does (`from queueprocessor.cli import main`), on its own SQLite file and its own database on a throwaway
PostgreSQL server, with the same Python and packages. Bytecode is compiled once beforehand (into a temporary
PYTHONPYCACHEPREFIX), as it is for an installed package; the runs alternate before/after so both see the same
load. Reported: median and best wall time, and median CPU (user + system) of the process; beside them, the
same for a Python that only imports click and SQLAlchemy, the least any command that opens a farm costs.

    .venv/bin/python bench/cli_time.py [--before REF] [--runs N] [--quick]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from common import ROOT, farm, load_average, postgres, print_table, source_tree

TARGETS = {"--help": 0.15, "enqueue http /x": 0.2}  # seconds of wall clock
COMMANDS = ("--help", "enqueue http /x", "status")
LAUNCH = "import sys; from queueprocessor.cli import main; sys.exit(main())"  # what the console script runs
FLOOR = "import click, sqlalchemy, sqlalchemy.dialects.sqlite"  # what any command that opens a farm must load


def timed(tree: Path, args: list[str], db: str, cache: Path, code: str = LAUNCH) -> tuple[float, float]:
    """One command's wall time and CPU time (user + system), in seconds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QP_") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(tree), PYTHONPYCACHEPREFIX=str(cache), QP_DB=db)
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    error = child.stderr.read().decode()
    child.stderr.close()
    if child.returncode != 0:
        raise SystemExit(f"{tree}: queueprocessor {' '.join(args)} failed: {error}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="04b0f48", help="git ref to compare with (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=15, help="runs of each command on each side")
    parser.add_argument("--quick", action="store_true", help="3 runs each")
    options = parser.parse_args()
    runs = 3 if options.quick else options.runs
    with postgres() as server, ExitStack() as farms:
        with tempfile.TemporaryDirectory(prefix="qp-cli-time-") as tmp:
            tmp = Path(tmp)
            (tmp / "before").mkdir()
            sides = {"before": source_tree(options.before, tmp / "before"), "after": ROOT}
            rows = []
            for backend in ("sqlite", "postgresql"):
                dbs = {  # each side's farm: a SQLite file, or a database on the server
                    side: farms.enter_context(farm(backend=backend, server=server, prefix=side, open=False)).url
                    for side in sides
                }
                for side, tree in sides.items():  # create each farm and compile the bytecode, untimed
                    for command in COMMANDS:
                        timed(tree, command.split(), dbs[side], tmp / "pycache")
                for command in COMMANDS:
                    figures = {side: [] for side in sides}
                    for _ in range(runs):
                        for side, tree in sides.items():
                            figures[side].append(timed(tree, command.split(), dbs[side], tmp / "pycache"))
                    if command == "enqueue http /x" and backend == "sqlite":
                        enqueue_medians = {side: _medians(figures[side]) for side in sides}
                    rows.append(
                        [
                            command,
                            backend,
                            *(_shown(figures[side]) for side in sides),
                            f"{TARGETS[command]:.2f} s" if command in TARGETS else "-",
                        ]
                    )
            floor = [timed(ROOT, [], "", tmp / "pycache", FLOOR) for _ in range(runs)]
            rows.append([f"(no command: python -c '{FLOOR}')", "-", "-", _shown(floor), "-"])
            least = _medians(floor)
            ratios = {side: (wall / least[0], cpu / least[1]) for side, (wall, cpu) in enqueue_medians.items()}
    print(
        f"queueprocessor commands, {runs} runs each, alternated; before = {options.before}, after = working tree; "
        f"{load_average()}"
    )
    print_table(
        [
            "command",
            "database",
            f"before ({options.before}): wall median / best, CPU",
            "after: wall median / best, CPU",
            "target (wall)",
        ],
        rows,
    )
    print(
        "enqueue http /x on SQLite / the floor, medians of wall (target <= 1.5) and CPU: "
        + ", ".join(f"{side} {wall:.2f} (CPU {cpu:.2f})" for side, (wall, cpu) in ratios.items())
    )


def _medians(figures: list[tuple[float, float]]) -> tuple[float, float]:
    """Median wall and median CPU time."""
    return statistics.median(w for w, _ in figures), statistics.median(c for _, c in figures)


def _shown(figures: list[tuple[float, float]]) -> str:
    walls, cpus = [w for w, _ in figures], [c for _, c in figures]
    return f"{statistics.median(walls):.3f} / {min(walls):.3f} s, CPU {statistics.median(cpus):.3f} s"


if __name__ == "__main__":
    main()
