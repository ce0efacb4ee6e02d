"""Check an environment against requirements.lock: torch at its pin and every other installed
distribution at the locked version, so that no install step quietly took something else.

Usage: python .ci/locked.py requirements.lock TORCH_VERSION [NAME ...]
NAMEs are installed on purpose without the lock (CI's --no-deps parity packages). Besides
torch, only what torch's own wheel index brings (CUDA libraries, triton) may be unlocked.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

from packaging.utils import canonicalize_name

_WITH_TORCH = re.compile(r"^(nvidia-.*|cuda-.*|triton|pytorch-triton.*)$")


def main(lock_path: str, torch_version: str, *unlocked: str) -> int:
    pins: dict[str, str] = {}
    with open(lock_path) as lock:
        for line in lock:
            if match := re.match(r"^([A-Za-z0-9._-]+)(?:\[[^]]*\])?==([^\s;]+)", line):
                pins[canonicalize_name(match[1])] = match[2]
    allowed = {canonicalize_name(name) for name in ("decidealot", *unlocked)}
    problems = []
    for dist in importlib.metadata.distributions():
        name, version = canonicalize_name(dist.metadata["Name"]), dist.version
        if name == "torch":
            if version.split("+")[0] != torch_version:
                problems.append(f"torch {version} replaced the pinned {torch_version}")
        elif name in pins:
            if version != pins[name]:
                problems.append(f"{name} {version} is installed; the lock pins {pins[name]}")
        elif name not in allowed and not _WITH_TORCH.match(name):
            problems.append(f"{name} {version} is installed but not locked (run .ci/lock)")
    for problem in sorted(problems):
        print(f"{lock_path}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
