"""What every command is handed: the farm, opened on first use, so `--help` and bad options never touch the
database and a command loads SQLAlchemy only when it reads or writes rows."""

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from ..rules.urls import default_url

if TYPE_CHECKING:  # the engine and SQLAlchemy: loaded by the first command that uses the farm
    from ..farm import Farm


class Context:
    """Opens the farm lazily, so `--help` and bad options never touch the database."""

    def __init__(self, url: str | None):
        self.chosen = url is not None  # by --db, QP_DB or the config file
        self.url = url or default_url()
        self.machine: str | None = None  # a node's --name, which labels the farm's connections
        self._farm: Farm | None = None

    @property
    def farm(self) -> "Farm":
        """The farm to change: created on first use, with its tables."""
        return self._open(read_only=False)

    @property
    def reader(self) -> "Farm":
        """The farm only to look at (the app's watch-only mode): a command that reads creates no file or table
        and adopts no settings, so the first node still chooses the farm's timing."""
        return self._open(read_only=True)

    def _open(self, read_only: bool) -> "Farm":
        if self._farm is None:
            with _collector_paused():
                # The engine and SQLAlchemy: loaded by the first command that uses the farm.
                from ..farm import Farm
                from ..store.database import client_name

                self._farm = Farm(self.url, read_only=read_only, client=client_name(self.machine))
        return self._farm

    def close(self) -> None:
        if self._farm is not None:
            self._farm.close()


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The first load of the farm side (SQLAlchemy, the stores, the engine) makes some hundred thousand objects that
    live as long as the process: the cyclic collector, started every 700 new objects and once more at exit, would
    walk them again and again and free nothing (a fifth of `enqueue`'s time). It rests meanwhile, and what was
    loaded is frozen out of its walks after, as a node freezes what it holds once started. A process that has the
    farm loaded already (a test calling main) is left as it is."""
    if "queueprocessor.farm" in sys.modules or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


pass_ctx = click.make_pass_decorator(Context)
