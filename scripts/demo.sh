#!/usr/bin/env bash
# The demo: a 2-rank PyTorch DDP job (gloo, CPU) whose rank 1 is SIGKILLed at step 155;
# trainguard notices, stops rank 0, restarts both (forked from the warm-start zygote: no
# second torch import) from the in-memory snapshot of step 155 (the last checkpoint on disk
# is step 150), and the job finishes. Then the restart record of what happened, and the
# job's goodput: read from the steps the script prints (it never calls sdk.report).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh torch
export PATH="$PWD/.venv/bin:$PATH"
export TRAINGUARD_HOME="$PWD/demo-out/home"
rm -rf demo-out && mkdir -p demo-out
set -x
trainguard run --job-name ddp-demo --nproc-per-node 2 -- \
  python examples/ddp_train.py --steps 300 --step-time 0.02 --crash-at-step 155 \
  --snapshot --ckpt-dir demo-out/ckpt --out demo-out/final.pt
trainguard records ddp-demo
trainguard status ddp-demo
trainguard goodput ddp-demo
