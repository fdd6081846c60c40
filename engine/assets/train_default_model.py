"""Train Deltafin's built-in default model: a small DeepSeek-V3-architecture MoE (MLA attention,
sigmoid-routed experts with a shared expert, a dense first layer) on Jane Austen's six novels,
on CPU, with Hugging Face `transformers` as the model definition. Writes the checkpoint in the
published DeepSeek-V3 on-disk layout (BF16 weights, F32 `e_score_correction_bias`, per-expert
tensor names, `tokenizer.json` + `tokenizer_config.json` with a DeepSeek-V3-style chat template)
into `engine/assets/austen-moe/`, and its golden (HF transformers, float32, eager, reloaded from
those files) into `golden.json` beside it. Nothing here imports or calls Deltafin.

Corpus: the novels as packaged by the R package `janeaustenr` 1.0.0 (MIT; the texts are Project
Gutenberg's public-domain editions), taken from Debian's `r-cran-janeaustenr` .deb and read
without R (its lazy-load database is zlib-compressed R serialisation, parsed with PyPI `rdata`).

Expert balance: DeepSeek-V3's auxiliary-loss-free method — after every step each MoE layer's
`e_score_correction_bias` moves by BIAS_RATE toward the mean load (sign of the load error).

Run (about 35 minutes on 2 cores; deterministic for a fixed torch build and thread count):
    python3 -m venv /work/.venv-oracle
    /work/.venv-oracle/bin/pip install torch transformers==5.24.0 safetensors numpy tokenizers rdata
    /work/.venv-oracle/bin/python engine/assets/train_default_model.py [--steps N] [--deb PATH]
"""

from __future__ import annotations

import argparse
import copy
import gzip
import hashlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "tests" / "fixtures"
sys.path.insert(0, str(FIXTURES))
sys.path.insert(0, str(FIXTURES / "tokenizers"))
import oracle_common as oc  # noqa: E402
from gen_deepseek_tiny import BOS, EOS, NON_SPECIAL, PAD, SPLIT_CJK, SPLIT_DIGITS, SPLIT_MAIN  # noqa: E402
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, PreTrainedTokenizerFast  # noqa: E402

OUT = HERE / "austen-moe"
SEED = 20261203
VOCAB = 4096
SEQ = 256
BATCH = 16
LR, LR_MIN, WARMUP = 2e-3, 2e-4, 100
BIAS_RATE = 1e-3
NOVELS = ["prideprejudice", "sensesensibility", "emma", "mansfieldpark", "northangerabbey", "persuasion"]
PROMPTS = ["Once upon a time", "It is a truth universally acknowledged", "The weather was"]
N_GOLDEN = 64
# Trained routers have near-ties somewhere along 64 tokens; 1e-5 is still far above the float32
# reordering error of a 256-wide router dot product (~1e-7), so both sides pick the same experts.
MIN_ROUTE_MARGIN = 1e-5

CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=256,
    intermediate_size=768,
    moe_intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=96,
    kv_lora_rank=64,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    n_shared_experts=1,
    first_k_dense_replace=1,
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
    max_position_embeddings=4096,
    num_nextn_predict_layers=0,
    initializer_range=0.02,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attention_bias=False,
    bos_token_id=0,
    eos_token_id=1,
    rope_parameters=dict(rope_type="default", rope_theta=10000.0),
)


# ---- corpus ---------------------------------------------------------------------------


def fetch_deb(dest: Path) -> Path:
    subprocess.run(["apt-get", "download", "r-cran-janeaustenr"], cwd=dest, check=True)
    (deb,) = dest.glob("r-cran-janeaustenr_*.deb")
    return deb


def read_novels(deb: Path) -> dict[str, list[str]]:
    import rdata

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        data = Path(tmp) / "usr/lib/R/site-library/janeaustenr/data"
        index = rdata.conversion.convert(rdata.parser.parse_data(gzip.decompress((data / "Rdata.rdx").read_bytes())))
        rdb = (data / "Rdata.rdb").read_bytes()
    out = {}
    for name in NOVELS:
        off, length = (int(x) for x in index["variables"][name])
        blob = rdb[off : off + length]  # 4-byte big-endian raw length, then zlib
        obj = rdata.conversion.convert(rdata.parser.parse_data(zlib.decompress(blob[4:])))
        out[name] = [str(x) for x in obj]
    return out


