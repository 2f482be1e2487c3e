"""Where a checkpoint, tokenizer or adapter that the config names lives on this machine: `resolve` takes
a local directory, or a Hugging Face Hub id ``org/name``, optionally pinned as ``org/name@revision``
(a branch, tag or commit hash: ``Qwen/Qwen2.5-7B-Instruct@main``, ``...@v1.0``, ``...@<40 hex digits>``),
and says how it was found (`Resolution.status`):

- ``local``: an existing directory, used as it is (a local directory always wins over a Hub id);
- ``hub-cache``: the snapshot is already in the local Hub cache (no network is touched);
- ``hub``: downloaded now into the Hub cache (only the files a checkpoint or tokenizer is read
  from, `FILES`; no subfolder), or, with ``download=False`` (``--dry-run``), not in the cache yet:
  a run would download it;
- ``missing``: none of these; `Resolution.reason` names the key (``what``), the value and what
  was expected.

A value is a Hub id when it is not an existing path, matches `HUB_ID` (``org/name[@revision]``,
each name starting and ending with a letter, digit or ``_``) and its ``org`` is not a local directory
(``runs/x`` with a ``runs/`` here is a local path that is missing, not a Hub repository).

A branch or tag already in the cache is used as cached (as ``HF_HUB_OFFLINE=1`` would): a moved
branch is fetched again only once its cache entry is deleted (``hf cache delete``) or the newer
commit is named (``@<commit>``).

The environment is read at each call (huggingface_hub reads it once, at import): ``HF_HUB_OFFLINE=1``
(also ``true``, ``yes``, ``on``) never touches the network: a Hub id is found in the cache or is
``missing``, with a reason that names the variable. The cache is ``HF_HUB_CACHE``, else
``$HF_HOME/hub``, else huggingface_hub's default (``~/.cache/huggingface/hub``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import Literal

#: ``org/name`` or ``org/name@revision``; a name starts and ends with a letter, digit or ``_`` (as
#: huggingface_hub's repo-id check), a revision is a branch, tag or commit (``refs/pr/1`` included).
HUB_ID = re.compile(r"^(\w(?:[\w.-]*\w)?)/(\w(?:[\w.-]*\w)?)(?:@([\w./-]+))?$")

#: What a download fetches (huggingface_hub's ``allow_patterns``), top-level files only
#: (`IGNORED`): the checkpoint (``jaxagent.models.hf``: config.json, *.safetensors and the index)
#: and the tokenizer (``jaxagent.text.tokenizer``: tokenizer.json / tokenizer_config.json with
#: vocab.json, merges.txt, special_tokens_map.json, added_tokens.json through transformers, or
#: tokenizer.model for SentencePiece; generation_config.json; chat_template.jinja / .json).
FILES = {
    "checkpoint": ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"),
    "tokenizer": ("*.json", "*.model", "*.txt", "*.jinja"),
}
#: Subfolders (``original/``, ``onnx/``, ``gguf/`` ...) hold nothing the loaders read.
IGNORED = ("*/*",)
_TRUE = ("1", "ON", "YES", "TRUE")

Status = Literal["local", "hub-cache", "hub", "missing"]


@dataclasses.dataclass(frozen=True)
class Resolution:
    """How the value ``ref`` of the config key ``what`` was found. ``path`` is the local directory
    (None when ``missing``, and for ``hub`` before a download); ``repo_id`` / ``revision`` are set
    for a Hub id (``revision`` None: the default branch); ``reason`` says why, for ``missing``
    the whole error message."""

    what: str
    ref: str
    status: Status
    path: str | None = None
    repo_id: str | None = None
    revision: str | None = None
    reason: str = ""

    @property
    def is_hub(self) -> bool:
        return self.repo_id is not None

    def describe(self) -> dict[str, str]:
        """The JSON-able report of ``--dry-run``: value, status, and the path or the reason."""
        out = {"value": self.ref, "status": self.status}
        if self.path is not None:
            out["path"] = self.path
        if self.reason:
            out["note"] = self.reason
        return out


def parse_hub_id(ref: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` when ``ref`` reads as a Hub id (see the module docstring), else None."""
    m = HUB_ID.match(ref)
    if m is None or Path(ref).exists() or Path(m.group(1)).is_dir():
        return None
    repo_id = f"{m.group(1)}/{m.group(2)}"
    if ".." in repo_id or "--" in repo_id:  # huggingface_hub refuses both
        return None
    return repo_id, m.group(3)


