"""``job=serve``: the policy behind an OpenAI-compatible API (`jaxagent.serve`), until SIGINT/SIGTERM.

What is served: ``model.path`` (a Hugging Face checkpoint directory), ``serve.run`` (a run's final
policy, ``<run>/hf``, with the tokenizer exported beside it), ``model.path`` + ``serve.adapter``
(a PEFT LoRA adapter), or with none of them the preset's random weights (for trying the API).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
from pathlib import Path
from typing import Any

from jaxagent import configlib
from jaxagent.jobs.build import build_engine, build_model, build_tokenizer, param_count
from jaxagent.jobs.config import RunConfig
from jaxagent.models import LogicalRules, make_mesh
from jaxagent.serve.server import PolicyServer, ServeSettings, bind, make_app, uvicorn_server


def resolve(cfg: RunConfig) -> RunConfig:
    """``serve.run`` becomes ``model.path`` and ``tokenizer`` (its ``hf/`` export), and the model's
    name the run's (unless ``serve.model_name`` is set)."""
    s = cfg.serve
    if s.run is None:
        return cfg
    hf = Path(s.run) / "hf"
    if not (hf / "config.json").is_file():
        raise configlib.ConfigError(f"serve.run={s.run!r}: no hf/config.json there; expected a run directory whose "
                                    "final policy was exported (checkpoint.export_hf=true)")
    name = s.model_name or Path(s.run).resolve().name
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(hf)), tokenizer=str(hf),
                               serve=dataclasses.replace(s, run=None, model_name=name))


def model_name(cfg: RunConfig) -> str:
    if cfg.serve.model_name:
        return cfg.serve.model_name
    if cfg.model.path is not None:
        return Path(cfg.model.path).resolve().name
    return cfg.model.preset


def api_key(cfg: RunConfig) -> str | None:
    env = cfg.serve.api_key_env
    if env is None:
        return None
    key = os.environ.get(env)
    if not key:
        raise configlib.ConfigError(f"serve.api_key_env={env!r}: the environment variable {env} is not set or empty; "
                                    "expected it to hold the bearer token clients send")
    return key


def build_server(cfg: RunConfig) -> tuple[PolicyServer, dict[str, Any]]:
    """The server of a resolved config (model, tokenizer, adapter, engine), and what it serves."""
    key = api_key(cfg)
    rules = LogicalRules(make_mesh(cfg.mesh))
    tok = build_tokenizer(cfg)
    qcfg, params = build_model(cfg, tok, rules)
    if cfg.serve.adapter is not None:
        from jaxagent.models.lora_hf import load_peft_adapter

        if not Path(cfg.serve.adapter).is_dir():
            raise configlib.ConfigError(f"serve.adapter={cfg.serve.adapter!r}: not a directory; expected a PEFT adapter "
                                        "directory (adapter_config.json + adapter_model.safetensors)")
        params, qcfg = load_peft_adapter(cfg.serve.adapter, params, qcfg, rules=rules)
    r = cfg.rollout
    engine = build_engine(cfg, params, qcfg, park_rows=r.park_rows if r.park_rows >= 0 else r.slots,
                          vocab_limit=tok.vocab_size)
    s = cfg.serve
    settings = ServeSettings(model_name=model_name(cfg), max_tokens=s.max_tokens, max_n=s.max_n, max_queue=s.max_queue,
                             retry_after_s=s.retry_after_s, request_timeout_s=s.request_timeout_s, api_key=key,
                             seed=cfg.seed, max_body_bytes=s.max_body_bytes)
    what = {"model": settings.model_name, "path": cfg.model.path, "adapter": s.adapter,
            "weights": "checkpoint" if cfg.model.path else f"random ({cfg.model.preset}, model.init_seed)",
            "model_params": param_count(params), "slots": r.slots, "capacity": r.capacity}
    return PolicyServer(engine, tok, settings), what


def run_serve(cfg: RunConfig) -> dict[str, Any]:
    cfg = resolve(cfg)
    server, what = build_server(cfg)
    s = cfg.serve
    try:
        sock = bind(s.host, s.port)
    except OSError as e:
        raise configlib.ConfigError(f"serve.port={s.port}: cannot listen on {s.host}:{s.port} ({e.strerror or e}); "
                                    "expected a free port (0: any)") from None
    uv = uvicorn_server(make_app(server), shutdown_timeout_s=s.shutdown_timeout_s)
    # SIGINT/SIGTERM stop the server gracefully, also when they come before it runs (during the
    # warmup: it then stops as soon as it has started). uvicorn raises the signal again for the
    # handler it found when it stops: this one notes it, so the job ends with its summary, exit 0.
    # Stopping drains (`uvicorn_server`): in-flight requests get serve.shutdown_timeout_s to finish
    # (counted drained), then the server ends the rest itself (aborted: a 503, or an error event and
    # [DONE]) before uvicorn's own, later deadline would cancel them.
    signals: list[int] = []

    def stop(n, _frame):
        signals.append(n)
        uv.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if s.warmup:
            server.engine.warmup()
        host, port = sock.getsockname()[:2]
        url = f"http://{host}:{port}/v1"
        if s.api_key_env is None and s.host not in ("127.0.0.1", "localhost", "::1"):
            print(f"jaxagent serve: warning: listening on {s.host} without an API key (serve.api_key_env)",
                  file=sys.stderr, flush=True)
        print(f"jaxagent serve: {what['model']} ({what['weights']}, {what['model_params']:,} parameters) on {url}",
              file=sys.stderr, flush=True)
        asyncio.run(uv.serve(sockets=[sock]))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    st = server.stats
    print(f"jaxagent serve: stopped ({', '.join(sorted({signal.Signals(n).name for n in signals})) or 'no signal'}); "
          f"{st['requests']} requests: {st['served']} served, {st['drained']} drained (finished while stopping), "
          f"{st['aborted']} aborted (ended by the shutdown), {st['disconnected']} abandoned by their client, "
          f"{st['timeouts']} timed out, {st['errors']} failed", file=sys.stderr, flush=True)
    return {"job": "serve", "url": url, **what, **server.stats, "prefix_reuses": server.sessions.reused}
