"""Starting the desktop app: options, the database (asked for when none is configured), the window.

    queueprocessor-gui [--db URL] [--observe] [--theme auto|light|dark] [NODE OPTIONS]

The node options are `queueprocessor node`'s own (queueprocessor.nodeoptions), checked the same way.

The database comes from --db, then QP_DB, then a dialog that remembers recent
ones. Without --observe the app runs this machine's node in-process, with
the same allow-lists as `queueprocessor node`, and closing the window (or
SIGTERM, or Ctrl-C in its terminal) stops it.
"""

import gc
import logging
import signal
import sys
from dataclasses import dataclass

import click

from queueprocessor.farm import with_password
from queueprocessor.nodeoptions import NodeCommand, NodeConfig, flag_of
from queueprocessor.nodeoptions import node_options as _node_option_set
from queueprocessor.rules import logs
from queueprocessor.rules.errors import QPError

try:
    from pyqtgraph.util.garbage_collector import GarbageCollector
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication
except ImportError as error:  # the GUI is an extra: say how to get it, no traceback
    sys.exit(
        f"error: the desktop app needs PySide6 and pyqtgraph ({error.name} is missing): "
        "pip install 'queueprocessor[gui]'"
    )

from . import theme, xcb
from .dialogs import DatabaseDialog
from .mainwindow import MainWindow
from .operator import recent_databases

_collector: GarbageCollector | None = None  # see collect_on_gui_thread


@click.command(cls=NodeCommand, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--db", metavar="URL", envvar="QP_DB", help="Farm database (default: QP_DB, else asked for in a dialog).")
@click.option("--observe", is_flag=True, help="Only watch the farm: run no node on this machine.")
@_node_option_set
@click.option(
    "--theme",
    type=click.Choice(["auto", "light", "dark"]),
    help="Colour scheme (default: as last chosen, else the system's).",
)
@click.option("--tour", is_flag=True, help="Open Help ▸ Tour beside the window at start (the demo does).")
@click.option("--interval", type=float, default=0.4, hidden=True)
def command(**_params) -> None:
    """The QueueProcessor desktop app (queueprocessor-gui): options only, see main()."""


@dataclass(frozen=True)
class Args:
    db: str | None
    observe: bool
    options: NodeConfig  # this machine's node, as `queueprocessor node` takes them
    theme: str | None
    tour: bool
    interval: float


def parse_args(argv: list[str] | None) -> Args:
    """The app's options, the node's among them checked as `queueprocessor node` checks them; a refusal is one
    line and exit code 2."""
    try:
        ctx = command.make_context("queueprocessor-gui", list(argv or []))
        if ctx.params["db"]:
            with_password(ctx.params["db"])  # checked before any window opens
    except click.exceptions.Exit as done:  # --help
        sys.exit(done.exit_code)
    except (click.ClickException, QPError) as error:  # options on a command line: named as on one
        text = error.format_message() if isinstance(error, click.ClickException) else error.say(flag_of)
        print(f"error: {' '.join(text.split())}", file=sys.stderr)
        sys.exit(2)
    return Args(**ctx.params)


def node_options(args: Args) -> NodeConfig | None:
    """This machine's node's settings; None when the app only observes."""
    return None if args.observe else args.options


def make_app(argv: list[str], scheme: str | None) -> QApplication:
    app = QApplication.instance() or QApplication(argv)
    assert isinstance(app, QApplication)  # a QCoreApplication would have no windows to show
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
    logs.configure(logging.WARNING, args.options.log_format, args.options.name)
    lacking = xcb.problem()  # Qt would abort without a word a user can act on
    if lacking:
        print(f"error: {lacking}", file=sys.stderr)
        sys.exit(1)
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
    if args.tour:
        window.operator.show_tour()
    settle()
    sys.exit(app.exec())
