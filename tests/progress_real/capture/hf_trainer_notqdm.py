"""Capture: Hugging Face transformers Trainer, disable_tqdm=True (no bar; PrinterCallback prints the dicts).

Tiny GPT2LMHeadModel built from a config (no hub download), random token data.
Run (from this directory):
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH=/tmp/capsite \
    /work/main/.venv/bin/python hf_trainer_notqdm.py 2>&1 | cat > ../hf_trainer_notqdm.log   (what ./run_all.sh hf_trainer_notqdm does, with PYTHONUNBUFFERED=1)
"""
import json
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

CASE = "hf_trainer_notqdm"
HERE = os.path.dirname(os.path.abspath(__file__))


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seq_len=16, vocab=100, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}


class SlowStep(TrainerCallback):
    """Sleep after each optimizer step so a step takes ~0.15 s, like a real (slower) model.

    Without it the tiny model runs ~150 it/s and tqdm (mininterval 0.1 s) skips most counts.
    It prints nothing and does not change any output format.
    """

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.15)


def main():
    set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64))
    args = TrainingArguments(
        output_dir="/tmp/cap_" + CASE,
        max_steps=40,
        logging_steps=5,
        per_device_train_batch_size=4,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    # 64 samples / batch 4 = 16 steps per epoch, so the epoch value changes mid-run.
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(64), callbacks=[SlowStep()])
    trainer.train()

    st = trainer.state
    losses = [e for e in st.log_history if "loss" in e]
    last = losses[-1]
    truth = {
        "steps_total": st.global_step,
        "last_step_printed": st.global_step,
        "last_loss_printed": float(f"{last['loss']:.4g}"),
        "last_loss_printed_str": f"{last['loss']:.4g}",
        "last_loss_step": last["step"],
        "loss_log_steps": [e["step"] for e in losses],
        "max_steps": st.max_steps,
        "step_number_in_output": False,
        "num_train_epochs": st.num_train_epochs,
        "train_loss_summary": float(f"{st.log_history[-1]['train_loss']:.4g}"),
        "notes": (
            "disable_tqdm=True: no progress bar at all; HF Trainer global_step from trainer.state; loss dicts are printed by PrinterCallback via print() "
            "with floats formatted as strings '{:.4g}' (e.g. {'loss': '4.6', ...}); the step number is "
            "NOT printed anywhere (only epoch is); last_step_printed is the trainer's own global_step. The final summary dict has 'train_loss' "
            "(average over the run), which is a different key from 'loss'."
        ),
    }
    with open(os.path.join(HERE, "..", CASE + ".truth.json"), "w") as f:
        json.dump(truth, f, indent=2)


if __name__ == "__main__":
    main()
