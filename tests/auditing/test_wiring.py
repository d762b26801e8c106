"""The wiring check (opacus_lastiterate.auditing.wiring): correct Opacus set-ups pass, broken
ones are named, and the check changes nothing of the training it watches.

The LoRA cases build a 2-layer GPT-2 from a ``transformers`` config in code (no download)
with ``peft`` LoRA adapters on ``c_attn``; they skip when ``peft`` is not installed.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from opacus_lastiterate.auditing import check_private_training
from opacus_lastiterate.exceptions import PrivacyWiringError

VOCAB, SEQ, BATCH = 64, 12, 4


# -- set-ups ------------------------------------------------------------------------------------


class TwoLayer(nn.Module):
    """A frozen first layer and a trainable head; ``reuse`` also uses the head's weight
    through a functional call that Opacus's hooks do not see."""

    def __init__(self, reuse: bool = False) -> None:
        super().__init__()
        self.body = nn.Linear(6, 6)
        self.head = nn.Linear(6, 6)
        self.body.requires_grad_(False)
        self.reuse = reuse

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        out = self.head(h)
        if self.reuse:
            out = out + F.linear(h, self.head.weight)
        return out


def _plain(reuse: bool = False, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    model = TwoLayer(reuse)
    x, y = torch.randn(16, 6), torch.randint(0, 6, (16,))
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    engine = PrivacyEngine(accountant="rdp")
    wrapped, dp_opt, loader = engine.make_private(
        module=model, optimizer=opt, data_loader=loader, noise_multiplier=1.0,
        max_grad_norm=0.5, poisson_sampling=False, **kwargs,
    )
    return model, wrapped, dp_opt, loader, engine


def _plain_steps(wrapped, dp_opt, loader, steps: int) -> None:
    batches = iter(loader)
    for _ in range(steps):
        x, y = next(batches)
        F.cross_entropy(wrapped(x), y).backward()
        dp_opt.step()
        dp_opt.zero_grad()


def _lora(mode: str = "hooks", wrap_model: bool = False, seed: int = 0):
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=16,
                        bos_token_id=0, eos_token_id=0)
    model = get_peft_model(
        GPT2LMHeadModel(config),
        LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0,
                   fan_in_fan_out=True),
    )
    tokens = torch.randint(0, VOCAB, (16, SEQ))
    loader = DataLoader(TensorDataset(tokens), batch_size=BATCH)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    engine = PrivacyEngine(accountant="rdp")
    out = engine.make_private(
        module=model, optimizer=opt, data_loader=loader, noise_multiplier=1.0,
        max_grad_norm=0.01, poisson_sampling=False, grad_sample_mode=mode,
        wrap_model=wrap_model,
    )
    trained = out[0] if wrap_model else model
    criterion = out[2] if mode == "ghost" else None
    return model, trained, out[1], criterion, out[-1], engine


def _lora_steps(trained, dp_opt, criterion, loader, steps: int) -> None:
    batches = iter(loader)
    for _ in range(steps):
        (tokens,) = next(batches)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if criterion is None:
                loss = trained(input_ids=tokens, labels=tokens).loss
            else:
                logits = trained(input_ids=tokens).logits[:, :-1]
                loss = criterion(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1),
                                 shape=(tokens.shape[0], SEQ - 1))
        loss.backward()
        dp_opt.step()
        dp_opt.zero_grad()


def _trainable(model: nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


# -- correct set-ups pass -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "wrap_model"), [("hooks", False), ("hooks", True), ("ghost", False)]
)
def test_a_correct_lora_setup_passes(mode: str, wrap_model: bool) -> None:
    model, trained, dp_opt, criterion, loader, _ = _lora(mode, wrap_model)
    check = check_private_training(dp_opt, trained)
    _lora_steps(trained, dp_opt, criterion, loader, 2)
    assert check is not None and check.done and check.report is not None
    report = check.report
    assert {p.name.replace("_module.", "") for p in report.parameters} == _trainable(model)
    assert all("lora_" in p.name for p in report.parameters)
    assert report.ghost_clipping == (mode == "ghost")
    if mode == "hooks":
        assert all(p.examples == BATCH for p in report.parameters)
        assert all(p.clipped_norm_max <= 0.01 * (1 + 1e-6) for p in report.parameters)
    # the pooled noise std over 1024 entries: relative error about 1/sqrt(2*1024) = 2.2%
    assert report.pooled_noise_std == pytest.approx(report.stated_std, rel=5 * 0.022)
    assert len(report.frozen) > 0 and not any("lora_" in n for n in report.frozen)


