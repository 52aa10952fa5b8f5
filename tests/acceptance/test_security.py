"""Security: passwords never shown, allow-lists that hold against hostile input, SQL only through
bound parameters, and a watch-only app that cannot change anything. Real PostgreSQL, real node processes and
in-process nodes, real HTTP servers, real Qt widgets offscreen."""

import ast
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, inspect, text
from sqlalchemy.engine import make_url
from yarl import URL

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from queueprocessor import work_spec  # noqa: E402
from queueprocessor.executors.base import JobFailed  # noqa: E402
from queueprocessor.executors.http import LOCAL_HOSTS, HttpExecutor  # noqa: E402
from queueprocessor.farm import Farm  # noqa: E402
from queueprocessor.rules.errors import InvalidJob, QPError  # noqa: E402
from queueprocessor.rules.job import JobSpec  # noqa: E402
from queueprocessor.rules.states import Wish  # noqa: E402
from queueprocessor.store.database import open_engine  # noqa: E402
from tests.acceptance.test_bad_input import run_cli, snapshot  # noqa: E402
from tests.app.test_ui_window import app, close  # noqa: E402, F401  (the app fixture, and closing a window)
from tests.support.tcpproxy import TcpProxy  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FAST = {"period": 0.25, "heartbeat": 0.25, "misses": 4}
MARK = 'QP7x\'); DROP TABLE qp_jobs; --" OR "1"="1'  # "QP7x" never appears in SQL we write ourselves


def wait_until(condition, timeout: float = 60.0, what: str = "it"):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def settle(farm: Farm, timeout: float = 60.0) -> None:
    wait_until(lambda: (c := farm._store.jobs.counts())["queued"] == 0 and c["running"] == 0, timeout, "the queue")


# -- passwords ----------------------------------------------------------------


@pytest.fixture
def farm_with_everything(pg_url, tmp_path):
    """A farm with a failed job, a queued one, a machine, a schedule and a singleton: every command has work."""
    with Farm(pg_url) as farm:
        farm.settings(**FAST)
        [failed] = farm._store.jobs.enqueue(JobSpec("http", "/fail", max_attempts=1))
        farm._store.count(text("UPDATE qp_jobs SET state = 'failed' WHERE id = :id"), {"id": failed})
        [queued] = farm.enqueue_http("/later", delay=3600)
        machine = farm._store.machines.register(
            name="desk", host="h", instance=uuid.uuid4().hex, pid=1, version="0", capacity=1, allow=None
        )
    return pg_url, failed, queued, machine


@pytest.mark.postgres
def test_no_command_shows_the_password_right_or_wrong(farm_with_everything, pg_server, tmp_path):
    url, failed, queued, machine = farm_with_everything
    wrong = url.replace(pg_server.password, "Wr0ng-" + pg_server.password[::-1])
    chains = [  # every command with the password in its URL: each chain in order, the chains side by side
        [["init-db"], ["status"], ["status", "--json"], ["-vv", "status"], ["--version"]],
        [
            ["jobs"],
            ["jobs", "--json"],
            ["job", str(failed), "--json"],
            ["turns", "--json"],
            ["retry", str(failed)],
            ["cancel", str(queued)],
        ],
        [
            ["enqueue", "http", "/x"],
            ["enqueue", "python", "tests.support.pyjobs:echo"],
            ["enqueue", "command", "--", "true"],
            ["grab", "report", "2026-11-22", "http", "/report"],
        ],
        [["pause", str(machine)], ["resume", str(machine)], ["drain", str(machine)]],
        [
            ["schedule", "add", "nightly", "http", "/n", "--every", "60"],
            ["schedule", "list"],
            ["schedule", "list", "--json"],
            ["schedule", "pause", "nightly"],
            ["schedule", "remove", "nightly"],
        ],
        [
            ["singleton", "add", "feed", "http", "/feed"],
            ["singleton", "list", "--json"],
            ["singleton", "remove", "feed"],
        ],
    ]
    config = tmp_path / "qp.toml"
    config.write_text(f'db = "{url}"\n')
    right = [[(["--db", url, *argv], {}) for argv in chain] for chain in chains]
    right.append([(["status"], {"QP_DB": url}), (["--config", str(config), "status", "--json"], {})])
    commands = {argv[0]: argv for chain in chains for argv in chain if argv[0] not in ("-vv", "--version")}
    refused = [[(["--db", wrong, *argv], {})] for argv in [*commands.values(), ["node"]]]
    refused.append([(["status"], {"QP_DB": wrong})])

    def run_chain(chain):
        return [(argv, run_cli(argv, env, tmp_path)) for argv, env in chain]

    with ThreadPoolExecutor(max_workers=4) as pool:
        ran_right = [r for chain in pool.map(run_chain, right) for r in chain]
        ran_refused = [r for chain in pool.map(run_chain, refused) for r in chain]
    for argv, result in ran_right + ran_refused:
        shown = result.stdout + result.stderr
        assert pg_server.password not in shown and "Wr0ng-" not in shown, argv
        assert "Traceback" not in shown, (argv, shown)
    for argv, result in ran_right:
        assert result.returncode == 0, (argv, result.stderr)
        if argv[-2:] == ["status", "--json"]:
            assert json.loads(result.stdout)["database"].startswith("postgresql+psycopg://postgres:***@")
    for argv, result in ran_refused:
        assert result.returncode == 1 and "password authentication failed" in result.stderr, (argv, result.stderr)
        assert "postgres:***@" in result.stderr


