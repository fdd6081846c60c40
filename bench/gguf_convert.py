#!/usr/bin/env python3
"""Convert a deltafin synthetic checkpoint to a BF16 GGUF with llama.cpp's own
convert_hf_to_gguf.py (from the llama-cpp-python sdist).

The synthetic checkpoints carry a Kimi-style byte-level tiktoken tokenizer, which the
converter cannot read without remote code. This script builds a conversion directory next to
the output with symlinks to config.json and the shards, plus an equivalent Hugging Face
tokenizer.json (the same 256 byte ranks and the same special-token ids), and tells the
converter that its unknown pre-tokenizer hash is plain GPT-2 byte-level (it is).

usage: gguf_convert.py LLAMA_CPP_DIR MODEL_DIR OUT.gguf
"""
import json
import os
import runpy
import sys


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def main():
    llama, model, out = sys.argv[1:4]
    conv = out + ".src"
    os.makedirs(conv, exist_ok=True)
    for name in os.listdir(model):
        if name.endswith(".safetensors") or name in ("config.json", "model.safetensors.index.json"):
            dst = os.path.join(conv, name)
            if not os.path.lexists(dst):
                os.symlink(os.path.abspath(os.path.join(model, name)), dst)
    cfg = json.load(open(os.path.join(model, "tokenizer_config.json")))
    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    # llama.cpp refuses a BPE vocabulary without merges: add one merge ("e" + "r") whose
    # result takes the first id that is neither a byte nor a special token. The engine never
    # merges (its ranks are single bytes); llama-bench feeds token ids, so this is inert.
    taken = {int(i) for i in cfg["added_tokens_decoder"]}
    free = next(i for i in range(256, 100000) if i not in taken)
    vocab["er"] = free
    merges = ["e r"]
    added = [
        {"id": int(i), "content": t["content"], "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, t in sorted(cfg["added_tokens_decoder"].items(), key=lambda kv: int(kv[0]))
    ]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    json.dump(tokenizer, open(os.path.join(conv, "tokenizer.json"), "w"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": cfg.get("bos_token"),
               "eos_token": cfg.get("eos_token")}, open(os.path.join(conv, "tokenizer_config.json"), "w"))
    sys.path.insert(0, os.path.join(llama, "gguf-py"))
    sys.path.insert(0, llama)
    import conversion.base as base  # noqa: E402

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    sys.argv = ["convert_hf_to_gguf.py", conv, "--outtype", "bf16", "--outfile", out]
    runpy.run_path(os.path.join(llama, "convert_hf_to_gguf.py"), run_name="__main__")


if __name__ == "__main__":
    main()
