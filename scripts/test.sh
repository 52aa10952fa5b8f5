#!/usr/bin/env bash
# Run the whole test suite: ./scripts/test.sh [pytest arguments...]
#
# Creates .venv in the repository root on first use, installs the project with
# its test extra (editable, so the tests see the working tree), checks the tree
# with ruff (lint and format) and mypy, then runs pytest from the root. The first
# check that fails stops the run; pytest's exit status is passed through, so "no
# tests collected" (5) fails the run just like a failing test does.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
