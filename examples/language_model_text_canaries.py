"""Text canaries in a private language model: a one-run audit of the final model.

The tiny 2-layer GPT-2 of ``examples/language_model_lora.py`` (built here the same way from
a config in code, so nothing is downloaded) is trained privately (Opacus 1.6, SGD; the whole
model by default, its LoRA adapters with ``--rank``; a plain loop over Opacus's Poisson
loader, or the Hugging Face ``Trainer`` with ``--trainer``) on synthetic sentences of a toy
language plus text canaries: random token sequences, each appended to the training set by a
recorded fair coin (:func:`~opacus_lastiterate.auditing.input_space.make_text_canaries`).
At the end every canary is scored by the fall of its negative log-likelihood from the
initial model to the final one, and
:class:`~opacus_lastiterate.callbacks.InTrainingCanaryAudit` prints the one-run lower bounds
(Steinke, Nasr, Jagielski, arXiv 2305.08846; Mahloujifar, Melis, Chaudhuri, arXiv
2410.22235) beside the heuristic and the standard epsilon of the same run
(``docs/text_canaries.md``).

Each ``--sigma`` given is one training run; the default runs a weak noise (0.3), where the
audit finds a clearly positive bound, and the usual sigma = 1. Needs ``transformers`` (and
``peft`` for ``--rank``).

    python examples/language_model_text_canaries.py              # two runs of 100 steps
    python examples/language_model_text_canaries.py --quick      # 10 steps (CI)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, Dataset

VOCAB, LENGTH = 64, 16


class ToyLanguage(Dataset):
    """Sentences ``a, a+k, a+2k, ... (mod VOCAB)`` with k in {1, 2, 3, 5}, as dicts of
    ``input_ids`` and ``labels`` (the model shifts them), as in ``language_model_lora.py``."""

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
    """A 2-layer GPT-2 with LoRA adapters on its attention projections (only they train),
    or, for ``rank = 0``, the whole GPT-2 trained (no peft)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=VOCAB, n_positions=LENGTH,
                        bos_token_id=0, eos_token_id=0)
    if rank == 0:
        model = GPT2LMHeadModel(config)
        # the position embeddings see position ids without a batch dimension, which
        # per-example clipping cannot split (docs/language_models.md): keep them frozen
        model.transformer.wpe.weight.requires_grad_(False)
        return model
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                      target_modules=["c_attn"], fan_in_fan_out=True, task_type="CAUSAL_LM")
    return get_peft_model(GPT2LMHeadModel(config), lora)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--sigma", type=float, nargs="+", default=[0.3, 1.0],
                        help="noise multipliers, one training run each")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps per run")
    parser.add_argument("--n", type=int, default=64, help="training sentences")
    parser.add_argument("--canaries", type=int, default=200, help="m text canaries")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--clip", type=float, default=1.0, help="max_grad_norm C")
    parser.add_argument("--lr", type=float, default=2.0, help="SGD learning rate")
    parser.add_argument("--rank", type=int, default=0,
                        help="LoRA rank (0: train the whole GPT-2, which memorises far more)")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0, help="seed of model, canaries and coins")
    parser.add_argument("--trainer", action="store_true",
                        help="train with the Hugging Face Trainer (shuffled batches) instead of "
                        "a plain loop over Opacus's Poisson loader")
    parser.add_argument("--quick", action="store_true", help="10 steps, 100 canaries (CI)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.canaries, args.sigma = 10, min(args.canaries, 100), args.sigma[:1]
    if args.rank < 0:
        parser.error(f"--rank must be >= 0, got {args.rank}.")
    for name in ("steps", "n", "canaries", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if any(s < 0 for s in args.sigma):
        parser.error(f"--sigma must be >= 0, got {args.sigma}.")
    return args


def _train_plain(args, model, dp_optimizer, loader) -> None:
    """A plain loop over Opacus's Poisson loader: ``args.steps`` optimizer steps."""
    taken = 0
    while taken < args.steps:
        for batch in loader:
            dp_optimizer.zero_grad()
            model(input_ids=batch["input_ids"], labels=batch["labels"]).loss.backward()
            dp_optimizer.step()
            taken += 1
            if taken == args.steps:
                return


def _train_hf(args, engine, model, dp_optimizer, data) -> None:
    """The Hugging Face Trainer (shuffled batches), as in ``language_model_lora.py``."""
    from transformers import Trainer, TrainingArguments

    from opacus_lastiterate.callbacks import HFPrivacyCallback, PrivacyMonitor

    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="text_canaries_"), max_steps=args.steps,
        per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
        lr_scheduler_type="constant", max_grad_norm=0.0, report_to=[], save_strategy="no",
        disable_tqdm=True, logging_strategy="no", use_cpu=not torch.cuda.is_available(),
        seed=args.seed,
    )
    # the callback clears Opacus's per-sample gradients after each step and tells the
    # accountant that the Trainer shuffles; no epsilon is computed during training
    monitor = PrivacyMonitor(engine, delta=args.delta, heuristic_every=None,
                             weighted_every=None, robust_every=None, standard_every=None,
                             check_wiring=False)
    callback = HFPrivacyCallback(monitor, finish_on_train_end=False)
    Trainer(model=model, args=training_args, train_dataset=data,
            optimizers=(dp_optimizer, None), callbacks=[callback]).train()


