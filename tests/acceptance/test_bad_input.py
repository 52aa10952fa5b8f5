"""Every bad input we could think of, given to real `queueprocessor` processes.

Each case must end with one clear line on stderr, a non-zero exit code, no traceback, no password in the
output, and the farm's database exactly as it was. The farm is a real PostgreSQL database reached with a
password, holding a queued job, a schedule, a singleton, two machines named alike and one live machine that
publishes the default allow-lists. A few hostile inputs are not errors at all: they are stored verbatim.

docs/bad-input.md is generated from these same cases: `python scripts/bad_input_table.py`.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from queueprocessor.farm import Farm
from queueprocessor.rules.errors import ECHO_LIMIT
from queueprocessor.store.database import open_engine

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = 'x\'); DROP TABLE qp_jobs; --" OR "1"="1'


@dataclass(frozen=True)
class Case:
    """One bad input. `args` follow `queueprocessor`; {db}, {tmp}, {config}, {notadb}, {pg_wrong}, {pg_nodb} and
    {pg_closed} are filled in for each run. `says` is a regular expression the one line must match."""

    kind: str
    args: tuple[str, ...]
    says: str
    env: dict = field(default_factory=dict)
    config: str | None = None
    newer_schema: bool = False
    secret: str = "hunter2"  # must not be shown either (besides the farm's own password)


def case(kind, args, says, **extra) -> Case:
    return Case(kind, tuple(args), says, **extra)


DB = ("--db", "{db}")
LONG = "x" * 5000
CUT = rf"'x{{{ECHO_LIMIT}}}'\.\.\. \(5000 characters\)"  # LONG as an error repeats it
CAPACITY = r"^error: Invalid value for '--capacity' \(env var: 'QP_CAPACITY'\): "
BAD_INPUTS = [
    # -- the command line -------------------------------------------------
    case("command line", ["frobnicate"], r"^error: No such command 'frobnicate'"),
    case("command line", [*DB, "status", "--frobnicate"], r"^error: No such option '--frobnicate'.*status --help"),
    case("command line", [*DB, "job", "abc"], r"^error: Invalid value for 'JOB_ID': 'abc' is not a valid integer"),
    case("command line", [*DB, "job", "999999"], r"^error: no job with id 999999"),
    case("command line", [*DB, "cancel", "999999"], r"^error: no job with id 999999"),
    case("command line", [*DB, "retry", "1"], r"^error: job 1 is queued; only failed or cancelled jobs"),
    case("command line", [*DB, "pause", "nosuchmachine"], r"^error: no running machine is named or numbered"),
    case("command line", [*DB, "drain", "99999999999999999999"], r"^error: no running machine is named or numbered"),
    case("command line", [*DB, "pause", "twin"], r"^error: 2 machines are named 'twin' \(ids \d+, \d+\): give the id"),
    case("command line", [*DB, "jobs", "--state", "bogus"], r"^error: Invalid value for '--state': 'bogus'"),
    case("command line", [*DB, "jobs", "--limit", "0"], r"^error: Invalid value for '--limit': 0 is not in the range"),
    case("command line", [*DB, "turns", "--since", "-5"], r"^error: Invalid value for '--since'"),
    case("command line", [*DB, "demo", "--nodes", "99"], r"^error: Invalid value for '--nodes': 99"),
    case("command line", [*DB, "gui", "--theme", "neon"], r"^error: Invalid value for '--theme': 'neon'"),
    case("command line", [*DB, "node", "--capacity", "0"], CAPACITY + r"0"),
    case(
        "command line",
        [*DB, "node", "--http-base", "ftp://example.com/"],
        r"^error: --http-base 'ftp://example.com/' is not an http\(s\) URL",
    ),
    case(
        "command line",
        [*DB, "node", "--http-base", "http://example.com/"],
        r"^error: --http-base host 'example.com' is not in the allowed hosts",
    ),
    case("command line", [*DB, "node", "--heartbeat", "-1"], r"^error: --heartbeat must be a positive number"),
    case("command line", [*DB, "node", "--misses", "0"], r"^error: --misses must be a whole number from 2 to 1000"),
    case("command line", [*DB, "node", "--misses", "1"], r"^error: --misses must be a whole number from 2 to 1000"),
    case(
        "command line",
        [*DB, "node", "--misses", "99999999999999999999"],
        r"^error: --misses must be a whole number from 2 to 1000",
    ),
    case(
        "command line",
        [*DB, "node", "--capacity", "99999999999999999999"],
        CAPACITY + r"99999999999999999999 is not in the range 1<=x<=10000",
    ),
    case("command line", [*DB, "jobs", "--limit", "99999999999999999999"], r"^error: Invalid value for '--limit'"),
    case("command line", [*DB, "job", "99999999999999999999"], r"^error: Invalid value for 'JOB_ID'"),
    case("command line", [*DB, "cancel", "99999999999999999999"], r"^error: Invalid value for 'JOB_ID'"),
    case("command line", [*DB, "node", "--period", "2"], r"^error: this farm uses --period 1 \(every machine must"),
    case(
        "command line",
        [*DB, "init-db", "--period", "nan"],
        r"^error: Invalid value for '--period' \(env var: 'QP_PERIOD'\): 'nan' is not a finite number of seconds",
    ),
    case(
        "command line",
        [*DB, "node", "--clock-skew", "nan"],
        r"^error: Invalid value for '--clock-skew' \(env var: 'QP_CLOCK_SKEW'\): "
        r"'nan' is not a finite number of seconds",
    ),
    case(
        "command line",
        [*DB, "turns", "--since", "inf"],
        r"^error: Invalid value for '--since': 'inf' is not a finite number of seconds",
    ),
    case("command line", [*DB, "node", "--clock-skew", "soon"], r"^error: Invalid value for '--clock-skew'"),
    case(
        "command line",
        [*DB, "node", "--metrics-port", "70000"],
        r"^error: Invalid value for '--metrics-port' \(env var: 'QP_METRICS_PORT'\): 70000 is not in the range",
    ),
    case(
        "command line",
        [*DB, "node", "--metrics-port", "9100", "--metrics-host", "no.such.host.invalid"],
        r"^error: cannot serve metrics on no.such.host.invalid port 9100: .*; choose another --metrics-port or "
        r"--metrics-host$",
    ),
    case(
        "command line",
        [*DB, "node", "--log-format", "xml"],
        r"^error: Invalid value for '--log-format' \(env var: 'QP_LOG_FORMAT'\): 'xml' is not one of 'text', 'json'",
    ),
    # -- the config file --------------------------------------------------
    case(
        "config file",
        ["--config", "{tmp}/missing.toml", "status"],
        r"^error: config file .*missing.toml does not exist",
    ),
    case("config file", ["--config", "{tmp}", "status"], r"^error: cannot read config file .*: Is a directory"),
    case(
        "config file",
        ["--config", "{config}", "status"],
        r"^error: config file .* is not valid TOML",
        config="db = = 1\n",
    ),
    case(
        "config file",
        ["--config", "{config}", "status"],
        r"^error: config file .* unknown key 'colour'",
        config='colour = "blue"\n',
    ),
    case(
        "config file",
        ["--config", "{config}", *DB, "node"],
        r"^error: config file .* \[node\] has no option 'frob'",
        config="[node]\nfrob = 1\n",
    ),
    case(
        "config file",
        ["--config", "{config}", *DB, "node"],
        r"^error: config file .*: \[node\] capacity must be a whole number \(got 'lots'\)",
        config='[node]\ncapacity = "lots"\n',
    ),
    case("config file", ["--config", "{config}", *DB, "node"], CAPACITY + r"0", config="[node]\ncapacity = 0\n"),
    case("config file", ["--config", "{config}", "status"], r"^error: malformed database URL '5'", config="db = 5\n"),
    *(
        case(
            "config file",
            ["--config", "{config}", *DB, "node"],
            rf"^error: config file .*: \[node\] {re.escape(text.split(' = ')[0])} must be {expected} \(got ",
            config=f"[node]\n{text}\n",
        )
        for text, expected in (
            ("capacity = [1, 2]", "a whole number"),
            ("heartbeat = [1]", "a number of seconds"),
            ("heartbeat = {a = 1}", "a number of seconds"),
            ("period = 1979-05-27", "a number of seconds"),
            ("capacity = true", "a whole number"),
            ("capacity = 1.5", "a whole number"),
            ("clock-skew = true", "a number of seconds"),
            ("name = [1]", "a string in quotes"),
            ("allow-host = [1]", "a string in quotes, or a list of them"),
            ("push = 1", "true or false"),
        )
    ),
    case(
        "config file",
        ["--config", "{config}", "status"],
        r"^error: unsupported database 'mysql'",
        config='db = "mysql://qp:hunter2@db.example/farm"\n',
    ),
    # -- the environment --------------------------------------------------
    case(
        "environment",
        ["status"],
        r"^error: unsupported database 'mysql'",
        env={"QP_DB": "mysql://qp:hunter2@db.example/farm"},
    ),
    case("environment", [*DB, "node"], CAPACITY + r"'lots'", env={"QP_CAPACITY": "lots"}),
    case(
        "environment",
        [*DB, "node"],
        CAPACITY + r"99999999999999999999 is not in",
        env={"QP_CAPACITY": "99999999999999999999"},
    ),
    case("environment", [*DB, "node"], r"^error: --heartbeat must be a positive number", env={"QP_HEARTBEAT": "-1"}),
    case(
        "environment",
        [*DB, "init-db"],
        r"^error: Invalid value for '--period' \(env var: 'QP_PERIOD'\): 'abc'",
        env={"QP_PERIOD": "abc"},
    ),
    case(
        "environment",
        ["status"],
        r"^error: config file .*missing.toml does not exist",
        env={"QP_CONFIG": "{tmp}/missing.toml"},
    ),
    case(
        "environment",
        ["status"],
        r"^error: cannot use the database .*password authentication failed",
        env={"QP_DB": "{pg_wrong}"},
    ),
    # -- jobs and their payloads ------------------------------------------
    case("job", [*DB, "enqueue", "http", "/x", "--payload", "{not json"], r"^error: payload is not valid JSON"),
    case("job", [*DB, "enqueue", "http", "/x", "--payload", "[1, NaN]"], r"^error: payload is not valid JSON \(NaN is"),
    case("job", [*DB, "enqueue", "http", "/x", "--payload", "[" * 60_000], r"^error: .* nested too deeply"),
    case(
        "job",
        [*DB, "enqueue", "http", "/x", "--payload", '"caf\udce9"'],
        r"^error: argument .* is not valid UTF-8 text",
    ),
    case("job", [*DB, "enqueue", "http", "/x\udcff"], r"^error: argument '/x\\udcff' is not valid UTF-8 text"),
    case(
        "job", [*DB, "enqueue", "http", "/x", "--after", "999999"], r"^error: --after names job 999999, which does not"
    ),
    case(
        "job", [*DB, "enqueue", "http", "/x", "--after", "1,x"], r"^error: Invalid value for '--after': '1,x' is not a"
    ),
    case(
        "job", [*DB, "enqueue", "http", "/x", "--after", "0"], r"^error: --after names jobs by their ids, whole numbers"
    ),
    case("job", [*DB, "enqueue", "http", "/x", "--after", ""], r"^error: Invalid value for '--after': an empty list"),
    case("job", [*DB, "enqueue", "command", "--method", "post", "--", "/bin/true"], r"^error: --method is for http"),
    case("job", [*DB, "enqueue", "python", "--method", "GET", "m:f"], r"^error: --method is for http work only: py"),
    case("job", [*DB, "grab", "k", "i", "command", "--method", "post", "--", "true"], r"^error: --method is for http"),
    case("job", [*DB, "enqueue", "http", "/x", "--after-ended"], r"^error: --after-ended needs --after"),
    case("job", [*DB, "enqueue", "http", "/x", "--key-scope", "waiting"], r"^error: --key-scope needs --key"),
    case("job", [*DB, "enqueue", "http", "/x", "--key", "k", "--max-delay", "5"], r"^error: --max-delay needs --deb"),
    case(
        "job",
        [*DB, "enqueue", "http", "/x", "--key", "k", "--debounce", "5", "--count", "2"],
        r"^error: --debounce answers an enqueue of one job: give no --count with it$",
    ),
    case(
        "job",
        [*DB, "enqueue", "http", "/x", "--key", "k", "--debounce", "5", "--max-delay", "1"],
        r"^error: --max-delay must be seconds from the debounce \(5\) up to",
    ),
    case(
        "job",
        [*DB, "enqueue", "http", "/x", "--key", "k", "--key-until", "soon"],
        r"^error: Invalid value for --key-until: 'soon' is not a time",
    ),
    case("job", [*DB, "workflow", "show", "999999"], r"^error: no workflow or group with id 999999"),
    case(
        "job",
        [*DB, "enqueue", "http", "/x", "--payload", '"' + "x" * 70_000 + '"'],
        r"^error: payload is 70002 bytes, over the 65536 byte limit",
    ),
    case(
        "job",
        [*DB, "enqueue", "http", "ftp://example.com/x"],
        r"^error: HTTP job target 'ftp://example.com/x' is neither a path",
    ),
    case(
        "job", [*DB, "enqueue", "http", "http://example.com/x"], r"^error: .*host 'example.com' is not allowed on any"
    ),
    case("job", [*DB, "enqueue", "http", "//example.com/x"], r"^error: HTTP job target '//example.com/x' is neither"),
    case("job", [*DB, "enqueue", "http", "/x", "--method", "PUT"], r"^error: Invalid value for '--method': 'PUT'"),
    case("job", [*DB, "enqueue", "http", "/x", "--count", "0"], r"^error: Invalid value for '--count': 0"),
    case("job", [*DB, "enqueue", "http", "/x", "--max-attempts", "0"], r"^error: Invalid value for '--max-attempts'"),
    case("job", [*DB, "enqueue", "http", "/x", "--timeout", "0"], r"^error: Invalid value for '--timeout': 0"),
    case("job", [*DB, "enqueue", "http", "/x", "--delay", "-1"], r"^error: Invalid value for '--delay': -1"),
    case("job", [*DB, "enqueue", "http", "/x", "--priority", "high"], r"^error: Invalid value for '--priority'"),
    case(
        "job",
        [*DB, "enqueue", "http", "/x", "--priority", "99999999999999999999"],
        r"^error: --priority must be from -2147483647 to 2147483647",
    ),
    case(
        "job",
        [*DB, "enqueue", "http", "/x", "--max-attempts", "99999999999999"],
        r"^error: --max-attempts must be from 1 to 2147483647",
    ),
    case(
        "job",
        [*DB, "enqueue", "http", "/x", "--timeout", "inf"],
        r"^error: Invalid value for '--timeout': 'inf' is not a finite number of seconds",
    ),
    case(
        "job",
        [*DB, "enqueue", "http", "/x", "--delay", "nan"],
        r"^error: Invalid value for '--delay': 'nan' is not a finite number of seconds",
    ),
    case(
        "job",
        [*DB, "enqueue", "http", "/x", "--at", "nan"],
        r"^error: --at must be a time from 1970 to 9999.*\(got nan\)",
    ),
    case("job", [*DB, "enqueue", "http", "/x", "--at", "1e400"], r"^error: --at must be a time .*\(got inf\)"),
    case("job", [*DB, "enqueue", "http", "/x", "--at", "1e15"], r"^error: --at must be a time from 1970 to 9999"),
    case("job", [*DB, "enqueue", "http", "/x", "--at", "-1e13"], r"^error: --at must be a time from 1970 to 9999"),
    case(
        "job",
        [*DB, "enqueue", "http", "/x", "--at", "0001-01-01T00:00:00+00:00"],
        r"^error: --at must be a time from 1970 to 9999",
    ),
    case(
        "job",
        [*DB, "enqueue", "http", "/x", "--delay", "1e15"],
        r"^error: --delay must be from 0 to 315576000 seconds, ten years \(got 1e\+15\)",
    ),
    case(
        "job", [*DB, "enqueue", "http", "/x", "--at", "tomorrow"], r"^error: Invalid value for --at: 'tomorrow' is not"
    ),
    case("job", [*DB, "enqueue", "http", "/x", "--at", "2026-13-45T00:00:00"], r"^error: Invalid value for --at"),
    case("job", [*DB, "enqueue", "http", "/x", "--at", "1", "--delay", "5"], r"^error: give --delay or --at, not both"),
    case("job", [*DB, "enqueue", "http", "/x", "--key", "report"], r"^error: report was taken first by .* \(job 1\)"),
    case("job", [*DB, "enqueue", "http", "/x", "--instance", "2026"], r"^error: --instance needs --key"),
    case("job", [*DB, "enqueue", "python", "notamodule"], r"^error: Python job target 'notamodule' is not of the form"),
    case("job", [*DB, "enqueue", "python", "os:system"], r"^error: Python module 'os' is not allowed on any live"),
    case(
        "job", [*DB, "enqueue", "command", "--", "rm", "-rf", "/"], r"^error: command 'rm' is not allowed on any live"
    ),
    case("job", [*DB, "enqueue", "command"], r"^error: Missing argument 'ARGV...'"),
    case("job", [*DB, "grab", "report"], r"^error: Missing argument 'INSTANCE'"),
    case("job", [*DB, "grab", "report", "2026", "bogus", "/x"], r"^error: Invalid value for 'EXECUTOR': 'bogus'"),
    # -- schedules and singletons -----------------------------------------
    case("schedule", [*DB, "schedule", "add", "n", "http", "/x"], r"^error: give a schedule either --cron"),
    case(
        "schedule",
        [*DB, "schedule", "add", "n", "http", "/x", "--cron", "0 3 * * *", "--every", "60"],
        r"^error: give a schedule either --cron",
    ),
    case("schedule", [*DB, "schedule", "add", "n", "http", "/x", "--cron", "bogus"], r"^error: malformed cron"),
    case("schedule", [*DB, "schedule", "add", "n", "http", "/x", "--cron", "61 * * * *"], r"^error: malformed cron"),
    case(
        "schedule",
        [*DB, "schedule", "add", "n", "http", "/x", "--cron", "0 3 * * *", "--tz", "Mars/Olympus"],
        r"^error: unknown time zone 'Mars/Olympus'",
    ),
    case("schedule", [*DB, "schedule", "add", "n", "http", "/x", "--every", "0"], r"^error: --every must be at least"),
    case("schedule", [*DB, "schedule", "add", "n", "http", "/x", "--every", "soon"], r"^error: .*--every.*soon"),
    case(
        "schedule",
        [*DB, "schedule", "add", "big", "--every", "1e300", "http", "/x"],
        r"^error: --every must be at most 315576000 seconds, ten years \(got 1e\+300\)",
    ),
    case(
        "schedule",
        [*DB, "schedule", "add", "big", "--every", "1e12", "http", "/x"],
        r"^error: --every must be at most 315576000 seconds",
    ),
    case(
        "schedule",
        [*DB, "schedule", "add", "n", "http", "/x", "--every", "60", "--misfire", "sometimes"],
        r"^error: Invalid value for '--misfire': 'sometimes'",
    ),
    case(
        "schedule",
        [*DB, "schedule", "add", "nightly", "http", "/x", "--every", "60"],
        r"^error: .*'nightly'.*(exists|already)",
    ),
    case(
        "schedule",
        [*DB, "schedule", "add", "n", "http", "http://example.com/x", "--every", "60"],
        r"^error: .*host 'example.com' is not allowed on any",
    ),
    case("schedule", [*DB, "schedule", "remove", "nosuch"], r"^error: no schedule named 'nosuch'"),
    case(
        "schedule",
        [*DB, "singleton", "add", "s", "command", "--", "rm", "-rf", "/"],
        r"^error: command 'rm' is not allowed on any live",
    ),
    case("schedule", [*DB, "singleton", "add", "feed", "http", "/x"], r"^error: .*'feed'.*(exists|already)"),
    case("schedule", [*DB, "singleton", "add", "s", "python", "--method", "post", "m:f"], r"^error: --method is for"),
    case(
        "schedule",
        [*DB, "schedule", "add", "n", "--every", "60", "command", "--method", "post", "--", "true"],
        r"^error: --method is for http work only: command work takes no method",
    ),
    case("schedule", [*DB, "schedule", "set", "nightly", "--method", "post", "python", "m:f"], r"^error: --method is"),
    case("schedule", [*DB, "singleton", "remove", "nosuch"], r"^error: no singleton named 'nosuch'"),
    # -- queues -------------------------------------------------------------
    case(
        "queue", [*DB, "enqueue", "http", "/x", "--queue", "two words"], r"^error: --queue 'two words' is not a queue"
    ),
    case(
        "queue",
        [*DB, "enqueue", "http", "/x", "--queue", "q" * 65],
        r"^error: --queue 'q{60}'\.\.\. \(65 characters\) is not a queue name",
    ),
    case("queue", [*DB, "enqueue", "http", "/x", "--queue", "-x"], r"^error: --queue '-x' is not a queue name"),
    case(
        "queue",
        [*DB, "enqueue", "http", "/x", "--order-key", "k" * 201],
        r"^error: --order-key 'k{60}'\.\.\. \(201 characters\) is refused: an order key is 1 to 200",
    ),
    case(
        "queue",
        [*DB, "schedule", "add", "n", "http", "/x", "--every", "60", "--queue", "a,b"],
        r"^error: --queue 'a,b' is not a queue name",
    ),
    case(
        "queue", [*DB, "queue", "pause", "nosuch"], r"^error: no queue named 'nosuch'.*see `queueprocessor queue list`"
    ),
    case("queue", [*DB, "queue", "set", "default", "--limit", "0"], r"^error: --limit must be a whole number from 1"),
    case("queue", [*DB, "queue", "set", "default", "--limit", "-3"], r"^error: --limit must be a whole number from 1"),
    case("queue", [*DB, "queue", "set", "default", "--rate", "ten/s"], r"^error: --rate 'ten/s' is not a rate: use"),
    case("queue", [*DB, "queue", "set", "default", "--rate", "5/fortnight"], r"^error: --rate '5/fortnight' is not a"),
    case("queue", [*DB, "queue", "set", "default"], r"^error: nothing to change: give --limit"),
    case("queue", [*DB, "queue", "set", "default", "--keep", "3x"], r"^error: --keep must be a time from 1s to 3650d"),
    case("queue", [*DB, "queue", "set", "default", "--keep", "0"], r"^error: --keep must be a time from 1s to 3650d"),
    case("queue", [*DB, "queue", "set", "default", "--keep", "3d", "--no-keep"], r"^error: give --keep or --no-keep"),
    case(
        "queue", [*DB, "queue", "set", "default", "--on-failure", "retry"], r"^error: Invalid value for '--on-failure'"
    ),
    case("queue", [*DB, "node", "--queues", ","], r"^error: --queues ',' names no queue"),
    case(
        "queue",
        [*DB, "node", "--queues", "reports:0"],
        r"^error: --queues 'reports:0': a machine's own limit for a queue is NAME:N",
    ),
    case("queue", [*DB, "node"], r"^error: --queues 'a b' is not a queue name", env={"QP_QUEUES": "a b"}),
    case(
        "hostile name", [*DB, "queue", "resume", HOSTILE], r"^error: Invalid value for 'NAME': name .* is not a queue"
    ),
    # -- database URLs ----------------------------------------------------
    case("database URL", ["--db", "notaurl", "status"], r"^error: malformed database URL 'notaurl'"),
    case(
        "database URL",
        ["--db", "mysql://qp:hunter2@db.example/farm", "status"],
        r"^error: unsupported database 'mysql' in mysql://qp:\*\*\*@db.example/farm",
    ),
    case(
        "database URL",
        ["--db", "postgresql://qp:hunter2@db.example:notaport/farm", "status"],
        r"^error: malformed database URL 'postgresql://qp:\*\*\*@db.example:notaport/farm'",
    ),
    case(
        "database URL", ["--db", "{pg_wrong}", "status"], r"^error: cannot use the database .*password authentication"
    ),
    case(
        "database URL",
        ["--db", "postgresql//qp:hunter2@db.example/farm", "status"],
        r"^error: malformed database URL 'postgresql//qp:\*\*\*@db.example/farm'",
    ),
    case(
        "database URL",
        ["--db", "postgresql:/qp:hunter2@db.example/farm", "status"],
        r"^error: malformed database URL 'postgresql:/qp:\*\*\*@db.example/farm'",
    ),
    case(
        "database URL",
        ["--db", "qp:hunter2@db.example/farm", "status"],
        r"^error: malformed database URL 'qp:\*\*\*@db.example/farm'",
    ),
    case(
        "database URL",
        ["--db", "postgresql://qp@127.0.0.1:1/farm?sslmode=disable&password=hunter2", "status"],
        r"^error: cannot use the database postgresql://qp@127.0.0.1:1/farm\?sslmode=disable&password=\*\*\*: ",
    ),
    case(
        "database URL",
        ["--db", "postgresql://qp@127.0.0.1:1/farm?PWD=hunter2", "status"],
        r"^error: cannot use the database postgresql://qp@127.0.0.1:1/farm\?PWD=\*\*\*: invalid connection option",
    ),
    case(
        "database URL",
        [
            "--db",
            "mssql+pyodbc:///?odbc_connect=DRIVER%3D%7BODBC+Driver+18+for+SQL+Server%7D%3B"
            "SERVER%3D127.0.0.1%2C1%3BUID%3Dqp%3BPWD%3Dhunter2%3BEncrypt%3Dno",
            "status",
        ],
        r"^error: (the driver for mssql.*PWD%3D\*\*\*%3BEncrypt.* cannot be loaded|cannot use the database mssql)",
    ),
    case(
        "database URL",
        ["--db", "sqlite+pysqlcipher://:hunter2@/{tmp}/farm.db", "enqueue", "http", "/x"],
        r"^error: the driver for sqlite\+pysqlcipher://:\*\*\*@/.* cannot be loaded \(pysqlcipher3\)",
    ),
    case(
        "database URL",
        ["--db", "sqlite://rel/path", "status"],
        r"^error: the SQLite URL sqlite://rel/path names a host: a file takes three slashes, e.g. sqlite:///",
    ),
    case(
        "database URL",
        ["--db", "sqlite:///{tmp}/nowhere/farm.db", "status"],
        r"^error: there is no QueueProcessor farm in sqlite:///.*/nowhere/farm.db yet: start a node there",
    ),
    case(
        "database URL",
        ["--db", "sqlite:///{tmp}/nowhere/farm.db", "jobs"],
        r"^error: there is no QueueProcessor farm in sqlite:///.*/nowhere/farm.db yet",
    ),
    case(
        "database URL",
        ["--db", "postgresql://qp:my secret@127.0.0.1:1/farm", "status"],
        r"^error: cannot use the database postgresql://qp:\*\*\*@127.0.0.1:1/farm: .*refused",
        secret="my secret",
    ),
    case(
        "database URL",
        ["--db", "postgresql://qp:p@ssw0rd@127.0.0.1:1/farm", "status"],
        r"^error: the password in the database URL postgresql://qp:\*\*\*@127.0.0.1:1/farm contains '@'",
        secret="ssw0rd",
    ),
    case(
        "database URL",
        ["--db", "postgresql://qp:caf\udce9@127.0.0.1:1/farm", "status"],
        r"^error: argument 'postgresql://qp:\*\*\*@127.0.0.1:1/farm' is not valid UTF-8 text",
        secret="caf",
    ),
    case("database URL", ["--db", "{pg_nodb}", "status"], r"^error: cannot use the database .*does not exist"),
    case("database URL", ["--db", "{pg_closed}", "status"], r"^error: cannot use the database .*Connection refused"),
    case(
        "database URL",
        ["--db", "sqlite:////dev/null/farm.db", "enqueue", "http", "/x"],
        r"^error: cannot use the SQLite database /dev/null/farm.db: its folder /dev/null cannot be created",
    ),
    case(
        "database URL",
        ["--db", "sqlite:///{notadb}", "status"],
        r"^error: cannot use the database .*not a database — check that the file is a QueueProcessor farm's SQLite",
    ),
    case(
        "database URL",
        ["--db", "mssql://qp:hunter2@127.0.0.1:1/farm", "status"],
        r"^error: the SQL Server URL mssql\+pyodbc://qp:\*\*\*@127.0.0.1:1/farm does not name its ODBC driver",
    ),
    case(
        "database URL",
        ["--db", "mssql://qp:hunter2@127.0.0.1:1/farm?driver=ODBC+Driver+18+for+SQL+Server", "status"],
        r"^error: (the driver for mssql.*cannot be loaded|cannot use the database mssql.*Can't open lib)",
    ),
    # -- a database of a newer schema -------------------------------------
    case("schema", [*DB, "status"], r"^error: this database has schema version 999, newer than", newer_schema=True),
    case("schema", [*DB, "node"], r"^error: this database has schema version 999, newer than", newer_schema=True),
    case("schema", [*DB, "enqueue", "http", "/x"], r"^error: this database has schema version 999", newer_schema=True),
    # -- long input: repeated cut at ECHO_LIMIT characters, with its length --
    case(
        "long input",
        [*DB, "schedule", "add", LONG, "--every", "60", "http", "/x"],
        r"^error: schedule name " + CUT + " must be 1-200 characters",
    ),
    case("long input", [*DB, "schedule", "remove", LONG], r"^error: no schedule named " + CUT + ": see"),
    case("long input", [*DB, "singleton", "add", LONG, "http", "/x"], r"^error: singleton name " + CUT),
    case("long input", [*DB, "pause", LONG], r"^error: no running machine is named or numbered " + CUT),
    case("long input", [*DB, "enqueue", "python", LONG], r"^error: Python job target " + CUT),
    case("long input", [*DB, "jobs", "--state", LONG], r"^error: Invalid value for '--state': " + CUT + " is not"),
    case("long input", [*DB, LONG], r"^error: No such command " + CUT),
    case("long input", [*DB, "node"], CAPACITY + CUT, env={"QP_CAPACITY": LONG}),
    # -- hostile names ----------------------------------------------------
    case("hostile name", [*DB, "pause", "x'; DROP TABLE qp_machines; --"], r"^error: no running machine is named"),
    case("hostile name", [*DB, "job", "1; DROP TABLE qp_jobs"], r"^error: Invalid value for 'JOB_ID'"),
    case("hostile name", [*DB, "cancel", "1 OR 1=1"], r"^error: Invalid value for 'JOB_ID'"),
    case("hostile name", [*DB, "schedule", "remove", "'; DELETE FROM qp_jobs; --"], r"^error: no schedule named"),
    case("hostile name", [*DB, "singleton", "remove", '"; DROP TABLE qp_locks; --'], r"^error: no singleton named"),
    case("hostile name", [*DB, "drain", HOSTILE], r"^error: no running machine is named"),
]

# Hostile, but not errors: accepted, and stored exactly as given ({hostile} is HOSTILE).
HOSTILE_ACCEPTED = [
    case(
        "hostile name",
        [*DB, "enqueue", "http", "/{hostile}", "--key", "{hostile}", "--payload", "{hostile_json}"],
        r"^enqueued job \d+$",
    ),
    case(
        "hostile name",
        [*DB, "schedule", "add", "{hostile}", "http", "/{hostile}", "--every", "3600"],
        r"^(added|scheduled|schedule)",
    ),
    case("hostile name", [*DB, "grab", "{hostile}", "{hostile}", "http", "/{hostile}"], r".*"),
]


# -- running a case -----------------------------------------------------------


class Farmyard:
    """The farm every case starts from: a template database on the suite's PostgreSQL server, copied per case."""

    def __init__(self, server, root: Path):
        self.server = server
        self.root = root
        self.template = f"bad_{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        url = server.create_database(self.template)
        with Farm(url) as farm:
            farm.settings(period=1.0, heartbeat=1.0, misses=3)
            farm.enqueue_http("/reports/daily", key="report")
            for name in ("twin", "twin", "worker"):
                farm._store.machines.register(
                    name=name,
                    host="h",
                    instance=uuid.uuid4().hex,
                    pid=1,
                    version="0",
                    capacity=1,
                    allow='{"hosts": [], "modules": [], "commands": []}',
                )
        engine = open_engine(url, pool_size=1)
        try:
            with engine.begin() as conn:
                # "worker" checks in far in the future: it is live however long the suite runs.
                conn.execute(text("UPDATE qp_machines SET last_seen = 1e12 WHERE name = 'worker'"))
        finally:
            engine.dispose()
        for argv in (
            ["schedule", "add", "nightly", "http", "/nightly", "--cron", "0 3 * * *"],
            ["singleton", "add", "feed", "http", "/feed"],
        ):
            done = run_cli(["--db", url, *argv], {}, root)
            assert done.returncode == 0, done.stderr

    def database(self) -> str:
        name = f"case_{uuid.uuid4().hex[:10]}"
        with self._lock:  # CREATE DATABASE ... TEMPLATE wants the template to itself
            run_sql(self.server.url, f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"', autocommit=True)
        return self.server.url_for(name)


def run_sql(url: str, statement: str, autocommit: bool = False) -> None:
    engine = open_engine(url, pool_size=1)
    try:
        options = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
        with engine.connect().execution_options(**options) as conn:
            conn.execute(text(statement))
            conn.commit()
    finally:
        engine.dispose()


def hashable(row) -> tuple:
    """A row as a tuple that sets can hold: a jsonb value (qp_payloads) as its JSON text."""
    return tuple(json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value for value in row)


def snapshot(url: str) -> dict:
    """Every row of every table, in a stable order: what "nothing changed" compares."""
    engine = open_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            return {
                table: sorted(map(hashable, conn.execute(text(f'SELECT * FROM "{table}"'))), key=repr)
                for table in sorted(inspect(conn).get_table_names())
            }
    finally:
        engine.dispose()


def run_cli(args: list[str], env: dict, home: Path) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("QP_")}
    clean.update(HOME=str(home), XDG_DATA_HOME=str(home / "data"), XDG_CONFIG_HOME=str(home / "config"), **env)
    command = [sys.executable, "-m", "queueprocessor.cli", *args]
    try:
        return subprocess.run(command, env=clean, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired as hung:  # it took the bad input and ran with it
        return subprocess.CompletedProcess(
            command, -1, hung.stdout or "", f"{hung.stderr or ''}(still running after 60 s)"
        )


@dataclass
class Ran:
    case: Case
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    before: dict
    after: dict
    values: dict
    created: list[str]  # files and folders the run left in its home (HOME, XDG_DATA_HOME...)


def run_case(yard: Farmyard, case: Case) -> Ran:
    tmp = Path(tempfile.mkdtemp(prefix="qp-bad-", dir=yard.root))
    db = yard.database()
    if case.newer_schema:
        run_sql(db, "UPDATE qp_meta SET value = '999' WHERE key = 'schema_version'")
    server = yard.server
    values = {
        "db": db,
        "tmp": str(tmp),
        "config": str(tmp / "config.toml"),
        "notadb": str(tmp / "notes.txt"),
        "pg_wrong": db.replace(server.password, "wrong-" + server.password[:4]),
        "pg_nodb": server.url_for("no_such_farm"),
        "pg_closed": server.url_for("farm").replace(f":{server.port}/", ":1/"),
        "hostile": HOSTILE,
        "hostile_json": json.dumps({"q": HOSTILE}),
    }
    (tmp / "notes.txt").write_text("shopping list: eggs\n")
    if case.config is not None:
        (tmp / "config.toml").write_text(case.config)
    args = [fill(a, values) for a in case.args]
    env = {k: fill(v, values) for k, v in case.env.items()}
    before = snapshot(db)
    done = run_cli(args, env, tmp)
    after = snapshot(db)
    created = sorted(
        str(path.relative_to(tmp)) for path in tmp.rglob("*") if path.name not in ("notes.txt", "config.toml")
    )
    shutil.rmtree(tmp, ignore_errors=True)
    return Ran(case, args, done.returncode, done.stdout, done.stderr, before, after, values, created)


def fill(template: str, values: dict) -> str:
    for name, value in values.items():
        template = template.replace("{" + name + "}", value)
    return template


def run_all(yard: Farmyard, cases: list[Case]) -> list[Ran]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda c: run_case(yard, c), cases))


