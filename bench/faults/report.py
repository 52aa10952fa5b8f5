"""The report: the Faults section of docs/benchmarks.md, rendered from the outcomes and written in its marked block."""

import re
from datetime import datetime

from common import load_average, percentile

from .rig import BENCHMARKS, QUICK, SECTION_BEGIN, SECTION_END, Outcome, secs
from .trials import FAULT_KINDS


def causes_text(causes: dict) -> str:
    return "; ".join(f"{n} {cause}" for cause, n in sorted(causes.items(), key=lambda kv: -kv[1])) or "-"


FOUND = [
    "PostgreSQL freeze: a job the watchdog stopped before its asyncio task first ran stayed 'running', its lease "
    "renewed forever (a job stuck in processing); the queue never drained. Fixed in 8d9b459 (runner.py).",
    "Black-holed database link: the watchdog ran on the turn thread, so a turn stuck on a dead connection kept a "
    "cut-off node running its jobs 3.2 s into a 1.5 s lease: 2 jobs ran twice at once. Fixed in 32fbb91 "
    "(node.py: a watchdog thread of its own).",
    "PostgreSQL restart: a result that could not be written during a 0.3 s restart was given up, so the lease "
    "expired and 7 of 300 finished jobs ran again elsewhere. Fixed in 5f782b1 (runner.py: retry the write).",
    "PostgreSQL freeze: a claim the frozen database held up took, when it thawed, leases that had run out during "
    "the stall, from a live machine; and after the thaw the watchdog stopped jobs claimed a moment earlier. Fixed "
    "in 4de41b6 (store.py, node.py, runner.py).",
    "SIGKILL churn under a backlog: killed machines' jobs waited up to 48 s (lease 3 s) for a turn whose holder "
    "had room, as expired leases were taken back by a turn's claim only. Fixed in 70c4b58 (a full turn-holder "
    "still puts expired leases back in the queue).",
    "PostgreSQL freezes, stalled links and restarts of 2-10 s: on 9718429 a node claimed back (new fence) a job whose "
    "stopped run it was still handing back; the runner kept runs by job id, so the old run's end removed the new "
    "one, which was then neither renewed nor stoppable: its lease ran out and the job ran twice at once (on another "
    "machine, or beside a third run on the same one), and the result writer died of a KeyError, leaving jobs "
    "'running' for ever. On 9718429: twice at once in 1 of 10 random freezes, 2 of 10 stalls (and a job failed for "
    "good), 2 of 10 restarts; tests/test_faults.py's freeze failed 14 of 18 trials (10 or 11 pairs twice at once in "
    "each run of 6). Fixed in 1784ea0 (runner.py, node.py, store.py: each run held under its job and fence).",
]


def takeover_text(takeovers: list[float] | None) -> str:
    if not takeovers:
        return "-"
    return f"{percentile(takeovers, 50):.2f} / {max(takeovers):.2f} s"


OUTLIVES = ("kill-commands", "lone-freeze", "sys-exit", "dependency-races")  # work that must not outlive its lease


def outlives_failed(o: Outcome) -> bool:
    """Whether a scenario of OUTLIVES found what it hunts: two runs at once, a job lost or never ended, a child
    before its parent, an error in a log, a node that died or would not drain."""
    t, f = o.tally, o.facts
    return bool(
        t["overlaps"]
        or t["lost"]
        or t["log_errors"]
        or f.get("stuck")
        or f.get("early")
        or f.get("waiting")
        or f.get("alive") is False
        or f.get("drained") is False
    )


def outlives_extra(o: Outcome) -> list[str]:
    """The figures of a scenario of OUTLIVES for its line under the table."""
    f = o.facts
    if o.name == "kill-commands":
        return [f"{f['kills']} kills, {f['mid_command']} commands under way at them, {f['twice']} pairs at once"]
    if o.name == "lone-freeze":
        return [f"twice at once in {f['twice_trials']} of {f['trials']} trials; the frozen node lived on: {f['alive']}"]
    if o.name == "sys-exit":
        return [f"node alive: {f['alive']}; drain ended: {f['drained']} (exit code {f['drain_code']})"]
    if o.name == "dependency-races":
        return [
            f"{len(f['early'])} child runs started before their parent's success, over {f['edges']} `after=` links; "
            f"bulk actions: {causes_text(f['actions'])}; jobs left unfinished: {f['waiting']}"
        ]
    return []


