"""The transformers side of the HF parity checks: a tiny Qwen2/Qwen3 with spread-out random weights,
a padded batch (full, right- and left-padded rows), and its logits. Used by tests/test_hf.py and
by scripts/make_fixtures.py, which commits the expected logits."""

from __future__ import annotations

import numpy as np


def make_model(arch: str, hf_kwargs: dict, seed: int):
    import torch
    import transformers

    cls_cfg = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[arch]
    config = cls_cfg(**hf_kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    return model


def padded_batch(vocab: int, seed: int, offset: int = 0):
    """Three rows of length 12: full, right-padded (8 real), left-padded (6 real)."""
    rng = np.random.default_rng(seed)
    B, L = 3, 12
    tokens = rng.integers(0, vocab, size=(B, L)).astype(np.int32)
    mask = np.ones((B, L), np.int32)
    mask[1, 8:] = 0
    mask[2, :6] = 0
    tokens[mask == 0] = 0
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None).astype(np.int32) + offset
    return tokens, mask, positions


def hf_logits(model, tokens, mask, positions) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    return out.logits.float().numpy()
