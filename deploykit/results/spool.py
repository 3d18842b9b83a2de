"""Rows a store could not take when they were made (the server away, the disk full, a read-only copy),
kept until it can: "every attempt writes exactly one row" survives a store that goes away.

A spooled row is one owner-only file (0600, written whole then renamed: deploykit.files) named by the
row's `row_uuid`, in an owner-only directory (0700): beside a SQLite store (`.NAME.spool/`), or for
PostgreSQL (and when that directory cannot be written) under the spool root (`$DEPLOYKIT_SPOOL_DIR`, else
the user data directory), one directory per store. `open_store` writes a store's spooled rows first, oldest
first, before the command's own; the store's unique `row_uuid` makes a replay idempotent (two processes
replaying at once, a replay interrupted after the insert): a row is never written twice.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from deploykit.files import make_private_dirs, replace_private

if TYPE_CHECKING:
    from deploykit.results.record import ResultRecord
    from deploykit.results.store import Store

SUFFIX = ".row.json"
_UNREADABLE_SUFFIX = ".unreadable"
FORMAT = 1


class SpoolError(OSError):
    """No spool directory could take the row."""


def spool_dirs(store_url: str) -> list[Path]:
    """Where rows for the store at `store_url` are kept, in the order tried: beside a SQLite file, then
    the spool root's directory for this store."""
    from deploykit.results.urls import display_url, normalise_url

    places: list[Path] = []
    normalised = normalise_url(store_url)
    if normalised.startswith("sqlite:///"):
        from sqlalchemy.engine import make_url

        database = make_url(normalised).database or ""
        if database:
            path = Path(database)
            places.append(path.parent / f".{path.name}.spool")
    try:
        from deploykit.paths import default_spool_root

        key = hashlib.sha256(display_url(store_url).encode()).hexdigest()[:16]
        places.append(default_spool_root() / key)
    except Exception:  # no platformdirs (the vLLM image) and no $DEPLOYKIT_SPOOL_DIR: beside only
        pass
    return places


def keep(record: ResultRecord, store_url: str) -> Path:
    """Spool `record` for the store at `store_url`; returns the file. SpoolError when no place can take it."""
    content = json.dumps(
        {"format": FORMAT, "record": record.model_dump(mode="json")}, separators=(",", ":")
    ).encode()
    problems: list[str] = []
    for directory in spool_dirs(store_url):
        try:
            make_private_dirs(directory)
            os.chmod(directory, 0o700)
            path = directory / f"{record.row_uuid}{SUFFIX}"
            replace_private(path, content)
            return path
        except OSError as exc:
            problems.append(f"{directory}: {exc.strerror or exc}")
    raise SpoolError("; ".join(problems) or "no spool directory (set $DEPLOYKIT_SPOOL_DIR)")


def pending(store_url: str) -> list[Path]:
    """The rows spooled for the store at `store_url`, oldest first."""
    found: list[tuple[float, str, Path]] = []
    for directory in spool_dirs(store_url):
        if not directory.is_dir():
            continue
        for path in directory.glob(f"*{SUFFIX}"):
            try:
                found.append((path.stat().st_mtime, path.name, path))
            except OSError:
                continue
    return [path for _, _, path in sorted(found)]


def replay(store: Store) -> int:
    """Write the rows spooled for `store`, oldest first; returns how many left the spool. A store that fails
    meanwhile stops the replay (the rest stay spooled for the next command); a file that is not a row is
    renamed `.unreadable` and left for a person."""
    from pydantic import ValidationError

    from deploykit.errors import StoreError
    from deploykit.results.record import ResultRecord

    written = 0
    for path in pending(store.url):
        try:
            data = json.loads(path.read_bytes())
            record = ResultRecord.model_validate(data["record"])
        except FileNotFoundError:
            continue  # another process replayed it
        except (OSError, ValueError, KeyError, TypeError, ValidationError):
            path.replace(path.with_name(path.name + _UNREADABLE_SUFFIX))
            continue
        if record.row_uuid is None:
            record.row_uuid = path.name.removesuffix(SUFFIX)
        try:
            store.add(record)
        except StoreError as exc:
            if exc.spoolable:
                break
            path.replace(path.with_name(path.name + _UNREADABLE_SUFFIX))
            continue
        path.unlink(missing_ok=True)
        written += 1
    return written
