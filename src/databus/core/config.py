"""The one way config files are read: YAML/JSON into frozen pydantic models, every
problem a :class:`ConfigError` naming the field (relay, bootstrap service)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from databus.core.errors import ConfigError


def config_error(exc: ValidationError, what: str) -> ConfigError:
    """One ConfigError naming each bad field of a pydantic ValidationError. The tags of
    tagged unions (written ``<kind>``, e.g. the source kinds) are left out of the field
    names: ``source.server_id``, not ``source.<sqlite>.server_id``."""
    problems = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"]
                       if not (isinstance(p, str) and p.startswith("<") and p.endswith(">")))
        msg = e["msg"]
        if e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif e["type"] == "extra_forbidden":
            msg = "unknown setting"
        problems.append(f"{loc or 'config'}: {msg}")
    return ConfigError(f"invalid {what} config: {'; '.join(problems)}")


def _compiles(patterns: list[str]) -> list[str]:
    for p in patterns:
        try:
            re.compile(p)
        except re.error as exc:
            raise ValueError(f"bad regex {p!r}: {exc}") from exc
    return patterns


RegexList = Annotated[list[str], AfterValidator(_compiles)]
"""A config field of regexes: each must compile (the error names the bad one)."""


class FrozenModel(BaseModel):
    """Base of config sections: unknown fields refused, values immutable. Built by
    :func:`validate` (a ConfigError naming each bad field, nested ones included)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigModel(FrozenModel):
    """Base of a top-level config that users build with its constructor (the client's):
    a validation problem is a :class:`ConfigError` there too, never pydantic's
    ``ValidationError``. Not for sections nested in another model (the error would
    lose its place in the parent)."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error(exc, type(self).__name__) from exc


M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], raw: Any, what: str) -> M:
    """Validate a mapping; raises ConfigError naming each bad field."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{what} config must be a mapping")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise config_error(exc, what) from exc


_ENV_REF = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def interpolate(raw: Any, env: Mapping[str, str] | None = None) -> Any:
    """``${NAME}`` in every string of a parsed config replaced by the environment
    variable NAME (a ConfigError naming it when unset); ``$$`` is a literal ``$``.
    Secrets can so stay out of config files."""
    env = os.environ if env is None else env

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        if name not in env:
            raise ConfigError(f"config refers to ${{{name}}}, which is not set")
        return env[name]

    if isinstance(raw, str):
        return _ENV_REF.sub(one, raw) if "$" in raw else raw
    if isinstance(raw, list):
        return [interpolate(v, env) for v in raw]
    if isinstance(raw, dict):
        return {k: interpolate(v, env) for k, v in raw.items()}
    return raw


def read_file(path: Path) -> dict[str, Any]:
    """A YAML/JSON config file as a mapping, its ``${ENV}`` references replaced
    (:func:`interpolate`); errors name the file. An empty file is an empty mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from exc
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path} must be a mapping")
    try:
        out: dict[str, Any] = interpolate(raw)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return out


def load_file(path: Path, parse: Callable[[Any], M]) -> M:
    """Read a YAML/JSON file (:func:`read_file`) and hand it to ``parse``; errors name
    the file."""
    raw = read_file(path)
    try:
        return parse(raw)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top, section by section (nested mappings merge;
    any other value in ``over`` replaces ``base``'s)."""
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        out[key] = (merged(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping)
                    else value)
    return out
