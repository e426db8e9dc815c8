#!/usr/bin/env bash
# One command: set up and run the demo on the embedded default (SQLite source,
# relay, a live consumer, a replicate sink); it ends by checking the replica.
# Usage: bash scripts/demo.sh [--transactions N]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/databus demo "$@"
