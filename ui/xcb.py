"""What Qt's X11 platform plugin needs of the system, said in one line before the app tries to open a window.

The PySide6 wheel carries Qt, but not every X library its xcb plugin loads: a
minimal Debian 12 lacks libxcb-cursor0, libxcb-icccm4 and libxcb-keysyms1, and
Qt then aborts ("could not load the Qt platform plugin xcb") after the demo's
nodes have started. `ldd` on the plugin names what is missing, in about 10 ms
and without loading Qt: the app (app.main) and the demo (`python -m ui.xcb`)
ask it first and name the packages to install. PACKAGES is the one list: the
README's and .ci/run's are checked against it (tests/unit/test_docs.py).
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

# Each library the plugin loads that the X display does not bring by itself, by the Debian package with it.
PACKAGES = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb.so.1": "libxcb1",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
}


def plugin() -> Path | None:
    """PySide6's xcb platform plugin, found without importing Qt; None if there is none (not Linux, no PySide6)."""
    spec = importlib.util.find_spec("PySide6")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
        if path.exists():
            return path
    return None


def uses_xcb(env: Mapping[str, str]) -> bool:
    """Will Qt open its windows through the xcb plugin here (as opposed to offscreen, Wayland, Windows, macOS)?"""
    chosen = env.get("QT_QPA_PLATFORM", "")
    if chosen:
        return chosen.split(":")[0].split(";")[0] == "xcb"
    return sys.platform.startswith("linux") and not env.get("WAYLAND_DISPLAY")


def missing(ldd_output: str) -> list[str]:
    """The packages that hold the libraries `ldd` did not find (a library with no known package by its name)."""
    lost = [line.split("=>")[0].strip() for line in ldd_output.splitlines() if "not found" in line]
    return sorted({PACKAGES.get(name, name) for name in lost})


def problem(env: Mapping[str, str] = os.environ) -> str | None:
    """One line naming what to install for the window to open here, or None when nothing is missing (or Qt will
    not use the xcb plugin, or there is no `ldd` to ask)."""
    path, ldd = plugin(), shutil.which("ldd")
    if not uses_xcb(env) or path is None or ldd is None:
        return None
    try:
        found = subprocess.run([ldd, str(path)], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    packages = missing(found.stdout)
    if not packages:
        return None
    return (
        "the desktop app cannot open a window here: Qt's X11 plugin needs libraries this system lacks; "
        f"install them with `sudo apt-get install {' '.join(packages)}` (Debian, Ubuntu)"
    )


if __name__ == "__main__":  # the demo asks before it starts its nodes: the line on stderr, exit status 1
    line = problem()
    if line:
        print(line, file=sys.stderr)
    sys.exit(1 if line else 0)
