#!/usr/bin/env bash
# Run the demo farm: ./scripts/demo.sh [queueprocessor demo options...]
#
# Creates .venv in the repository root on first use, installs the project with
# the desktop app, then opens the app with three local nodes on embedded SQLite
# (the demo's own file in the data directory, started afresh each time; --headless
# prints live status instead of opening a window). Before anything starts, the demo
# checks that the window can open and names the system packages it lacks, if any.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[gui]'

exec .venv/bin/queueprocessor demo "$@"
