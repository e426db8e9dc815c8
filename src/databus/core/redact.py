"""Keeping secrets out of output: the one redaction helper.

Two layers, both needed:

* :func:`redact_url` hides the password of a URL wherever code prints one (start-up
  lines, ``/admin``, error messages);
* a :class:`Redactor` knows the secret values of a process (source and target
  passwords, tokens) and replaces each occurrence in any text by ``***``. The CLI
  builds one from its config and puts :class:`RedactingFilter` on every log handler,
  so a secret that slips into a message, a driver's exception or a traceback is
  still not written, at any log level; the CLI's own error line goes through it too.

Secrets shorter than 4 characters are not searched for (they would blank out
ordinary words); such a password is refused nowhere but is the operator's risk.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import quote, unquote, urlsplit, urlunsplit

MASK = "***"
_MIN_SECRET = 4
_URL_PASSWORD = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s]*):"
                           r"(?P<pw>[^@/\s]*)@")


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{netloc}"))


def url_password(url: str) -> str | None:
    """The (decoded) password of ``url``, or None."""
    try:
        pw = urlsplit(url).password
    except ValueError:
        return None
    return unquote(pw) if pw else None


class Redactor:
    """Replaces known secret values (and URL passwords) in text."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        self._secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(*secrets)

    def add(self, *secrets: str | None) -> None:
        """Also hide these values (their URL-encoded forms too)."""
        for s in secrets:
            if s and len(s) >= _MIN_SECRET:
                self._secrets.update({s, quote(s, safe=""), quote(s)})
        if self._secrets:
            alternatives = sorted(self._secrets, key=len, reverse=True)  # longest first
            self._pattern = re.compile("|".join(re.escape(s) for s in alternatives))

    def __call__(self, text: str) -> str:
        text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        return text


class RedactingFilter(logging.Filter):
    """A handler filter: renders each record once, redacts it, and hands the handler
    the redacted text (arguments and exception text included)."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args = self.redactor(message), None
        if record.exc_text:
            record.exc_text = self.redactor(record.exc_text)
            record.exc_info = None  # the redacted text stands in for the traceback
        return True
