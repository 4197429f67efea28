"""Commands that only read a store refuse a root that holds none: a mistyped ``--root`` must not answer like an
empty store (0 rows, "ok" for 0 parts) nor be created (``report``). ``audit`` and ``probes add`` create roots."""

from __future__ import annotations

import typer


def require_store(store, root_flag: str | None) -> None:
    """Exit 1 with one ``error:`` line naming the root, why it is not a store and the default root, unless
    ``store``'s root holds a normaudit store (:meth:`pipeline.storage.store.Store.why_no_store`)."""
    from pipeline.settings import default_root  # pydantic: kept out of the CLI's start-up, as in cli/main.py

    why = store.why_no_store()
    if why is None:
        return
    if root_flag is not None:
        source = "given by --root"
    elif store.root_url == default_root():
        source = "the default root"
    else:
        source = "from $NORMAUDIT_ROOT"
    typer.secho(
        f"error: no normaudit store at {store.root_url} ({source}): {why}. Check the path: without --root, "
        f"$NORMAUDIT_ROOT or else the default root {default_root()} is read. `normaudit audit` or "
        "`normaudit probes add` creates a store.", fg=typer.colors.RED, err=True)
    raise typer.Exit(1)