# -- the tests ----------------------------------------------------------------

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(900)]  # every case is a process: minutes on a busy machine


@pytest.fixture(scope="module")
def yard(pg_server, tmp_path_factory):
    return Farmyard(pg_server, tmp_path_factory.mktemp("bad-input"))


@pytest.fixture(scope="module")
def refused(yard):
    return run_all(yard, BAD_INPUTS)


@pytest.mark.parametrize(
    "index", range(len(BAD_INPUTS)), ids=[f"{c.kind}: {' '.join(c.args)[:60]}" for c in BAD_INPUTS]
)
def test_bad_input_gets_one_clear_line_and_changes_nothing(refused, pg_server, index):
    ran = refused[index]
    shown = ran.stdout + ran.stderr
    assert "Traceback" not in shown
    assert pg_server.password not in shown and ran.case.secret not in shown
    assert ran.returncode in (1, 2), (ran.returncode, shown)
    assert ran.stdout == ""
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran.stderr
    assert re.search(ran.case.says, lines[0]), lines[0]
    assert LONG[: ECHO_LIMIT + 1] not in shown, "a long input was repeated whole"
    assert ran.after == ran.before, "the database changed"
    assert ran.created == [], "files were created"


# The push throttle's one row (PostgreSQL, store/sql/push.py): an enqueue rewrites when the farm last notified.
REWRITTEN = {"qp_push"}


def test_hostile_names_that_are_valid_are_stored_verbatim(yard):
    for ran in run_all(yard, HOSTILE_ACCEPTED):
        assert ran.returncode == 0, ran.stderr
        assert "Traceback" not in ran.stdout + ran.stderr
        assert set(ran.after) == set(ran.before), "a table appeared or vanished"
        for table, rows in ran.before.items():
            if table not in REWRITTEN:
                assert set(rows) <= set(ran.after[table]), f"rows of {table} changed or vanished"
        added = [
            value for table in ran.after for row in set(ran.after[table]) - set(ran.before[table]) for value in row
        ]
        assert any(HOSTILE in str(value) for value in added), "the hostile text was not stored as given"
