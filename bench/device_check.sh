#!/usr/bin/env bash
# The one prepared GPU check: CUDA parity/engine tests, then the Von and Laya benches on cuda.
#
# The device machine (see the device tool's KINDS.md) has no network and its own python3 3.12
# with a CUDA torch (2.11+cu130 when last read), transformers, tokenizers, safetensors, numpy,
# httpx, pytest; it lacks laya, von-sdk, contrastive-lm, msgspec, litestar, granian, mcp, the
# pydantic/fastapi/uvicorn stack and pytest-asyncio. Our .venv cannot stand in: its torch is a
# CPU wheel and it is a Python 3.11 venv whose interpreter is not on that machine. So:
#
#   1. here, with the package index reachable:  bash bench/device_check.sh wheels
#      (downloads cp312 wheels of exactly the versions in .venv into .whl/, ignored by git;
#      about 30 MiB, within the 64 MiB a call may carry)
#   2. there, through the device tool:  run(command="bash bench/device_check.sh",
#      carry=[".whl"], timeout_s=600)
#
# There it makes a venv over the image's own packages (CUDA torch included), installs .whl/
# into it offline, and runs each step under `timeout`, all within about 8.5 minutes. Logs and
# summary.txt (each step's exit status) go to $OUT, or ./device-out where OUT is unset; a failed
# step does not stop the next. torch stays the image's version, not the pinned 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the five test files and both benches import that the image lacks (the requirement
# closure of pyproject's dependencies, laya, von-sdk, contrastive-lm and pytest-asyncio, less
# the image's packages), plus transformers, huggingface-hub and pytest, whose image versions are
# older than ours.
CARRIED=(
  annotated-types cachetools contrastive-lm faker fastapi granian httpcore2 httpx2
  huggingface-hub iniconfig jsonschema jsonschema-specifications laya litestar litestar-htmx
  mcp mcp-types msgspec multipart opentelemetry-api pluggy polyfactory pydantic pydantic-core
  pyjwt pytest pytest-asyncio python-multipart referencing rich-click rpds-py sniffio
  sse-starlette starlette tenacity transformers truststore typing-inspection uvicorn von-sdk
  zstandard
)
TESTS=(
  tests/parity/test_von_parity.py tests/parity/test_laya_parity.py tests/parity/test_clm_parity.py
  tests/worker/test_von_engine.py tests/worker/test_laya_engine.py
)
BUDGET_SECONDS=510  # every step together; the device tool allows 600 per command

fetch_wheels() {
  local venv_python=.venv/bin/python pins=()
  mapfile -t pins < <("$venv_python" -c '
import sys
from importlib.metadata import version
print("\n".join(f"{name}=={version(name)}" for name in sys.argv[1:]))
' "${CARRIED[@]}")
  rm -rf .whl
  "$venv_python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "${pins[@]}"
  du -sh .whl
}

# The steps run as `bash bench/device_check.sh _STEP` under `timeout`; they share these.
VENV=/tmp/decidealot-venv
IMAGE_PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT:-./device-out}"

setup_venv() {
  nvidia-smi
  # A venv whose own site-packages (the carried wheels) come before the image's (CUDA torch):
  # the image's python3 may itself be a venv, so --system-site-packages would miss its torch.
  "$IMAGE_PYTHON" -m venv --without-pip "$VENV"
  if [ -d .whl ]; then
    "$IMAGE_PYTHON" -m pip --python "$VENV/bin/python" install --quiet --no-index --no-deps \
      --ignore-installed --no-compile --no-cache-dir .whl/*.whl
  else
    echo "no .whl folder was carried: the tests and benches need it (see the header)"
  fi
  # Only now the image's packages join, after ours: pip never saw (nor replaced) them.
  local venv_site
  venv_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$IMAGE_PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' \
    >"$venv_site/image-packages.pth"
  "$VENV/bin/python" -c '
import sys, torch, transformers
print(sys.version)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("transformers", transformers.__version__)
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
    print("fp32 matmul precision", torch.get_float32_matmul_precision())
'
}

cuda_tests() {
  # Without a visible GPU every cuda item would be skipped and pytest would still pass.
  "$VENV/bin/python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)'
  "$VENV/bin/python" -m pytest -q -m cuda -p no:cacheprovider -rs \
    --junitxml="$OUT_DIR/pytest-junit.xml" "${TESTS[@]}"
}

run_checks() {
  local started=$SECONDS summary="$OUT_DIR/summary.txt"
  mkdir -p "$OUT_DIR"
  : >"$summary"
  export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH="$PWD"

  # step NAME CAP_SECONDS COMMAND...: output to $OUT_DIR/NAME.log, exit status to the summary;
  # the cap shrinks to what is left of the budget.
  step() {
    local name=$1 cap=$2 left status=0
    shift 2
    left=$((BUDGET_SECONDS - (SECONDS - started)))
    ((cap < left)) || cap=$left
    if ((cap <= 5)); then
      echo "$name skipped (budget spent)" | tee -a "$summary"
      return 0
    fi
    echo "== $name (at most ${cap}s): $*" | tee -a "$OUT_DIR/$name.log"
    timeout --kill-after=10 "$cap" "$@" >>"$OUT_DIR/$name.log" 2>&1 || status=$?
    echo "$name exit=$status seconds=$((SECONDS - started))" | tee -a "$summary"
  }

  step setup 120 bash "$0" _setup
  step pytest 240 bash "$0" _cuda-tests
  # The compute-bound checkpoints: on CPU they are where no server reaches 2x upstream.
  step bench-von 150 "$VENV/bin/python" bench/von.py --device cuda --sizes small --small-seconds 8
  step bench-laya 150 "$VENV/bin/python" bench/laya.py --device cuda --sizes base --base-seconds 8
  echo "total seconds=$((SECONDS - started))" | tee -a "$summary"
}

case "${1:-check}" in
  wheels) fetch_wheels ;;
  check) run_checks ;;
  _setup) setup_venv ;;
  _cuda-tests) cuda_tests ;;
  *)
    echo "usage: bash bench/device_check.sh [wheels|check]" >&2
    exit 2
    ;;
esac
