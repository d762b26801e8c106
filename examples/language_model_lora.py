"""A causal language model fine-tuned privately with LoRA: Opacus, peft, AdamW and the HF Trainer or Lightning.

A small GPT-2 built from a ``transformers`` config in code (no download) gets LoRA adapters
from ``peft`` on its attention projections (everything else frozen); Opacus 1.6's
``make_private(..., wrap_model=False)`` hooks the model and returns the ``DPOptimizer``
(AdamW by default, with the Hugging Face linear warm-up and decay of the learning rate;
``--optimizer sgd`` for SGD). The loop is the Hugging Face ``Trainer`` (``--loop hf``, with
``HFPrivacyCallback``) or PyTorch Lightning (``--loop lightning``, with
``PrivacyMonitorCallback``; ``make_private`` and the schedule live in
``configure_optimizers``). Either way the monitor logs one record per step with the adaptive
heuristic (the accountant follows AdamW's settings step by step; a fallback to the
constant-rate formula stops the script) and the standard epsilon of the batches the loop
really draws (shuffled, labelled so), and the wiring check
(:func:`~opacus_lastiterate.auditing.check_private_training`) verifies on the first step
that every LoRA weight is clipped and noised and that the frozen model stays frozen
(``docs/language_models.md``).

``--ghost`` uses Opacus's ghost clipping (``grad_sample_mode="ghost"``): the per-sequence
loss goes through the criterion ``make_private`` returns (the Trainer's
``compute_loss_func``; manual optimization under Lightning). ``--compare`` trains the same
configuration twice, without and with the monitor, and prints the seconds per step of each,
from set-up to ``finish()``. ``--size gpu`` is a larger model for a GPU run of a few minutes.

The data are synthetic sentences of a toy language (arithmetic progressions of tokens with a
few step sizes), so the loss has something to learn. Needs ``transformers`` and ``peft``
(``lightning`` for ``--loop lightning``).

    python examples/language_model_lora.py --steps 100
    python examples/language_model_lora.py --quick    # 10 steps, under a minute on a CPU (CI)
    python examples/language_model_lora.py --size gpu --compare --out out/lm   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

VOCAB, LENGTH = 64, 16

SIZES: dict[str, dict[str, int]] = {
    # model and data of each --size; --steps/--n/--batch-size override the last three
    "cpu": {"n_layer": 2, "n_head": 2, "n_embd": 64, "length": 16,
            "steps": 100, "n": 2048, "batch_size": 64},
    "gpu": {"n_layer": 4, "n_head": 8, "n_embd": 512, "length": 128,
            "steps": 300, "n": 8192, "batch_size": 64},
}
DEFAULT_LR = {"adamw": 1e-2, "sgd": 2.0}


class ToyLanguage(Dataset):
    """Sentences ``a, a+k, a+2k, ... (mod VOCAB)`` with k in {1, 2, 3, 5}, ``length`` tokens
    each: dicts of forward() arguments, the labels the inputs (the model shifts them)."""

    def __init__(self, n: int, seed: int, length: int = LENGTH) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        step = torch.tensor([1, 2, 3, 5])[torch.randint(0, 4, (n, 1), generator=g)]
        self.tokens = (start + step * torch.arange(length)) % VOCAB

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def build_model(rank: int, *, n_layer: int = 2, n_head: int = 2, n_embd: int = 64,
                n_positions: int = LENGTH, device: str | torch.device | None = None,
                ) -> torch.nn.Module:
    """The LoRA-adapted GPT-2 (only the adapters are trainable; by default the 2-layer one
    of ``--size cpu``). The model is moved to ``device`` before the adapters are added."""
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=VOCAB,
                        n_positions=n_positions, bos_token_id=0, eos_token_id=0)
    base: Any = GPT2LMHeadModel(config)
    if device is not None:
        base = base.to(device)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                      target_modules=["c_attn"], fan_in_fan_out=True, task_type="CAUSAL_LM")
    return get_peft_model(base, lora)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def mean_loss(model: torch.nn.Module, data: ToyLanguage) -> float:
    tokens = data.tokens.to(model_device(model))
    was_training = model.training
    model.eval()
    with torch.no_grad():
        loss = float(model(input_ids=tokens, labels=tokens).loss)
    model.train(was_training)
    return loss


def ghost_loss(criterion: Any, logits: torch.Tensor, labels: torch.Tensor) -> Any:
    """Next-token cross entropy through Opacus's ghost-clipping criterion: one loss per
    sequence (the mean over its tokens), the privacy unit."""
    shifted = logits[:, :-1, :]
    return criterion(shifted.reshape(-1, shifted.shape[-1]), labels[:, 1:].reshape(-1),
                     shape=shifted.shape)


@dataclass
class Run:
    """What one training run measured."""

    steps: int
    seconds: float  # set-up (model, make_private, monitor) to finish(), device synchronised
    loss_before: float
    loss_after: float
    engine: Any
    monitor: Any = None
    final: Any = None
    rows: list[dict[str, Any]] = field(default_factory=list)


def make_private(args: argparse.Namespace, model: torch.nn.Module, train_set: Dataset) -> tuple:
    """PrivacyEngine, DPOptimizer over AdamW or SGD, and (ghost clipping) the criterion."""
    from opacus import PrivacyEngine

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer: torch.optim.Optimizer
    if args.optimizer == "adamw":  # the Trainer's defaults: betas (0.9, 0.999), eps 1e-8
        optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    else:
        optimizer = torch.optim.SGD(params, lr=args.lr)
    engine = PrivacyEngine(accountant="last_iterate")
    extra = {"grad_sample_mode": "ghost", "criterion": torch.nn.CrossEntropyLoss()} if args.ghost else {}
    out = engine.make_private(
        module=model, optimizer=optimizer,
        data_loader=DataLoader(train_set, batch_size=args.batch_size),  # the loop's batch size
        noise_multiplier=args.sigma, max_grad_norm=args.clip, wrap_model=False, **extra,
    )
    return engine, out[1], (out[2] if args.ghost else None)


def make_monitor(args: argparse.Namespace, engine: Any, log: Path) -> Any:
    from opacus_lastiterate.callbacks import JsonlSink, PrivacyMonitor

    log.unlink(missing_ok=True)
    return PrivacyMonitor(engine, delta=args.delta, sinks=[JsonlSink(log)],
                          heuristic_every=1, weighted_every=1, standard_every=1,
                          check_wiring=not args.no_check)  # armed at attach (the loop's model)


def synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def set_up(args: argparse.Namespace, monitored: bool, out: Path) -> tuple[Any, ...]:
    """Seeded data, the start of the timed span, the LoRA model made private, and the
    monitor (None when ``monitored`` is False): what both training loops start from."""
    torch.manual_seed(args.seed)
    train_set = ToyLanguage(args.n, seed=1, length=args.length)
    held_out = ToyLanguage(256, seed=2, length=args.length)
    t0 = time.perf_counter()
    model = build_model(args.rank, **args.arch, device=args.device)
    engine, dp_optimizer, criterion = make_private(args, model, train_set)
    monitor = make_monitor(args, engine, out / "privacy.jsonl") if monitored else None
    return train_set, held_out, t0, model, engine, dp_optimizer, criterion, monitor


def train_hf(args: argparse.Namespace, monitored: bool, out: Path) -> Run:
    """The Hugging Face Trainer: it builds the linear warm-up/decay schedule on the DP
    optimizer it is given (``optimizers=(dp_optimizer, None)``)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from opacus_lastiterate.callbacks import HFPrivacyCallback

    train_set, held_out, t0, model, engine, dp_optimizer, criterion, monitor = set_up(
        args, monitored, out
    )

    class ClearPerSampleGradients(TrainerCallback):
        """What HFPrivacyCallback does after each step: the Trainer's model.zero_grad()
        keeps Opacus's p.grad_sample, which would otherwise pile up across steps."""

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            dp_optimizer.zero_grad(set_to_none=True)
            return control

    def compute_loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> Any:
        return ghost_loss(criterion, outputs.logits, labels)

    training_args = TrainingArguments(
        output_dir=str(out / "trainer"), max_steps=args.steps, seed=args.seed,
        per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
        lr_scheduler_type=args.schedule, warmup_steps=args.warmup_steps,
        max_grad_norm=0.0, report_to=[], save_strategy="no", disable_tqdm=True,
        logging_strategy="no", use_cpu=args.device.type != "cuda", dataloader_num_workers=0,
    )
    callbacks: list[Any] = [HFPrivacyCallback(monitor)] if monitor else [ClearPerSampleGradients()]
    trainer = Trainer(model=model, args=training_args, train_dataset=train_set,
                      optimizers=(dp_optimizer, None), callbacks=callbacks,
                      compute_loss_func=compute_loss if args.ghost else None)
    t_setup = time.perf_counter() - t0
    before = mean_loss(model, held_out)
    t1 = time.perf_counter()
    trainer.train()
    final = monitor.finish() if monitor else None
    synchronise(args.device)
    seconds = t_setup + time.perf_counter() - t1
    return Run(args.steps, seconds, before, mean_loss(model, held_out), engine, monitor, final)


