"""The public names a front end shows before it runs anything, and how it quotes an error.

This module imports nothing heavy (no numpy, scipy or drivers), so that `topk-middleware --help`
and `--version` stay fast: the CLI builds its parser from these names alone.
"""

from __future__ import annotations

import re

NOISES = ("gumbel", "laplace")
METHODS = ("auto", "threshold", "oneshot", "oneshot_in_store", "oneshot_full_read")
ORACLES = ("lazy", "eager")
OBLIVIOUS_METHODS = ("auto", "threshold", "oneshot_full_read")  # what oblivious=True accepts
# what preview() simulates (preview.py), and its defaults
PREVIEW_METHODS = ("threshold", "laplace", "limited_domain", "joint")
PREVIEW_DEFAULT_METHODS = ("threshold", "laplace", "limited_domain")
PREVIEW_EPSILONS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)


def first_line(error: BaseException) -> str:
    """An error's message as one line (its first), or its type's name when it has none: how
    the CLI, install-sql and the adapters quote a store's or a driver's error in their own;
    passwords in it are masked (mask_secrets)."""
    text = str(error).strip()
    return mask_secrets(text.splitlines()[0]) if text else type(error).__name__


MASK = "***"
# user:password@ in a URL (scheme://user:password@host): the password up to the last '@' of the
# authority, so a password holding '@' or ':' is masked whole.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s'\"]*:)[^\s'\"/]*@")
# password=... in a key=value DSN (libpq: a value quoted with '...' and backslash escapes, or up to
# the next space; a value quoted with "..." the same way, as some tools write it) and in a URL's
# query string (?password=... / &password=..., up to '&').
_KEY_PASSWORD = re.compile(
    r"(?P<head>(?:^|[\s?&;,(\"'])(?:password|passwd|pwd|sslpassword|passfile)\s*=\s*)"
    r"(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&;,)\"']*?(?=:?(?:[\s&;,)\"']|$)))",
    re.IGNORECASE,
)


def mask_secrets(text: str) -> str:
    """`text` with every password of a URL (user:password@, ?password=) or a key=value DSN
    (password=...) replaced by ***: what any message, output or log line of the project quotes."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    return _KEY_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)
