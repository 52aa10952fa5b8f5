"""What the leash tests run (tests/faults/test_commands_leashed.py): a command that stands for real work outside
its node, and an async job that blocks its node's event loop."""

import os
import sys
import time
import urllib.request

HERE = os.path.abspath(__file__)


def command(base_url: str, pid_dir: str, seconds: float) -> list[str]:
    """The argv of a command job that writes its pid to `pid_dir`/<fence>.pid, then holds one request to the
    recording target for `seconds` (its work, seen there with its job and fence), a tenth of a second after fence 1."""
    return [sys.executable, HERE, base_url, pid_dir, str(seconds)]


async def block_loop(payload, context):
    """An async job that blocks its node's event loop for payload["seconds"] (as CPU work or a sync call would),
    once it has created the file payload["marker"]."""
    open(payload["marker"], "w").close()
    time.sleep(payload["seconds"])


def _work(base_url: str, pid_dir: str, seconds: str) -> None:
    fence = os.environ["QP_FENCE"]
    with open(os.path.join(pid_dir, f"{fence}.tmp"), "w") as pid_file:
        pid_file.write(str(os.getpid()))
    os.rename(os.path.join(pid_dir, f"{fence}.tmp"), os.path.join(pid_dir, f"{fence}.pid"))
    hold = seconds if fence == "1" else "0.1"
    headers = {"X-QP-Job": os.environ["QP_JOB_ID"], "X-QP-Fence": fence, "X-QP-Machine": os.environ["QP_MACHINE"]}
    urllib.request.urlopen(urllib.request.Request(f"{base_url}sleep/{hold}", headers=headers)).read()


if __name__ == "__main__":
    _work(*sys.argv[1:])
