"""The configuration of the corrected accountants (:mod:`~.normalisation`): its keys and
defaults, its validation as a whole, and what a data loader tells of it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from opacus_lastiterate.analysis._validation import check_in_interval, check_int, check_positive

CONFIG_DEFAULTS: dict[str, Any] = {
    "dataset_size": None,
    "batch_size": None,
    "drop_last": False,
    "dimension": None,
    "public_divisor": None,
    "standard": "pld",
    "optimizer_divisor": None,
    "loss_reduction": None,
}


def optional(name: str, value: object, check: Callable[[str, object], Any]) -> Any:
    return None if value is None else check(name, value)


def check_config(
    values: Mapping[str, object], standards: tuple[str, ...], prefix: str = ""
) -> dict[str, Any]:
    """Validate a full configuration mapping (unknown or missing keys are errors; ``standard``
    one of ``standards``)."""
    unknown = sorted(set(map(str, values)) - set(CONFIG_DEFAULTS))
    if unknown:
        raise ValueError(f"`{prefix}configuration` has unknown keys {unknown}.")
    missing = sorted(set(CONFIG_DEFAULTS) - set(values))
    if missing:
        raise ValueError(f"`{prefix}configuration` is missing the keys {missing}.")

    def p(key: str) -> str:
        return f"{prefix}{key}"

    drop_last = values["drop_last"]
    if not isinstance(drop_last, bool):
        raise TypeError(f"`{p('drop_last')}` must be a bool, got {drop_last!r}.")
    standard = values["standard"]
    if standard not in standards:
        raise ValueError(
            f"`{p('standard')}` must be one of {standards}, got {standard!r}."
        )
    reduction = values["loss_reduction"]
    if reduction not in (None, "mean", "sum"):
        raise ValueError(
            f"`{p('loss_reduction')}` must be 'mean', 'sum' or None, got {reduction!r}."
        )
    return {
        "dataset_size": optional(p("dataset_size"), values["dataset_size"], int_at_least(1)),
        "batch_size": optional(p("batch_size"), values["batch_size"], int_at_least(1)),
        "drop_last": drop_last,
        "dimension": optional(p("dimension"), values["dimension"], int_at_least(1)),
        "public_divisor": optional(p("public_divisor"), values["public_divisor"], check_positive),
        "standard": standard,
        "optimizer_divisor": optional(
            p("optimizer_divisor"),
            values["optimizer_divisor"],
            lambda n, v: check_in_interval(n, v, 0.0, math.inf, low_open=False),
        ),
        "loss_reduction": reduction,
    }


def int_at_least(minimum: int) -> Callable[[str, object], int]:
    return lambda name, value: check_int(name, value, minimum=minimum)


def config_from_loader(loader: object) -> dict[str, Any]:
    """N (and L, drop_last for a plain DataLoader) from a torch DataLoader."""
    from torch.utils.data import DataLoader

    if not isinstance(loader, DataLoader):
        raise TypeError(
            f"`data_loader` must be a torch.utils.data.DataLoader, got {type(loader).__name__}."
        )
    try:
        size = len(loader.dataset)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError("`data_loader.dataset` must have a length (len(dataset) = N).") from None
    found: dict[str, Any] = {"dataset_size": size}
    # A DPDataLoader (make_private's result) has no batch size: L must then be explicit.
    if getattr(loader, "sample_rate", None) is None and loader.batch_size is not None:
        found["batch_size"] = loader.batch_size
        found["drop_last"] = bool(loader.drop_last)
    return found
