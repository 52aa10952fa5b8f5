"""`--log-format json`: a real node process writes one JSON object per line, names its machine and the job a line
is about, and masks passwords as the text log does."""

import json
import signal
import subprocess
import sys

from queueprocessor.farm import Farm
from tests.support.work import PYJOBS, ROOT, wait_for

SECRET_URL = "postgresql://qp:hunter2@db.internal/farm"


def test_a_node_logs_json_lines_naming_machine_and_job_with_passwords_masked(tmp_path):
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    log_path = tmp_path / "node.log"
    with Farm(url) as farm, open(log_path, "w") as log:
        [job_id] = farm.enqueue(farm.python_spec(f"{PYJOBS}:fail", SECRET_URL, max_attempts=1))
        node = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "queueprocessor.cli",
                "--db",
                url,
                "node",
                "--name",
                "json-node",
                "--log-format",
                "json",
                "--period",
                "0.2",
                "--heartbeat",
                "0.2",
                "--allow-module",
                PYJOBS,
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(lambda: farm.job(job_id)["state"] == "failed", timeout=30)
            wait_for(lambda: f'"job_id": {job_id}' in log_path.read_text(), timeout=10)
        finally:
            node.send_signal(signal.SIGTERM)
            assert node.wait(30) == 0
    text = log_path.read_text()
    lines = [json.loads(line) for line in text.splitlines()]  # every line is one JSON object
    assert lines and all({"time", "level", "logger", "machine", "message"} <= line.keys() for line in lines)
    assert {line["machine"] for line in lines} == {"json-node"}
    assert any(line["logger"] == "queueprocessor.node" and "joined the farm" in line["message"] for line in lines)
    [failed] = [line for line in lines if line.get("job_id") == job_id]
    assert (failed["level"], failed["logger"]) == ("INFO", "queueprocessor.runner")
    assert failed["message"].startswith(f"job {job_id} attempt 1 failed -> failed")
    assert "qp:***@db.internal" in failed["message"] and "hunter2" not in text
    assert lines[0]["time"].endswith("+00:00")
