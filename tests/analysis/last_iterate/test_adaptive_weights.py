"""Weights of the adaptive optimisers' steps in the final model (frozen second moment).

References written here, independently of the package:

* ``_forward``: each optimiser's update written out from torch's code, run forward on one
  scalar parameter per run, with the second-moment state replaced by a given deterministic
  sequence; driven by unit impulses (run r gets gradient 1 at step r, 0 elsewhere), so
  that run r's final parameter is -w_r.
* the expected state: closed-form sums (Adam family, RMSprop, Adagrad) and, for Adamax,
  ``scipy.integrate.quad`` of the product form of its distribution function.
* real ``torch.optim`` optimisers fed gradients of constant magnitude (their second moment is
  then deterministic, so the frozen model is exact for them).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, special

from opacus_lastiterate.analysis.last_iterate.adaptive_weights import (
    ADAPTIVE_WEIGHT_OPTIMIZERS,
    AdaptiveSettings,
    adaptive_weights,
    canonical_adaptive_name,
    expected_second_moment,
    settings_from_param_group,
    weights_given_second_moment,
)
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.exceptions import UnsupportedOptimizerError

T = 40


def _warmup_decay(peak: float, steps: int, warmup: int) -> np.ndarray:
    """Linear warm-up over ``warmup`` steps, then linear decay to 0 (Hugging Face's default)."""
    t = np.arange(steps, dtype=float)
    up = (t + 1) / warmup
    down = (steps - t) / (steps - warmup)
    return peak * np.where(t < warmup, up, down)


def _expected_state(name, beta2, s, *, centered=False, init=0.0, eps=0.0):
    """E[state_t] with gradients N(0, s_t^2) as explicit sums over past steps."""
    n = len(s)
    out = np.empty(n)
    for t in range(n):
        if name == "adagrad":
            out[t] = init + sum(s[j] ** 2 for j in range(t + 1))
            continue
        decay = [math.prod(beta2[i] for i in range(j + 1, t + 1)) for j in range(t + 1)]
        v = sum((1 - beta2[j]) * decay[j] * s[j] ** 2 for j in range(t + 1))
        if centered:
            v -= sum((1 - beta2[j]) ** 2 * decay[j] ** 2 * s[j] ** 2 for j in range(t + 1))
        out[t] = v
    if name == "adamax":  # E u_t = int_0^inf 1 - prod_j P(|g_j| + eps <= x / prod beta2)
        for t in range(n):
            scale = [math.prod(beta2[i] for i in range(j + 1, t + 1)) for j in range(t + 1)]

            def tail(x, t=t, scale=scale):
                cdf = 1.0
                for j in range(t + 1):
                    y = x / scale[j] - eps
                    cdf *= special.erf(max(y, 0.0) / (s[j] * math.sqrt(2)))
                return 1.0 - cdf

            out[t] = integrate.quad(tail, 0, 20 * max(s) + 2 * eps, limit=200, epsabs=1e-12)[0]
    return out


def _forward(name, hp, state, grads):
    """Final parameters of torch's update (written from its code) with the state frozen.

    ``hp`` holds per-step arrays lr, beta1, beta2, eps, wd and the options; ``grads`` is
    (steps, runs). Returns the final parameter of each run (initial parameter 0).
    """
    n, runs = grads.shape
    p, m, buf = np.zeros(runs), np.zeros(runs), np.zeros(runs)
    vmax, mu_prod = 0.0, 1.0
    for i in range(n):
        t = i + 1
        lr, b1, b2, eps, wd = (hp[key][i] for key in ("lr", "beta1", "beta2", "eps", "wd"))
        g = grads[i].copy()
        if wd:
            if hp.get("decoupled"):
                p = p * (1 - lr * wd)
            else:
                g = g + wd * p
        v = state[i]
        if name in ("adam", "adamw"):
            m = b1 * m + (1 - b1) * g
            if hp.get("amsgrad"):
                vmax = max(vmax, v)
                v = vmax
            denom = math.sqrt(v) / math.sqrt(1 - b2**t) + eps
            p = p - lr / (1 - b1**t) * m / denom
        elif name == "nadam":
            psi = hp.get("momentum_decay", 0.004)
            mu = b1 * (1 - 0.5 * 0.96 ** (t * psi))
            mu_next = b1 * (1 - 0.5 * 0.96 ** ((t + 1) * psi))
            mu_prod *= mu
            m = m + (1 - b1) * (g - m)
            denom = math.sqrt(v / (1 - b2**t)) + eps
            p = p - lr * (1 - mu) / (1 - mu_prod) * g / denom
            p = p - lr * mu_next / (1 - mu_prod * mu_next) * m / denom
        elif name == "radam":
            m = b1 * m + (1 - b1) * g
            m_hat = m / (1 - b1**t)
            rho_inf = 2 / (1 - b2) - 1
            rho = rho_inf - 2 * t * b2**t / (1 - b2**t)
            if rho > 5:
                r = math.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))
                p = p - m_hat * lr * math.sqrt(1 - b2**t) / (math.sqrt(v) + eps) * r
            else:
                p = p - m_hat * lr
        elif name == "adamax":
            m = b1 * m + (1 - b1) * g
            p = p - lr / (1 - b1**t) * m / v
        elif name == "rmsprop":
            avg = math.sqrt(v) + eps
            if b1 > 0:
                buf = b1 * buf + g / avg
                p = p - lr * buf
            else:
                p = p - lr * g / avg
        elif name == "adagrad":
            clr = lr / (1 + (t - 1) * hp["lr_decay"])
            p = p - clr * g / (math.sqrt(v) + eps)
    return p


