#!/usr/bin/env bash
# Build llama.cpp (CPU) from the llama-cpp-python 0.3.36 sdist on PyPI into $BENCH_CACHE, with a
# Python venv able to run its convert_hf_to_gguf.py (torch, transformers, gguf deps).
# Download ~2 min, build ~5 min on 2 idle cores; torch ~3 GB.
set -euo pipefail
CACHE=${BENCH_CACHE:-/work/.bench-cache}
mkdir -p "$CACHE" && cd "$CACHE"
[ -x venv/bin/python ] || python3 -m venv venv
venv/bin/pip install -q numpy sentencepiece protobuf safetensors gguf tokenizers torch transformers
[ -f sdist/llama_cpp_python-0.3.36.tar.gz ] ||
  venv/bin/pip download -q --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d sdist
[ -d llama_cpp_python-0.3.36 ] || tar xzf sdist/llama_cpp_python-0.3.36.tar.gz
cd llama_cpp_python-0.3.36/vendor/llama.cpp
command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake; }
cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF
cmake --build build -j 2 --target llama-bench llama-simple llama-cli
