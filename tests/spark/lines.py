"""What the Spark line the tests run on has (:mod:`databus.spark.lines`), for the tests.

The suite runs the Spark tests on the pinned line (``.venv``, 4.1) and smaller sets on the
newer lines (``.venv-spark42``, ``.venv-spark43``, ``scripts/test-spark-line.sh``): a test
needing a lakehouse format the line has no jars for is skipped there, naming why.
"""

from __future__ import annotations

import pytest

from databus.spark import lines
from databus.spark.lakehouse import Format

LINE = lines.current()
FORMATS: list[Format] = [f for f in ("delta", "iceberg") if f in lines.formats(LINE)]
"""The lakehouse formats of this line, for ``parametrize("fmt", FORMATS)``."""


def needs(*formats: str) -> pytest.MarkDecorator:
    """Skip a test needing ``formats`` on a line that lacks one of them."""
    missing = [f for f in formats if f not in lines.formats(LINE)]
    return pytest.mark.skipif(bool(missing), reason=f"Spark {LINE.name} has no {missing}: "
                              + "; ".join(LINE.why_not.get(f, "") for f in missing))
