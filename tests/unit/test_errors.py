"""Errors carry their parts as fields and the core words them in the API's terms; the CLI (and the app) say
them in their own: options as flags, and where to look for what was not found."""

import ast
import re
from pathlib import Path

import pytest

from queueprocessor import work_spec
from queueprocessor.cli.output import in_cli_words
from queueprocessor.executors import AllowLists, make_executors
from queueprocessor.farm import Farm
from queueprocessor.rules.errors import ECHO_LIMIT, BadJobInput, BadSetting, InvalidJob, NotAllowed, NotFound, echoed
from queueprocessor.rules.job import JobSpec

ROOT = Path(__file__).resolve().parents[2]
FRONT_ENDS = {"cli", "nodeoptions.py", "demo.py"}  # the CLI's own modules (the demo is a CLI command)
CLI_WORDS = re.compile(r"(?<![\"\w-])--[a-z]|`queueprocessor ")


def test_an_out_of_range_value_carries_what_value_and_limit():
    with pytest.raises(BadJobInput) as refused:
        work_spec("http", "/x", max_attempts=0)
    error = refused.value
    assert isinstance(error, InvalidJob)
    assert (error.what, error.value, error.limit) == ("max_attempts", 0, "from 1 to 2147483647")
    assert str(error) == "max_attempts must be from 1 to 2147483647 (got 0)"
    assert in_cli_words(error) == "--max-attempts must be from 1 to 2147483647 (got 0)"
    assert error.say(lambda keyword: {"max_attempts": "Max attempts"}[keyword]).startswith("Max attempts must be")


def test_a_method_is_for_http_work_alone():
    """Silently kept and ignored before: every door (API, CLI, the app's forms) now refuses it for another kind."""
    for kind, target in (("python", "m:f"), ("command", '["true"]')):
        with pytest.raises(BadJobInput) as refused:
            work_spec(kind, target, method="POST")
        assert in_cli_words(refused.value) == f"--method is for http work only: {kind} work takes none"
        assert work_spec(kind, target).method == "GET"  # the column's default: what a row of any kind holds
    assert work_spec("http", "/x", method="post").method == "POST"


def test_an_echoed_input_is_cut_at_a_readable_length_and_says_how_long_it_was():
    assert echoed("nightly") == "'nightly'" and echoed("x" * ECHO_LIMIT) == repr("x" * ECHO_LIMIT)
    assert echoed("x" * 5000) == f"{'x' * ECHO_LIMIT!r}... (5000 characters)"
    assert echoed("y" * 5000, quote=False) == f"{'y' * ECHO_LIMIT}... (5000 characters)"
    assert echoed(10**100) == f"{'1' + '0' * (ECHO_LIMIT - 1)}... (101 characters)"
    refused = BadJobInput.out_of("timeout", "z" * 5000, "a positive number of seconds")
    assert (
        str(refused) == f"timeout must be a positive number of seconds (got {'z' * ECHO_LIMIT!r}... (5000 characters))"
    )


def test_a_node_setting_is_named_by_the_option_each_front_end_has_for_it():
    with pytest.raises(BadSetting) as refused:
        make_executors(AllowLists(), "ftp://nowhere/")
    assert refused.value.inputs == ("http_base",) and refused.value.value == "ftp://nowhere/"
    assert in_cli_words(refused.value).startswith("--http-base 'ftp://nowhere/' is not an http(s) URL")
    with pytest.raises(NotAllowed) as refused:
        make_executors(AllowLists())["command"].validate(JobSpec("command", '["backup"]'))
    assert (refused.value.kind, refused.value.value, refused.value.option) == ("command", "backup", "allow_commands")
    assert in_cli_words(refused.value).endswith("none (start the node with --allow-command NAME)")


def test_what_was_not_found_is_a_field_and_the_cli_says_where_to_look(tmp_path):
    with Farm(f"sqlite:///{tmp_path / 'farm.db'}") as farm:
        for act, what, look in (
            (lambda: farm.cancel(424242), "job", "see `queueprocessor jobs`"),
            (lambda: farm.remove_schedule("nosuch"), "schedule", "see `queueprocessor schedule list`"),
            (lambda: farm.remove_singleton("nosuch"), "singleton", "see `queueprocessor singleton list`"),
            (lambda: farm.steer("nosuch", "pause"), "machine", "see `queueprocessor status`"),
        ):
            with pytest.raises(NotFound) as missing:
                act()
            assert missing.value.what == what and "queueprocessor" not in str(missing.value)
            assert in_cli_words(missing.value) == f"{missing.value}: {look}"


def test_the_core_names_no_cli_option_or_command_in_what_it_raises():
    """Messages the core raises are in the API's terms; only the CLI's own modules speak in flags and commands."""
    found = []
    for path in sorted((ROOT / "queueprocessor").rglob("*.py")):
        if path.relative_to(ROOT / "queueprocessor").parts[0] in FRONT_ENDS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                texts = [
                    n.value for n in ast.walk(node.exc) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                ]
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {t}" for t in texts if CLI_WORDS.search(t)]
    assert found == []