@pytest.mark.postgres
@pytest.mark.slow
def test_a_node_cut_off_and_back_logs_no_password(pg_server, pg_url, http_target, tmp_path):
    with Farm(pg_url) as farm:
        farm.settings(**FAST)
    with TcpProxy("127.0.0.1", pg_server.port) as proxy:
        url = pg_url.replace(f":{pg_server.port}/", f":{proxy.port}/")
        with open(tmp_path / "node.log", "w") as log:
            node = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "queueprocessor.cli",
                    "-vv",
                    "--db",
                    url,
                    "node",
                    "--name",
                    "talkative",
                    "--http-base",
                    http_target.base_url,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        try:
            with Farm(pg_url) as farm:
                wait_until(lambda: farm.status()["machines"], 30, "the node")
                farm.enqueue_http("/ok", count=5)
                settle(farm)
                proxy.cut()
                time.sleep(2.0)  # connection errors, a self-fence, retries: all logged
                proxy.restore()
                wait_until(
                    lambda: "database reachable" in (tmp_path / "node.log").read_text().split("unreachable")[-1],
                    30,
                    "the node to reconnect",
                )
        finally:
            node.send_signal(signal.SIGTERM)
            node.wait(30)
    output = (tmp_path / "node.log").read_text()
    assert "database unreachable" in output  # the errors were logged...
    assert pg_server.password not in output  # ...without the password


# Credentials an HTTP job's target may carry: its userinfo and secret-looking query parameters.
SECRETS = ("usr-Q7Zs", "pw-Q7Zs", "tok-Q7Zs", "key-Q7Zs", "sig-Q7Zs", "auth-Q7Zs")


def with_credentials(base: str, path: str) -> str:
    """`base` + `path` with every kind of credential in it."""
    url = URL(base)
    query = "token=tok-Q7Zs&API_KEY=key-Q7Zs&day=1&X-Amz-Signature=sig-Q7Zs&auth=auth-Q7Zs"
    return f"http://usr-Q7Zs:pw-Q7Zs@{url.host}:{url.port}/{path}?{query}"


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens: connecting to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.postgres
def test_credentials_in_an_http_target_are_stored_nowhere_but_the_target(pg_url, http_target):
    """A real node runs HTTP jobs whose URLs carry a password, a token and keys, against a real server that answers
    500 and a port that refuses the connection; a schedule of such a URL is logged. The jobs' errors, their runs'
    and the events say where and why, but hold no secret."""
    answers_500 = with_credentials(http_target.base_url, "fail")
    refuses = with_credentials(f"http://127.0.0.1:{closed_port()}/", "x")
    with Farm(pg_url) as farm:
        farm.settings(**FAST)
        farm.schedule("nightly", JobSpec("http", answers_500), every=3600)
        node = farm.node(name="careful", http_base=http_target.base_url).start()
        try:
            ids = [farm.enqueue(JobSpec("http", target, max_attempts=1))[0] for target in (answers_500, refuses)]
            jobs = [
                wait_until(lambda i=i: farm.job(i)["state"] == "failed" and farm.job(i), 30, "a failure") for i in ids
            ]
        finally:
            node.stop(drain=False)
        stored = [job["last_error"] for job in jobs] + [run["error"] for job in jobs for run in job["runs"]]
        stored += [event["detail"] or "" for event in farm.events()]
    assert len(http_target.requests("/fail")) == 1  # the first reached its server
    assert "answered HTTP 500" in stored[0] and f":{http_target.port}/fail?" in stored[0]
    assert "ClientConnectorError" in stored[1]
    assert any("every 3600 s" in detail and "/fail?" in detail for detail in stored)
    assert [secret for secret in SECRETS if secret in "\n".join(stored)] == []
    assert "day=1" in stored[0]  # a parameter that is no secret is shown