def paragraphs(lines: list[str]) -> str:
    """The R package keeps Gutenberg's hard-wrapped lines; join each paragraph onto one line."""
    paras, cur = [], []
    for line in lines + [""]:
        line = line.strip()
        if line:
            cur.append(line)
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    return "\n\n".join(paras)


# ---- tokenizer ------------------------------------------------------------------------


def build_tokenizer(text: str):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in (SPLIT_DIGITS, SPLIT_CJK, SPLIT_MAIN)]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    n_added = len(NON_SPECIAL)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - n_added,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text.split("\n\n"), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NON_SPECIAL])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]
    )
    assert tok.get_vocab_size(with_added_tokens=True) <= VOCAB
    return tok


def write_tokenizer(tok, out: Path) -> PreTrainedTokenizerFast:
    tok.save(str(out / "tokenizer.json"))
    template = (FIXTURES / "tokenizers" / "templates" / "deepseek_v3_like.jinja").read_text(encoding="utf-8")

    def added(content):
        return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": True, "rstrip": False, "single_word": False}

    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": added(BOS),
        "eos_token": added(EOS),
        "pad_token": added(PAD),
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": CONFIG["max_position_embeddings"],
        "unk_token": None,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template,
    }
    oc.write_plain_json(out / "tokenizer_config.json", config)
    return PreTrainedTokenizerFast.from_pretrained(str(out))


# ---- training -------------------------------------------------------------------------


class LoadBalancer:
    """Counts routed tokens per expert at every MoE router (forward hook) and applies the
    auxiliary-loss-free bias update after each optimiser step."""

    def __init__(self, model):
        self.gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
        self.loads = [None] * len(self.gates)
        self.handles = [g.register_forward_hook(self._hook(i)) for i, g in enumerate(self.gates)]

    def _hook(self, i):
        def fn(mod, inp, out):
            idx = out[2] if isinstance(out, tuple) else out
            self.loads[i] = torch.bincount(idx.reshape(-1), minlength=mod.e_score_correction_bias.numel()).float()

        return fn

    @torch.no_grad()
    def update(self):
        imbalance = []
        for gate, load in zip(self.gates, self.loads):
            gate.e_score_correction_bias += BIAS_RATE * torch.sign(load.mean() - load)
            imbalance.append(float(load.max() / load.mean()))
        return max(imbalance)

    def remove(self):
        for h in self.handles:
            h.remove()


def lr_at(step: int, steps: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    t = (step - WARMUP) / max(1, steps - WARMUP)
    return LR_MIN + 0.5 * (LR - LR_MIN) * (1 + math.cos(math.pi * t))


def batches(ids: np.ndarray, steps: int, rng: np.random.Generator):
    for _ in range(steps):
        starts = rng.integers(0, len(ids) - SEQ, size=BATCH)
        yield torch.from_numpy(np.stack([ids[s : s + SEQ] for s in starts]).astype(np.int64))


@torch.no_grad()
def val_loss(model, ids: np.ndarray) -> float:
    model.eval()
    n = (len(ids) - 1) // SEQ
    xs = torch.from_numpy(ids[: n * SEQ + 1].astype(np.int64))
    losses = []
    for i in range(min(n, 16)):
        chunk = xs[i * SEQ : (i + 1) * SEQ][None]
        losses.append(float(model(input_ids=chunk, labels=chunk, use_cache=False).loss))
    model.train()
    return sum(losses) / len(losses)


def train(model, train_ids, val_ids, steps: int, log: list):
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    balancer = LoadBalancer(model)
    rng = np.random.default_rng(SEED)
    model.train()
    t0 = time.time()
    for step, batch in enumerate(batches(train_ids, steps, rng)):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps)
        # HF shifts labels itself: the same window is input and labels.
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        imbalance = balancer.update()
        if step % 50 == 0 or step == steps - 1:
            entry = {"step": step, "loss": round(loss.item(), 4), "max_load_over_mean": round(imbalance, 3), "seconds": round(time.time() - t0, 1)}
            if step % 250 == 0 or step == steps - 1:
                entry["val_loss"] = round(val_loss(model, val_ids), 4)
            log.append(entry)
            print(json.dumps(entry), flush=True)
    balancer.remove()
    model.eval()
    return time.time() - t0


# ---- checkpoint + golden --------------------------------------------------------------


