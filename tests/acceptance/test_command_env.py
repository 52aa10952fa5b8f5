"""What a command job sees of its node's environment: a small documented set, never the farm's database URL and its
password (QP_DB) nor anything else of the node's, unless the node is told to pass a variable through."""

import os
import subprocess
import sys

import pytest

from queueprocessor.farm import Farm
from queueprocessor.node.config import NodeConfig
from queueprocessor.nodeoptions import NodeCommand, node_options
from queueprocessor.rules.errors import BadSetting
from tests.support.work import FAST, ROOT, wait_for


@pytest.mark.postgres
def test_a_command_gets_no_database_url_nor_password_only_what_it_needs_and_what_the_node_passes(pg_url, tmp_path):
    password = pg_url.split("//", 1)[1].split("@", 1)[0].split(":", 1)[1]
    seen = tmp_path / "env"
    node_env = dict(os.environ, QP_DB=pg_url, SHARED_TOKEN="given", PRIVATE_TOKEN="kept", LC_TIME="C", TZ="UTC")
    with Farm(pg_url) as farm, open(tmp_path / "node.log", "w") as log:
        farm.settings(**FAST)
        node = subprocess.Popen(
            [sys.executable, "-m", "queueprocessor.cli", "node", "--name", "a", "--allow-command", "sh"]
            + ["--period", "0.2", "--heartbeat", "0.2", "--command-env", "SHARED_TOKEN"],
            env=node_env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            [job_id] = farm.enqueue_command(["sh", "-c", f"env > {seen}"], queue="reports")
            wait_for(lambda: farm.job(job_id)["state"] == "succeeded", timeout=20)
        finally:
            node.terminate()
            node.wait()
    text = seen.read_text()
    env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert password not in text and "QP_DB" not in env and "PRIVATE_TOKEN" not in env
    assert env["SHARED_TOKEN"] == "given"
    assert (env["PATH"], env["LC_TIME"], env["TZ"]) == (os.environ["PATH"], "C", "UTC")
    assert (env["QP_JOB_ID"], env["QP_FENCE"], env["QP_ATTEMPT"], env["QP_QUEUE"]) == (str(job_id), "1", "1", "reports")
    assert {name for name in env if name.startswith("QP_")} == {
        "QP_JOB_ID",
        "QP_ATTEMPT",
        "QP_FENCE",
        "QP_MACHINE",
        "QP_QUEUE",
    }


def parsed(args: list[str], env: dict[str, str]) -> tuple[str, ...]:
    """The command_env a node command is given by `args` and the environment `env`."""
    command = node_options(NodeCommand("node", callback=lambda options: None))
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return command.make_context("node", args).params["options"].command_env
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_the_names_a_node_passes_come_from_its_options_or_its_environment_separated_by_commas():
    assert parsed(["--command-env", "A", "--command-env", "B"], {}) == ("A", "B")
    assert parsed([], {"QP_COMMAND_ENV": "HTTPS_PROXY,NO_PROXY"}) == ("HTTPS_PROXY", "NO_PROXY")


@pytest.mark.parametrize("name", ["QP_DB", "qp_db", "A=B", "", "1X"])
def test_a_node_refuses_to_pass_its_own_settings_or_what_is_no_variable_name(name):
    with pytest.raises(BadSetting, match="command_env"):  # Farm.node's keyword, checked as every entry point does
        NodeConfig().given(command_env=[name]).checked()
