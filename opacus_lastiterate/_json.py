"""``json_safe``: a value made strict JSON (non-finite floats as strings), for every layer.

Numbers and containers only, no third-party import: the command line (``--json``) and the
figures both write their results through it.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["json_safe"]


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float written as a string ("inf", "-inf", "nan"), so
    that the result is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
