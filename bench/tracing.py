"""What tracing costs a request: two replicas side by side, one exporting every span.

Both are the production server over real worker subprocesses hosting the torch-free arith
engine (tests/ops_server), so the request path (HTTP, validation, admission, slot, worker
frames) is the real one and the model costs nearly nothing: what differs is tracing alone.
One replica exports to a local OTLP/HTTP receiver (tests/otlp_receiver), the other has no
OTEL_* variables. One client sends the same small request to each in turn (the order
alternates), sequentially; the table gives client-side latency.

    .venv/bin/python bench/tracing.py                 # 300 requests per replica
    .venv/bin/python bench/tracing.py --requests 1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import ops_server
from tests.otlp_receiver import OtlpReceiver

BODY = {"model": "laya", "state": {"t": "x"}, "questions": {"q": {"type": "noul"}}}
WARMUP = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="per replica")
    args = parser.parse_args()
    receiver = OtlpReceiver().start()
    with tempfile.TemporaryDirectory() as folder:
        replicas = {
            "off": ops_server.start(Path(folder, "off")),
            "on": ops_server.start(Path(folder, "on"), OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url),
        }
        latencies: dict[str, list[float]] = {name: [] for name in replicas}
        try:
            with httpx.Client(timeout=60) as http:
                for server in replicas.values():
                    for _ in range(WARMUP):
                        http.post(server.url + "/v1/systemone", json=BODY).raise_for_status()
                for index in range(args.requests):
                    order = list(replicas.items())
                    for name, server in order if index % 2 else reversed(order):
                        started = time.perf_counter()
                        http.post(server.url + "/v1/systemone", json=BODY).raise_for_status()
                        latencies[name].append((time.perf_counter() - started) * 1000)
        finally:
            for server in replicas.values():
                server.stop()
    receiver.stop()
    print("| tracing | requests | p50 ms | p95 ms |")
    print("|---|---|---|---|")
    for name, values in latencies.items():
        values.sort()
        p95 = values[int(len(values) * 0.95)]
        print(f"| {name} | {len(values)} | {statistics.median(values):.2f} | {p95:.2f} |")
    print(f"\nspans received: {len(receiver.spans)}")


if __name__ == "__main__":
    main()