def test_a_correct_plain_setup_passes_without_the_model() -> None:
    _, wrapped, dp_opt, loader, _ = _plain()
    check = check_private_training(dp_opt)
    _plain_steps(wrapped, dp_opt, loader, 1)
    assert check is not None and check.report is not None
    assert [p.name for p in check.report.parameters] == [
        "param_groups[0][0] (shape (6, 6))", "param_groups[0][1] (shape (6,))"
    ]


def test_training_after_the_check_is_bit_identical() -> None:
    def run(with_check: bool):
        model, wrapped, dp_opt, loader, engine = _plain(seed=3)
        if with_check:
            check_private_training(dp_opt, wrapped)
        torch.manual_seed(11)  # the noise stream
        _plain_steps(wrapped, dp_opt, loader, 3)
        return ([p.detach().clone() for p in model.parameters()], list(engine.accountant.history),
                torch.get_rng_state(), copy.deepcopy(dp_opt.state_dict()))

    a, b = run(False), run(True)
    assert all(torch.equal(x, y) for x, y in zip(a[0], b[0], strict=True))
    assert a[1] == b[1] and len(a[1]) > 0
    assert torch.equal(a[2], b[2])
    assert repr(a[3]) == repr(b[3])


def test_lora_training_after_the_check_is_bit_identical() -> None:
    def run(with_check: bool):
        model, trained, dp_opt, criterion, loader, engine = _lora(seed=5)
        if with_check:
            check_private_training(dp_opt, trained)
        torch.manual_seed(7)
        _lora_steps(trained, dp_opt, criterion, loader, 3)
        return [p.detach().clone() for p in model.parameters()], list(engine.accountant.history)

    a, b = run(False), run(True)
    assert all(torch.equal(x, y) for x, y in zip(a[0], b[0], strict=True))
    assert a[1] == b[1]


def test_the_switch_off_arms_nothing() -> None:
    _, wrapped, dp_opt, loader, _ = _plain(reuse=True)
    assert check_private_training(dp_opt, wrapped, enabled=False) is None
    _plain_steps(wrapped, dp_opt, loader, 1)  # broken, but nobody checks


# -- broken set-ups are named -------------------------------------------------------------------


def test_an_unhooked_lora_layer_is_named() -> None:
    model, trained, dp_opt, criterion, loader, _ = _lora()
    layer = model.base_model.model.transformer.h[1].attn.c_attn.lora_B["default"]
    layer._forward_hooks.clear()  # what Opacus registered on it: it no longer sees the layer
    layer._backward_hooks.clear()
    check_private_training(dp_opt, trained)
    with pytest.raises(PrivacyWiringError, match="no per-sample gradient") as info:
        _lora_steps(trained, dp_opt, criterion, loader, 1)
    assert list(info.value.problems) == [
        "base_model.model.transformer.h.1.attn.c_attn.lora_B.default.weight"
    ]


def test_a_use_the_hooks_do_not_see_is_named() -> None:
    model, wrapped, dp_opt, loader, engine = _plain(reuse=True)
    before = model.head.weight.detach().clone()
    check_private_training(dp_opt, wrapped)
    with pytest.raises(PrivacyWiringError, match="do not add up") as info:
        _plain_steps(wrapped, dp_opt, loader, 1)
    assert list(info.value.problems) == ["_module.head.weight"]
    assert torch.equal(model.head.weight, before)  # raised before the update
    assert len(engine.accountant.history) == 0  # and before the accountant recorded it


def _noise_all_but(dp_opt, skip: torch.Tensor, scale: float = 0.0):
    def add_noise() -> None:
        for p in dp_opt.params:
            std = dp_opt.noise_multiplier * dp_opt.max_grad_norm
            noise = torch.normal(0.0, std, size=p.summed_grad.shape)
            p.grad = (p.summed_grad + (scale * noise if p is skip else noise)).view_as(p)

    return add_noise


@pytest.mark.parametrize(("scale", "reason"), [(0.0, "no noise"), (0.5, "noise of std")])
def test_an_unnoised_lora_parameter_is_named(scale: float, reason: str) -> None:
    model, trained, dp_opt, criterion, loader, engine = _lora()
    target = model.base_model.model.transformer.h[0].attn.c_attn.lora_B["default"].weight
    dp_opt.add_noise = _noise_all_but(dp_opt, target, scale)
    check_private_training(dp_opt, trained)
    with pytest.raises(PrivacyWiringError, match=reason) as info:
        _lora_steps(trained, dp_opt, criterion, loader, 1)
    assert list(info.value.problems) == [
        "base_model.model.transformer.h.0.attn.c_attn.lora_B.default.weight"
    ]
    assert len(engine.accountant.history) == 0