@pytest.mark.postgres
def test_the_python_api_never_shows_the_password(pg_server, pg_url):
    with Farm(pg_url) as farm:
        assert pg_server.password not in farm.masked_url + json.dumps(farm.status(), default=str)
        assert pg_server.password not in repr(farm._engine.url) + str(farm._engine.url)
    with pytest.raises(QPError) as refused:
        Farm(pg_url.replace(pg_server.password, "not-" + pg_server.password))
    assert "password authentication failed" in str(refused.value)
    assert pg_server.password not in str(refused.value)


@pytest.mark.postgres
def test_the_app_shows_no_password_anywhere(pg_url, pg_server, app, qtbot):  # noqa: F811
    from PySide6.QtWidgets import QAbstractButton, QLabel, QLineEdit, QWidget

    from ui.mainwindow import MainWindow

    Farm(pg_url).close()
    window = MainWindow(pg_url, None, interval=0.1)
    window.show()
    try:
        qtbot.waitUntil(lambda: window.snap is not None, timeout=30_000)
        shown = [window.windowTitle()]
        for widget in window.findChildren(QWidget):
            shown += [widget.toolTip(), widget.statusTip(), widget.windowTitle()]
            if isinstance(widget, (QLabel, QLineEdit, QAbstractButton)):
                shown.append(widget.text())
        for action in window.actions():
            shown += [action.text(), action.toolTip(), action.statusTip()]
        assert any("postgres:***@" in s for s in shown)  # the database is named...
        assert not [s for s in shown if pg_server.password in s]  # ...never with its password
    finally:
        close(window, qtbot)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://qp:QP7pw@db.example/farm",
        "postgresql://qp@db.example/farm?sslmode=require&PassWord=QP7pw",
        "postgresql://qp@db.example/farm?pwd=QP7pw",
        "mssql+pyodbc:///?odbc_connect=DRIVER%3D%7BODBC+Driver+18%7D%3BUID%3Dqp%3BPWD%3DQP7pw%3BEncrypt%3Dyes",
    ],
)
def test_the_app_remembers_recent_databases_without_any_password(url, tmp_path):
    from PySide6.QtCore import QSettings

    from ui.operator import recent_databases, remember

    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    remember(settings, url)
    settings.sync()
    assert "QP7pw" not in (tmp_path / "settings.ini").read_text() + " ".join(recent_databases(settings))
    assert recent_databases(settings)  # remembered, all the same


# -- allow-lists ----------------------------------------------------------------


