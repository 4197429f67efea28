"""The SQL files of ``sql/``: where they are, their text by name, and the parameters a text names."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path


def sql_dir() -> Path:
    """Where the .sql files live: inside the installed package, or the repository's ``sql/``."""
    packaged = resources.files("pipeline") / "sql"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "sql"


def load_sql(name: str) -> str:
    """The text of ``sql/<name>.sql``; a miss lists the queries that exist."""
    path = sql_dir() / f"{name}.sql"
    if not path.is_file():
        known = sorted(p.stem for p in sql_dir().glob("*.sql"))
        raise KeyError(f"no SQL query named {name!r} in {sql_dir()}; known: {known}")
    return path.read_text()


def bind_params(sql: str, params: dict) -> dict:
    """The entries of ``params`` that ``sql`` names as ``$name`` (DuckDB refuses unused parameters)."""
    named = set(re.findall(r"\$([A-Za-z_]\w*)", sql))
    return {k: v for k, v in params.items() if k in named}