def train_and_audit(args: argparse.Namespace, sigma: float) -> None:
    """One private run with text canaries; print the audit report."""
    from opacus_lastiterate.analysis.sampling import ShuffledBatches
    from opacus_lastiterate.auditing.input_space import make_text_canaries
    from opacus_lastiterate.callbacks import InTrainingCanaryAudit

    torch.manual_seed(args.seed)
    train_set = ToyLanguage(args.n, seed=1)
    # random 16-token canaries, in the records' form ({"input_ids", "labels"}), each
    # appended by its fair coin: they are sampled like any sentence
    data, canaries = make_text_canaries(
        train_set, args.canaries, vocab_size=VOCAB, length=LENGTH, seed=args.seed
    )
    model = build_model(args.rank)
    # score each canary by the fall of its loss from the initial model (a fixed reference)
    canaries = canaries.with_reference(model)
    engine = PrivacyEngine(accountant="last_iterate")
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    _, dp_optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=DataLoader(data, batch_size=args.batch_size),
        noise_multiplier=sigma, max_grad_norm=args.clip, wrap_model=False,
    )
    # the Trainer draws shuffled batches; the plain loop Opacus's Poisson ones
    sampling = ShuffledBatches(len(data), args.batch_size) if args.trainer else None
    audit = InTrainingCanaryAudit(
        dp_optimizer, num_canaries=0, sample_rate=1 / len(loader), seed=args.seed,
        accountant=engine.accountant, input_canaries=canaries, sampling=sampling,
    )
    t0 = time.perf_counter()
    if args.trainer:
        _train_hf(args, engine, model, dp_optimizer, data)
    else:
        _train_plain(args, model, dp_optimizer, loader)
    seconds = time.perf_counter() - t0
    report = audit.report(delta=args.delta, model=model)
    losses = canaries.losses(model)
    inc = canaries.included
    print(f"\n== sigma = {sigma:g}: {args.steps} steps, "
          f"{'shuffled batches of ' if args.trainer else 'Poisson batches, expected size '}"
          f"{args.batch_size} ({args.steps * args.batch_size / len(data):.1f} epochs of "
          f"{len(data)} records: {args.n} sentences + {int(inc.sum())} canaries), "
          f"C = {args.clip:g}, lr = {args.lr:g}, {seconds:.0f} s")
    print(f"canary NLL (nats, sum over 15 tokens; guessing: {15 * np.log(VOCAB):.2f}): "
          f"included {losses[inc].mean():.2f}, held out {losses[~inc].mean():.2f}")
    print(report)


def main(argv: Sequence[str] | None = None) -> int:
    """Train once per sigma with text canaries and print each audit."""
    args = parse_args(argv)
    try:
        import transformers  # noqa: F401

        if args.rank:
            import peft  # noqa: F401
    except ImportError as err:
        print(f"skipped: {err.name} is not installed (pip install 'opacus-lastiterate[lm]')")
        return 0 if args.quick else 2
    from opacus_lastiterate.analysis.audit import plan_one_run_audit

    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message=".*Full backward hook is firing.*")
    warnings.filterwarnings("ignore", message=".*loss_type=None.*")
    best = plan_one_run_audit(args.canaries, delta=args.delta).epsilon
    print(f"{args.canaries} text canaries of {LENGTH} random tokens (vocabulary {VOCAB}); "
          f"the best one-run bound {args.canaries} canaries can give (every guess right) is "
          f"{best:.3f} at delta {args.delta:g}")
    for sigma in args.sigma:
        train_and_audit(args, sigma)
    return 0


if __name__ == "__main__":
    sys.exit(main())
