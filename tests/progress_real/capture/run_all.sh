#!/usr/bin/env bash
# Re-captures every log in tests/progress_real/ the way trainguard's local backend sees a replica:
# stdout and stderr merged into ONE pipe (stderr=STDOUT), PYTHONUNBUFFERED=1 (trainguard sets it
# for replicas), nothing is a terminal. The raw bytes (\r, ANSI escapes) are kept as they come.
# Needs /tmp/capsite (transformers/accelerate installed with `pip install --target`, see SOURCES.md).
set -uo pipefail
cd "$(dirname "$0")"
PY=/work/main/.venv/bin/python
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cases=(hf_trainer_tqdm hf_trainer_notqdm hf_trainer_eval_epochs lightning_tqdm lightning_ddp2
       lightning_rich tqdm_plain tqdm_epochs pytorch_examples_mnist nanogpt_style
       negative_torch_compile_warn negative_hf_save_load)
for c in "${@:-${cases[@]}}"; do
  start=$(date +%s)
  case "$c" in
    hf_*|negative_hf_*) PYTHONPATH=/tmp/capsite "$PY" "$c.py" 2>&1 | cat > "../$c.log" ;;
    *) "$PY" "$c.py" 2>&1 | cat > "../$c.log" ;;
  esac
  echo "$c: rc=$? $(( $(date +%s) - start ))s $(wc -c < "../$c.log") bytes"
done
