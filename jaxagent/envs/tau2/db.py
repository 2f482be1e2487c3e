"""tau2-bench databases, what every domain shares: the hash, the data files, cached loading.

- `db_hash`: tau2's database hash (sha256 of the canonical JSON, keys sorted at every level), the
  DB reward component compares;
- `data_file`: a file of a domain's data directory (``env.tau2.data_dir``, default the packaged
  copy), with an error that names the config key when it is missing;
- `load_canonical`: a parsed, canonicalised database, parsed once per path (the cache is keyed by
  the resolved path, size and modification time), an independent copy on every call, cheap enough
  for one per episode; JSON by default (`parse_json`), another format through its ``parse`` argument;
- `read_task_file`: the raw task list of a split's file.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["CONFIG_KEY", "check_tables", "data_file", "db_hash", "load_canonical", "parse_json", "read_task_file"]

CONFIG_KEY = "env.tau2.data_dir"

# resolved path -> ((size, mtime_ns), pickled canonical db)
_CACHE: dict[str, tuple[tuple[int, int], bytes]] = {}
_CACHE_LOCK = threading.Lock()


def data_file(data_dir: str | Path | None, default_dir: Path, name: str, *, domain: str,
              holds: tuple[str, ...] = ()) -> Path:
    """``<data_dir or default_dir>/name``; FileNotFoundError naming `CONFIG_KEY` when it is missing."""
    base = default_dir if data_dir is None else Path(data_dir)
    path = base / name
    if not path.is_file():
        raise FileNotFoundError(
            f"tau2 {domain} data file not found: {path} (set the config key {CONFIG_KEY} to the folder "
            f"holding {', '.join(holds or (name,))}; the packaged copy is {default_dir})")
    return path


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_tables(raw: Any, tables: tuple[str, ...], source: str) -> None:
    """Raise ``ValueError`` unless ``raw`` (a parsed ``db.json``) is an object with exactly the keys
    ``tables``, each an object mapping ids to records; the message names the file, the key and what
    was expected."""
    if not isinstance(raw, dict):
        raise ValueError(  # noqa: TRY004 (a bad file)
            f"{source}: the database must be a JSON object with keys {list(tables)}, got {type(raw).__name__}")
    keys = list(raw)
    if sorted(keys) != sorted(tables):
        extra = [k for k in keys if k not in tables]
        missing = [k for k in tables if k not in raw]
        raise ValueError(f"{source}: top-level keys {keys} (unexpected {extra}, missing {missing}); "
                         f"expected exactly {list(tables)}")
    for table in tables:
        if not isinstance(raw[table], dict):
            raise ValueError(f"{source}: field {table!r} is a {type(raw[table]).__name__} "  # noqa: TRY004 (a bad file)
                             f"({_describe(raw[table])}); expected an object mapping ids to records")


def parse_json(text: str, source: str) -> Any:
    """``text`` parsed as JSON; ``ValueError`` naming ``source`` when it is not valid JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not valid JSON ({exc})") from exc


def load_canonical(path: Path, canonicalize: Callable[[Any, str], dict], *,
                   parse: Callable[[str, str], Any] = parse_json) -> dict:
    """A fresh, independent copy of ``canonicalize(parse(text of path, str(path)), str(path))``, parsed
    and validated once per path (every call returns a new deep copy, so tools may mutate it freely).
    ``parse`` (default JSON) raises ``ValueError`` naming the file when the text is malformed."""
    stat = path.stat()
    stamp = (stat.st_size, stat.st_mtime_ns)
    key = os.fspath(path.resolve())
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
    if hit is None or hit[0] != stamp:
        raw = parse(path.read_text(encoding="utf-8"), str(path))
        blob = pickle.dumps(canonicalize(raw, str(path)), protocol=pickle.HIGHEST_PROTOCOL)
        with _CACHE_LOCK:
            _CACHE[key] = (stamp, blob)
        hit = (stamp, blob)
    # Unpickling our own pickle of plain dicts/lists/str/float/bool/None builds a fully independent
    # copy and is ~4x faster than copy.deepcopy.
    return pickle.loads(hit[1])


def db_hash(db: dict) -> str:
    """tau2's database hash: sha256 hex of ``json.dumps(db, sort_keys=True)`` (defaults otherwise).

    Keys are sorted at every level, lists keep their order, floats are in repr form and an integer
    0 differs from 0.0. The unmodified packaged retail database hashes to
    ``b25c9cb211f5efcaee5dd646054a73c4a9f43f4f5acc32c10713cd9f9ac20e9c``.
    """
    text = json.dumps(db, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_task_file(path: Path) -> list[dict]:
    """The raw task dicts of a task file (a JSON list of objects)."""
    with open(path, encoding="utf-8") as fh:
        tasks = json.load(fh)
    if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
        raise ValueError(f"{path}: expected a JSON list of task objects, got {type(tasks).__name__}")
    return tasks