def test_a_trainable_parameter_outside_the_dp_optimizer_is_named() -> None:
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = get_peft_model(
        GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB,
                                   n_positions=16, bos_token_id=0, eos_token_id=0)),
        LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True),
    )
    lora = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.SGD([p for n, p in lora if "lora_A" in n], lr=0.1)  # lora_B left out
    loader = DataLoader(TensorDataset(torch.randint(0, VOCAB, (8, SEQ))), batch_size=BATCH)
    _, dp_opt, loader = PrivacyEngine().make_private(
        module=model, optimizer=opt, data_loader=loader, noise_multiplier=1.0,
        max_grad_norm=1.0, wrap_model=False, poisson_sampling=False,
    )
    check_private_training(dp_opt, model)
    with pytest.raises(PrivacyWiringError, match="not in the DP optimizer") as info:
        _lora_steps(model, dp_opt, None, loader, 1)
    assert set(info.value.problems) == {n for n, _ in lora if "lora_B" in n}


def test_an_optimizer_holding_replaced_parameters_is_named() -> None:
    # the signature of Opacus issue 820: the model no longer uses the tensors the optimizer
    # updates (here one LoRA weight is replaced after make_private)
    model, trained, dp_opt, criterion, loader, _ = _lora()
    layer = model.base_model.model.transformer.h[0].attn.c_attn.lora_A["default"]
    check_private_training(dp_opt, trained)
    old = layer.weight
    layer.weight = nn.Parameter(old.detach().clone())
    vars(layer.weight).update(vars(old))  # what Opacus attached to the old one, so it runs
    name = "base_model.model.transformer.h.0.attn.c_attn.lora_A.default.weight"
    with pytest.raises(PrivacyWiringError) as info:
        _lora_steps(trained, dp_opt, criterion, loader, 1)
    assert "not in the DP optimizer" in info.value.problems[name]
    assert "re-materialised" in info.value.problems[f"{name} (the optimizer's tensor)"]


def test_a_frozen_parameter_that_changes_is_named() -> None:
    model, wrapped, dp_opt, loader, _ = _plain()
    check = check_private_training(dp_opt, wrapped)
    _plain_steps(wrapped, dp_opt, loader, 1)
    assert check is not None and check.report is not None and not check.done
    with torch.no_grad():
        model.body.bias[0] += 1e-6  # e.g. another optimizer's update
    with pytest.raises(PrivacyWiringError, match="frozen") as info:
        _plain_steps(wrapped, dp_opt, loader, 1)
    assert list(info.value.problems) == ["_module.body.bias"]
    _plain_steps(wrapped, dp_opt, loader, 1)  # the check is disarmed after it fired


def test_a_position_embedding_shared_across_the_batch_is_named() -> None:
    # a tiny BERT trained whole: Opacus sees position ids of shape (1, T), so the position
    # embedding gets per-sample gradients for 1 example, and Opacus's clipping would fail
    # with "stack expects each tensor to be equal size"
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32,
        vocab_size=50, max_position_embeddings=16, num_labels=2))
    data = TensorDataset(torch.randint(0, 50, (8, SEQ)), torch.randint(0, 2, (8,)))
    wrapped, dp_opt, loader = PrivacyEngine().make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=BATCH), noise_multiplier=1.0,
        max_grad_norm=1.0, poisson_sampling=False,
    )
    check_private_training(dp_opt, wrapped)
    x, y = next(iter(loader))
    wrapped(input_ids=x, labels=y).loss.backward()
    with pytest.raises(PrivacyWiringError, match=r"position_ids of shape \(B, T\)") as info:
        dp_opt.step()
    assert list(info.value.problems) == ["_module.bert.embeddings.position_embeddings.weight"]
    # the remedy the message gives: position ids with the batch dimension
    dp_opt.zero_grad()
    check = check_private_training(dp_opt, wrapped)
    wrapped(input_ids=x, labels=y, position_ids=torch.arange(SEQ).expand(len(x), SEQ)
            ).loss.backward()
    dp_opt.step()
    assert check is not None and check.report is not None


# -- bad input ----------------------------------------------------------------------------------


def test_bad_arguments_are_named() -> None:
    model, _, dp_opt, _, _ = _plain()
    with pytest.raises(TypeError, match="`optimizer`"):
        check_private_training(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="`model`"):
        check_private_training(dp_opt, model="m")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`alpha`"):
        check_private_training(dp_opt, alpha=0.7)
    with pytest.raises(ValueError, match="`rtol`"):
        check_private_training(dp_opt, rtol=0)
    with pytest.raises(TypeError, match="`enabled`"):
        check_private_training(dp_opt, enabled=1)  # type: ignore[arg-type]
    assert "pre_step" not in dp_opt.__dict__  # nothing was armed


