"""A causal language model fine-tuned privately with LoRA: Opacus, peft and the HF Trainer.

A 2-layer GPT-2 built from a ``transformers`` config in code (no download) gets LoRA adapters
from ``peft`` on its attention projections (everything else frozen); Opacus 1.6's
``make_private(..., wrap_model=False)`` hooks the model and returns the ``DPOptimizer``
(SGD) that the Hugging Face ``Trainer`` drives; ``HFPrivacyCallback`` logs one record per
step with the heuristic and the standard epsilon of the batches the Trainer really draws
(shuffled, labelled so), and the wiring check
(:func:`~opacus_lastiterate.auditing.check_private_training`) verifies on the first step
that every LoRA weight is clipped and noised and that the frozen model stays frozen
(``docs/language_models.md``).

The data are synthetic sentences of a toy language (arithmetic progressions of tokens with a
few step sizes), so the loss has something to learn. Needs ``transformers`` and ``peft``.

    python examples/language_model_lora.py --steps 300
    python examples/language_model_lora.py --quick    # 10 steps, under a minute on a CPU (CI)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, Dataset

VOCAB, LENGTH = 64, 16


class ToyLanguage(Dataset):
    """Sentences ``a, a+k, a+2k, ... (mod VOCAB)`` with k in {1, 2, 3, 5}: dicts of forward()
    arguments, the labels the inputs (the model shifts them)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        step = torch.tensor([1, 2, 3, 5])[torch.randint(0, 4, (n, 1), generator=g)]
        self.tokens = (start + step * torch.arange(LENGTH)) % VOCAB

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def build_model(rank: int) -> torch.nn.Module:
    """The LoRA-adapted 2-layer GPT-2 (only the adapters are trainable)."""
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=VOCAB, n_positions=LENGTH,
                        bos_token_id=0, eos_token_id=0)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                      target_modules=["c_attn"], fan_in_fan_out=True, task_type="CAUSAL_LM")
    return get_peft_model(GPT2LMHeadModel(config), lora)


def mean_loss(model: torch.nn.Module, data: ToyLanguage) -> float:
    with torch.no_grad():
        return float(model(input_ids=data.tokens, labels=data.tokens).loss)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps")
    parser.add_argument("--n", type=int, default=2048, help="training sentences")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--sigma", type=float, default=1.0, help="noise multiplier")
    parser.add_argument("--clip", type=float, default=1.0, help="max_grad_norm C")
    parser.add_argument("--lr", type=float, default=2.0, help="SGD learning rate")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--no-check", action="store_true", help="skip the wiring check")
    parser.add_argument("--out", type=Path, default=Path("examples/output/language_model_lora"))
    parser.add_argument("--quick", action="store_true", help="10 steps of 32 sentences (CI)")
    args = parser.parse_args()
    try:
        import peft  # noqa: F401
        from transformers import Trainer, TrainingArguments
    except ImportError as err:
        print(f"skipped: {err.name} is not installed (pip install 'opacus-lastiterate[lm]')")
        return 0 if args.quick else 2

    from opacus_lastiterate.callbacks import HFPrivacyCallback, JsonlSink, PrivacyMonitor

    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message=".*Full backward hook is firing.*")
    torch.manual_seed(0)
    steps = 10 if args.quick else args.steps
    if args.quick:
        args.n, args.batch_size = 512, 32
    train_set, held_out = ToyLanguage(args.n, seed=1), ToyLanguage(256, seed=2)
    model = build_model(args.rank)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    print(f"trainable parameters: {trainable} of {total} (LoRA r={args.rank} on c_attn)")

    engine = PrivacyEngine(accountant="last_iterate")
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    _, dp_optimizer, _ = engine.make_private(
        module=model, optimizer=optimizer,
        data_loader=DataLoader(train_set, batch_size=args.batch_size),  # the Trainer's size
        noise_multiplier=args.sigma, max_grad_norm=args.clip, wrap_model=False,
    )

    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "privacy.jsonl"
    log.unlink(missing_ok=True)
    monitor = PrivacyMonitor(engine, delta=args.delta, sinks=[JsonlSink(log)],
                             heuristic_every=1, weighted_every=1, standard_every=1,
                             check_wiring=not args.no_check)  # armed at attach (the Trainer's model)
    training_args = TrainingArguments(
        output_dir=str(args.out / "trainer"), max_steps=steps,
        per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
        lr_scheduler_type="constant", max_grad_norm=0.0, report_to=[], save_strategy="no",
        disable_tqdm=True, logging_strategy="no", use_cpu=not torch.cuda.is_available(),
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train_set,
                      optimizers=(dp_optimizer, None), callbacks=[HFPrivacyCallback(monitor)])
    before = mean_loss(model, held_out)
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    final = monitor.finish()
    after = mean_loss(model, held_out)

    if monitor.wiring is not None:
        report = monitor.wiring.report
        assert report is not None  # a failed check raises from the first step
        print(f"wiring check passed on {len(report.parameters)} LoRA tensors: noise std "
              f"{report.pooled_noise_std:.4f} (stated {report.stated_std:.4f}), largest clipped "
              f"contribution {max(p.clipped_norm_max or 0 for p in report.parameters):.4f} "
              f"(C = {args.clip}), {len(report.frozen)} frozen tensors unchanged")
    print(f"held-out loss {before:.3f} -> {after:.3f} in {steps} steps ({seconds:.1f} s)")
    print(f"sampling: {final.sampling}; heuristic epsilon {final.heuristic_epsilon:.3f}, "
          f"standard epsilon {final.standard_epsilon:.3f} at delta {args.delta:g}")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    print(f"per-step log: {log} ({len(rows)} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