def save_checkpoint(model, out: Path):
    """BF16 weights, F32 router bias (as DeepSeek-V3 ships it), one shard, per-expert names."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(oc.bf16_round(p))
    m_save = copy.deepcopy(model).to(torch.bfloat16)
    for li in oc.moe_layer_indices(model):
        m_save.model.layers[li].mlp.gate.e_score_correction_bias = model.model.layers[li].mlp.gate.e_score_correction_bias.clone()
    m_save.save_pretrained(str(out))
    on_disk = oc.read_checkpoint(out)
    ref = oc.per_expert_state_dict(model)
    assert set(ref) == set(on_disk), set(ref) ^ set(on_disk)
    for k in ref:
        want = torch.float32 if k.endswith("e_score_correction_bias") else torch.bfloat16
        assert on_disk[k].dtype == want, (k, on_disk[k].dtype)
        assert torch.equal(on_disk[k].float(), ref[k]), k
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1, "do_sample": False}, indent=2) + "\n")


def golden(out: Path, hf_tok, corpus_sha: str, train_info: dict):
    reloaded = DeepseekV3ForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    tried = []
    for prompt in PROMPTS:
        prompt_ids = hf_tok(prompt)["input_ids"]
        g = oc.compute_goldens(reloaded, prompt_ids, n_new=N_GOLDEN)
        text = hf_tok.decode(g["greedy_ids"])
        print(f"{prompt!r}: margin {g['min_top1_margin']:.4g} prompt {g['min_prompt_top1_margin']:.4g} route {g['min_route_margin']:.4g}\n  -> {text!r}")
        tried.append({"prompt": prompt, "min_top1_margin": g["min_top1_margin"], "min_route_margin": g["min_route_margin"]})
        if (
            min(g["min_top1_margin"], g["min_prompt_top1_margin"]) >= oc.MIN_TOP1_MARGIN
            and g["min_route_margin"] >= MIN_ROUTE_MARGIN
            and g["max_abs_hidden"] < 1e4
        ):
            break
    else:
        raise SystemExit(f"no prompt with acceptable margins: {tried}")
    doc = oc.golden_json(
        g,
        prompt_ids,
        extra={
            "prompt_text": prompt,
            "greedy_text": text,
            "prompts_tried": tried,
            "corpus": {"source": "Debian r-cran-janeaustenr 1.0.0 (janeaustenr, MIT; texts public domain via Project Gutenberg)", "novels": NOVELS, "sha256": corpus_sha},
            "training": train_info,
            "versions": oc.versions(),
        },
    )
    oc.write_json(out / "golden.json", doc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1800)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--deb", type=Path, help="r-cran-janeaustenr .deb (default: apt-get download)")
    args = ap.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        deb = args.deb or fetch_deb(Path(tmp))
        novels = read_novels(deb)
    text = "\n\n".join(paragraphs(novels[n]) for n in NOVELS)
    corpus_sha = hashlib.sha256(text.encode()).hexdigest()
    print(f"corpus: {len(text):,} characters, sha256 {corpus_sha}")

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    hf_tok = write_tokenizer(build_tokenizer(text), OUT)
    ids = np.array(hf_tok(text, add_special_tokens=False)["input_ids"], dtype=np.int32)
    split = int(len(ids) * 0.98)
    print(f"tokens: {len(ids):,} ({len(text) / len(ids):.2f} characters per token)")

    cfg = DeepseekV3Config(**CONFIG)
    model = DeepseekV3ForCausalLM._from_config(cfg, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params:,}")
    log: list = []
    torch.set_grad_enabled(True)
    seconds = train(model, ids[:split], ids[split:], args.steps, log)
    torch.set_grad_enabled(False)
    info = {
        "seed": SEED, "steps": args.steps, "batch": BATCH, "seq": SEQ, "threads": args.threads,
        "tokens_seen": args.steps * BATCH * SEQ, "corpus_tokens": int(len(ids)), "parameters": n_params,
        "lr": [LR, LR_MIN, WARMUP], "bias_rate": BIAS_RATE, "seconds": round(seconds, 1), "log": log,
    }
    save_checkpoint(model, OUT)
    torch.set_num_threads(1)  # the golden: one thread, as for every fixture
    golden(OUT, hf_tok, corpus_sha, info)
    print(f"done in {seconds / 60:.1f} min of training")


if __name__ == "__main__":
    main()