def train_lightning(args: argparse.Namespace, monitored: bool, out: Path) -> Run:
    """PyTorch Lightning: ``configure_optimizers`` returns the DP optimizer (``make_private``
    ran on the model, already on its device) with the linear warm-up/decay schedule,
    stepped every optimizer step."""
    import lightning.pytorch as pl
    from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

    from opacus_lastiterate.callbacks import PrivacyMonitorCallback

    class LoraLM(pl.LightningModule):
        def __init__(self, model: torch.nn.Module, dp_optimizer: Any, criterion: Any) -> None:
            super().__init__()
            self.model, self.dp_optimizer, self.criterion = model, dp_optimizer, criterion
            self.automatic_optimization = criterion is None  # ghost: its loss runs backward

        def configure_optimizers(self) -> Any:
            if args.schedule == "linear":
                schedule = get_linear_schedule_with_warmup(
                    self.dp_optimizer, args.warmup_steps, args.steps)
            else:
                schedule = get_constant_schedule_with_warmup(self.dp_optimizer, args.warmup_steps)
            return {"optimizer": self.dp_optimizer,
                    "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> Any:
            if self.automatic_optimization:
                return self.model(**batch).loss
            optimizer: Any = self.optimizers()
            schedule: Any = self.lr_schedulers()
            optimizer.zero_grad(set_to_none=True)
            logits = self.model(input_ids=batch["input_ids"]).logits
            loss = ghost_loss(self.criterion, logits, batch["labels"])
            loss.backward()  # Opacus's two backward passes
            optimizer.step()
            schedule.step()
            return loss.detach()

        def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
            optimizer.zero_grad(set_to_none=True)  # the DPOptimizer's: clears p.grad_sample

    warnings.filterwarnings("ignore", module="lightning")
    train_set, held_out, t0, model, engine, dp_optimizer, criterion, monitor = set_up(
        args, monitored, out
    )
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed))
    trainer = pl.Trainer(
        max_steps=args.steps, accelerator="gpu" if args.device.type == "cuda" else "cpu",
        devices=1, callbacks=[PrivacyMonitorCallback(monitor)] if monitor else [],
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )
    t_setup = time.perf_counter() - t0
    before = mean_loss(model, held_out)
    t1 = time.perf_counter()
    trainer.fit(LoraLM(model, dp_optimizer, criterion), train_dataloaders=loader)
    final = monitor.last_record if monitor else None  # the callback called finish()
    synchronise(args.device)
    seconds = t_setup + time.perf_counter() - t1
    return Run(args.steps, seconds, before, mean_loss(model, held_out), engine, monitor, final)


