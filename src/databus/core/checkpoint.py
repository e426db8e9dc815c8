"""Checkpoint: where a consumer is. JSON with Databus field names.

Contract (online consumption):

* ``windowScn = -1``: no position yet ("flexible"): the relay serves from the
  oldest window it holds.
* ``windowScn = S, windowOffset = -1``: window S was consumed completely; the
  next window served is the first with an SCN greater than S.
* ``windowScn = S, windowOffset = k >= 0``: the first ``k`` events of window S
  that this consumer receives (after its server-side filter) were consumed; the
  relay resumes with event ``k`` of that window. ``k`` counts data events only.
* ``prevScn``: the SCN of the last window consumed completely before
  ``windowScn`` (``-1`` when unknown).

The bootstrap fields are used by the bootstrap service (docs/bootstrap.md).
A checkpoint is immutable; the helpers return new ones.
"""

from __future__ import annotations

import json
import re
import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from databus.core import jsonsafe
from databus.core.errors import InvalidCheckpointError

MAX_CHECKPOINT_BYTES = 16 * 1024
_INT64_MAX = (1 << 63) - 1

# An online checkpoint as :meth:`Checkpoint.to_compact_json` writes it (what the
# client library sends with every request), members in sorted order, integers in
# JSON's canonical form. from_json takes it without json and pydantic (7-13 us each,
# per request on the relay); anything else, however valid, takes the full path.
_INT = r"(-1|0|[1-9][0-9]{0,18})"
_COMPACT_ONLINE = re.compile(
    r'\{(?:"prevScn":' + _INT + r',)?(?:"tsNsecs":(0|[1-9][0-9]{0,18}),)?'
    r'(?:"windowOffset":' + _INT + r',)?"windowScn":' + _INT + r'\}')


class ConsumptionMode(StrEnum):
    ONLINE_CONSUMPTION = "ONLINE_CONSUMPTION"
    BOOTSTRAP_SNAPSHOT = "BOOTSTRAP_SNAPSHOT"
    BOOTSTRAP_CATCHUP = "BOOTSTRAP_CATCHUP"


