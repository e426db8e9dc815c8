"""Names a package hands on without importing their modules first (PEP 562).

The convention for package ``__init__`` files (docs/architecture.md) is that they only
hand names on: imports and ``__all__``. A package whose import must stay cheap, because
some of its users need one module of it and not a heavy or optional dependency the
others load, hands its names on lazily instead::

    __getattr__ = lazy_names(__name__, {"databus.client.client": ["DatabusClient"]})

A name is imported from its module at first use and then kept in the package's
namespace (later uses do not come back here); a name not in the table is an
:class:`AttributeError`, as for any module. The package also names those modules
under ``TYPE_CHECKING``, so type checkers and the import-rule test see them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_names(package: str, modules: Mapping[str, Sequence[str]]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` handing on each module's names."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