def train(args: argparse.Namespace, monitored: bool, out: Path) -> Run:
    """One run; a fallback of the accountant to the constant-rate formula is an error."""
    from opacus_lastiterate.exceptions import OptimizerTraceWarning

    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizerTraceWarning)
        run = (train_lightning if args.loop == "lightning" else train_hf)(args, monitored, out)
    if monitored:
        run.rows = [json.loads(line) for line in (out / "privacy.jsonl").read_text().splitlines()]
    return run


def check_log(args: argparse.Namespace, run: Run) -> None:
    """One record per step, each with the heuristic; AdamW's is the adaptive one."""
    from opacus_lastiterate.analysis.last_iterate.adaptive_weights import ADAPTIVE_HEURISTIC_LABEL

    rows = run.rows  # the final record repeats the last step unless that step was flushed last
    steps = [r["step"] for i, r in enumerate(rows)
             if not (r["final"] and i and rows[i - 1]["step"] == r["step"])]
    if steps != list(range(1, run.steps + 1)):
        raise SystemExit(f"error: the log has steps {steps[:5]}..., not one record per step")
    if any(r["heuristic_epsilon"] is None for r in run.rows):
        raise SystemExit("error: a record without the heuristic epsilon")
    label = run.engine.accountant.heuristic_label
    if args.optimizer == "adamw" and label != ADAPTIVE_HEURISTIC_LABEL:
        raise SystemExit(f"error: the accountant's heuristic is {label!r}, not the adaptive one")


