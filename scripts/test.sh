#!/usr/bin/env bash
# One command: set up and run the whole test suite (lint, types, tests).
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
DATABUS_SETUP_SERVERS=1 bash scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check src tests bench
echo "== mypy (strict, src/)"
.venv/bin/mypy
echo "== pytest"
.venv/bin/python -m pytest -q "$@"
