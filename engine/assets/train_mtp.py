"""Train a multi-token-prediction (MTP) module for the built-in `austen-moe` model, so that
`--draft-mtp` can be measured with a drafter that has learned something (the fixtures' MTP
layers are random). Writes a copy of `engine/assets/austen-moe` with the module added in
DeepSeek-V3's published layout (`model.layers.4.{enorm, hnorm, eh_proj, input_layernorm,
self_attn.*, post_attention_layernorm, mlp.* (per-expert), shared_head.{norm, head},
embed_tokens}`, BF16, the router's `e_score_correction_bias` F32) and `num_nextn_predict_layers 1`
to OUT. The repository does not change; nothing here imports or calls Deltafin.

The module follows the DeepSeek-V3 report §2.2 and vLLM's `DeepSeekMultiTokenPredictorLayer`:
row `t` sees the target's final-normed hidden state `h_t` and the embedding of token `t + 1`
(zero at `t = 0`), `x = eh_proj([enorm(e), hnorm(h)])`, one DeepSeek-V3 decoder layer (MLA + the
routed MoE), `logits = shared_head.head(shared_head.norm(x))`. The target is frozen, and so are
the module's embedding and head (copies of the target's). The objective is distillation: row `t`
learns the target's own greedy choice at position `t + 1` — the token greedy decoding emits right
after `t + 1`, i.e. what a draft must equal to be accepted.

Run (about 15 minutes on 2 cores):
    /work/.venv-oracle/bin/pip install rdata
    apt-get download r-cran-janeaustenr     # in some directory DEB_DIR
    /work/.venv-oracle/bin/python engine/assets/train_mtp.py --deb DEB_DIR/r-cran-janeaustenr_*.deb \\
        --out /tmp/austen-mtp [--steps N]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import train_default_model as base  # noqa: E402
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf  # noqa: E402

SRC = HERE / "austen-moe"
SEED = 20261206
SEQ, BATCH = 128, 16
LR, LR_MIN, WARMUP = 2e-3, 2e-4, 50


class Mtp(torch.nn.Module):
    """The MTP module in torch, named as the checkpoint names it below `model.layers.{L}.`."""

    def __init__(self, target: DeepseekV3ForCausalLM):
        super().__init__()
        cfg = target.config
        h, L = cfg.hidden_size, cfg.num_hidden_layers
        layer_cfg = DeepseekV3Config(**{**cfg.to_dict(), "num_hidden_layers": L + 1})
        layer_cfg._attn_implementation = "eager"
        layer_cfg._experts_implementation = "eager"
        self.enorm = hf.DeepseekV3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.hnorm = hf.DeepseekV3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * h, h, bias=False)
        self.layer = hf.DeepseekV3DecoderLayer(layer_cfg, layer_idx=L)
        self.head_norm = hf.DeepseekV3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.embed = torch.nn.Embedding.from_pretrained(target.model.embed_tokens.weight.detach().clone(), freeze=True)
        self.head = torch.nn.Linear(h, cfg.vocab_size, bias=False)
        self.head.weight = torch.nn.Parameter(target.lm_head.weight.detach().clone(), requires_grad=False)
        std = cfg.initializer_range
        with torch.no_grad():
            for name, p in self.layer.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, std)
            self.eh_proj.weight.normal_(0.0, std)
        self.rotary = target.model.rotary_emb

    def forward(self, tokens_next: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Logits of rows `0..S-1` from the tokens after each position and the target's rows."""
        b, s = tokens_next.shape
        e = self.embed(tokens_next)
        e[:, 0] = 0.0  # the row at position 0 (vLLM masks it)
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h)], dim=-1))
        pos = torch.arange(s)[None].expand(b, s)
        cos_sin = self.rotary(x, pos)
        mask = torch.full((s, s), torch.finfo(x.dtype).min).triu(1)[None, None]
        out = self.layer(x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
        x = out[0] if isinstance(out, tuple) else out
        return self.head(self.head_norm(x))


def target_rows(target, tokens):
    """The target's final-normed hidden rows and its greedy choices."""
    normed = {}
    hook = target.model.norm.register_forward_hook(lambda m, i, o: normed.setdefault("h", o))
    try:
        logits = target(input_ids=tokens, use_cache=False).logits
    finally:
        hook.remove()
    return normed["h"], logits.argmax(-1)


def lr_at(step: int, steps: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    t = (step - WARMUP) / max(1, steps - WARMUP)
    return LR_MIN + 0.5 * (LR - LR_MIN) * (1 + math.cos(math.pi * t))


def batch_loss(mtp, target, tokens):
    """Loss and accuracy of rows `0..S-2` against the target's greedy choice at `t + 1`."""
    with torch.no_grad():
        h, greedy = target_rows(target, tokens)
    logits = mtp(tokens[:, 1:], h[:, :-1])
    labels = greedy[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    acc = float((logits.argmax(-1) == labels).float().mean())
    return loss, acc


def save(mtp: Mtp, target_dir: Path, out: Path, info: dict):
    from safetensors.torch import load_file, save_file

    L = json.loads((target_dir / "config.json").read_text())["num_hidden_layers"]
    p = f"model.layers.{L}."
    tensors = load_file(str(target_dir / "model.safetensors"))
    layer = {}
    for name, t in mtp.layer.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                layer[f"mlp.experts.{e}.gate_proj.weight"] = t[e, :inter]
                layer[f"mlp.experts.{e}.up_proj.weight"] = t[e, inter:]
        elif name.endswith("mlp.experts.down_proj"):
            for e in range(t.shape[0]):
                layer[f"mlp.experts.{e}.down_proj.weight"] = t[e]
        else:
            layer[name] = t
    extra = {
        "enorm.weight": mtp.enorm.weight,
        "hnorm.weight": mtp.hnorm.weight,
        "eh_proj.weight": mtp.eh_proj.weight,
        "shared_head.norm.weight": mtp.head_norm.weight,
        "shared_head.head.weight": mtp.head.weight,
        "embed_tokens.weight": mtp.embed.weight,
    }
    for name, t in {**layer, **extra}.items():
        t = t.detach().float().contiguous()
        tensors[p + name] = t if name.endswith("e_score_correction_bias") else t.to(torch.bfloat16)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(target_dir, out, ignore=shutil.ignore_patterns("golden.json", "model.safetensors"))
    save_file(dict(sorted(tensors.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((target_dir / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "mtp_training.json").write_text(json.dumps(info, indent=2) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deb", type=Path, required=True, help="r-cran-janeaustenr .deb")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(args.threads)

    novels = base.read_novels(args.deb)
    text = "\n\n".join(base.paragraphs(novels[n]) for n in base.NOVELS)
    tok = PreTrainedTokenizerFast.from_pretrained(str(SRC))
    ids = np.array(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    split = int(len(ids) * 0.98)  # the base model's own train / validation split
    train_ids, val_ids = ids[:split], ids[split:]

    target = DeepseekV3ForCausalLM.from_pretrained(
        str(SRC), dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    mtp = Mtp(target)
    params = [p for p in mtp.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(SEED)
    log, t0 = [], time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps)
        starts = rng.integers(0, len(train_ids) - SEQ, size=BATCH)
        tokens = torch.from_numpy(np.stack([train_ids[s : s + SEQ] for s in starts]))
        loss, acc = batch_loss(mtp, target, tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            log.append({"step": step, "loss": round(loss.item(), 4), "acc": round(acc, 4), "s": round(time.time() - t0, 1)})
            print(log[-1], flush=True)
    with torch.no_grad():
        n = (len(val_ids) - 1) // SEQ
        vals = [batch_loss(mtp, target, torch.from_numpy(val_ids[i * SEQ : (i + 1) * SEQ])[None]) for i in range(min(n, 16))]
    val = {"loss": round(sum(float(v[0]) for v in vals) / len(vals), 4), "acc": round(sum(v[1] for v in vals) / len(vals), 4)}
    print("validation", val)
    info = {"seed": SEED, "steps": args.steps, "batch": BATCH, "seq": SEQ, "lr": [LR, LR_MIN, WARMUP],
            "objective": "target's greedy choice at t+1 (distillation)", "validation": val, "log": log,
            "seconds": round(time.time() - t0, 1)}
    save(mtp, SRC, args.out, info)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