class Listener:
    """A server on another loopback address (127.0.0.2, not in any allow-list) that counts who calls it."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.2", 0))
        self.port = self.socket.getsockname()[1]
        self.calls = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            self.calls += 1
            conn.close()

    def close(self):
        self.socket.close()
        self._thread.join(5)


url_pieces = st.sampled_from(
    [
        "http:",
        "https:",
        "HTTP:",
        "//",
        "/",
        "\\",
        "@",
        ":",
        "127.0.0.1",
        "127.0.0.2",
        "evil.example",
        "localhost",
        ".",
        "..",
        "%2F",
        "%40",
        "%5C",
        "?",
        "#",
        "\t",
        "\n",
        " ",
        "[::1]",
        "[::ffff:127.0.0.2]",
        "2130706434",
        "8080",
        "x",
        "%00",
        "\u3002",
        "\uff0e",
        "\uff0f",
        "\uff20",
    ]
)


@settings(max_examples=3000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(url_pieces, max_size=10).map("".join))
def test_whatever_target_passes_the_http_allow_list_goes_to_an_allowed_host(target):
    executor = HttpExecutor("http://127.0.0.1:8080/api/")
    try:
        executor.validate(JobSpec("http", target))
    except InvalidJob:
        return
    try:
        host = URL(executor.url_for(target)).host  # where the client would really connect
    except ValueError:
        return  # the client refuses to send it at all
    assert host in LOCAL_HOSTS


# -- HTTP paths stay under the node's base ---------------------------------------

# Relative targets that would leave a base's path for a server that reads them plainly, decodes them (once or twice),
# takes "\\" for "/", or reads "..;" as ".." (Tomcat).
CLIMBING = [
    "../ok",
    "/../ok",
    "a/../../ok",
    "./../ok",
    "..",
    "%2e%2e/ok",
    "%2E%2E/ok",
    ".%2e/ok",
    "..%2fok",
    "..%2Fok",
    "..\\ok",
    "%2e%2e%5cok",
    "..;/ok",
    "%252e%252e/ok",
    "%25252e%25252e%25252fok",
]


def as_a_server_reads(raw_path: str) -> str:
    """The path a lenient server would serve for `raw_path`: decoded until nothing is left to decode, "\\" taken
    for "/", each segment's ";parameters" dropped, "." and ".." resolved (".." at the root stays there)."""
    while (decoded := unquote(raw_path)) != raw_path:
        raw_path = decoded
    segments: list[str] = []
    for segment in re.split(r"[/\\]", raw_path)[1:]:
        segment = segment.split(";")[0].strip()
        if segment == "..":
            segments = segments[:-1]
        elif segment != ".":
            segments.append(segment)
    return "/" + "/".join(segments)


path_pieces = st.sampled_from(
    ["/", "\\", ".", "..", "%2e", "%2E", "%2f", "%5c", "%25", "25", "2e", ";", "?", "#", "x", "ok", "//", "@", "%00"]
)


@settings(max_examples=2000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(path_pieces, max_size=10).map("".join))
def test_whatever_relative_target_passes_stays_under_the_http_base(target):
    """Under the base's path as the client sends it and as any lenient server reads it, or refused."""
    executor = HttpExecutor("http://127.0.0.1:8080/api/")
    try:
        url = executor.resolve("GET", target)
    except (InvalidJob, JobFailed):
        return
    assert url.raw_path.startswith("/api/") and f"{as_a_server_reads(url.raw_path)}/".startswith("/api/"), url


@pytest.mark.parametrize("target", CLIMBING)
def test_the_door_refuses_a_path_that_climbs_out_of_the_http_base(target, tmp_path):
    with Farm(f"sqlite:///{tmp_path / 'farm.db'}") as farm, pytest.raises(InvalidJob) as refused:
        farm.enqueue_http(target)
    assert "climbs out of the node's HTTP base" in str(refused.value) and "\n" not in str(refused.value)


def test_the_cli_refuses_a_path_that_climbs_out_of_the_http_base_in_one_line(tmp_path):
    ran = run_cli(
        ["--db", f"sqlite:///{tmp_path / 'farm.db'}", "enqueue", "http", "/reports/%2e%2e/admin"], {}, tmp_path
    )
    assert ran.returncode != 0 and ran.stdout == ""
    assert ran.stderr.startswith("error: HTTP job target '/reports/%2e%2e/admin' climbs out of the node's HTTP base")
    assert ran.stderr.count("\n") == 1


@pytest.mark.postgres
def test_a_node_refuses_a_path_that_climbs_out_of_its_http_base(pg_url, http_target):
    """Put straight into the table (past the door), each climbing path fails on a real node with the reason and
    reaches no server; a path under the base runs."""
    with Farm(pg_url) as farm:
        farm.settings(**FAST)
        node = farm.node(name="based", http_base=http_target.base_url + "status/").start()
        try:
            climbing = [farm._store.jobs.enqueue(JobSpec("http", t, max_attempts=1))[0] for t in CLIMBING]
            [under] = farm.enqueue_http("200")
            settle(farm)
            jobs = {job["id"]: job for job in farm._store.jobs.newest(limit=100)}
        finally:
            node.stop(drain=False)
    assert jobs[under]["state"] == "succeeded"
    for job_id in climbing:
        assert jobs[job_id]["state"] == "failed" and "climbs out of the node's HTTP base" in jobs[job_id]["last_error"]
    assert [request["path"] for request in http_target.requests()] == ["/status/200"]


