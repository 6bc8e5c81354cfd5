#!/usr/bin/env bash
# The shared tier's figures (issue 35) on the GPU machine's host, which has 16 cores but no
# registry: moto's S3 server, redis-py and botocore travel as wheels, redis-server as the
# distribution's binary with its libraries. Make the kit here first (ignored by git):
#
#   python3 -m pip download -d .gpukit/w312 --python-version 3.12 --only-binary=:all: \
#       --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 "moto[server]>=5" botocore redis
#   (then remove what moto's S3 server does not import, to stay within the 64 MiB carried:
#    cfn_lint, sympy, networkx, pydantic*, jsonschema*, openapi*, docker, aws_xray_sdk, ...)
#   mkdir -p .gpukit/redis/lib && cp -L /usr/bin/redis-server .gpukit/redis/
#   cp -L $(ldd /usr/bin/redis-server | awk '/=> \//{print $3}' | grep -v -e libc.so -e libm.so \
#       -e libstdc++ -e libgcc_s) .gpukit/redis/lib/
#
# and, to compare with another commit, its tree in .gpukit/old (`git archive REV | tar x -C
# .gpukit/old`). Run from the repository root, carrying .gpukit: each fleet's results land in
# $OUT/fleet_<tag>.json.
set -uo pipefail
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
python3 -m pip install -q --no-index --no-deps --disable-pip-version-check --target /tmp/site .gpukit/w312/*.whl >/dev/null 2>&1
# a .pth, not PYTHONPATH: the tool's child processes get a clean environment of their own
echo /tmp/site > "$SP/zz-bench-site.pth"
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$PWD/.gpukit/redis/lib" "$PWD/.gpukit/redis/redis-server" > /tmp/rs.sh
chmod +x /tmp/rs.sh .gpukit/redis/redis-server
inst() {  # install a tree's kcache (the children import the installed one) and say which
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --disable-pip-version-check "$1" >/dev/null 2>&1
  (cd /tmp && python3 -c "import kcache.store.tiers.backend as b; print('installed:', 'with' if hasattr(b.Backend, 'poll_s') else 'without', 'Backend.poll_s')")
}
fleet() {  # fleet TAG PROCS CONDITIONS REPEATS
  timeout 240 python3 tools/bench_remote.py --backends s3 --fleet-only --conditions "$3" --procs "$2" \
    --repeats "$4" --redis-server /tmp/rs.sh --json "$OUT/fleet_$1.json" 2>&1 |
    grep -E "server CPU|alone\)|compiles in every" | sed -E 's/Triton compiles/c/; s/kcache puts +[0-9]+ +//'
}
nproc; uptime
if [ -d .gpukit/old ]; then
  inst ./.gpukit/old
  fleet old8 8 s3-secret,alone 5
  fleet old2 2 s3-secret,alone 3
fi
inst .
fleet new8 8 s3,s3-secret,redis-secret,alone 7
uptime
