"""Launching the app as a user does: `queueprocessor gui`, `python -m ui`, the demo; and its dialogs."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QSettings  # noqa: E402

from queueprocessor import work_spec  # noqa: E402
from queueprocessor.farm import Farm  # noqa: E402
from ui.app import make_app  # noqa: E402
from ui.dialogs import DatabaseDialog, EnqueueDialog  # noqa: E402
from ui.operator import recent_databases, remember  # noqa: E402

QP = [sys.executable, "-m", "queueprocessor.cli"]


def _env(tmp_path, **extra):
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        XDG_DATA_HOME=str(tmp_path / "data"),
    )
    env.pop("QP_DB", None)
    return env | extra


def _wait(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_queueprocessor_gui_runs_this_machines_node_until_the_window_closes(tmp_path):
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    log = tmp_path / "app.log"
    config = tmp_path / "qp.toml"
    config.write_text('[gui]\nallow-module = ["myapp.jobs", "reports"]\nallow-command = ["true"]\n')
    command = [
        *QP,
        "--config",
        str(config),
        "--db",
        url,
        "gui",
        "--name",
        "desk-1",
        "--clock-skew",
        "0.5",
        "--allow-host",
        "reports.internal",
        "--allow-host",
        "backup.internal",
    ]
    with open(log, "wb") as out:
        app = subprocess.Popen(command, env=_env(tmp_path), stdout=out, stderr=subprocess.STDOUT)
    try:
        with Farm(url) as farm:
            assert _wait(
                lambda: any(m["name"] == "desk-1" and m["state"] == "active" for m in farm.status()["machines"])
            ), log.read_text()
            # The node's allow-lists, from the command line and the config's [gui] table, as it publishes them.
            [machine] = farm.status()["machines"]
            assert json.loads(machine["allow"]) == {
                "hosts": ["reports.internal", "backup.internal"],
                "modules": ["myapp.jobs", "reports"],
                "commands": ["true"],
            }
            app.send_signal(signal.SIGTERM)  # as a desktop session's logout does: the window closes
            assert app.wait(30) == 0
            [machine] = farm.status()["machines"]
            assert machine["state"] == "stopped"
            assert machine["clock_offset"] == pytest.approx(-0.5, abs=0.1)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()


def test_bad_options_get_a_clear_error_and_no_traceback(tmp_path):
    for args in (["--db", "nosuchdb://x", "gui"], ["gui", "--capacity", "0"]):
        done = subprocess.run([*QP, *args], env=_env(tmp_path), capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        assert "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1].lower().startswith("error: "), done.stderr
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ui",
            "--db",
            "postgresql://qp:s3cret@127.0.0.1:1/farm",
            "--http-base",
            "ftp://nowhere/",
        ],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: ") and "Traceback" not in done.stderr


def test_the_sample_config_is_accepted_by_the_cli(tmp_path):
    sample = Path(__file__).resolve().parents[2] / "resources" / "sample-config.toml"
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    Farm(url).close()  # `status` only reads a farm; it makes none
    done = subprocess.run(
        [*QP, "--config", str(sample), "--db", url, "status"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


OPEN_INSTALLED_WINDOW = """
import sys, time
from pathlib import Path
import ui
from ui import theme
from ui.app import make_app
from queueprocessor.nodeoptions import NodeConfig
from ui.mainwindow import MainWindow
app = make_app([], "dark")
window = MainWindow(sys.argv[1], NodeConfig(name="installed", capacity=1), interval=0.2)
window.show()
deadline = time.monotonic() + 30
while time.monotonic() < deadline and not (window.snap and window.snap.node):
    app.processEvents()
    time.sleep(0.02)
icons = all(not action.icon().isNull() for action in (window.act.pause, window.act.drain, window.act.follow))
print(Path(ui.__file__).parent, theme.RESOURCES, window.snap.node["state"], icons, len(app.styleSheet()) > 1000)
window.close()
while window.isVisible():
    app.processEvents()
    time.sleep(0.02)
