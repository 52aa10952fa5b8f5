"""Commands that run something on this machine: its node (`node`), the desktop app (`gui`) and a whole demo farm
(`demo`)."""

import gc
import logging
import os
import signal
import sys
import threading
from typing import Protocol

import click

from ..nodeoptions import NodeCommand, NodeConfig, Seconds, node_options, secret_env, to_argv
from ..rules import logs
from ..rules.urls import default_url
from .config import load_config
from .context import Context, pass_ctx

log = logging.getLogger("queueprocessor")


class Runs(Protocol):
    """What the command uses of the node Farm.node() gives it: the CLI never reaches into a node's insides, and
    `--help` and `enqueue` load none of it (test_cli_imports)."""

    stopped: threading.Event

    def start(self) -> object: ...

    def stop(self, drain: bool = True) -> None: ...


@click.command(cls=NodeCommand)
@node_options
@pass_ctx
def node(ctx: Context, options: NodeConfig) -> None:
    """Run this machine's node until stopped (SIGTERM or Ctrl-C drains; a second Ctrl-C exits at once)."""
    logs.configure(min(logging.INFO, logging.getLogger().level), options.log_format, options.name)
    ctx.machine = options.name
    run_until_signalled(ctx.farm.node(options))


def run_until_signalled(the_node: Runs) -> None:
    """SIGTERM or the first SIGINT drains the node; a second SIGINT leaves at once."""
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stopping.is_set() and signum == signal.SIGINT:
            log.warning("second interrupt: leaving now; running jobs go back to the queue")
            threading.Thread(target=the_node.stop, kwargs={"drain": False}, daemon=True).start()
            return
        stopping.set()
        log.info("%s: draining, then exiting (Ctrl-C again to leave at once)", signal.Signals(signum).name)
        threading.Thread(target=the_node.stop, kwargs={"drain": True}, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    the_node.start()
    # What the process holds once started (modules, the engine, compiled statements) lives as long as it does: the
    # collector no longer walks it at each full collection, which a busy node's jobs set off every few seconds.
    gc.freeze()
    the_node.stopped.wait()  # a signal still runs its handler here (a lock's wait is interrupted by it)


@click.command()
@click.option("--nodes", type=click.IntRange(1, 8), default=3, help="Local node processes to start.")
@click.option("--seconds", type=Seconds(min=0), default=0, help="Stop after this long (0: until Ctrl-C).")
@click.option("--headless", is_flag=True, help="Print live status instead of opening the desktop app.")
@pass_ctx
def demo(ctx: Context, nodes: int, seconds: float, headless: bool) -> None:
    """A demo farm on this machine: local nodes at different clock skews, a web server, and a mix of work that shows
    every capability (the app's Help ▸ Tour says what to look at).

    Without --db it has a SQLite file of its own (demo.db beside the default farm.db), so a real node
    never runs the demo's work."""
    from ..demo import run_demo

    url = ctx.url if ctx.chosen else default_url("demo.db")
    run_demo(url, nodes=nodes, seconds=seconds, headless=headless, fresh=not ctx.chosen)  # its own file: afresh


@click.command(cls=NodeCommand)
@click.option("--observe", is_flag=True, help="Only watch the farm: run no node on this machine.")
@node_options
@click.option("--theme", type=click.Choice(["auto", "light", "dark"]), help="Colour scheme. Default: as last chosen.")
@click.option("--tour", is_flag=True, help="Open Help ▸ Tour beside the window at start (the demo does).")
@click.pass_context
def gui(ctx: click.Context, observe: bool, options: NodeConfig, theme: str | None, tour: bool) -> None:
    """Open the desktop app: it runs this machine's node (unless --observe) and shows the whole farm live.

    Without --db, QP_DB or a db in the config file, the app asks for the database.
    """
    root = ctx.find_root()
    url = root.params.get("db") or load_config(root.params.get("config")).get("db")
    args = to_argv(options) + (["--observe"] if observe else []) + (["--theme", theme] if theme else [])
    args += ["--tour"] if tour else []
    # The app is a separate package the core never imports: run it in place of this process. The URL
    # travels in the environment, so its password never shows in the process list.
    env = {k: v for k, v in os.environ.items() if k != "QP_DB"} | ({"QP_DB": url} if url else {}) | secret_env(options)
    os.execve(sys.executable, [sys.executable, "-m", "ui", *args], env)


COMMANDS = (node, gui, demo)
