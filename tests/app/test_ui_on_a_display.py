"""The app on a real X display (Xvfb), the way the README's first command opens it, and what the demo says when
the system lacks what Qt's X11 plugin loads. The other app tests draw offscreen, which needs none of the X
libraries: only these can see that a window really opens on a fresh machine (.ci/run installs Xvfb, so in CI
they always run)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from queueprocessor.farm import Farm
from tests.acceptance.test_bad_input import run_cli
from ui import xcb

ROOT = Path(__file__).resolve().parents[2]

OPEN_A_WINDOW = """
import sys, time
from PySide6.QtWidgets import QApplication
from ui import xcb
from ui.app import make_app
from ui.mainwindow import MainWindow
assert xcb.problem() is None, xcb.problem()
app = make_app([], "light")
window = MainWindow(sys.argv[1], None, interval=0.2)
window.show()
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not (window.windowHandle().isExposed() and window.snap):
    app.processEvents()
    time.sleep(0.02)
print(QApplication.platformName(), window.windowHandle().isExposed(), [m["name"] for m in window.snap.machines])
window.close()
while window.isVisible():
    app.processEvents()
    time.sleep(0.02)
"""


@pytest.fixture
def display():
    """A fresh Xvfb display (its name, e.g. ':7'); skipped only where Xvfb is not installed."""
    if shutil.which("Xvfb") is None:
        pytest.skip("Xvfb is not installed (apt-get install xvfb; .ci/run installs it): no real window can open")
    read, write = os.pipe()
    server = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write), "-screen", "0", "1440x900x24", "-nolisten", "tcp"],
        pass_fds=(write,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write)
    with os.fdopen(read) as chosen:
        number = chosen.readline().strip()  # Xvfb writes the display it took once it accepts connections
    try:
        assert number, "Xvfb did not start"
        yield f":{number}"
    finally:
        server.terminate()
        server.wait(30)


def _on(display: str, tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("QP_DB", "WAYLAND_DISPLAY")}
    return env | dict(
        DISPLAY=display, QT_QPA_PLATFORM="xcb", XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(ROOT)
    )


def test_the_app_opens_a_real_window_on_an_x_display(display, tmp_path):
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    with Farm(url) as farm:
        farm._store.machines.register(name="desk", host="h", instance="i", pid=1, version="0", capacity=1, allow=None)
    shown = subprocess.run(
        [sys.executable, "-c", OPEN_A_WINDOW, url],
        env=_on(display, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split("\n")[0] == "xcb True ['desk']", shown.stderr


def test_the_demo_names_the_packages_to_install_before_it_starts_anything(tmp_path):
    """A system whose X libraries are missing, as `ldd` reports it on a minimal Debian 12: one line, nothing started."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ldd").write_text(
        "#!/bin/sh\necho '\tlibxcb-icccm.so.4 => not found'\necho '\tlibxcb-keysyms.so.1 => not found'\n"
        "echo '\tlibxcb-cursor.so.0 => not found'\necho '\tlibxcb.so.1 => /lib/libxcb.so.1 (0x0)'\n"
    )
    (fake / "ldd").chmod(0o755)
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "QT_QPA_PLATFORM": "xcb", "DISPLAY": ":99"}
    ran = run_cli(["demo", "--seconds", "5"], env, tmp_path)
    assert ran.returncode == 1 and ran.stdout == "", ran.stdout
    assert ran.stderr == (
        "demo: the desktop app cannot open a window here: Qt's X11 plugin needs libraries this system lacks; "
        "install them with `sudo apt-get install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1` (Debian, Ubuntu); "
        "or run the demo with --headless\n"
    )
    assert not (tmp_path / "data" / "queueprocessor" / "demo.db").exists()  # no farm, no node started


def test_the_readme_and_ci_install_every_library_the_x11_plugin_loads():
    readme, ci = (ROOT / "README.md").read_text(), (ROOT / ".ci" / "run").read_text()
    for package in xcb.PACKAGES.values():
        assert package in readme and package in ci, package
    assert "xvfb" in ci
    if xcb.plugin() is not None and shutil.which("ldd"):  # the list is whole: every library the plugin loads
        loads = subprocess.run(["ldd", str(xcb.plugin())], capture_output=True, text=True, check=True).stdout
        x_libraries = {line.split()[0] for line in loads.splitlines() if "xcb" in line or "X11" in line}
        assert x_libraries <= set(xcb.PACKAGES), x_libraries - set(xcb.PACKAGES)
