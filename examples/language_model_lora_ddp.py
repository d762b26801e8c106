"""The LoRA language-model recipe under distributed data parallel: one log and one audit per run.

The model and data of ``language_model_lora.py`` (a 2-layer GPT-2 from a config, LoRA
adapters from ``peft`` on the attention projections, a toy language of arithmetic
progressions) trained with Opacus's distributed DP-SGD, the way Opacus 1.6 documents it for
DDP: the model wrapped in ``DifferentiallyPrivateDistributedDataParallel`` (which broadcasts
rank 0's parameters), ``make_private`` with Poisson sampling, which gives each rank a
``DPDataLoader`` over its own shard of the data (``DistributedUniformWithReplacementSampler``:
every example of the shard is in a step with probability q, so the global batch is Poisson
with expected size q N) and a ``DistributedDPOptimizer`` (rank 0 adds the noise, the clipped
sums are all-reduced). The loop is plain PyTorch: the Hugging Face Trainer under torchrun
wraps the model in its own ``DistributedDataParallel`` and puts its own shuffled
``DistributedSampler`` in the loader, neither of which is what Opacus's distributed optimizer
and accountant expect.

On every rank: the optimizer (AdamW by default, ``--optimizer sgd`` for plain SGD), a
``PrivacyMonitor`` (every rank accounts the same steps; only rank 0 has a ``JsonlSink``, so
the run writes one log, one row per step) and the in-training canary audit
(``InTrainingCanaryAudit`` with the same seed on every rank: gradient canaries on the LoRA B
matrices, added to rank 0's clipped sum only, so each enters the global sum once). After
training, rank 0 prints and writes the one audit report; every rank checks that its
parameters equal rank 0's.

Each rank draws its Poisson batches from its own generator (seeded with the rank): with
``torch.manual_seed`` the same on every rank, as is usual for identical initial models, the
samplers would otherwise draw the same positions in every shard at the first step, so that
two examples' inclusions are coupled, which Poisson subsampling's analysis does not allow.

    torchrun --nproc_per_node=2 examples/language_model_lora_ddp.py --steps 300
    torchrun --nproc_per_node=2 examples/language_model_lora_ddp.py --quick   # CPU, gloo

Needs ``transformers`` and ``peft``. The backend is nccl when CUDA is available (one GPU per
process, ``LOCAL_RANK``), gloo otherwise. Run without torchrun it trains in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from language_model_lora import ToyLanguage, build_model


def _adaptive_noise_std(accountant: Any) -> list[float] | None:
    """The noise std the adaptive heuristic took (sigma C / B), one value per change."""
    from opacus_lastiterate.accountants.adaptive_trace import adaptive_trace_as_lists

    stored = accountant.state_dict().get("adaptive_trace")
    return None if stored is None else adaptive_trace_as_lists(stored)["noise_std"]["values"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps")
    parser.add_argument("--n", type=int, default=2048, help="training sentences")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="expected global batch size (all ranks together)")
    parser.add_argument("--sigma", type=float, default=1.0, help="noise multiplier")
    parser.add_argument("--clip", type=float, default=1.0, help="max_grad_norm C")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--lr", type=float, default=None,
                        help="learning rate (default 5e-3 for AdamW, 2.0 for SGD)")
    parser.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's decay")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--canaries", type=int, default=1000,
                        help="gradient canaries on the LoRA B entries (0: no audit)")
    parser.add_argument("--confidence", type=float, default=0.95, help="of the audit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--standard-every", default="1",
                        help="steps between standard (PLD) epsilons in the log, or 'auto' "
                             "(the monitor's 1%% overhead budget); every rank computes them")
    parser.add_argument("--no-check", action="store_true", help="skip the wiring check")
    parser.add_argument("--out", type=Path, default=Path("examples/output/language_model_lora_ddp"))
    parser.add_argument("--dump-params", action="store_true",
                        help="every rank saves its trainable parameters to OUT/params_rank<r>.pt")
    parser.add_argument("--quick", action="store_true",
                        help="10 steps of 512 sentences, batches of 32, 200 canaries (CI)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.n, args.batch_size = 10, 512, 32
        args.canaries = min(args.canaries, 200)
    if args.standard_every != "auto":
        args.standard_every = int(args.standard_every)
    if args.lr is None:
        args.lr = 5e-3 if args.optimizer == "adamw" else 2.0
    return args


def init_distributed() -> tuple[int, int, torch.device]:
    """Join the process group torchrun describes (a group of one without torchrun)."""
    if "RANK" not in os.environ:  # plain `python`: a group of one, on a free port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), device


def lora_b_coordinates(model: torch.nn.Module, params: list[torch.Tensor]) -> list[int]:
    """Flat indices (in the order of ``params``, the optimizer's) of the LoRA B entries: zero
    at the start, so weight decay leaves them alone and a canary's push is the score."""
    names = {id(p): n for n, p in model.named_parameters()}
    out, offset = [], 0
    for p in params:
        if "lora_B" in names[id(p)]:
            out.extend(range(offset, offset + p.numel()))
        offset += p.numel()
    return out


def flat_trainable(params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def mean_loss(model: torch.nn.Module, data: ToyLanguage, device: torch.device) -> float:
    with torch.no_grad():
        tokens = data.tokens.to(device)
        return float(model(input_ids=tokens, labels=tokens).loss)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """One rank's part of the run; returns its summary (rank 0 also writes the files)."""
    from opacus import PrivacyEngine
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP

    from opacus_lastiterate.callbacks import InTrainingCanaryAudit, JsonlSink, PrivacyMonitor

    rank, world, device = init_distributed()
    if rank != 0:  # every rank accounts the same run: its warnings are printed by rank 0
        from opacus_lastiterate.exceptions import AdaptiveHeuristicWarning

        warnings.filterwarnings("ignore", category=AdaptiveHeuristicWarning)
    torch.manual_seed(args.seed)  # the same initial model everywhere (DPDDP broadcasts it too)
    train_set, held_out = ToyLanguage(args.n, seed=1), ToyLanguage(256, seed=2)
    model = build_model(args.rank).to(device)  # on its device before make_private
    model = DPDDP(model)
    params = [p for p in model.parameters() if p.requires_grad]
    if args.optimizer == "adamw":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(
            params, lr=args.lr, weight_decay=args.weight_decay)
    else:
        optimizer = torch.optim.SGD(params, lr=args.lr)
    # The loader's batch size is the global one: make_private reads q = 1 / len(loader) and
    # gives each rank a Poisson loader over its shard at that rate, from its own generator.
    sampling = torch.Generator().manual_seed(1_000_003 * (args.seed + 1) + rank)
    engine = PrivacyEngine(accountant="last_iterate")
    _, dp_optimizer, dp_loader = engine.make_private(
        module=model, optimizer=optimizer,
        data_loader=DataLoader(train_set, batch_size=args.batch_size, generator=sampling),
        noise_multiplier=args.sigma, max_grad_norm=args.clip, poisson_sampling=True,
        wrap_model=False,
    )
    q = dp_loader.sample_rate
    canaries = InTrainingCanaryAudit(
        dp_optimizer, num_canaries=args.canaries, sample_rate=q, seed=args.seed + 17,
        accountant=engine.accountant, candidates=lora_b_coordinates(model, params),
    )  # before the monitor: the wiring check then observes Opacus's step with the canaries
    log = args.out / "privacy.jsonl"
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        log.unlink(missing_ok=True)
    monitor = PrivacyMonitor(
        engine, delta=args.delta, sinks=[JsonlSink(log)] if rank == 0 else [],
        heuristic_every=1, weighted_every=1, standard_every=args.standard_every,
        check_wiring=not args.no_check,
    ).attach(dp_optimizer, model)

    before = mean_loss(model, held_out, device)
    drawn = taken = 0  # examples this rank drew, steps
    t0 = time.perf_counter()
    while taken < args.steps:
        for batch in dp_loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            dp_optimizer.zero_grad(set_to_none=True)
            model(**batch).loss.backward()
            dp_optimizer.step()
            drawn += len(batch["input_ids"])
            taken += 1
            if taken == args.steps:
                break
    seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    final = monitor.finish()
    finish_seconds = time.perf_counter() - t1
    after = mean_loss(model, held_out, device)

    # every rank: the same parameters as rank 0, the same accountant history
    mine = flat_trainable(params).double()
    reference = mine.clone()
    dist.broadcast(reference, 0)
    same = torch.tensor([float(torch.equal(mine, reference))], device=device)
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    history = [(float(s), float(r), int(n)) for s, r, n in engine.accountant.history]
    realised = torch.tensor([float(drawn)], dtype=torch.float64, device=device)
    dist.all_reduce(realised, op=dist.ReduceOp.SUM)  # the examples of all ranks' batches
    if args.dump_params:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(mine.cpu(), args.out / f"params_rank{rank}.pt")

    summary: dict[str, Any] = {
        "world_size": world,
        "backend": dist.get_backend(),
        "steps": taken,
        "seconds": seconds,  # the loop, with the monitor's flushes every 100 steps
        "finish_seconds": finish_seconds,  # the monitor's last flush and final record
        "dataset_size": args.n,
        "global_batch_size": args.batch_size,
        "sample_rate": q,
        "per_rank_expected_batch_size": float(dp_optimizer.expected_batch_size),
        "mean_realised_global_batch": float(realised.item()) / taken,
        "history": history,
        # what the adaptive heuristic took as the noise on the averaged gradient (sigma C / B)
        "adaptive_noise_std": _adaptive_noise_std(engine.accountant),
        "parameters_identical_across_ranks": bool(same.item() == 1.0),
        "held_out_loss": [before, after],
        "final": None if final is None else final.as_dict(),
    }
    if rank == 0:
        if args.canaries > 0:
            report = canaries.report(delta=args.delta, confidence=args.confidence)
            summary["audit"] = report.as_dict()
            print(report)
        summary["wiring"] = None if monitor.wiring is None or monitor.wiring.report is None else {
            "parameters": len(monitor.wiring.report.parameters),
            "pooled_noise_std": monitor.wiring.report.pooled_noise_std,
            "stated_std": monitor.wiring.report.stated_std,
        }
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, **summary}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import peft  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:
        print(f"skipped: {err.name} is not installed (pip install 'opacus-lastiterate[lm]')")
        return 0 if args.quick else 2
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message=".*Full backward hook is firing.*")
    warnings.filterwarnings("ignore", message=".*Optimal order is the (largest|smallest) alpha.*")
    summary = train(args)
    if summary["rank"] != 0:
        return 0 if summary["parameters_identical_across_ranks"] else 1
    world, q = summary["world_size"], summary["sample_rate"]
    expected_q = args.batch_size / args.n
    print(f"{world} process(es), {summary['backend']}; {summary['steps']} steps in "
          f"{summary['seconds']:.1f} s (then {summary['finish_seconds']:.1f} s to finish the "
          f"privacy records); held-out loss {summary['held_out_loss'][0]:.3f} -> "
          f"{summary['held_out_loss'][1]:.3f}")
    print(f"sample rate the accountant recorded: {sorted({h[1] for h in summary['history']})} "
          f"(global batch / N = {args.batch_size}/{args.n} = {expected_q:g}); per-rank expected "
          f"batch {summary['per_rank_expected_batch_size']:g}, mean realised global batch "
          f"{summary['mean_realised_global_batch']:.2f}")
    if summary["wiring"] is not None:
        w = summary["wiring"]
        print(f"wiring check passed on {w['parameters']} LoRA tensors (rank 0 noise std "
              f"{w['pooled_noise_std']:.4f}, stated {w['stated_std']:.4f})")
    final = summary["final"]
    if final is not None:
        print(f"final: heuristic epsilon {final['heuristic_epsilon']:.4f}, standard epsilon "
              f"{final['standard_epsilon']:.4f} at delta {args.delta:g}")
    rows = (args.out / "privacy.jsonl").read_text().splitlines()
    print(f"one log: {args.out / 'privacy.jsonl'} ({len(rows)} records); parameters identical "
          f"on all ranks: {summary['parameters_identical_across_ranks']}")
    ok = summary["parameters_identical_across_ranks"] and all(
        abs(h[1] - q) == 0 for h in summary["history"])
    if args.n % args.batch_size == 0:
        ok = ok and q == expected_q
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
