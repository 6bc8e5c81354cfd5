#!/usr/bin/env bash
# kcache's torch.compile and Triton tests against an older torch (and the Triton it pins), the
# way CI runs them against torch 2.13: a virtual environment of its own with torch from PyPI
# (a CUDA build: about 4 GB with its NVIDIA libraries; no GPU is needed, the tests compile for
# the CPU and for sm_90 without one) and this checkout installed in it (editable).
#
#   bash tools/torch_compat_check.sh 2.10.0 [DIR]     # DIR: where the environment goes
#
# Prints pytest's summary and writes the whole output to DIR/compat.log. The torch test files'
# subjects that an older torch lacks skip with a reason; see docs/torch-compile.md, "Older torch",
# for what each version was seen to do.
set -euo pipefail
version="${1:?usage: tools/torch_compat_check.sh TORCH_VERSION [DIR]}"
dir="${2:-.venv-torch-$version}"
here="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
if [ ! -x "$dir/bin/python" ]; then
  echo "== torch $version into $dir (PyPI: a few GB)"
  "$python" -m venv "$dir"
  "$dir/bin/pip" install -q --disable-pip-version-check "torch==$version"
  "$dir/bin/pip" install -q --disable-pip-version-check -e "$here[test,redis]"
fi
"$dir/bin/python" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
cd "$here"
workers="${KCACHE_TEST_WORKERS:-2}"
set +e
"$dir/bin/python" -m pytest -q -p no:cacheprovider -n "$workers" --dist loadfile \
  tests/test_inductor.py tests/test_inductor_pch.py tests/test_inductor_restarts.py \
  tests/test_inductor_served.py tests/test_inductor_torchkey.py tests/test_inductor_transparency.py \
  tests/test_inductor_tunecheck.py tests/test_inductor_handover.py tests/test_inductor_debuglines.py \
  tests/test_prewarm_spec.py tests/test_prewarm_inputs.py tests/test_triton.py \
  tests/test_triton_transparency.py tests/test_remote_triton.py >"$dir/compat.log" 2>&1
rc=$?
set -e
grep -E "^(FAILED|ERROR)|passed|failed" "$dir/compat.log" | tail -40
exit $rc