def offline() -> bool:
    """``HF_HUB_OFFLINE`` set to 1/true/yes/on now (or, when unset now, at huggingface_hub's import)."""
    value = os.environ.get("HF_HUB_OFFLINE")
    if value is not None:
        return value.strip().upper() in _TRUE
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def cache_dir() -> Path:
    """The Hub cache: ``HF_HUB_CACHE`` (or its old name ``HUGGINGFACE_HUB_CACHE``), else
    ``$HF_HOME/hub``, else huggingface_hub's default."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def _kind(what: str) -> str:
    return "tokenizer" if what.split(".")[-1] == "tokenizer" else "checkpoint"


def _lacking(path: Path, kind: str) -> str | None:
    """What a snapshot of ``kind`` lacks to be read (a partial download, or one made for a tokenizer
    only), or None."""
    if kind == "tokenizer":
        if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            return "tokenizer.json, tokenizer_config.json or tokenizer.model"
        return None
    if not ((path / "config.json").is_file() or (path / "adapter_config.json").is_file()):
        return "config.json"
    if not any(path.glob("*.safetensors")):
        return "*.safetensors"
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def resolve(ref: str, *, what: str, download: bool = True) -> Resolution:
    """The local directory of ``ref`` (the value of config key ``what``, e.g. ``model.path``): see
    the module docstring. With ``download=False`` nothing goes over the network (a Hub id not in
    the cache comes back as ``hub`` with no path). Never raises for a bad value: a ``missing``
    Resolution carries the message."""
    p = Path(ref).expanduser()
    if p.is_dir():
        return Resolution(what, ref, "local", str(p))
    parsed = parse_hub_id(ref)
    if parsed is None:
        found = "not a directory" if p.exists() else "no such directory"
        return Resolution(what, ref, "missing", reason=(
            f"{what}={ref!r}: {found}; expected a local directory or a Hugging Face Hub id org/name[@revision]"))
    repo_id, revision = parsed
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    kind = _kind(what)
    cache = cache_dir()
    at = f"{repo_id}@{revision}" if revision else repo_id
    expected = (f"expected a local {kind} directory or a Hugging Face Hub id org/name[@revision] "
                f"({'in the cache ' + str(cache) if offline() else 'in the cache or on the Hub'})")
    hub = {"repo_id": repo_id, "revision": revision}
    files = {"allow_patterns": list(FILES[kind]), "ignore_patterns": list(IGNORED), "cache_dir": str(cache)}
    try:
        snap = Path(snapshot_download(repo_id, revision=revision, local_files_only=True, **files))
        lacking = _lacking(snap, kind)
        if lacking is None:
            return Resolution(what, ref, "hub-cache", str(snap), reason=f"Hub repo {at} in the cache {cache}", **hub)
        in_cache = f"its cached snapshot {snap} lacks {lacking}"
    except LocalEntryNotFoundError as e:  # not cached, or cached only in part (IncompleteSnapshotError)
        partial = type(e).__name__ == "IncompleteSnapshotError"  # newer huggingface_hub releases
        in_cache = f"{'only part of it is' if partial else 'it is not'} in the Hub cache {cache}"
    except (OSError, ValueError) as e:  # a repo id or revision huggingface_hub refuses, an unreadable cache
        return Resolution(what, ref, "missing", reason=f"{what}={ref!r}: not a local directory, and not a usable "
                                                       f"Hub id ({_first_line(e)}); {expected}", **hub)
    if offline():
        return Resolution(what, ref, "missing", reason=(
            f"{what}={ref!r}: not a local directory, and as Hub repo {at} {in_cache}, while HF_HUB_OFFLINE="
            f"{os.environ.get('HF_HUB_OFFLINE', '1')} forbids downloading it; {expected} (download it where the "
            "network is reachable, with the same HF_HUB_CACHE / HF_HOME, or unset HF_HUB_OFFLINE)"), **hub)
    if not download:
        return Resolution(what, ref, "hub", reason=(
            f"not a local directory; as Hub repo {at} {in_cache}: a run downloads its "
            f"{', '.join(FILES[kind])} there (if a local directory is meant, put the {kind} there first)"), **hub)
    print(f"jaxagent: {what}: downloading {', '.join(FILES[kind])} of Hub repo {at} into {cache}",
          file=sys.stderr, flush=True)
    try:
        snap = Path(snapshot_download(repo_id, revision=revision, **files))
    except (OSError, ValueError) as e:  # not found / gated / unauthorised, no network, a bad revision
        return Resolution(what, ref, "missing", reason=(
            f"{what}={ref!r}: not a local directory, and Hub repo {at} could not be downloaded "
            f"({_first_line(e)}; a gated or private repository needs HF_TOKEN or `hf auth login`); {expected}"), **hub)
    lacking = _lacking(snap, kind)
    if lacking is not None:
        return Resolution(what, ref, "missing", reason=(
            f"{what}={ref!r}: Hub repo {at} holds no {lacking} (downloaded to {snap}); expected a Hub "
            f"repository holding a {kind}, or a local {kind} directory"), **hub)
    return Resolution(what, ref, "hub", str(snap), reason=f"Hub repo {at} downloaded into {cache}", **hub)


__all__ = ["FILES", "HUB_ID", "IGNORED", "Resolution", "cache_dir", "offline", "parse_hub_id", "resolve"]