@pytest.mark.postgres
@pytest.mark.slow
def test_a_node_refuses_hostile_work_put_straight_into_the_table_and_runs_the_rest(pg_url, http_target, tmp_path):
    evil = Listener()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    e = f"127.0.0.2:{evil.port}"
    at_the_door = {  # target: refused when enqueued (a live machine publishes its allow-lists)
        f"http://{e}/x": True,
        f"//{e}/x": True,
        f"http://127.0.0.1@{e}/": True,
        f"HTTP://{e}/": True,
        f"http://2130706434:{evil.port}/": True,
        f"http://[::ffff:127.0.0.2]:{evil.port}/": True,
        f" http://{e}/": True,
        f"http:{e}/x": True,
        "http://[::1": True,
        "//\uff0fx": True,
        f"/http://{e}/x": False,  # a path on this machine's service (it once went to {e})
        f"http://{e}\\@127.0.0.1/": False,  # userinfo "{e}\\", host 127.0.0.1, for every parser
        # The door cannot import the module (the enqueuer may not have it); the node finds where these lead.
        "tests.support.pgserver:shutil.rmtree": False,
        "tests.support.pgserver:os.system": False,
    }
    hostile = {
        "http": list(at_the_door),
        "python": [
            "os:system",
            "builtins:exec",
            "tests.support.pgserver:shutil.rmtree",
            "tests.supportx:f",
            "tests.support.pgserver:os.system",
            "tests.support.pyjobs:echo.__globals__",
            "subprocess:run",
        ],
        "command": [
            ["sh", "-c", f"touch {victim}/sh"],
            ["/bin/echo", "x"],
            ["echo;touch", f"{victim}/semi"],
            ["./echo"],
            ["rm", "-rf", str(victim)],
        ],
    }
    fine = [
        JobSpec("http", "/ok"),
        JobSpec("python", "tests.support.pyjobs:echo", payload='{"a": 1}'),
        JobSpec(
            "command",
            json.dumps(
                ["echo", f"$(touch {victim}/a)", f"; touch {victim}/b", f"`touch {victim}/c`", f"| touch {victim}/d"]
            ),
        ),
    ]
    with Farm(pg_url) as farm:
        farm.settings(**FAST)
        node = farm.node(
            name="guard", http_base=http_target.base_url, allow_modules=("tests.support",), allow_commands=("echo",)
        ).start()
        try:
            bad = []
            for executor, targets in hostile.items():
                for target in targets:
                    spec = JobSpec(
                        executor,
                        target if executor != "command" else json.dumps(target),
                        payload=json.dumps(str(victim)),
                        max_attempts=1,
                    )
                    if at_the_door.get(target, True) if executor != "command" else True:
                        try:
                            farm.enqueue(spec)
                        except InvalidJob:
                            pass
                        else:
                            pytest.fail(f"the door let in {executor} {target!r}")
                    bad += farm._store.jobs.enqueue(spec)  # as a SQL insert would put it, past the door
            for spec in (
                JobSpec("bogus", "/x", max_attempts=1),
                JobSpec("http", "/ok", method="DELETE", max_attempts=1),
                JobSpec("python", "tests.support.pyjobs:echo", payload="{not json", max_attempts=1),
                JobSpec("command", "rm -rf /", max_attempts=1),
            ):
                bad += farm._store.jobs.enqueue(spec)  # malformed rows a node must fail alone, and carry on
            good = [farm._store.jobs.enqueue(spec)[0] for spec in fine]
            settle(farm)
            jobs = {j["id"]: j for j in farm._store.jobs.newest(limit=1000)}
        finally:
            node.stop(drain=False)
            evil.close()
    assert evil.calls == 0, "a job reached a host outside the allow-list"
    assert (victim / "precious").read_text() == "keep me"
    assert sorted(p.name for p in victim.iterdir()) == ["precious"], "a hostile job ran"
    for job_id in bad:
        job = jobs[job_id]
        assert job["state"] == "failed", job
        if job["executor"] in ("python", "command") and job["payload"] != "{not json":
            assert any(why in job["last_error"] for why in ("not allowed", "private attribute", "not a JSON list")), job
    assert [jobs[i]["state"] for i in good] == ["succeeded"] * len(good), [jobs[i]["last_error"] for i in good]
    runs = farm_runs(pg_url, good[-1])
    assert "$(touch" in runs[0]["output"] and "`touch" in runs[0]["output"]  # arguments, not shell syntax