"""


@pytest.mark.slow
def test_an_installed_app_has_its_icons_and_style_sheet_and_its_window_opens(tmp_path):
    """resources/ sits at the top of the repository; an installed app must still find it (as ui/resources)."""
    root = Path(__file__).resolve().parents[2]
    source = tmp_path / "source"  # a copy: building writes build/ and an egg-info next to the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source)
    for name in ("queueprocessor", "ui", "resources"):
        shutil.copytree(root / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    # What a wheel carries, and `pip install` puts in site-packages, is what setuptools' build_py lays out.
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import setuptools; setuptools.setup()",
            "--quiet",
            "build_py",
            "--build-lib",
            str(site),
        ],
        cwd=source,
        check=True,
        timeout=120,
        capture_output=True,
    )
    wanted = {
        p.relative_to(root / "resources")
        for p in (root / "resources").rglob("*")
        if p.suffix in (".svg", ".qss", ".toml")
    }
    assert (
        wanted
        and {p.relative_to(site / "ui" / "resources") for p in (site / "ui" / "resources").rglob("*") if p.is_file()}
        == wanted
    )

    # Run from outside the repository, importing the installed copy of the app.
    done = subprocess.run(
        [sys.executable, "-c", OPEN_INSTALLED_WINDOW, f"sqlite:///{tmp_path / 'farm.db'}"],
        cwd=tmp_path,
        env=_env(tmp_path, PYTHONPATH=str(site)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(site / "ui"), str(site / "ui" / "resources"), "active", "True", "True"]


@pytest.mark.slow
def test_headless_demo_runs_a_farm_and_cleans_up(tmp_path):
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    done = subprocess.run(
        [*QP, "--db", url, "demo", "--headless", "--seconds", "12"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("[") for line in lines) >= 6
    with Farm(url) as farm:
        machines = farm.status()["machines"]
        assert sorted(m["name"] for m in machines) == ["demo-1", "demo-2", "demo-3"]
        assert {m["state"] for m in machines} == {"stopped"}  # every node left; no process left behind
        assert len({t["machine_id"] for t in farm._store.turns.read(0)}) == 3
        counts = farm._store.jobs.counts()
        assert counts["succeeded"] > 5
        schedule = farm.get_schedule("demo-report")
        assert (schedule["every"], schedule["overlap"], schedule["jitter"]) == (10.0, "skip", 3.0)
        assert [s["name"] for s in farm.list_singletons()] == ["demo-watcher"]
        queues = {q.name: q for q in farm.queues()}
        assert (queues["reports"].limit, queues["partner"].breaker) == (2, "3/20s")
        offsets = sorted(m["clock_offset"] for m in machines)
        assert offsets == pytest.approx([-0.9, -0.25, 0.7], abs=0.05)  # the skews, seen from the database


@pytest.fixture
def app(qapp, tmp_path):
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "settings"))
    return make_app([], "light")


def test_database_dialog_checks_the_url_and_remembers_without_password(app, qtbot):
    settings = QSettings()
    remember(settings, "postgresql://ops:hunter2@db.farm.local/farm")
    remember(settings, "sqlite:////srv/farm.db")
    assert recent_databases(settings) == ["sqlite:////srv/farm.db", "postgresql+psycopg://ops@db.farm.local/farm"]
    dialog = DatabaseDialog(recent_databases(settings))
    qtbot.addWidget(dialog)
    dialog.choice.setCurrentText("mysql://x/y")
    dialog.accept()
    assert dialog.result() == 0 and "unsupported database" in dialog.error.text()
    dialog.choice.setCurrentIndex(1)
    dialog.password.setText("hunter2")
    dialog.accept()
    assert dialog.result() == 1
    assert dialog.url == "postgresql+psycopg://ops:hunter2@db.farm.local/farm"


def test_enqueue_dialog_refuses_bad_jobs_with_the_reason(app, qtbot):
    dialog = EnqueueDialog()
    qtbot.addWidget(dialog)
    dialog.path.setText("ftp://elsewhere.example/x")
    dialog.accept()
    assert dialog.result() == 0 and "neither a path" in dialog.error.text()
    dialog.path.setText("/reports")
    dialog.method.setCurrentText("POST")
    dialog.payload.setPlainText("{not json")
    dialog.accept()
    assert dialog.result() == 0 and "not valid JSON" in dialog.error.text()
    dialog.payload.setPlainText('{"day": "2026-11-22"}')
    dialog.timeout.setValue(5)
    dialog.accept()
    assert dialog.result() == 1
    assert dialog.options == dict(
        spec=work_spec("http", "/reports", method="POST", payload='{"day": "2026-11-22"}', timeout=5.0),
        delay=0.0,
        count=1,
    )