# -- the set-up of Opacus issue 820 -------------------------------------------------------------


def test_the_opacus_820_setup_passes_and_its_lora_weights_move(tmp_path) -> None:
    # The reported combination (Opacus issue 820: LoRA weights silently not updated with
    # peft 0.14+): a causal LM loaded with from_pretrained and not moved before
    # get_peft_model, LoRA r=16 on c_attn, AdamW, make_private_with_epsilon, Poisson
    # batches. Here a 2-layer GPT-2 saved to and loaded from a local folder, on CPU. Never
    # silent: either the check names a parameter, or it passes and the LoRA weights move.
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB,
                               n_positions=32, bos_token_id=0, eos_token_id=0)
                    ).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                             target_modules=["c_attn"], task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    loader = DataLoader(TensorDataset(torch.randint(0, VOCAB, (64, 16))), batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = PrivacyEngine(accountant="rdp").make_private_with_epsilon(
            module=model, optimizer=opt, data_loader=loader, target_epsilon=8.0,
            target_delta=1e-5, epochs=1, max_grad_norm=1.0)
    check = check_private_training(opt, model)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    for (tokens,) in loader:
        if len(tokens):
            model(input_ids=tokens, labels=tokens).loss.backward()
            opt.step()
            opt.zero_grad()
    assert check is not None and check.report is not None
    assert {p.name for p in check.report.parameters} == _trainable(model)
    for name, p in model.named_parameters():
        if name in before:
            assert float((p - before[name]).abs().max()) > 1e-4, name


# -- beside the privacy monitor -----------------------------------------------------------------


@pytest.mark.parametrize("check_first", [True, False])
def test_the_check_and_the_monitor_wrap_the_same_optimizer_in_either_order(
    check_first: bool,
) -> None:
    from opacus_lastiterate.callbacks import PrivacyMonitor

    torch.manual_seed(0)
    model = TwoLayer()
    x, y = torch.randn(16, 6), torch.randint(0, 6, (16,))
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped, dp_opt, loader = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.head.parameters(), lr=0.5),
            data_loader=DataLoader(TensorDataset(x, y), batch_size=BATCH),
            noise_multiplier=1.0, max_grad_norm=0.5, poisson_sampling=False,
        )
    records: list[object] = []
    if check_first:
        check = check_private_training(dp_opt, wrapped)
    monitor = PrivacyMonitor(engine, delta=1e-5, sinks=[records.append], optimizer=dp_opt)
    if not check_first:
        check = check_private_training(dp_opt, wrapped)
    _plain_steps(wrapped, dp_opt, loader, 3)
    monitor.finish()
    assert check is not None and check.done and check.report is not None
    assert [r.step for r in records if not r.final] == [1, 2, 3]  # type: ignore[attr-defined]
    monitor.detach()
    _plain_steps(wrapped, dp_opt, loader, 1)  # still trains after both let go
    assert len(engine.accountant.history) > 0


def test_gradient_accumulation_over_two_backward_passes_passes() -> None:
    _, wrapped, dp_opt, loader, _ = _plain()
    check = check_private_training(dp_opt, wrapped)
    batches = iter(loader)
    for _ in range(2):  # two micro-batches of 4, one step
        x, y = next(batches)
        F.cross_entropy(wrapped(x), y).backward()
    dp_opt.step()
    assert check is not None and check.report is not None
    assert all(p.examples == 2 * BATCH for p in check.report.parameters)


def test_a_check_that_cannot_read_the_step_gives_up_with_a_warning_not_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A set-up the probe cannot read (here: its comparison fails inside, as a sharded
    optimizer's missing clipped sums did) never aborts a step Opacus accepts: the check is
    switched off with one AuditWarning and training goes on with the same update."""
    from opacus_lastiterate.auditing import wiring
    from opacus_lastiterate.exceptions import AuditWarning

    reference = _plain()
    _plain_steps(reference[1], reference[2], reference[3], 2)
    model, wrapped, dp_opt, loader, engine = _plain()  # the same seed: the same noise
    check = check_private_training(dp_opt, model)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("cannot read this optimizer")

    monkeypatch.setattr(wiring.WiringCheck, "_verify", broken)
    with pytest.warns(AuditWarning, match="could not observe"):
        _plain_steps(wrapped, dp_opt, loader, 2)
    assert check is not None and check.report is None and check.done
    for p, q in zip(model.parameters(), reference[0].parameters(), strict=True):
        assert torch.equal(p, q)
    assert engine.accountant.history == reference[4].accountant.history
