"""The devices engine tests run on: CPU everywhere, CUDA only where torch sees a GPU.

CI and the development machines have no GPU, so the CUDA cases are collected and skipped
there; `pytest -m cuda` selects them on a machine that has one (bench/device_check.sh).
"""

from __future__ import annotations

import pytest
import torch

CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
    ],
    id="cuda",
)
DEVICES = ["cpu", CUDA]


def assert_fp32_matmul_is_ieee() -> None:
    """fp32 parity on CUDA assumes matmuls are not silently run in TF32 (10-bit mantissa),
    which torch allows only when asked; neither side may have asked."""
    assert torch.get_float32_matmul_precision() == "highest"
    assert not torch.backends.cuda.matmul.allow_tf32


def autocast_tolerance(dtype: torch.dtype) -> float:
    """Absolute tolerance on a probability computed under CUDA autocast to fp16 or bf16.

    Under autocast every matmul output is rounded to `dtype` (bf16: 8 significant bits,
    eps 2**-7; fp16: 11 bits, eps 2**-10), so two runs that pad or batch differently may
    disagree on a logit of magnitude ~1-4 by a few ulps, i.e. a few eps relative. A
    probability moves by at most 1/4 of a logit change (the slope of the logistic), so a few
    ulps on logits of that size stay within 4 eps on a probability: about 0.031 for bf16
    and 0.0039 for fp16.
    """
    assert dtype in (torch.bfloat16, torch.float16), dtype
    return 4 * torch.finfo(dtype).eps