def farm_runs(url: str, job_id: int) -> list[dict]:
    with Farm(url) as farm:
        return farm._store.runs.read(job_id=job_id)


# -- SQL ------------------------------------------------------------------------

SQL_CALLS = {"text", "exec_driver_sql", "execute", "literal_column", "executescript"}


def built_from_values(expression: ast.expr) -> bool:
    """Is this text put together from anything but literals and UPPER_CASE constants?"""

    def fixed(part: ast.expr) -> bool:
        return isinstance(part, ast.Constant) or (isinstance(part, ast.Name) and part.id.isupper())

    if isinstance(expression, ast.JoinedStr):
        return not all(fixed(v.value) if isinstance(v, ast.FormattedValue) else fixed(v) for v in expression.values)
    if isinstance(expression, ast.BinOp):
        return not (fixed(expression.left) and fixed(expression.right))
    return (
        isinstance(expression, ast.Call)
        and isinstance(expression.func, ast.Attribute)
        and expression.func.attr == "format"
    )


def test_sql_is_never_built_from_strings_in_the_code():
    """No statement text is made from values with an f-string, % or + or .format(): values only travel as bound
    parameters (a channel name from a constant is not a value)."""
    built = []
    for path in sorted((ROOT / "queueprocessor").rglob("*.py")) + sorted((ROOT / "ui").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and node.args:
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in SQL_CALLS and built_from_values(node.args[0]):
                    built.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert built == []


@pytest.mark.postgres
def test_hostile_text_only_ever_reaches_the_database_as_a_parameter(pg_url, http_target):
    statements = []
    with Farm(pg_url) as farm:
        event.listen(
            farm._engine, "before_cursor_execute", lambda conn, cursor, statement, *rest: statements.append(statement)
        )
        farm.settings(**FAST)
        node = farm.node(name=MARK, http_base=http_target.base_url).start()
        try:
            [job] = farm.enqueue_http(
                "/" + MARK, method="POST", payload=json.dumps({"m": MARK}), key=MARK, max_attempts=1
            )
            grabbed = farm.grab(MARK, MARK, JobSpec("http", "/" + MARK, max_attempts=1))
            farm.schedule(MARK, JobSpec("http", "/" + MARK), every=3600)
            farm.singleton(MARK + "-feed", JobSpec("http", "/ok"))
            farm.wait(job, timeout=60)
            farm.wait(grabbed, timeout=60)
            assert farm.steer(MARK, "pause")["name"] == MARK
            assert job in [j["id"] for j in farm._store.views.find_jobs(MARK)]
            with pytest.raises(QPError):
                farm.steer(MARK + "x", "drain")
            stored = farm._store.jobs.get(job)
        finally:
            node.stop(drain=False)
        tables = inspect(farm._engine).get_table_names()
    assert (stored["target"], stored["key"], json.loads(stored["payload"])) == ("/" + MARK, MARK, {"m": MARK})
    assert {"qp_jobs", "qp_machines", "qp_runs", "qp_turns"} <= set(tables)
    # The capture saw the statements that carried the hostile text: the enqueue, the schedule and the steer.
    # (The node's hot statements go straight to the driver, compiled once from constructs: store.Raw.)
    for carrier in ("INSERT INTO qp_jobs", "INSERT INTO qp_schedules", "UPDATE qp_machines SET wish"):
        assert any(s.startswith(carrier) for s in statements), carrier
    assert not [s for s in statements if "QP7x" in s]


# -- the watch-only app -----------------------------------------------------------


def prepare_farm(url: str) -> int:
    """A farm at rest (no node running): a failed job, a queued one, a machine row. Returns the machine id."""
    with Farm(url) as farm:
        [failed] = farm._store.jobs.enqueue(JobSpec("http", "/fail", max_attempts=1))
        farm._store.count(text("UPDATE qp_jobs SET state = 'failed' WHERE id = :id"), {"id": failed})
        farm.enqueue_http("/later", delay=3600)
        return farm._store.machines.register(
            name="desk", host="h", instance=uuid.uuid4().hex, pid=1, version="0", capacity=1, allow=None
        )


def test_a_read_only_farm_cannot_change_anything(db_url):
    machine = prepare_farm(db_url)
    before = snapshot(db_url)
    with Farm(db_url, read_only=True) as farm:
        assert farm.status()["jobs"]["failed"] == 1
        writes = [
            lambda: farm.enqueue_http("/x"),
            lambda: farm._store.jobs.cancel(2),
            lambda: farm._store.jobs.retry(1),
            lambda: farm.steer(str(machine), "pause"),
            lambda: farm._store.machines.wish(machine, "drain"),
            lambda: farm.schedule("s", JobSpec("http", "/s"), every=60),
            lambda: farm.singleton("f", JobSpec("http", "/f")),
            lambda: farm._store.settings.adopt({"period": "9"}),
            lambda: farm.node(name="sneaky").start(),
            lambda: farm._store.machines.mark_stopped(machine),
            lambda: farm._store.turns.prune(0),
        ]
        for write in writes:
            with pytest.raises(Exception):  # noqa: B017  (the database's own refusal, whatever the driver calls it)
                write()
    assert snapshot(db_url) == before


def test_a_read_only_farm_creates_nothing_in_an_empty_database(db_url):
    before = snapshot(db_url) if not db_url.startswith("sqlite") else None
    with pytest.raises(QPError, match="there is no QueueProcessor farm in .* yet"):
        Farm(db_url, read_only=True)
    if before is None:
        assert not Path(make_url(db_url).database).exists()
    else:
        assert snapshot(db_url) == before == {}


@pytest.mark.postgres
def test_the_watch_only_app_cannot_change_anything(pg_url, app, qtbot):  # noqa: F811
    from ui.mainwindow import MainWindow

    machine = prepare_farm(pg_url)
    before = snapshot(pg_url)
    window = MainWindow(pg_url, None, interval=0.1)
    window.show()
    try:
        qtbot.waitUntil(lambda: window.snap is not None and bool(window.snap.machines), timeout=30_000)
        writers = [
            window.act.enqueue,
            window.act.retry,
            window.act.cancel,
            window.act.pause,
            window.act.resume,
            window.act.drain,
        ]
        window.tabs.setCurrentWidget(window.jobs)
        qtbot.waitUntil(lambda: window.jobs.table.model().rowCount() > 0, timeout=30_000)
        for row in range(window.jobs.table.model().rowCount()):  # a failed and a queued job: retry, cancel
            window.jobs.table.selectRow(row)
            window._update_actions()
            assert not any(action.isEnabled() for action in writers)
        window.operator.show_peer_menu(window.peers_view.visualRect(window.peers.index(0, 0)).center())
        assert not [a.text() for a in window.operator.peer_menu.actions() if a.isEnabled()]
        for action in writers:
            action.trigger()  # disabled: nothing happens
        # Past the disabled buttons, straight to the worker: the database itself refuses.
        window.commands.enqueue(work_spec("http", "/sneaky"))
        qtbot.waitUntil(lambda: window.last_result is not None, timeout=30_000)
        assert window.last_result[1] is False
        window.operator.steer(machine, Wish.PAUSE)
        qtbot.waitUntil(lambda: window.last_result[0].startswith("Pause"), timeout=30_000)
        assert window.last_result[1] is False
        time.sleep(0.5)  # a few more polls
    finally:
        close(window, qtbot)
    assert snapshot(pg_url) == before


@pytest.mark.postgres
def test_the_watch_only_app_creates_nothing_in_an_empty_database(pg_url, app, qtbot):  # noqa: F811
    from ui.connection import State
    from ui.mainwindow import MainWindow

    window = MainWindow(pg_url, None, interval=0.1)
    window.show()
    try:
        qtbot.waitUntil(lambda: window.connection.state is State.ENDED, timeout=30_000)
        assert "no QueueProcessor farm" in window.connection.reason
    finally:
        close(window, qtbot)
    engine = open_engine(pg_url, pool_size=1)
    try:
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()
