"""The fault suite's command line: `python bench/faults [--quick] [--only ...] [--trials N] [--seed S]`."""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: common, and this package as `faults`

from common import ROOT, load_average, postgres, print_table  # noqa: E402

import faults  # noqa: E402
from faults import (  # noqa: E402
    FAULT_KINDS,
    FREEZE_TRIALS,
    TRIALS,
    clock_step,
    command_kill_churn,
    cut_off,
    dependency_races,
    fault_trials,
    kill_churn,
    lone_freeze,
    long_jobs,
    partition,
    postgres_freeze,
    postgres_restart,
    same_name,
    stalled_node,
    sys_exit_jobs,
)
from faults.report import BENCHMARKS, causes_text, render, takeover_text, write_section  # noqa: E402

SCENARIOS = {
    "kill": kill_churn,
    "restart": postgres_restart,
    "freeze": postgres_freeze,
    "long": long_jobs,
    "clock": clock_step,
    "cut": cut_off,
    "blackhole": lambda server, quick: cut_off(server, quick, mode="blackhole"),
    "partition": partition,
    "stall": stalled_node,
    "twins": same_name,
    "kill-commands": command_kill_churn,
    "lone-freeze": lone_freeze,
    "sys-exit": sys_exit_jobs,
    "dependency-races": dependency_races,
    **{kind: lambda server, quick, kind=kind: fault_trials(server, quick, kind) for kind in FAULT_KINDS},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=faults.__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short form, about two minutes")
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), help="run only these scenarios")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    parser.add_argument(
        "--trials",
        type=int,
        help=f"trials of each of {', '.join(FAULT_KINDS)} and lone-freeze (default: "
        f"{', '.join(f'{k} {v[1]}' for k, v in TRIALS.items())}, lone-freeze {FREEZE_TRIALS[1]}; short "
        f"form {', '.join(str(v[0]) for v in TRIALS.values())}, {FREEZE_TRIALS[0]})",
    )
    parser.add_argument("--seed", type=int, default=24, help="draws the trials' shapes")
    args = parser.parse_args()
    names = args.only or list(SCENARIOS)
    print(f"faults ({'short' if args.quick else 'long'} form): {', '.join(names)}; {load_average()}", flush=True)
    outcomes = []
    with postgres() as server:
        for name in names:
            began = time.monotonic()
            if name in FAULT_KINDS:
                outcome = fault_trials(server, args.quick, name, trials=args.trials, seed=args.seed)
            elif name == "lone-freeze":
                outcome = lone_freeze(server, args.quick, trials=args.trials)
            else:
                outcome = SCENARIOS[name](server, args.quick)
            outcomes.append(outcome)
            t = outcome.tally
            print(
                f"{name}: {t['succeeded']}/{t['jobs']} run, {t['lost']} lost, {t['overlaps']} twice at once, "
                f"{t['reruns']} re-runs ({causes_text(t['causes'])}), {len(t['log_errors'])} log errors; "
                f"{t['batch_jobs']} batch-function jobs, {t['batch_reruns']} of them run again; {outcome.recovery} "
                f"[{time.monotonic() - began:.0f} s]",
                flush=True,
            )
            for note in outcome.notes:
                print(f"    {note}", flush=True)
    print()
    print_table(
        [
            "scenario",
            "trials",
            "run",
            "lost",
            "twice",
            "re-runs",
            "service re-runs/fault",
            "false deaths",
            "stale completions",
            "stuck",
            "password",
            "log errors",
            "take-over median/max",
        ],
        [
            [
                o.name,
                o.facts.get("trials", 1),
                f"{o.tally['succeeded']}/{o.tally['jobs']}",
                o.tally["lost"],
                o.tally["overlaps"],
                o.tally["reruns"],
                f"{o.facts['reruns_per_fault']:.2f}" if o.name in FAULT_KINDS else "-",
                o.tally["false_deaths"],
                o.tally["stale_completions"],
                o.tally["stuck_runs"],
                o.tally["password_in_logs"],
                len(o.tally["log_errors"]),
                takeover_text(o.facts["takeovers"]) if o.name in FAULT_KINDS else "-",
            ]
            for o in outcomes
        ],
    )
    if not args.quick and not args.only and not args.no_write:
        write_section(render(outcomes, "python bench/faults"))
        print(f"\nwrote the Faults section of {BENCHMARKS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
