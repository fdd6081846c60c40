#!/usr/bin/env python3
"""Compile the CUDA kernel sources with NVRTC exactly as the backend does (one module:
matmul.cu, math.cuh, layers.cu, deepseek.cu; --fmad=false --ftz=false --prec-div=true --prec-sqrt=true)
and report the entry points and the floating-point instructions of the PTX. Needs only
libnvrtc (no GPU, no driver): e.g. from the `nvidia-cuda-nvrtc` wheel.

    python3 bench/nvrtc_check.py [--lib PATH/libnvrtc.so.N] [--arch compute_90]

Fails (exit 1) when the source does not compile or the PTX holds an approximate or
flush-to-zero instruction, which would break bit-identity with the CPU.
"""
import argparse
import ctypes
import glob
import re
import sys
from pathlib import Path

SOURCES = ["matmul.cu", "math.cuh", "layers.cu", "deepseek.cu"]


def find_lib():
    for pattern in ["/usr/local/cuda/lib64/libnvrtc.so*", "/usr/lib/x86_64-linux-gnu/libnvrtc.so*"]:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    try:
        import nvidia  # the pip wheels' namespace package

        for base in nvidia.__path__:
            hits = sorted(glob.glob(f"{base}/*/lib/libnvrtc.so*"))
            hits = [h for h in hits if "builtins" not in h]
            if hits:
                return hits[0]
    except ImportError:
        pass
    sys.exit("no libnvrtc found: pass --lib")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib")
    ap.add_argument("--arch", default="compute_90")
    args = ap.parse_args()
    lib = ctypes.CDLL(args.lib or find_lib())
    root = Path(__file__).resolve().parent.parent / "engine/src/backend/cuda"
    src = b"".join((root / s).read_bytes() for s in SOURCES)
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"deltafin.cu", 0, None, None) != 0:
        sys.exit("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={args.arch}", "--ftz=false", "--prec-div=true", "--prec-sqrt=true", "--fmad=false"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if log.value.strip():
        print(log.value.decode())
    if rc != 0:
        sys.exit(f"compilation failed (nvrtc {rc})")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    text = ptx.value.decode()
    print("entries:", " ".join(re.findall(r"\.entry (\w+)", text)))
    counts = {op: text.count(op) for op in ["fma.rn.f32", "mul.rn.f32", "add.rn.f32", "sub.rn.f32", "div.rn.f32", "sqrt.rn.f32"]}
    print("instructions:", ", ".join(f"{k} {v}" for k, v in counts.items()))
    bad = {op: text.count(op) for op in [".ftz", ".approx", "ex2.", "lg2.", "tanh."] if op in text}
    if bad:
        sys.exit(f"non-IEEE instructions in the PTX: {bad}")
    print(f"ok: {args.arch}, no approximate or flush-to-zero instruction")


if __name__ == "__main__":
    main()
