"""Starting the desktop app: options, the database (asked for when none is configured), the window.

    queueprocessor-gui [--db URL] [--observe] [--name NAME] [--capacity N] [--http-base URL] [--clock-skew S]
                       [--allow-host HOST]... [--allow-module PREFIX]... [--allow-command PROGRAM]...

The database comes from --db, then QP_DB, then a dialog that remembers recent
ones. Without --observe the app runs this machine's node in-process, with
the same allow-lists as `queueprocessor node`, and closing the window (or
SIGTERM, or Ctrl-C in its terminal) stops it.
"""

import argparse
import gc
import logging
import os
import signal
import socket
import sys

from queueprocessor.database import parse_url
from queueprocessor.errors import QPError
from queueprocessor.executors import AllowLists

try:
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication
    from pyqtgraph.util.garbage_collector import GarbageCollector
except ImportError as error:  # the GUI is an extra: say how to get it, no traceback
    sys.exit(f"error: the desktop app needs PySide6 and pyqtgraph ({error.name} is missing): "
             "pip install 'queueprocessor[gui]'")

from . import theme
from .dialogs import DatabaseDialog
from .mainwindow import MainWindow, recent_databases

_collector: GarbageCollector | None = None  # see collect_on_gui_thread


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="queueprocessor-gui", description="The QueueProcessor desktop app.")
    parser.add_argument("--db", metavar="URL", default=os.environ.get("QP_DB"),
                        help="Farm database (default: QP_DB, else asked for in a dialog).")
    parser.add_argument("--observe", action="store_true", help="Only watch the farm: run no node on this machine.")
    parser.add_argument("--name", default=socket.gethostname(), help="This machine's name in the farm.")
    parser.add_argument("--capacity", type=int, default=4, help="Jobs this machine runs at once.")
    parser.add_argument("--http-base", default="http://localhost/", help="Base URL that HTTP job paths are "
                        "relative to.")
    parser.add_argument("--clock-skew", type=float, default=0.0, metavar="SECONDS",
                        help="Pretend this machine's clock is off by SECONDS.")
    parser.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                        help="Also run HTTP jobs on this host (the local machine is always allowed). Repeatable.")
    parser.add_argument("--allow-module", action="append", default=[], metavar="PREFIX",
                        help="Run Python jobs from modules under this prefix, e.g. myapp.jobs. Repeatable.")
    parser.add_argument("--allow-command", action="append", default=[], metavar="PROGRAM",
                        help="Run command jobs whose argv[0] is exactly this. Repeatable.")
    parser.add_argument("--theme", choices=("auto", "light", "dark"), help="Colour scheme (default: as last "
                        "chosen, else the system's).")
    parser.add_argument("--interval", type=float, default=0.4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.db:
            parse_url(args.db)
        if args.capacity < 1:
            raise QPError(f"--capacity must be at least 1 (got {args.capacity})")
        AllowLists(args.allow_host, args.allow_module, args.allow_command).executors(args.http_base)
    except QPError as error:
        parser.exit(2, f"error: {error}\n")
    return args


def node_options(args: argparse.Namespace) -> dict | None:
    if args.observe:
        return None
    return dict(name=args.name, capacity=args.capacity, http_base=args.http_base, clock_skew=args.clock_skew,
                allow_hosts=args.allow_host, allow_modules=args.allow_module, allow_commands=args.allow_command)


def make_app(argv: list[str], scheme: str | None) -> QApplication:
    app = QApplication.instance() or QApplication(argv)
    app.setOrganizationName("QueueProcessor")
    app.setApplicationName("QueueProcessor")
    app.setApplicationDisplayName("QueueProcessor")
    app.setDesktopFileName("queueprocessor-gui")
    choice = scheme or QSettings().value("view/scheme", "auto")
    choice = choice if choice in ("auto", "light", "dark") else "auto"
    current = app.findChild(theme.Theme)
    if current is None:
        theme.Theme(app, choice)
    elif current.choice != choice:
        current.choice = choice
        current.apply()
    app.setWindowIcon(theme.icon("app"))
    collect_on_gui_thread()
    return app


def collect_on_gui_thread() -> None:
    """Run Python's garbage collector on a GUI-thread timer only (pyqtgraph's GarbageCollector), not on whichever
    thread happens to allocate when a threshold is crossed. Run on the worker thread, freeing a Qt wrapper took
    Qt's connection lock and then waited for the interpreter lock, which the GUI thread held while it waited for
    that Qt lock in a connect(): the window froze for good (seen in the test suite)."""
    global _collector
    if _collector is None:
        _collector = GarbageCollector(interval=0.1)


def settle() -> None:
    """Once the window is up: set what exists so far aside from the garbage collector's full passes.

    The app's startup makes some 140,000 objects (Qt and pyqtgraph wrappers, SQLAlchemy's metadata) that
    live as long as it does. The worker's polls keep pushing fresh objects into the oldest generation, so
    Python runs a full collection every few polls; frozen, those objects no longer make each one a pause of
    tens of milliseconds with the interpreter lock held (bench/bench_gui.py --live).
    """
    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = make_app(sys.argv[:1], args.theme)
    url = args.db
    if not url:
        dialog = DatabaseDialog(recent_databases(QSettings()))
        if not dialog.exec():
            return
        url = dialog.url
    window = MainWindow(url, node_options(args), interval=args.interval)
    # SIGTERM (the demo, a service manager) and Ctrl-C close the window the normal way: the node stops cleanly.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: window.close())
    window.show()
    settle()
    sys.exit(app.exec())
