"""Names that become path segments (model, release, probe set) are checked here, once."""

from __future__ import annotations

import re

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@-]{0,127}$")


def check_name(value: str, what: str = "name") -> str:
    """Return ``value`` if it is safe as one path segment, else raise ``ValueError`` saying why.

    Allowed: letters, digits and ``. _ + @ -``, starting with a letter or digit, at most
    128 characters; so no ``/``, no ``..`` and no ``=`` (which would confuse hive-style paths).
    """
    if not isinstance(value, str) or not _NAME.match(value) or ".." in value:
        raise ValueError(
            f"invalid {what} {value!r}: use letters, digits and . _ + @ - only "
            "(start with a letter or digit, no '/' or '..', at most 128 characters)"
        )
    return value
