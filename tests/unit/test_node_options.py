"""`queueprocessor node`, `queueprocessor gui` and the desktop app take one set of node options: each accepts
the same values, into the same NodeConfig, and refuses the same values with the same words."""

import pytest

pytest.importorskip("PySide6")

import click  # noqa: E402

from queueprocessor.cli import node as node_commands  # noqa: E402
from queueprocessor.cli.output import in_cli_words  # noqa: E402
from queueprocessor.nodeoptions import NodeConfig, secret_env, to_argv  # noqa: E402
from queueprocessor.rules.errors import QPError  # noqa: E402
from ui import app  # noqa: E402

ACCEPTED = [
    [],
    [
        "--capacity",
        "10000",
        "--clock-skew",
        "-1.5",
        "--name",
        "desk",
        "--allow-module",
        "myapp.jobs",
        "--allow-host",
        "a.internal",
        "--allow-host",
        "b.internal",
        "--allow-command",
        "true",
        "--no-push",
    ],
    [
        "--period",
        "0.5",
        "--heartbeat",
        "2",
        "--misses",
        "4",
        "--turn-keep",
        "60",
        "--keep-jobs",
        "3600",
        "--keep-history",
        "86400",
        "--keep-events",
        "86400",
        "--http-base",
        "http://127.0.0.1:8080/",
    ],
    ["--log-format", "json", "--metrics-port", "9100", "--metrics-host", "0.0.0.0"],
    ["--listen-db", "postgresql://qp:s3cret@db.internal/farm"],
]
REFUSED = [
    ["--capacity", "0"],
    ["--capacity", "10001"],
    ["--capacity", "99999999999999999999"],
    ["--capacity", "lots"],
    ["--clock-skew", "nan"],
    ["--clock-skew", "inf"],
    ["--clock-skew", "soon"],
    ["--turn-keep", "-inf"],
    ["--keep-jobs", "0"],
    ["--keep-history", "0"],
    ["--keep-events", "-1"],
    ["--heartbeat", "nan"],
    ["--http-base", "ftp://nowhere/"],
    ["--log-format", "xml"],
    ["--metrics-port", "65536"],
    ["--metrics-port", "-1"],
    ["--no-such-option"],
    ["--listen-db", "sqlite:///farm.db"],
    ["--listen-db", "postgresql//qp:s3cret@db.internal/farm"],
]


def _by_command(command: click.Command, args: list[str]) -> NodeConfig | str:
    """What the CLI's command makes of `args`: its options, or the line cli.main would print."""
    try:
        return command.make_context(command.name, list(args)).params["options"]
    except click.ClickException as error:
        return f"error: {' '.join(error.format_message().split())}"
    except QPError as error:
        return f"error: {in_cli_words(error)}"


def _by_app(args: list[str], capsys) -> NodeConfig | str:
    try:
        return app.parse_args(args).options
    except SystemExit as done:
        assert done.code == 2
        [line] = capsys.readouterr().err.splitlines()
        return line


@pytest.mark.parametrize("args", ACCEPTED, ids=" ".join)
def test_node_gui_and_the_app_accept_the_same_options(args, capsys, monkeypatch):
    node = _by_command(node_commands.node, args)
    assert isinstance(node, NodeConfig), node
    assert node == _by_command(node_commands.gui, args) == _by_app(args, capsys)
    # and gui hands the app exactly these options: a URL with a password in its environment, not its argv
    handed = _by_command(node_commands.gui, args)
    for variable, value in secret_env(handed).items():
        monkeypatch.setenv(variable, value)
    assert "s3cret" not in " ".join(to_argv(handed))
    assert app.parse_args(to_argv(handed)).options == node


@pytest.mark.parametrize("args", REFUSED, ids=" ".join)
def test_node_gui_and_the_app_refuse_the_same_values_in_the_same_words(args, capsys):
    node = _by_command(node_commands.node, args)
    assert isinstance(node, str) and node.startswith("error: "), node
    assert node == _by_command(node_commands.gui, args) == _by_app(args, capsys)


def test_the_app_runs_a_node_with_the_settings_it_was_given(tmp_path):
    """What the app hands its worker is what Farm.node takes: the node it makes has the options asked for."""
    from queueprocessor.farm import Farm

    args = app.parse_args(
        ["--name", "desk", "--capacity", "3", "--keep-jobs", "60", "--no-push", "--allow-command", "true"]
    )
    with Farm(f"sqlite:///{tmp_path / 'farm.db'}") as farm:
        node = farm.node(app.node_options(args))
        assert (node.config.name, node.config.capacity, node.config.keep_jobs, node.config.push) == (
            "desk",
            3,
            60.0,
            False,
        )
        assert node.config.allow.commands == ("true",)
