"""Classpaths of the pinned Java bundles (ZooKeeper, and later Kafka, Delta, Iceberg).

Each bundle is a pinned Maven dependency list, ``scripts/java/<bundle>.pom.xml``, whose
jars ``scripts/setup.sh`` fetches once into a cache directory and checks against
``scripts/java/<bundle>.sha256``. Nothing here downloads: a missing bundle is a
``ConfigError`` that names the command that fetches it.

The cache is ``$DATABUS_JAVA_CACHE`` when set, else ``.cache/java`` of the source
checkout this module runs from.
"""

from __future__ import annotations

import os
from pathlib import Path

from databus.core.errors import ConfigError


def cache_dir() -> Path:
    """Where the bundles' jars are kept (see the module docstring)."""
    env = os.environ.get("DATABUS_JAVA_CACHE")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".cache" / "java"


def jars(bundle: str) -> list[Path]:
    """The jar files of ``bundle``, sorted by name; ``ConfigError`` when not fetched."""
    folder = cache_dir() / bundle
    found = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not found:
        raise ConfigError(f"Java bundle {bundle!r} is not in {folder}: "
                          f"run `bash scripts/java/fetch.sh {bundle}` (needs Maven) or "
                          "`DATABUS_SETUP_SERVERS=1 bash scripts/setup.sh`: they fetch the "
                          "pinned jars once")
    return found


def classpath(bundle: str, *more: str) -> str:
    """A ``java -cp`` value holding every jar of ``bundle`` and then of ``more``."""
    return os.pathsep.join(str(j) for b in (bundle, *more) for j in jars(b))
