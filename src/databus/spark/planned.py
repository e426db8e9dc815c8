"""The part the ``databus`` and ``databus-snapshot`` formats share: options are
parsed, and the relay or store asked for schemas, once per data source instance."""

from __future__ import annotations

from typing import Any, ClassVar

from pyspark.sql.datasource import DataSource
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType


class PlannedDataSource(DataSource):
    """A data source whose plan (``plan_type(options)``, with an ``arrow_schema``)
    is built on first use and kept: Spark asks ``schema()`` and then for a reader
    of the same instance, and each plan costs round trips to the relay or store."""

    plan_type: ClassVar[type[Any]]  # built as plan_type(options)

    def _plan(self) -> Any:
        plan = getattr(self, "_cached_plan", None)
        if plan is None:
            plan = type(self).plan_type(dict(self.options))
            self._cached_plan = plan
        return plan

    def schema(self) -> StructType:
        result: StructType = from_arrow_schema(self._plan().arrow_schema)
        return result
