"""DP-SGD in JAX with jax_privacy 2.0, accounted by opacus_lastiterate without torch.

A logistic regression on generated data, trained on the CPU with jax_privacy's parts: its
batch selection (Poisson, or balls-in-bins with ``--sampler balls-in-bins``), its clipped
per-example gradients (``clipped_grad``) and its Gaussian noise (``gaussian_privatizer``).
After every step the log holds the last-iterate heuristic of the model so far (final model
only; exact for linear losses, not a proven bound for deep networks) and the standard epsilon
by RDP (every intermediate model released, an upper bound); the last line adds the tighter
standard epsilon by PLD, once (dp_accounting's PLD accountant takes seconds per composed step,
too slow to ask after every step):

* Poisson batches: each step is composed as ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``
  into ``LastIterateHeuristicAccountant`` (the heuristic) and into dp_accounting's own
  ``RdpAccountant`` (the standard number), the interface jax_privacy's accounting uses; the
  PLD number is dp_accounting's ``PLDAccountant`` on the T steps;
* balls-in-bins batches: dp_accounting has no event for them, so the numbers come from the
  run description, ``privacy_model(name, DPSGDRun.constant(..., sampling=BallsInBins(k)))``
  (its standard numbers: without amplification by RDP, by random allocation with the extra
  ``allocation``). jax_privacy's ``BallsInBinsSampling`` keeps one bin per record for as many
  iterations as it is asked for; the loop draws a new assignment every epoch (a new iterator
  of ``k`` iterations, a new seed), the scheme the package's ``BallsInBins`` describes.

Each record also carries the Opacus route's numbers for the same run description:
``privacy_model("heuristic", DPSGDRun.constant(...))`` (what ``LastIterateAccountant`` answers
in an Opacus run of those steps) and ``privacy_model("standard_rdp", ...)``
(tests/examples/test_jax_privacy_example.py compares them).

    python examples/jax_privacy_dpsgd.py                  # 300 steps, Poisson
    python examples/jax_privacy_dpsgd.py --sampler balls-in-bins
    python examples/jax_privacy_dpsgd.py --quick          # 40 steps (CI)

Needs the extra ``jax`` (``pip install './light[jax]'`` or ``'.[jax]'``); no torch.
"""

# example-requires: jax, jax_privacy

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import dp_accounting
import numpy as np

from opacus_lastiterate.analysis import BallsInBins, DPSGDRun, LastIterateHeuristicAccountant
from opacus_lastiterate.analysis.privacy_models import privacy_model

try:
    import jax
    import jax.numpy as jnp
    from jax_privacy import batch_selection, clipped_grad, noise_addition
except ModuleNotFoundError as error:  # the example's own dependencies: say which extra
    sys.exit(f"{error}: this example needs the extra `jax` (pip install './light[jax]').")


def generated_data(n: int, dimension: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n points in R^dimension with labels of a noisy linear rule (0 or 1)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dimension)).astype(np.float32)
    direction = rng.normal(size=dimension)
    y = (x @ direction + 0.5 * rng.normal(size=n) > 0).astype(np.float32)
    return x, y


def loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean logistic loss of a batch (one example per call under clipped_grad)."""
    logits = x @ params["w"] + params["b"]
    return jnp.mean(jnp.logaddexp(0.0, logits) - y * logits)


def batches(sampler: str, n: int, q: float, k: int, steps: int, seed: int):
    """Indices of each step's batch, from jax_privacy's batch selection."""
    if sampler == "poisson":
        yield from batch_selection.CyclicPoissonSampling(
            sampling_prob=q, iterations=steps
        ).batch_iterator(n, rng=seed)
        return
    for epoch in range(math.ceil(steps / k)):  # a new assignment of records to bins each epoch
        strategy = batch_selection.BallsInBinsSampling(
            iterations=min(k, steps - epoch * k), cycle_length=k
        )
        yield from strategy.batch_iterator(n, rng=(seed, epoch))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--sampler", choices=["poisson", "balls-in-bins"], default="poisson")
    parser.add_argument("--dataset-size", type=int, default=2_000, help="N records")
    parser.add_argument("--batch-size", type=int, default=100, help="expected batch size")
    parser.add_argument("--steps", type=int, default=300, help="T steps")
    parser.add_argument("--noise-multiplier", type=float, default=1.0, help="sigma")
    parser.add_argument("--clip-norm", type=float, default=1.0, help="C")
    parser.add_argument("--learning-rate", type=float, default=0.5, help="plain SGD")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", type=Path, default=None, help="JSON lines, one per step")
    parser.add_argument("--quick", action="store_true", help="40 steps")
    args = parser.parse_args(argv)
    steps = 40 if args.quick else args.steps
    n, sigma, delta = args.dataset_size, args.noise_multiplier, args.delta
    k = n // args.batch_size  # steps per epoch
    q = args.batch_size / n if args.sampler == "poisson" else 1.0 / k
    sampling = BallsInBins(steps_per_epoch=k) if args.sampler == "balls-in-bins" else None

    x, y = generated_data(n, 20, args.seed)
    params = {"w": jnp.zeros(x.shape[1]), "b": jnp.zeros(())}
    grad_sum = jax.jit(clipped_grad(loss, l2_clip_norm=args.clip_norm, batch_argnums=(1, 2)))
    privatizer = noise_addition.gaussian_privatizer(
        stddev=sigma * args.clip_norm, prng_key=args.seed
    )
    noise_state = privatizer.init(params)
    heuristic = LastIterateHeuristicAccountant()  # the dp_accounting route (Poisson steps)
    standard = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    pad = 32  # batch shapes padded to a multiple of 32: a few compilations, not one per size

    log = args.log.open("w") if args.log else None
    print(f"jax {jax.__version__}, jax_privacy batches: {args.sampler}, N = {n}, q = {q:.4g}, "
          f"sigma = {sigma}, delta = {delta}, CPU: {jax.devices()[0].platform}")
    print(f"{'step':>5} {'batch':>5} {'loss':>7} {'heuristic':>10} {'std (RDP)':>9}  route")
    started = time.perf_counter()
    for t, indices in enumerate(batches(args.sampler, n, q, k, steps, args.seed), start=1):
        padded = batch_selection.pad_to_multiple_of(np.asarray(indices), pad)
        is_padding = padded < 0
        rows = np.where(is_padding, 0, padded)
        summed = grad_sum(params, x[rows], y[rows], is_padding_example=is_padding)
        noisy, noise_state = privatizer.update(sum_of_clipped_grads=summed, noise_state=noise_state)
        params = jax.tree.map(
            lambda p, g: p - args.learning_rate * g / args.batch_size, params, noisy
        )
        run = DPSGDRun.constant(steps=t, sample_rate=q, noise_multiplier=sigma, sampling=sampling)
        opacus_route = {
            name: privacy_model(name, run).epsilon(delta) for name in ("heuristic", "standard_rdp")
        }
        if sampling is None:
            heuristic.compose(event)
            standard.compose(event)
            eps_h, eps_s = heuristic.get_epsilon(delta), standard.get_epsilon(delta)
            route = "dp_accounting accountants"
        else:
            eps_h, eps_s = opacus_route["heuristic"], opacus_route["standard_rdp"]
            route = "run description (no dp_accounting event for balls-in-bins)"
        train_loss = float(loss(params, x, y))
        record = {
            "step": t, "batch_size": len(indices), "loss": train_loss,
            "heuristic_epsilon": eps_h, "standard_rdp_epsilon": eps_s,
            "opacus_route_heuristic_epsilon": opacus_route["heuristic"],
            "opacus_route_standard_rdp_epsilon": opacus_route["standard_rdp"],
            "sampler": args.sampler, "sample_rate": q, "noise_multiplier": sigma, "delta": delta,
            "route": route,
        }
        if log:
            log.write(json.dumps(record) + "\n")
        if t == 1 or t % max(1, steps // 10) == 0 or t == steps:
            print(f"{t:5d} {len(indices):5d} {train_loss:7.4f} {eps_h:10.4f} {eps_s:9.4f}  {route}")
    seconds = time.perf_counter() - started
    accuracy = float(np.mean(((x @ np.asarray(params["w"]) + float(params["b"])) > 0) == y))
    final = privacy_model("standard", run)
    label = privacy_model("heuristic", run).label
    opacus_standard = final.epsilon(delta)
    if sampling is None:  # the T steps as one event: one PLD self-composition
        pld = dp_accounting.pld.PLDAccountant().compose(event, steps).get_epsilon(delta)
    else:
        pld = opacus_standard
    summary = {
        "step": steps, "final": True, "train_accuracy": accuracy, "seconds": seconds,
        "standard_pld_epsilon": pld, "opacus_route_standard_epsilon": opacus_standard,
        "standard_label": final.label, "heuristic_label": label,
    }
    print(f"train accuracy {accuracy:.3f}; {seconds:.1f} s for {steps} steps")
    print(f"final model: heuristic epsilon {eps_h:.4f} ({label})")
    print(f"standard epsilon {pld:.4f} ({final.label})")
    if log:
        log.write(json.dumps(summary) + "\n")
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