def _settings(name, hp):
    n = len(hp["lr"])
    return [
        AdaptiveSettings(
            name,
            lr=hp["lr"][i],
            beta1=hp["beta1"][i],
            beta2=hp["beta2"][i],
            eps=hp["eps"][i],
            weight_decay=hp["wd"][i],
            decoupled_weight_decay=hp.get("decoupled", False),
            amsgrad=hp.get("amsgrad", False),
            centered=hp.get("centered", False),
            lr_decay=hp.get("lr_decay", 0.0),
            initial_accumulator_value=hp.get("init", 0.0),
            momentum_decay=hp.get("momentum_decay", 0.004),
        )
        for i in range(n)
    ]


def _hp(lr, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.0, **options):
    n = len(lr)
    full = {"lr": list(lr)}
    for key, value in (("beta1", beta1), ("beta2", beta2), ("eps", eps), ("wd", wd)):
        full[key] = list(value) if np.ndim(value) else [value] * n
    full.update(options)
    return full


# noise_std falls then rises (so amsgrad's maximum differs from the state), in units where
# the eps values below are comparable to it
NOISE = 1e-3 * (1.5 + np.cos(np.linspace(0, 2 * math.pi, T)))
SCHEDULE = _warmup_decay(1e-2, T, warmup=8)

