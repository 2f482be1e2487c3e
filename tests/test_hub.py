"""``model.path`` / ``tokenizer`` as a Hugging Face Hub id (`jaxagent.hub`): a local directory stays
``local``; ``org/name[@revision]`` is found in a local Hub cache laid out as huggingface_hub lays it
(``models--org--name/{refs/<branch or tag>, snapshots/<commit>/}``) with ``HF_HUB_OFFLINE=1`` and
``HF_HUB_CACHE`` / ``HF_HOME``; a miss offline names the key and the variable; ``--dry-run`` reports
each path's status and downloads nothing; a download fetches only the files the loaders read;
and ``job=eval`` runs from the cache offline, end to end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from jaxagent import hub
from jaxagent.jobs.config import load_config
from jaxagent.jobs.launcher import resolve_paths
from jaxagent.launch import main
from jaxagent.models import preset, save_pretrained
from jaxagent.models.qwen import init_params

ROOT = Path(__file__).resolve().parents[1]
GYM_TOKENIZER = ROOT / "jaxagent" / "data" / "tokenizers" / "gyms"
MAIN, TAGGED = "a" * 40, "b" * 40  # the commits refs/main and refs/v1 point at


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny checkpoint (vocab 1024, above the gyms tokenizer's ids) with the gyms tokenizer beside it."""
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    cfg = preset("tiny-qwen2", vocab_size=1024, max_position_embeddings=2048)  # room for rollout.capacity
    save_pretrained(path, cfg, init_params(jax.random.key(0), cfg))
    for f in GYM_TOKENIZER.iterdir():
        if f.name != "README.md":
            shutil.copy2(f, path / f.name)
    return path


def hub_cache(root: Path, checkpoint: Path, repo: str = "org/name", refs: dict[str, str] | None = None) -> Path:
    """``root`` laid out as a Hub cache holding ``repo``: a snapshot per commit of ``refs``
    (branch or tag -> commit), each a copy of ``checkpoint`` plus a ``commit.txt`` naming it."""
    refs = {"main": MAIN, "v1": TAGGED} if refs is None else refs
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    for ref, commit in refs.items():
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / ref).write_text(commit)  # huggingface_hub writes it without a newline
        snap = repo_dir / "snapshots" / commit
        if not snap.exists():
            shutil.copytree(checkpoint, snap)
            (snap / "commit.txt").write_text(commit)
    return root


