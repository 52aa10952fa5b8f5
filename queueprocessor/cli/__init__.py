"""The `queueprocessor` command: the root group, its commands gathered from the modules beside this one (one per
group of commands), and `main`, the entry point.

Options come from the command line, then QP_* environment variables, then the
TOML config file (`--config`, a `[node]`-style table per command and a
top-level `db`), then defaults. Every error a user can cause is one line on
stderr and a non-zero exit code, never a traceback.

A command answers as fast as what it does allows: the package loads only click and the light modules (errors,
states, output, urls, nodeoptions), and a command's handler loads the farm side it uses (`Context.farm` the
engine and SQLAlchemy, `Farm.node` the node, aiohttp and the executors). So `--help` loads no SQLAlchemy and
`enqueue` no node; tests/unit/test_cli_imports.py holds both.
"""

import logging
import os
import sys

import click

from ..rules import logs
from ..rules.errors import QPError, echoed
from ..rules.urls import mask
from ..version import __version__
from . import farm, jobs, node, schedule, work
from .config import check_config_keys, load_config
from .context import Context
from .output import cut_inputs, database_failure, in_cli_words, qp_variables


@click.group(context_settings={"auto_envvar_prefix": "QP", "help_option_names": ["-h", "--help"], "show_default": True})
@click.option(
    "--db",
    envvar="QP_DB",
    metavar="URL",
    help="Farm database, e.g. postgresql://user:pw@host/farm. Default: a SQLite file in your data folder.",
)
@click.option("--config", envvar="QP_CONFIG", metavar="FILE", help="TOML file with defaults for any option.")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.version_option(__version__, prog_name="queueprocessor")
@click.pass_context
def cli(ctx: click.Context, db: str | None, config: str | None, verbose: int) -> None:
    """A farm of machines sharing one SQL database drains a job queue together."""
    settings = load_config(config)
    ctx.default_map = check_config_keys(cli, settings, config)
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logs.configure(level)
    ctx.obj = Context(db or settings.get("db"))
    ctx.call_on_close(ctx.obj.close)


for module in (farm, jobs, node, schedule, work):
    for command in module.COMMANDS:
        cli.add_command(command)


def _show_envvars(command: click.Command) -> None:
    """Every option's help names its QP_* variable: QP_ENQUEUE_HTTP_PRIORITY is written nowhere else."""
    for param in command.params:
        if isinstance(param, click.Option) and param.expose_value:
            param.show_envvar = True
    for sub in getattr(command, "commands", {}).values():
        _show_envvars(sub)


_show_envvars(cli)


def main(argv: list[str] | None = None) -> None:
    """Entry point: one clear line for every error a user can cause."""
    ctx = None
    args = list(sys.argv[1:] if argv is None else argv)
    for arg in args:
        try:
            arg.encode()
        except UnicodeEncodeError:  # bytes that are not UTF-8 arrive as lone surrogates
            click.echo(f"error: argument {echoed(mask(arg))} is not valid UTF-8 text", err=True)
            sys.exit(2)
    try:
        ctx = cli.make_context("queueprocessor", args)
        with ctx:
            cli.invoke(ctx)
        sys.stdout.flush()  # a reader that left (`| head -1`) shows here, not at exit
    except BrokenPipeError:
        # As Python's documentation advises: nothing more can be written, and flushing at exit must not fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.exceptions.NoArgsIsHelpError as error:  # a command group alone: its help is the answer
        error.show()
        sys.exit(error.exit_code)
    except click.ClickException as error:
        # One line like every other error; a usage error names the help that explains the option.
        hint = f" (see `{error.ctx.command_path} --help`)" if isinstance(error, click.UsageError) and error.ctx else ""
        message = cut_inputs(error.format_message(), [*args, *qp_variables()])
        click.echo(f"error: {' '.join(message.split())}{hint}", err=True)
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except QPError as error:
        click.echo(f"error: {in_cli_words(error)}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as error:
        click.echo(f"error: {database_failure(error, ctx)}", err=True)
        sys.exit(1)