class Checkpoint(BaseModel):
    """A consumer position; ``to_json``/``from_json`` use Databus's field names."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, strict=True)

    window_scn: int = Field(-1, alias="windowScn", ge=-1, le=_INT64_MAX)
    window_offset: int = Field(-1, alias="windowOffset", ge=-1, le=_INT64_MAX)
    prev_scn: int = Field(-1, alias="prevScn", ge=-1, le=_INT64_MAX)
    consumption_mode: ConsumptionMode = Field(ConsumptionMode.ONLINE_CONSUMPTION, strict=False)
    bootstrap_since_scn: int = Field(-1, ge=-1, le=_INT64_MAX)
    bootstrap_start_scn: int = Field(-1, ge=-1, le=_INT64_MAX)
    bootstrap_target_scn: int = Field(-1, ge=-1, le=_INT64_MAX)
    snapshot_source: str | None = Field(None, max_length=1024)
    snapshot_offset: int = Field(-1, ge=-1, le=_INT64_MAX)
    catchup_source: str | None = Field(None, max_length=1024)
    ts_nsecs: int = Field(0, alias="tsNsecs", ge=0, le=_INT64_MAX)

    @model_validator(mode="after")
    def _consistent(self) -> Checkpoint:
        if self.window_scn == -1 and self.window_offset != -1:
            raise ValueError("windowOffset requires a windowScn")
        return self

    # -- construction ------------------------------------------------------

    @classmethod
    def flexible(cls) -> Checkpoint:
        """No position: start with the oldest window the relay holds."""
        return cls()

    @classmethod
    def after(cls, scn: int, prev_scn: int = -1) -> Checkpoint:
        """Window ``scn`` (and everything before it) fully consumed."""
        return cls(window_scn=scn, window_offset=-1, prev_scn=prev_scn, ts_nsecs=time.time_ns())

    @classmethod
    def from_json(cls, text: str | bytes) -> Checkpoint:
        """Parse and validate; raises :class:`InvalidCheckpointError`.

        The compact online form (:meth:`to_compact_json`) is recognised without the
        JSON parser and pydantic; the result is equal (fields, fields set, errors) to
        what the full path gives for the same text."""
        if isinstance(text, str):
            m = _COMPACT_ONLINE.fullmatch(text)
            if m is not None:
                fast = cls._from_compact(m)
                if fast is not None:
                    return fast
        return cls._from_json_full(text)

    @classmethod
    def _from_json_full(cls, text: str | bytes) -> Checkpoint:
        """:meth:`from_json` through the JSON parser and pydantic (any text)."""
        raw = jsonsafe.loads_bounded(text, MAX_CHECKPOINT_BYTES, "checkpoint",
                                     InvalidCheckpointError)
        return cls.from_dict(raw)

    @classmethod
    def _from_compact(cls, m: re.Match[str]) -> Checkpoint | None:
        """The checkpoint of a :data:`_COMPACT_ONLINE` match, built as pydantic's
        ``model_construct`` builds one (its ~20 us are more than validating);
        None when the full path must decide (out of range, offset without an SCN)."""
        prev, ts, offset, scn = m.groups()
        values = dict(_DEFAULT_VALUES)
        fields = {"window_scn"}
        values["window_scn"] = window_scn = int(scn)
        if prev is not None:
            values["prev_scn"] = int(prev)
            fields.add("prev_scn")
        if ts is not None:
            values["ts_nsecs"] = int(ts)
            fields.add("ts_nsecs")
        if offset is not None:
            values["window_offset"] = int(offset)
            fields.add("window_offset")
            if window_scn == -1 and offset != "-1":
                return None  # the validator's error
        if max(values["window_scn"], values["prev_scn"], values["ts_nsecs"],
               values["window_offset"]) > _INT64_MAX:
            return None
        obj = cls.__new__(cls)
        object.__setattr__(obj, "__dict__", values)
        object.__setattr__(obj, "__pydantic_fields_set__", fields)
        object.__setattr__(obj, "__pydantic_extra__", None)
        object.__setattr__(obj, "__pydantic_private__", None)
        return obj

    @classmethod
    def from_dict(cls, raw: Any) -> Checkpoint:
        if not isinstance(raw, dict):
            raise InvalidCheckpointError("checkpoint must be a JSON object")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'checkpoint'}: {e['msg']}"
                for e in exc.errors()
            )
            raise InvalidCheckpointError(f"invalid checkpoint: {problems}") from exc

    # -- use ---------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    def to_compact_json(self) -> str:
        """The same checkpoint in fewer bytes: the members that differ from their
        defaults and always ``windowScn``, sorted, without spaces (built without
        pydantic). ``from_json`` of it equals this checkpoint; the client library
        sends this form with every request."""
        d = self.__dict__
        if (d["consumption_mode"] is ConsumptionMode.ONLINE_CONSUMPTION
                and d["bootstrap_since_scn"] == d["bootstrap_start_scn"]
                == d["bootstrap_target_scn"] == d["snapshot_offset"] == -1
                and d["snapshot_source"] is None and d["catchup_source"] is None):
            # the online checkpoint: four integers at most
            parts = []
            if d["prev_scn"] != -1:
                parts.append(f'"prevScn":{d["prev_scn"]},')
            if d["ts_nsecs"] != 0:
                parts.append(f'"tsNsecs":{d["ts_nsecs"]},')
            if d["window_offset"] != -1:
                parts.append(f'"windowOffset":{d["window_offset"]},')
            return f'{{{"".join(parts)}"windowScn":{d["window_scn"]}}}'
        full = self.to_dict()
        return json.dumps({k: v for k, v in full.items()
                           if k == "windowScn" or v != _DEFAULT_DICT[k]},
                          separators=(",", ":"), sort_keys=True)

    @property
    def is_flexible(self) -> bool:
        return self.window_scn == -1

    @property
    def in_window(self) -> bool:
        """True when a window was started but not finished."""
        return self.window_offset >= 0

    def window_done(self, scn: int) -> Checkpoint:
        """The checkpoint after window ``scn`` ended."""
        prev = self.window_scn if self.window_offset == -1 else self.prev_scn
        return self.model_copy(
            update={"window_scn": scn, "window_offset": -1, "prev_scn": prev,
                    "ts_nsecs": time.time_ns()}
        )

    def within(self, scn: int, offset: int) -> Checkpoint:
        """The checkpoint after ``offset`` events of window ``scn``."""
        prev = self.window_scn if self.window_offset == -1 else self.prev_scn
        if scn == self.window_scn and self.window_offset != -1:
            prev = self.prev_scn
        return self.model_copy(
            update={"window_scn": scn, "window_offset": offset, "prev_scn": prev,
                    "ts_nsecs": time.time_ns()}
        )


_DEFAULT_VALUES: dict[str, Any] = dict(Checkpoint().__dict__)
_DEFAULT_DICT: dict[str, Any] = Checkpoint().to_dict()
