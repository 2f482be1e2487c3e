"""Writes the tiny HF checkpoints and expected logits under tests/fixtures/ (needs torch).

    python scripts/make_fixtures.py [--out tests/fixtures]

Each fixture is a random Qwen-architecture model made with transformers, with every parameter
(norm weights and biases included) perturbed so that no mapping mistake can hide behind a
default value, saved as a HF checkpoint, plus ``expected.npz``: a padded batch (right- and
left-padded rows, explicit position ids) and the logits transformers computes for it in float32.
The test suite checks our forward against these without torch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python scripts/make_fixtures.py`
    sys.path.insert(0, str(ROOT))

from tests.hf_reference import hf_logits, make_model, padded_batch  # noqa: E402

VARIANTS = {
    # Qwen2/2.5: q/k/v bias, tied embeddings, default RoPE, one safetensors file.
    "qwen2_tied": dict(
        arch="qwen2",
        hf=dict(
            vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        max_shard_size=None,
    ),
    # Qwen3: q/k RMSNorm, explicit head_dim != hidden/heads, untied, yarn RoPE, sharded files.
    "qwen3_untied_yarn": dict(
        arch="qwen3",
        hf=dict(
            vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
            tie_word_embeddings=False, attention_bias=False,
            rope_parameters={
                "rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        max_shard_size="20KB",
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))
    args = ap.parse_args()
    out = Path(args.out)
    for k, (name, spec) in enumerate(VARIANTS.items()):
        model = make_model(spec["arch"], spec["hf"], seed=100 + k)
        target = out / name
        shutil.rmtree(target, ignore_errors=True)
        kwargs = {"max_shard_size": spec["max_shard_size"]} if spec["max_shard_size"] else {}
        model.save_pretrained(target, **kwargs)
        # Offset positions exercise RoPE beyond the yarn model's original context.
        offset = 150 if spec["arch"] == "qwen3" else 0
        tokens, mask, positions = padded_batch(spec["hf"]["vocab_size"], seed=200 + k, offset=offset)
        logits = hf_logits(model, tokens, mask, positions)
        np.savez_compressed(
            target / "expected.npz", tokens=tokens, attention_mask=mask, position_ids=positions, logits=logits
        )
        files = sorted(p.name for p in target.iterdir())
        print(json.dumps({"fixture": name, "files": files, "max_abs_logit": float(np.abs(logits).max())}), flush=True)
    print(f"make_fixtures: wrote {', '.join(VARIANTS)} under {out}/", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
