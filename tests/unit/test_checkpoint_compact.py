"""The compact checkpoint form the client sends with every request, and from_json's
path for it without the JSON parser and pydantic: equal to the full path for every
text, accepted or refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from databus.core.checkpoint import Checkpoint, ConsumptionMode
from databus.core.errors import InvalidCheckpointError

_I64 = (1 << 63) - 1
_ints = st.one_of(st.integers(-3, 3), st.integers(-1, _I64),
                  st.integers(_I64 - 2, _I64 + 2), st.integers(-(1 << 70), 1 << 70))


def _outcome(parse: object, text: str) -> tuple[str, object]:
    try:
        cp = parse(text)  # type: ignore[operator]
    except InvalidCheckpointError as exc:
        return ("error", str(exc))
    assert isinstance(cp, Checkpoint)
    return ("ok", (cp, dict(cp.__dict__), cp.model_fields_set, cp.to_json(), hash(cp)))


def _same_as_full_path(text: str) -> None:
    assert _outcome(Checkpoint.from_json, text) == _outcome(Checkpoint._from_json_full, text)


@st.composite
def _near_compact(draw: st.DrawFn) -> str:
    """Texts shaped like the compact form, with every way to be slightly off."""
    names = ["prevScn", "tsNsecs", "windowOffset", "windowScn", "windowscn", "consumption_mode"]
    chosen = draw(st.lists(st.sampled_from(names), max_size=5))
    if draw(st.booleans()):
        chosen = sorted(set(chosen))
    parts = []
    for name in chosen:
        value = draw(st.one_of(
            _ints.map(str), st.sampled_from(["-0", "01", "1.0", "1e3", "true", "null", '"5"',
                                             " 5", "-", "00", '"ONLINE_CONSUMPTION"'])))
        parts.append(f'"{name}":{value}')
    sep = draw(st.sampled_from([",", ", ", ",,"]))
    return "{" + sep.join(parts) + "}" + draw(st.sampled_from(["", " ", "\n", "}"]))


@settings(max_examples=3000)
@given(_near_compact())
def test_from_json_equals_the_full_path_near_the_compact_form(text: str) -> None:
    _same_as_full_path(text)


@settings(max_examples=500)
@given(st.text(max_size=80))
def test_from_json_equals_the_full_path_for_any_text(text: str) -> None:
    _same_as_full_path(text)


@settings(max_examples=2000)
@given(scn=st.integers(-1, _I64), offset=st.integers(-1, _I64), prev=st.integers(-1, _I64),
       ts=st.integers(0, _I64))
def test_compact_form_round_trips_and_takes_the_fast_path(
        scn: int, offset: int, prev: int, ts: int) -> None:
    if scn == -1:
        offset = -1
    cp = Checkpoint(window_scn=scn, window_offset=offset, prev_scn=prev, ts_nsecs=ts)
    text = cp.to_compact_json()
    assert json.loads(text) == {k: v for k, v in cp.to_dict().items()
                                if k == "windowScn" or v != Checkpoint().to_dict()[k]}
    back = Checkpoint.from_json(text)
    assert back == cp and back.to_json() == cp.to_json()
    _same_as_full_path(text)
    _same_as_full_path(cp.to_json())


@pytest.mark.parametrize("cp", [
    Checkpoint.flexible(), Checkpoint.after(7), Checkpoint.after(7, 3).within(9, 2),
    Checkpoint(consumption_mode=ConsumptionMode.BOOTSTRAP_SNAPSHOT, snapshot_source="é.t",
               snapshot_offset=4, bootstrap_start_scn=10),
    Checkpoint(consumption_mode=ConsumptionMode.BOOTSTRAP_CATCHUP, catchup_source="a.b",
               window_scn=5, bootstrap_target_scn=9),
])
def test_compact_form_of_every_mode_round_trips(cp: Checkpoint) -> None:
    assert Checkpoint.from_json(cp.to_compact_json()) == cp
    assert len(cp.to_compact_json()) < len(cp.to_json())


def test_fast_path_refuses_what_the_full_path_refuses() -> None:
    for text in ['{"windowOffset":3,"windowScn":-1}', '{"windowScn":9223372036854775808}',
                 '{"tsNsecs":-1,"windowScn":1}', '{"windowScn":-2}']:
        with pytest.raises(InvalidCheckpointError):
            Checkpoint.from_json(text)