def report(args: argparse.Namespace, run: Run, out: Path) -> dict[str, Any]:
    monitor, final = run.monitor, run.final
    if monitor.wiring is not None:
        rep = monitor.wiring.report
        assert rep is not None  # a failed check raises from the first step
        clipped = [p.clipped_norm_max for p in rep.parameters if p.clipped_norm_max is not None]
        largest = f"largest clipped contribution {max(clipped):.4f}" if clipped else "ghost clipping"
        print(f"wiring check passed on {len(rep.parameters)} LoRA tensors: noise std "
              f"{rep.pooled_noise_std:.4f} (stated {rep.stated_std:.4f}), {largest} "
              f"(C = {args.clip}), {len(rep.frozen)} frozen tensors unchanged")
    first = run.rows[0]
    print(f"held-out loss {run.loss_before:.3f} -> {run.loss_after:.3f} in {run.steps} steps "
          f"({run.seconds:.1f} s, {run.seconds / run.steps:.3f} s/step)")
    print(f"lr: step 1 {first['lr']:.3g}, largest {max(r['lr'] for r in run.rows):.3g}, "
          f"last {run.rows[-1]['lr']:.3g} ({args.schedule}, {args.warmup_steps} warm-up steps)")
    print(f"sampling: {final.sampling}; heuristic epsilon {final.heuristic_epsilon:.3f}, "
          f"standard epsilon {final.standard_epsilon:.3f} at delta {args.delta:g}")
    print(f"heuristic label: accountant {run.engine.accountant.heuristic_label!r}; "
          f"record {final.labels()['heuristic_epsilon']!r}")
    print(f"per-step log: {out / 'privacy.jsonl'} ({len(run.rows)} records)")
    return {"steps": run.steps, "seconds": run.seconds, "loss_before": run.loss_before,
            "loss_after": run.loss_after, "sampling": final.sampling,
            "heuristic_epsilon": final.heuristic_epsilon,
            "standard_epsilon": final.standard_epsilon,
            "heuristic_label": run.engine.accountant.heuristic_label, "records": len(run.rows)}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu",
                        help="model and data size (gpu: 4 layers, n_embd 512, 128 tokens)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (size's default)")
    parser.add_argument("--n", type=int, default=None, help="training sentences (size's default)")
    parser.add_argument("--batch-size", type=int, default=None, help="(size's default)")
    parser.add_argument("--loop", choices=["hf", "lightning"], default="hf")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"peak learning rate (default {DEFAULT_LR})")
    parser.add_argument("--schedule", choices=["linear", "constant"], default="linear",
                        help="learning rate after the warm-up: linear decay to 0, or constant")
    parser.add_argument("--warmup-ratio", type=float, default=0.1,
                        help="share of the steps with a linear warm-up from 0")
    parser.add_argument("--weight-decay", type=float, default=0.0, help="AdamW's")
    parser.add_argument("--ghost", action="store_true", help="Opacus ghost clipping")
    parser.add_argument("--sigma", type=float, default=1.0, help="noise multiplier")
    parser.add_argument("--clip", type=float, default=1.0, help="max_grad_norm C")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto (cuda when there), cpu, cuda")
    parser.add_argument("--compare", action="store_true",
                        help="train twice, without and with the monitor, and compare s/step")
    parser.add_argument("--no-check", action="store_true", help="skip the wiring check")
    parser.add_argument("--out", type=Path, default=Path("examples/output/language_model_lora"))
    parser.add_argument("--quick", action="store_true", help="10 steps of 32 sentences (CI)")
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    if args.quick:
        size = {**size, "steps": 10, "n": 512, "batch_size": 32}
    for key in ("steps", "n", "batch_size"):
        if getattr(args, key) is None:
            setattr(args, key, size[key])
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be at least 1")
    if not 0 <= args.warmup_ratio < 1:
        parser.error("--warmup-ratio must be in [0, 1)")
    args.length = size["length"]
    args.arch = {"n_layer": size["n_layer"], "n_head": size["n_head"], "n_embd": size["n_embd"],
                 "n_positions": size["length"]}
    args.lr = DEFAULT_LR[args.optimizer] if args.lr is None else args.lr
    args.warmup_steps = math.ceil(args.warmup_ratio * args.steps)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.device = torch.device(args.device)
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but CUDA is not available")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        import peft  # noqa: F401
        import transformers  # noqa: F401

        if args.loop == "lightning":
            import lightning  # noqa: F401
    except ImportError as err:
        print(f"skipped: {err.name} is not installed (pip install 'opacus-lastiterate[lm]')")
        return 0 if args.quick else 2
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message=".*Full backward hook is firing.*")
    args.out.mkdir(parents=True, exist_ok=True)
    model = build_model(args.rank, **args.arch)
    if args.device.type == "cuda":  # the CUDA context and kernels, outside the timed runs
        model = model.to(args.device)  # (float32 matmuls stay full, no TF32: the wiring
        tokens = ToyLanguage(args.batch_size, seed=3, length=args.length).tokens  # check
        tokens = tokens.to(args.device)  # compares sums of per-example gradients to 1e-4)
        model(input_ids=tokens, labels=tokens).loss.backward()
        synchronise(args.device)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    del model
    print(f"{args.loop} loop, {args.optimizer} (peak lr {args.lr:g}, {args.schedule} schedule), "
          f"{'ghost clipping, ' if args.ghost else ''}size {args.size} on {args.device}: "
          f"{trainable} of {total} parameters trainable (LoRA r={args.rank} on c_attn), "
          f"{args.steps} steps of {args.batch_size} from {args.n} sentences of {args.length} tokens")

    baseline = train(args, False, args.out / "no_monitor") if args.compare else None
    run = train(args, True, args.out)
    check_log(args, run)
    summary = report(args, run, args.out)
    if baseline is not None:
        plain, monitored = baseline.seconds / baseline.steps, run.seconds / run.steps
        print(f"overhead ({args.device.type}, set-up to finish()): without the monitor "
              f"{plain:.4f} s/step, with it {monitored:.4f} s/step, ratio {monitored / plain:.3f}")
        print(f"  held-out loss without the monitor {baseline.loss_after:.3f}, "
              f"with it {run.loss_after:.3f}")
        summary["compare"] = {"seconds_per_step_without": plain, "seconds_per_step_with": monitored,
                              "ratio": monitored / plain, "loss_after_without": baseline.loss_after}
    summary.update(loop=args.loop, optimizer=args.optimizer, ghost=args.ghost, size=args.size,
                   device=str(args.device), batch_size=args.batch_size, n=args.n, lr=args.lr)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
