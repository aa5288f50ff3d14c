"""Negative capture (no training): transformers save_pretrained / from_pretrained of a sharded
checkpoint, done locally (no hub).

A tiny GPT2LMHeadModel is saved with max_shard_size="100KB" into /tmp/cap_shards (12 shards),
then loaded back; transformers draws tqdm bars 'Writing model shards: N/12' and
'Loading weights: N/52' (what a job prints while loading a checkpoint before training).
Run (from this directory):
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH=/tmp/capsite \
    /work/main/.venv/bin/python negative_hf_save_load.py 2>&1 | cat > ../negative_hf_save_load.log   (what ./run_all.sh negative_hf_save_load does, with PYTHONUNBUFFERED=1)
"""
import json
import os
import shutil

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

CASE = "negative_hf_save_load"
HERE = os.path.dirname(os.path.abspath(__file__))
DIR = "/tmp/cap_shards"


def main():
    shutil.rmtree(DIR, ignore_errors=True)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=64, n_head=2, vocab_size=100, n_positions=64))
    model.save_pretrained(DIR, max_shard_size="100KB")
    shards = sorted(f for f in os.listdir(DIR) if f.endswith(".safetensors"))
    print(f"saved {len(shards)} shards: {shards[0]} .. {shards[-1]}")
    loaded = GPT2LMHeadModel.from_pretrained(DIR)
    print(f"loaded {sum(p.numel() for p in loaded.parameters())} parameters")
    truth = {
        "steps_total": 0,
        "last_step_printed": None,
        "last_loss_printed": None,
        "shards_written": len(shards),
        "transformers_version": transformers.__version__,
        "notes": (
            "Not training progress: the 'Writing model shards: N/12' and 'Loading weights: N/52' "
            "tqdm bars count checkpoint shards / weight tensors, and 'model-0000K-of-00012' is a "
            "shard file name."
        ),
    }
    with open(os.path.join(HERE, "..", CASE + ".truth.json"), "w") as f:
        json.dump(truth, f, indent=2)


if __name__ == "__main__":
    main()
