"""The engine's one placeholder style, `:name`, written in each driver's own (driver.py).

Placeholders are found outside quoted text ('...', E'...', "...", `...`) and comments, so a
colon inside a literal or a quoted name is never taken for one, and `::` is a cast. Styles:
"pyformat" (`%(name)s`, every `%` doubled), "text" (sqlalchemy.text(): `:name` kept, in
parentheses before a `::` cast, the colons of quoted pieces escaped), "dollar" (`$name`),
"numbered" (`$1`, `$2`, ... by each name's first appearance), "brace" (`{name}`, which the driver
types). What a statement becomes is cached.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

_NAME = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def _segments(sql: str) -> Iterator[tuple[str, bool]]:
    """The statement as (text, quoted) pieces: quoted literals, quoted names and comments are
    `quoted` (never searched for placeholders)."""
    i, n, start = 0, len(sql), 0
    while i < n:
        c = sql[i]
        if c in "'\"`" or (c == "-" and sql.startswith("--", i)):
            if i > start:
                yield sql[start:i], False
            if c == "-":
                end = sql.find("\n", i)
                end = n if end < 0 else end
            else:
                escapes = c == "`" or (c == "'" and i > 0 and sql[i - 1] in "eE")
                end = i + 1
                while end < n:
                    if escapes and sql[end] == "\\":
                        end += 2
                        continue
                    if sql[end] == c:
                        if end + 1 < n and sql[end + 1] == c:  # a doubled quote
                            end += 2
                            continue
                        end += 1
                        break
                    end += 1
            yield sql[i:end], True
            i = start = end
            continue
        i += 1
    if start < n:
        yield sql[start:], False


@functools.lru_cache(maxsize=4096)
def convert(sql: str, style: str) -> tuple[str, tuple[str, ...]]:
    """`sql` with its `:name` placeholders written in `style` ("pyformat", "text", "dollar",
    "numbered", "brace"), and the names in order of appearance. "pyformat" doubles every `%`;
    "text" escapes the colons of quoted pieces (sqlalchemy.text() would read them); "brace"
    leaves `{name}` for the driver to type."""
    names: list[str] = []
    out: list[str] = []

    def place(match: re.Match[str]) -> str:
        name = match.group(1)
        names.append(name)
        if style == "pyformat":
            return f"%({name})s"
        if style == "dollar":
            return f"${name}"
        if style == "numbered":
            return f"${list(dict.fromkeys(names)).index(name) + 1}"
        if style == "brace":
            return "{" + name + "}"
        if match.string.startswith("::", match.end()):  # sqlalchemy.text() binds no `:name::`
            return f"(:{name})"
        return match.group(0)

    for text, quoted in _segments(sql):
        if quoted:
            if style == "pyformat":
                text = text.replace("%", "%%")
            elif style == "text" and not text.startswith("--"):
                text = text.replace(":", "\\:")
            out.append(text)
        else:
            if style == "pyformat":
                text = text.replace("%", "%%")
            out.append(_NAME.sub(place, text))
    return "".join(out), tuple(names)


__all__ = ["convert"]
