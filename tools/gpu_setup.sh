#!/usr/bin/env bash
# Set up the GPU machine (no registry there): kcache itself, as a real install (so that the
# kcache.pth hook is active as for users; msgpack and xxhash are already there), and nvFuser's
# boxkit when it is carried in .gpukit/. Run from the repository root.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-build-isolation --disable-pip-version-check .
if [ -f .gpukit/nvfuser-boxkit.tgz ] && [ ! -d /tmp/boxkit/tree ]; then
  tar xzf .gpukit/nvfuser-boxkit.tgz -C /tmp
  mkdir -p /tmp/boxkit/tree
  tar xJf /tmp/boxkit/nvfuser_cu130_torch210_slim.tar.xz -C /tmp/boxkit/tree
fi
# pip writes .pyc files at install time; this image's Triton has none for some modules (its first
# kernel then compiles gluon's sources, ~0.13 s, in every process): give it what an install gives.
python3 -m compileall -q -j 8 "$(python3 -c 'import os, triton; print(os.path.dirname(triton.__file__))')" >/dev/null 2>&1 || true
python3 -c "import kcache, msgpack, xxhash, triton, torch; print('kcache', kcache.__version__, 'triton', triton.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
