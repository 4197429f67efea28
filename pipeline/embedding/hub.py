"""Hub models (``hf:ORG/NAME[@REVISION]``): the local snapshot, and errors that name the model.

huggingface_hub reports a missing network, an offline setting and a missing repository with its own
exceptions whose messages never say which model was asked for; :func:`hub_dir` turns each into a
:class:`~pipeline.embedding.errors.ModelNotFoundError` that names it and says what to do.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.embedding.errors import ModelNotFoundError

__all__ = ["hub_dir"]

# (hub id, revision) -> (when, snapshot folder): the CLI resolves a model before the flow does (to fail fast),
# and the flow's resolve seconds later needs no second round trip. Short-lived, so a long-running process
# still sees a branch move.
_HUB_DIRS: dict[tuple[str, str | None], tuple[float, Path]] = {}
_REUSE_S = 300.0


def hub_dir(location: str, revision: str | None = None) -> Path:
    """The local snapshot of hub model ``location`` at ``revision`` (downloaded if a hub is reachable).

    Errors name the model and say what to do.
    """
    key = (location, revision)
    if key in _HUB_DIRS and time.monotonic() - _HUB_DIRS[key][0] < _REUSE_S and _HUB_DIRS[key][1].is_dir():
        return _HUB_DIRS[key][1]
    # lazy: huggingface_hub costs 1-2 s of imports on a small machine, and only hub ids need it
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    hub_id = f"hf:{location}" + (f"@{revision}" if revision else "")
    try:
        path = Path(snapshot_download(repo_id=location, revision=revision))
    except RevisionNotFoundError as exc:
        raise ModelNotFoundError(
            f"model {hub_id}: the hub has no revision {revision!r} of {location}; "
            "pass an existing branch, tag or commit after @"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise ModelNotFoundError(
            f"model {hub_id}: no repository {location!r} on the hub (or it is private or gated: log in "
            "with `hf auth login` or set HF_TOKEN); check the id, or pass a local model directory"
        ) from exc
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, ConnectionError, TimeoutError) as exc:
        raise ModelNotFoundError(
            f"model {hub_id}: no model hub is reachable (offline, or HF_HUB_OFFLINE is set) and the model "
            "is not in the local hub cache; download it once where the hub is reachable, or pass the path "
            "of a local model directory"
        ) from exc
    except HfHubHTTPError as exc:
        raise ModelNotFoundError(f"model {hub_id}: the hub refused the download ({exc}); try again later "
                                 "or pass a local model directory") from exc
    except Exception as exc:  # httpx transport errors (proxy, TLS) and the like: still say which model
        raise ModelNotFoundError(
            f"model {hub_id}: could not reach the model hub ({type(exc).__name__}: {exc}); check the network, "
            "or pass the path of a local model directory"
        ) from exc
    _HUB_DIRS[key] = (time.monotonic(), path)
    return path
