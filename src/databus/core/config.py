"""The one way config files are read: YAML/JSON into frozen pydantic models, every
problem a :class:`ConfigError` naming the field (relay, bootstrap service)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from databus.core.errors import ConfigError


def config_error(exc: ValidationError, what: str) -> ConfigError:
    """One ConfigError naming each bad field of a pydantic ValidationError."""
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}"
                         for e in exc.errors())
    return ConfigError(f"invalid {what} config: {problems}")


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


def load_file(path: Path, parse: Callable[[Any], M]) -> M:
    """Read a YAML/JSON file, replace ``${ENV}`` references (:func:`interpolate`) and
    hand it to ``parse``; errors name the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from exc
    try:
        return parse(interpolate(raw))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
