#!/usr/bin/env bash
# The device entry of `make gpu-check` (issue 19): scripts/gpu_check.py on the lent GPU
# machine, which has torch, Triton, transformers and pytest in its own python3 but no
# network, no venv of ours and none of Folio's other packages. The wheels of
# device-bundle/ (`make device-bundle`) go into a temporary folder with pip --no-index
# and nothing else (this machine's pip settings are set aside), the working tree and
# that folder go on PYTHONPATH, and the synthetic models are written into a temporary
# cache from the bundle's vocabulary. Everything temporary is removed at the end.
#
#   FOLIO_DEVICE_PYTHON  the interpreter (default python3); the emulation here sets it
#   FOLIO_DEVICE_BUNDLE  the bundle (default device-bundle/ in the tree)
#   FOLIO_DEVICE_TMP     where the temporary folder goes (default $TMPDIR or /tmp)
# Arguments go to scripts/gpu_check.py. Exit status: gpu_check.py's, or 3 without a bundle.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${FOLIO_DEVICE_PYTHON:-python3}
BUNDLE=${FOLIO_DEVICE_BUNDLE:-$ROOT/device-bundle}
if [ ! -f "$BUNDLE/manifest.json" ]; then
    echo "gpu-check: no device bundle at $BUNDLE; run \`make device-bundle\` where pip" \
         "can download, and carry the folder along" >&2
    exit 3
fi
WORK=$(mktemp -d "${FOLIO_DEVICE_TMP:-${TMPDIR:-/tmp}}/folio-device.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
echo "gpu-check: $("$PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])'),"\
     "bundle $BUNDLE"
env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT \
    PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
    --target "$WORK/site" "$BUNDLE"/wheels/*.whl
export PYTHONPATH="$ROOT:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
export FOLIO_CACHE_DIR="$WORK/cache"
export FOLIO_TOKENIZER_GGUF="$BUNDLE/starter-vocab.gguf"
export PYTHONUNBUFFERED=1
cd "$ROOT"
status=0
"$PYTHON" scripts/gpu_check.py "$@" || status=$?
exit "$status"