CASES = {
    "adam_l2": ("adam", _hp(SCHEDULE, beta2=0.95, eps=3e-4, wd=0.02)),
    "adam_amsgrad": ("adam", _hp(SCHEDULE, beta2=0.9, eps=1e-4, amsgrad=True)),
    "adamw": ("adamw", _hp(SCHEDULE, beta2=0.95, eps=1e-8, wd=2.0, decoupled=True)),
    "adamw_amsgrad_betas_cycled": (
        "adamw",
        _hp(SCHEDULE, beta1=np.linspace(0.95, 0.85, T), beta2=0.9, eps=2e-4, wd=0.1,
            decoupled=True, amsgrad=True),
    ),
    "nadam_l2": ("nadam", _hp(SCHEDULE, beta2=0.95, eps=1e-4, wd=0.02, momentum_decay=0.04)),
    "nadam_decoupled": ("nadam", _hp(SCHEDULE, beta2=0.99, wd=2.0, decoupled=True)),
    "radam_l2": ("radam", _hp(SCHEDULE, beta2=0.9, eps=1e-4, wd=0.02)),
    "radam_decoupled": ("radam", _hp(SCHEDULE, beta2=0.95, wd=2.0, decoupled=True)),
    "adamax_l2": ("adamax", _hp(SCHEDULE, beta2=0.9, eps=5e-4, wd=0.02)),
    "rmsprop_momentum_l2": ("rmsprop", _hp(SCHEDULE, beta1=0.9, beta2=0.95, eps=1e-4, wd=0.01)),
    "rmsprop_centered": ("rmsprop", _hp(SCHEDULE, beta1=0.0, beta2=0.9, eps=1e-4, centered=True)),
    "adagrad": ("adagrad", _hp(SCHEDULE, beta1=0.0, beta2=0.0, eps=1e-4, wd=0.01,
                              lr_decay=0.05, init=2e-6)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_weights_match_forward_impulse_simulation_with_frozen_state(case):
    name, hp = CASES[case]
    state = _expected_state(
        name, hp["beta2"], NOISE, centered=hp.get("centered", False), init=hp.get("init", 0.0),
        eps=hp["eps"][0],
    )
    final = _forward(name, hp, state, np.eye(T))
    w = adaptive_weights(_settings(name, hp), noise_std=NOISE)
    assert w.shape == (T,)
    np.testing.assert_allclose(w, -final, rtol=5e-5 if name == "adamax" else 1e-10, atol=0)
    assert np.ptp(w) > 0.1 * np.max(np.abs(w))  # the schedule and the state shape the weights


@pytest.mark.parametrize("case", sorted(CASES))
def test_expected_state_matches_explicit_sums(case):
    name, hp = CASES[case]
    expected = _expected_state(
        name, hp["beta2"], NOISE, centered=hp.get("centered", False), init=hp.get("init", 0.0),
        eps=hp["eps"][0],
    )
    got = expected_second_moment(_settings(name, hp), noise_std=NOISE)
    np.testing.assert_allclose(got, expected, rtol=5e-5 if name == "adamax" else 1e-12)


def test_amsgrad_changes_the_weights_when_the_noise_falls():
    hp = CASES["adam_amsgrad"][1]
    with_max = adaptive_weights(_settings("adam", hp), noise_std=NOISE)
    without = adaptive_weights(_settings("adam", {**hp, "amsgrad": False}), noise_std=NOISE)
    assert np.max(np.abs(with_max - without) / without) > 0.05


def test_l2_and_decoupled_weight_decay_differ_and_both_match_the_recursion():
    hp_l2 = _hp(SCHEDULE, beta2=0.95, eps=3e-4, wd=0.02)
    hp_dec = {**hp_l2, "decoupled": True}
    state = _expected_state("adam", hp_l2["beta2"], NOISE)
    for hp in (hp_l2, hp_dec):
        w = adaptive_weights(_settings("adam", hp), noise_std=NOISE)
        np.testing.assert_allclose(w, -_forward("adam", hp, state, np.eye(T)), rtol=1e-10)
    w_l2 = adaptive_weights(_settings("adam", hp_l2), noise_std=NOISE)
    w_dec = adaptive_weights(_settings("adam", hp_dec), noise_std=NOISE)
    assert np.max(np.abs(w_l2 - w_dec) / w_dec) > 0.01


def test_weights_go_into_the_weighted_heuristic():
    from opacus_lastiterate.analysis.privacy_models import privacy_model

    settings = _settings("adamw", CASES["adamw"][1])
    w = adaptive_weights(settings, noise_std=1.0)
    run = DPSGDRun.from_history([(1.0, 0.05, T)], weights=w)
    eps_adam = privacy_model("heuristic", run).epsilon(1e-5)
    eps_const = privacy_model("heuristic", DPSGDRun.from_history([(1.0, 0.05, T)])).epsilon(1e-5)
    assert 0 < eps_adam < eps_const  # decaying weights discount early steps


# -- real torch optimisers on gradients of constant magnitude ---------------------------------


def _lambda(steps: int, warmup: int):
    return lambda k: (k + 1) / warmup if k < warmup else max(0.0, (steps - k) / (steps - warmup))


TORCH_CASES = [
    ("Adam", {"betas": (0.9, 0.95), "eps": 1e-3, "weight_decay": 0.5}),
    ("Adam", {"betas": (0.8, 0.9), "eps": 1e-3, "amsgrad": True}),
    ("AdamW", {"betas": (0.9, 0.95), "eps": 1e-2, "weight_decay": 0.3}),
    ("AdamW", {"betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.1, "foreach": True}),
    ("NAdam", {"betas": (0.9, 0.95), "eps": 1e-3, "weight_decay": 0.5}),
    ("NAdam", {"betas": (0.9, 0.95), "weight_decay": 0.2, "decoupled_weight_decay": True}),
    ("RAdam", {"betas": (0.9, 0.9), "eps": 1e-3, "weight_decay": 0.5}),
    ("RAdam", {"betas": (0.9, 0.95), "weight_decay": 0.2, "decoupled_weight_decay": True}),
    ("Adamax", {"betas": (0.9, 0.95), "eps": 1e-3, "weight_decay": 0.5}),
    ("RMSprop", {"alpha": 0.9, "momentum": 0.8, "eps": 1e-3, "weight_decay": 0.5}),
    ("RMSprop", {"alpha": 0.95, "eps": 1e-2}),
    ("Adagrad", {"lr_decay": 0.02, "eps": 1e-3, "weight_decay": 0.5,
                 "initial_accumulator_value": 0.5}),
]


@pytest.mark.parametrize(("cls_name", "options"), TORCH_CASES, ids=lambda x: str(x)[:40])
def test_frozen_model_is_exact_for_torch_on_constant_magnitude_gradients(cls_name, options):
    """With folded gradients of magnitude 1 the state is deterministic (its value with
    noise_std = 1, Adamax's 1 + eps), so the model reproduces torch's final parameter."""
    torch = pytest.importorskip("torch")
    steps, warmup = 30, 6
    rng = np.random.default_rng(7)
    signs = rng.choice([-1.0, 1.0], size=steps)
    param = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = getattr(torch.optim, cls_name)([param], lr=0.05, **options)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lambda(steps, warmup))
    wd = options.get("weight_decay", 0.0)
    decoupled = cls_name == "AdamW" or options.get("decoupled_weight_decay", False)
    raw, settings = [], []
    for t in range(steps):
        p_before = float(param.detach()[0])
        # the raw gradient whose folded form g + wd p has magnitude 1
        r = signs[t] - (0.0 if decoupled else wd * p_before)
        raw.append(r)
        settings.append(settings_from_param_group(opt, opt.param_groups[0]))
        param.grad = torch.tensor([r], dtype=torch.float64)
        opt.step()
        sched.step()
    final = float(param.detach()[0])
    if cls_name == "Adamax":
        w = weights_given_second_moment(settings, np.full(steps, 1.0 + options["eps"]))
    else:
        w = adaptive_weights(settings, noise_std=1.0)
    # torch keeps NAdam's product of momenta as a float32 scalar: 1e-9 relative there
    tol = 1e-8 if cls_name == "NAdam" else 1e-12
    assert abs(final - (-np.dot(w, raw))) <= tol * abs(final)
    assert abs(final) > 1e-3


# -- names, options and bad input -------------------------------------------------------------


def test_canonical_names_and_unsupported_optimizers():
    assert canonical_adaptive_name("AdamW") == "adamw"
    assert canonical_adaptive_name("DPAdam") == "adam"
    for name in ADAPTIVE_WEIGHT_OPTIMIZERS:
        assert canonical_adaptive_name(name.upper()) == name
    for name in ("Adadelta", "LBFGS", "SparseAdam", "Rprop", "Lion", "SGD"):
        with pytest.raises(UnsupportedOptimizerError, match=name):
            canonical_adaptive_name(name)
    with pytest.raises(ValueError, match="standard"):
        AdaptiveSettings("Adadelta", lr=1.0)


def test_maximize_is_rejected_by_name():
    with pytest.raises(ValueError, match="maximize"):
        settings_from_param_group("AdamW", {"lr": 1e-3, "betas": (0.9, 0.999), "maximize": True})


def test_adamw_is_always_decoupled_and_options_belong_to_their_optimizer():
    assert AdaptiveSettings("adamw", lr=1e-3).decoupled_weight_decay is True
    with pytest.raises(ValueError, match="decoupled_weight_decay"):
        AdaptiveSettings("adamax", lr=1e-3, decoupled_weight_decay=True)
    with pytest.raises(ValueError, match="amsgrad"):
        AdaptiveSettings("nadam", lr=1e-3, amsgrad=True)
    with pytest.raises(ValueError, match="centered"):
        AdaptiveSettings("adam", lr=1e-3, centered=True)


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("lr", -1.0, ValueError),
        ("lr", "0.1", TypeError),
        ("beta1", 1.0, ValueError),
        ("beta2", -0.1, ValueError),
        ("eps", float("nan"), ValueError),
        ("weight_decay", -1e-3, ValueError),
        ("amsgrad", 1, TypeError),
    ],
)
def test_bad_settings_are_named(field, value, error):
    kwargs = {"lr": 1e-3, field: value}
    with pytest.raises(error, match=field):
        AdaptiveSettings("adam", **kwargs)


def test_bad_sequences_and_noise_are_named():
    s = [AdaptiveSettings("adam", lr=1e-3)] * 3
    with pytest.raises(ValueError, match="noise_std"):
        adaptive_weights(s, noise_std=0.0)
    with pytest.raises(ValueError, match="noise_std"):
        adaptive_weights(s, noise_std=[1.0, 1.0])
    with pytest.raises(ValueError, match=r"noise_std\[1\]"):
        adaptive_weights(s, noise_std=[1.0, -1.0, 1.0])
    with pytest.raises(TypeError, match="settings"):
        adaptive_weights(s[0], noise_std=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"settings\[1\].optimizer"):
        adaptive_weights([s[0], AdaptiveSettings("nadam", lr=1e-3)], noise_std=1.0)
    with pytest.raises(ValueError, match="second_moment"):
        weights_given_second_moment(s, [1.0, 1.0])
    with pytest.raises(ValueError, match="second_moment"):
        weights_given_second_moment([AdaptiveSettings("adam", lr=1e-3, eps=0.0)] * 2, [1.0, 0.0])
    assert adaptive_weights([], noise_std=1.0).shape == (0,)


# -- the simulated region ---------------------------------------------------------------------


def _study_rows():
    import csv
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "docs" / "results" / "adam_study.csv"
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_studied_ranges_are_the_simulated_settings_and_none_understates():
    from opacus_lastiterate.analysis.last_iterate.adaptive_regime import STUDIED_RANGES

    rows = _study_rows()
    columns = {"sample_rate": "q", "noise_multiplier": "sigma", "beta1": "beta1",
               "beta2": "beta2", "eps_over_noise": "eps", "steps": "steps"}
    for key, (low, high) in STUDIED_RANGES.items():
        seen = [float(r[columns[key]]) for r in rows]
        assert min(seen) <= low or key == "eps_over_noise"  # eps: any eps down to 0 is as studied
        assert max(seen) == high, key
    for r in rows:  # the committed results say what the module claims
        assert float(r["lower_bound"]) <= float(r["heuristic"]), r
        # the frozen estimate's standard error taken equal to the estimate's (same estimator,
        # similar laws); 3 combined standard errors for about 50 one-sided comparisons
        spread = 3 * math.sqrt(2) * max(float(r["estimate_se"]), 0.05)
        assert float(r["estimate"]) <= float(r["frozen_estimate"]) + spread, r


def test_caveats_are_empty_inside_the_box_and_name_each_way_out():
    from opacus_lastiterate.analysis.last_iterate.adaptive_regime import adaptive_heuristic_caveats

    inside = dict(sample_rate=0.01, noise_multiplier=1.0, steps=1000, beta1=0.9, beta2=0.999,
                  eps_over_noise=1e-5)
    assert adaptive_heuristic_caveats("AdamW", **inside) == ()
    for key, value in (("sample_rate", 0.5), ("noise_multiplier", 0.1), ("steps", 50_000),
                       ("beta1", 0.95), ("beta2", 0.9999), ("eps_over_noise", 10.0)):
        caveats = adaptive_heuristic_caveats("adam", **{**inside, key: value})
        assert len(caveats) == 1 and caveats[0].startswith(key), caveats
    caveats = adaptive_heuristic_caveats("RMSprop", **inside)
    assert len(caveats) == 1 and "rmsprop" in caveats[0]
    with pytest.raises(UnsupportedOptimizerError, match="Adadelta"):
        adaptive_heuristic_caveats("Adadelta", **inside)
    with pytest.raises(ValueError, match="sample_rate"):
        adaptive_heuristic_caveats("adam", **{**inside, "sample_rate": 0.0})
