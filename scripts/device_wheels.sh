#!/usr/bin/env bash
# Wheels of the engine's packages that the H200 device image lacks (it has jax, flax, orbax,
# transformers, tokenizers, safetensors and msgpack, but not gguf or pyzmq, which
# `import jaxvllm.entrypoints.llm` needs), for its Python 3.12 on x86-64, into .whl/ (git
# ignores it). scripts/device_check.sh installs whatever .whl/ holds before its first step;
# a device run carries the folder (run's `carry: [".whl"]`). Run here, where pip reaches PyPI.
#   scripts/device_wheels.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PY=${PYTHON:-$(test -x .venv/bin/python && echo .venv/bin/python || echo python3)}
mkdir -p "$DIR"
# The pins of pyproject.toml; neither needs a package the image lacks (gguf: numpy, pyyaml, tqdm).
for pkg in gguf==0.19.0 pyzmq==27.3.0; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DIR" "$pkg"
done
ls -l "$DIR"