@pytest.fixture
def offline_cache(tmp_path, checkpoint, monkeypatch) -> Path:
    cache = hub_cache(tmp_path / "hub", checkpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture
def no_network(monkeypatch):
    """Fails the test on any Hub API call or download (what a dry run must never make)."""
    from huggingface_hub import HfApi

    def refuse(*args, **kwargs):
        raise AssertionError("the Hub was contacted")

    for name in ("repo_info", "model_info", "list_repo_tree"):
        monkeypatch.setattr(HfApi, name, refuse)


def snapshot(cache: Path, commit: str) -> str:
    return str(cache / "models--org--name" / "snapshots" / commit)


# ----------------------------------------------------------------------------- the resolver
@pytest.mark.parametrize("ref, want", [
    ("org/name", ("org/name", None)), ("Qwen/Qwen2.5-7B-Instruct", ("Qwen/Qwen2.5-7B-Instruct", None)),
    ("org/name@v1", ("org/name", "v1")), ("org/name@refs/pr/1", ("org/name", "refs/pr/1")),
    (f"org/name@{TAGGED}", ("org/name", TAGGED)),
    ("./ckpt", None), ("../a", None), ("/abs/dir", None), ("a/b/c", None), ("name", None), ("org--x/name", None),
    ("org/name@", None), ("-org/name", None), ("org/name.", None),
])
def test_what_reads_as_a_hub_id(ref, want, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.parse_hub_id(ref) == want


def test_an_existing_path_or_a_local_org_directory_is_not_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "x").mkdir(parents=True)
    assert hub.parse_hub_id("runs/x") is None  # there
    assert hub.parse_hub_id("runs/y") is None  # runs/ is a local directory: a missing local path
    assert hub.parse_hub_id("other/y") == ("other/y", None)


def test_a_local_directory_stays_local(checkpoint, offline_cache):
    r = hub.resolve(str(checkpoint), what="model.path")
    assert (r.status, r.path, r.is_hub) == ("local", str(checkpoint), False)


def test_a_hub_id_resolves_to_the_cached_snapshot_offline(offline_cache, no_network):
    for what in ("model.path", "tokenizer"):
        r = hub.resolve("org/name", what=what)
        assert (r.status, r.path) == ("hub-cache", snapshot(offline_cache, MAIN))
        assert (r.repo_id, r.revision) == ("org/name", None)


def test_hf_home_places_the_cache(tmp_path, checkpoint, monkeypatch, no_network):
    hub_cache(tmp_path / "home" / "hub", checkpoint)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.resolve("org/name", what="model.path").path == snapshot(tmp_path / "home" / "hub", MAIN)


@pytest.mark.parametrize("rev, commit", [("main", MAIN), ("v1", TAGGED), (TAGGED, TAGGED), (MAIN, MAIN)])
def test_a_revision_pins_its_snapshot(rev, commit, offline_cache, no_network):
    r = hub.resolve(f"org/name@{rev}", what="model.path")
    assert (r.status, r.path, r.revision) == ("hub-cache", snapshot(offline_cache, commit), rev)
    assert Path(r.path, "commit.txt").read_text() == commit


@pytest.mark.parametrize("ref", ["org/other", "org/name@v2", f"org/name@{'c' * 40}"])
def test_a_miss_offline_names_the_key_and_hf_hub_offline(ref, offline_cache, no_network):
    r = hub.resolve(ref, what="model.path")
    assert r.status == "missing" and r.path is None and r.is_hub
    assert r.reason.startswith(f"model.path={ref!r}: ") and "HF_HUB_OFFLINE=1" in r.reason
    assert "expected" in r.reason and str(offline_cache) in r.reason


def test_a_tokenizer_only_snapshot_is_no_checkpoint(offline_cache, no_network):
    snap = Path(snapshot(offline_cache, MAIN))
    for f in snap.glob("*.safetensors"):
        f.unlink()
    assert hub.resolve("org/name", what="tokenizer").status == "hub-cache"
    r = hub.resolve("org/name", what="model.path")
    assert r.status == "missing" and "lacks *.safetensors" in r.reason and "HF_HUB_OFFLINE" in r.reason


def test_a_dry_resolve_touches_no_network(tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    r = hub.resolve("org/name@v1", what="model.path", download=False)
    assert (r.status, r.path, r.revision) == ("hub", None, "v1") and "a run downloads" in r.reason


def test_a_download_fetches_the_loaders_files_into_the_cache(tmp_path, checkpoint, monkeypatch):
    """Online and not cached: one `snapshot_download` with the allow/ignore patterns and the cache
    from the environment (a stand-in here: no network in the tests)."""
    import huggingface_hub

    class RepositoryNotFoundError(OSError):  # as huggingface_hub's (an OSError), without an HTTP response to build
        pass

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    calls, real = [], huggingface_hub.snapshot_download

    def fake(repo_id, *, revision=None, cache_dir=None, local_files_only=False, allow_patterns=None,
             ignore_patterns=None):
        calls.append({"repo_id": repo_id, "revision": revision, "cache_dir": cache_dir, "local": local_files_only,
                      "allow": allow_patterns, "ignore": ignore_patterns})
        if local_files_only:  # the real look-up in the cache
            return real(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True,
                        allow_patterns=allow_patterns, ignore_patterns=ignore_patterns)
        if repo_id == "org/gone":
            raise RepositoryNotFoundError("401 Client Error: Repository Not Found for url")
        hub_cache(Path(cache_dir), checkpoint, repo=repo_id, refs={revision or "main": TAGGED})
        return str(Path(cache_dir) / ("models--" + repo_id.replace("/", "--")) / "snapshots" / TAGGED)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    r = hub.resolve("org/name@v1", what="model.path")
    assert (r.status, r.path) == ("hub", snapshot(tmp_path / "cache", TAGGED))
    assert [c["local"] for c in calls] == [True, False]  # the cache first, then the download
    assert calls[1]["cache_dir"] == str(tmp_path / "cache") and calls[1]["revision"] == "v1"
    assert set(calls[1]["allow"]) == {"*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"}
    assert calls[1]["ignore"] == ["*/*"]  # top-level files only
    assert hub.resolve("org/name@v1", what="tokenizer").status == "hub-cache"  # the checkpoint's download has it
    assert hub.resolve("org/tok", what="tokenizer").status == "hub"
    assert "*.safetensors" not in calls[-1]["allow"] and not calls[-1]["local"]  # a tokenizer alone: no weights
    r = hub.resolve("org/gone", what="tokenizer")
    assert r.status == "missing" and r.reason.startswith("tokenizer='org/gone': ")
    assert "RepositoryNotFoundError" in r.reason and "could not be downloaded" in r.reason


# ----------------------------------------------------------------------------- the launcher
def _refused(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    return str(e.value.code)


def test_the_launcher_replaces_hub_ids_by_their_snapshots(offline_cache, no_network):
    cfg, paths = resolve_paths(load_config(None, ["job=serve", "model.path=org/name@v1", "tokenizer=org/name@v1"]))
    assert cfg.model.path == cfg.tokenizer == snapshot(offline_cache, TAGGED)
    assert {k: r.status for k, r in paths.items()} == {"model.path": "hub-cache", "tokenizer": "hub-cache"}
    assert cfg.serve.model_name == "org/name"  # job=serve names the model by its Hub id, not the commit
    cfg, paths = resolve_paths(load_config(None, [f"tokenizer={GYM_TOKENIZER}"]))
    assert cfg.tokenizer == str(GYM_TOKENIZER) and paths["tokenizer"].status == "local"


def test_dry_run_reports_each_path(offline_cache, no_network, capsys):
    assert main(["--dry-run", "job=eval", "model.path=org/name", "tokenizer=org/name@v1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] == out["verdict"] == "valid" and out["shapes_from"] == "model.path"
    assert {k: (v["status"], v["path"]) for k, v in out["paths"].items()} == {
        "model.path": ("hub-cache", snapshot(offline_cache, MAIN)),
        "tokenizer": ("hub-cache", snapshot(offline_cache, TAGGED))}
    # not cached and offline: reported as missing, still a valid plan on the preset's shapes
    assert main(["--dry-run", "job=eval", "model.path=org/other", "tokenizer=org/other"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] == "valid" and "not downloaded yet" in out["shapes_from"]
    assert {v["status"] for v in out["paths"].values()} == {"missing"}
    assert out["verdict"] == ("valid, with caveats: shapes from " + out["shapes_from"] + "; model.path is missing (a run "
                              "refuses it); tokenizer is missing (a run refuses it)")
    assert "HF_HUB_OFFLINE" in out["paths"]["model.path"]["note"]


def test_dry_run_online_says_a_run_downloads_and_downloads_nothing(tmp_path, monkeypatch, no_network, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert main(["--dry-run", "job=eval", "model.path=org/name", "tokenizer=org/tok", "model.preset=qwen2.5-0.5b"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] == "valid" and out["shapes_from"].startswith("model.preset='qwen2.5-0.5b'")
    assert "not downloaded yet" in out["shapes_from"] and out["parameters_millions"] == 494.03
    assert {k: v["status"] for k, v in out["paths"].items()} == {"model.path": "hub", "tokenizer": "hub"}
    assert out["verdict"].endswith("; model.path is downloaded by the run; tokenizer is downloaded by the run")
    # a Hub tokenizer alone (model.path null): the preset's shapes with its own vocabulary
    assert main(["--dry-run", "job=eval", "tokenizer=org/tok"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "tokenizer='org/tok' not downloaded yet" in out["shapes_from"]
    assert not (tmp_path / "empty").exists() or not any((tmp_path / "empty").rglob("*.json"))


def test_a_run_refuses_a_hub_id_missing_offline_naming_the_key(offline_cache, tmp_path, no_network):
    message = _refused([f"runs_dir={tmp_path}", "job=eval", "model.path=org/other", "tokenizer=org/other"])
    assert message.startswith("config error: model.path='org/other': ") and "HF_HUB_OFFLINE=1" in message
    message = _refused([f"runs_dir={tmp_path}", "job=eval", "tokenizer=org/name@v9"])
    assert message.startswith("config error: tokenizer='org/name@v9': ") and "HF_HUB_OFFLINE=1" in message
    # a local path that does not exist keeps its error
    missing = tmp_path / "no-such-checkpoint"
    message = _refused([f"runs_dir={tmp_path}", "job=eval", f"model.path={missing}"])
    assert message.startswith(f"config error: model.path='{missing}': not a directory")
    assert not (tmp_path / "eval-gym-intention").exists()


@pytest.mark.slow
def test_job_eval_runs_from_the_hub_cache_offline(offline_cache, tmp_path):
    """``python -m jaxagent.launch job=eval model.path=org/name tokenizer=org/name`` with
    ``HF_HUB_OFFLINE=1``: the checkpoint and tokenizer come from the cache, nothing is downloaded."""
    args = ["job=eval", "model.path=org/name@v1", "tokenizer=org/name@v1", "eval.tasks=1", f"runs_dir={tmp_path}",
            "name=hub", "progress=false", "rollout.max_turns=2", "rollout.max_new_tokens=8",
            "rollout.slots=2", "checkpoint.export_hf=false"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
           "HF_HUB_CACHE": str(offline_cache), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "jaxagent.launch", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "downloading" not in proc.stderr
    summary = json.loads((tmp_path / "hub" / "summary.json").read_text())
    assert summary["eval_tasks"] == 1
    recorded = (tmp_path / "hub" / "config.yaml").read_text()
    assert snapshot(offline_cache, TAGGED) in recorded  # the run records the snapshot it read
