"""The compute bound: how far any server could get ahead of a peer at equal CPU.

Once both servers keep every core busy, throughput is cores over CPU per decision. A decision's
matrix multiplies, counted by torch, cannot run faster than this core's best fp32 matmul rate,
so upstream's CPU per decision over that minimum bounds the lead any implementation of the same
fp32 forward pass can have. Attention is not counted (torch's counter skips CPU sdpa), so the
bound is generous to Decidealot.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def matmul_gflop(run: Callable[[], object]) -> float:
    """GFLOP of matrix multiplies that `run()` performs, as torch counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops() / 1e9


def matmul_ceiling(hidden: int, threads: int) -> float:
    """GFLOP/s of one fp32 matrix multiply of an encoder's widest shape (1024 tokens through a
    hidden x 3 hidden projection) on `threads` threads, best of five."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(1024, hidden), torch.randn(hidden, 3 * hidden)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(5):
            a @ b
        best = min(best, (time.perf_counter() - began) / 5)
    return 2 * 1024 * hidden * 3 * hidden / best / 1e9


def bound_table(
    gflop: dict[str, float],
    ceiling: float,
    threads: int,
    cpu_ms: dict[tuple[str, int], float],
    ours: str,
    peer: str,
) -> str:
    """Per client count: each server's CPU per decision and the matmul GFLOP/s it achieves,
    and the most any server doing `ours`'s work at the ceiling could reach over `peer` at equal
    CPU. `gflop` is keyed by server name, `cpu_ms` by (server name, clients)."""
    floor_ms = 1000 * gflop[ours] * threads / ceiling
    lines = [
        f"Matrix-multiply work per decision: {gflop[peer]:.2f} GFLOP {peer}, "
        f"{gflop[ours]:.2f} GFLOP {ours}; one fp32 matmul of this checkpoint's shape runs "
        f"at {ceiling:.0f} GFLOP/s on {threads} thread(s), so {ours}'s work cannot take "
        f"less than {floor_ms:.1f} ms of CPU per decision.\n",
        f"| clients | {peer} CPU ms/dec | its matmul GFLOP/s per core | {ours} CPU ms/dec | "
        "its matmul GFLOP/s per core | bound on the ratio at equal CPU |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted(clients for name, clients in cpu_ms if name == peer):
        theirs_ms, ours_ms = cpu_ms[(peer, n)], cpu_ms[(ours, n)]
        lines.append(
            f"| {n} | {theirs_ms:.1f} | {1000 * gflop[peer] / theirs_ms:.0f} | {ours_ms:.1f} | "
            f"{1000 * gflop[ours] / ours_ms:.0f} | **{theirs_ms / floor_ms:.2f}x** |"
        )
    return "\n".join(lines)