def render(outcomes: list[Outcome], command: str) -> str:
    lines = [
        "## Faults",
        "",
        SECTION_BEGIN,
        (
            f"`{command}` on {load_average()}, {datetime.now():%Y-%m-%d}. Real PostgreSQL 15, real node processes, "
            "a real HTTP service recording every request. *Lost*: jobs that did not end succeeded. *Twice at once*: "
            "pairs of requests for one job that the service saw overlap (in the many-trial rows: on different fences). "
            '*Re-runs*: runs of a job after its first, by cause; "lease expired while its machine lived" would be a '
            "live machine declared dead. The rows of many trials run each trial on a fresh farm and use the "
            f"short form's timing (heartbeat {QUICK.heartbeat:g} s, lease {QUICK.lease:g} s), so that every fault of "
            "2 s or more outlasts the lease and the whole long form stays under an hour. *Error lines*: lines of "
            "a node's log with a traceback, an exception nobody retrieved or an ERROR (target 0)."
        ),
        "",
        "| scenario | jobs run | lost | twice at once | re-runs (cause) | time to recover |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        t = o.tally
        lines.append(
            f"| {o.title} | {t['succeeded']} / {t['jobs']} | {t['lost']} | {t['overlaps']} | "
            f"{t['reruns']} ({causes_text(t['causes'])}) | {o.recovery} |"
        )
    lines.append("")
    for o in outcomes:
        extra = [
            f"stale completions accepted: {o.tally['stale_completions']}",
            f"runs left 'running': {o.tally['stuck_runs']}",
            f"password in node logs: {o.tally['password_in_logs']}",
            f"error lines in node logs: {len(o.tally['log_errors'])}",
        ]
        if o.name == "freeze":
            f = o.facts
            extra += [
                f"turns out of turn (a live machine skipped): {f['wrong_turns']} of {f['turns']}",
                (
                    f"live machines shown dead by `status` after the thaw: {f['status_dead_polls']} of "
                    f"{f['status_polls']} polls, for {f['status_dead_for']:.2f} s"
                ),
            ]
        if o.name in FAULT_KINDS:
            f = o.facts
            takeovers = f["takeovers"]
            extra += [
                f"twice at once in {f['twice_trials']} of {f['trials']} trials",
                f"re-runs per fault {f['reruns_per_fault']:.2f} (the service's count)",
                (
                    f"{len(takeovers)} stopped runs ran again after the fault's end: median "
                    f"{secs(percentile(takeovers, 50))}, 90th percentile {secs(percentile(takeovers, 90))}, max "
                    f"{secs(takeovers[-1])} (negative: during the fault, on a machine it did not cut off); "
                    f"{f['claimed_back']} on the machine that had been stopped"
                )
                if takeovers
                else "no stopped run ran again",
            ]
        extra += outlives_extra(o)
        lines.append(f"- **{o.name}**: " + "; ".join(extra + o.notes) + ".")
    for o in outcomes:
        if o.name in OUTLIVES and outlives_failed(o):
            lines += ["", f"**Open** ({o.name}): {o.recovery}."]
    for o in outcomes:
        if o.name == "kill" and o.facts["takeover_max"] > o.facts["lease"] + 3 * o.facts["period"]:
            lines += [
                "",
                (
                    f"**Open**: under a backlog, a killed machine's jobs waited up to "
                    f"{o.facts['takeover_max']:.0f} s (lease {o.facts['lease']:g} s) to run elsewhere: expired "
                    "leases are taken back by a turn's claim only, and the holder of a turn has no room when "
                    "every node is busy. DESIGN 3 wants them back in the queue on the next turn."
                ),
            ]
    lines += ["", "Found by these scenarios and fixed:", ""] + [f"- {found}" for found in FOUND]
    lines += ["", SECTION_END]
    return "\n".join(lines) + "\n"


def write_section(text: str) -> None:
    """Replace only the Faults section of docs/benchmarks.md (other sections belong to other benchmarks)."""
    BENCHMARKS.parent.mkdir(exist_ok=True)
    old = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(SECTION_BEGIN) + r".*?" + re.escape(SECTION_END) + r"\n", re.DOTALL)
    if pattern.search(old):  # the marked block only: the section's heading and the prose above it are kept
        new = pattern.sub(lambda _: text[text.index(SECTION_BEGIN) :], old)
    else:
        new = old.rstrip("\n") + "\n\n" + text
    BENCHMARKS.write_text(new)
