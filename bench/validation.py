"""Validation-path throughput: Decidealot vs a FastAPI + pydantic peer, side by side.

Measures, for each server: a 3-question request rejected with 422 (a score with one level, an
unknown choice field and an unknown config key, so every layer of validation runs), and
`GET /v1/models`. Decidealot runs as `decidealot serve` would (granian, one process) over the
test launcher's fake providers, which the validation path and the catalog never reach; the
peer (bench/peer_fastapi.py) runs on uvicorn with one worker. Not a test.

    .venv/bin/python bench/validation.py [--seconds 5] [--clients 1,16]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import loadgen

REJECTED = json.dumps(
    {
        "model": "von",
        "state": {"ticket": "A customer reports repeated failures after setup.", "tier": "gold"},
        "questions": {
            "route": {"type": "choice", "criteria": {"billing": "a", "technical": "b"}, "w": 1},
            "urgency": {"type": "score", "criteria": ["routine"]},
            "needs_review": {"type": "noul", "instructions": "Is review needed?"},
        },
        "config": {"temperature": 0.5},
    }
).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", default="1,16")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    root = loadgen.ROOT
    ours, peer = loadgen.free_port(), loadgen.free_port()
    env = {
        "DECIDEALOT_HOST": "127.0.0.1",
        "DECIDEALOT_PORT": str(ours),
        "DECIDEALOT_LOG_LEVEL": "warning",
        "PYTHONPATH": str(root),
    }
    results = []
    with (
        loadgen.server(
            [loadgen.python(), "-m", "tests.support.launcher"], port=ours, env=env
        ) as ours_url,
        loadgen.server(
            [loadgen.python(), str(root / "bench" / "peer_fastapi.py"), "--port", str(peer)],
            port=peer,
            env={"PYTHONPATH": str(root)},
        ) as peer_url,
    ):
        for name, base in (("decidealot", ours_url), ("fastapi+pydantic", peer_url)):
            check = loadgen.drive_raw(name, base + "/v1/systemone", lambda _: REJECTED,
                                  clients=1, seconds=0.2, expect=422)  # fmt: skip
            assert check.errors == 0, f"{name} did not answer 422"
        for what, path, method, body, expect in (
            ("422 rejection", "/v1/systemone", "POST", REJECTED, 422),
            ("GET /v1/models", "/v1/models", "GET", b"", 200),
        ):
            rows = []
            for n in clients:
                for name, base in (("decidealot", ours_url), ("fastapi+pydantic", peer_url)):
                    bodies = lambda _, b=body: b  # noqa: E731
                    rows.append(
                        loadgen.drive_raw(
                            name,
                            base + path,
                            bodies,
                            clients=n,
                            seconds=args.seconds,
                            expect=expect,
                            method=method,
                        )
                    )
            results.append((what, rows))
    for what, rows in results:
        print(f"\n### {what}\n")
        print(loadgen.table(rows, baseline="fastapi+pydantic"))


if __name__ == "__main__":
    main()
