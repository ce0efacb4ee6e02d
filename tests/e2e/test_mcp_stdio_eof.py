"""`decidealot mcp` with its input piped and closed after the last line, as scripts and some
hosts do (`printf '%s\\n' "$INIT" "$CALL" | decidealot mcp`): every line is answered before the
process exits, and it exits 0.

Each run is a real `decidealot mcp --url` process forwarding to the shared gateway (fake
providers: no checkpoint to load, so a run costs about an interpreter's start). `RUNS` runs
go through the kinds of last line in turn: a listing, a garbage line, a quick decision, a
decision that is still running when the input ends (its provider sleeps), and all of those
together. Before this was fixed, most runs ending in a listing lost its answer and a decision
running at the end was answered "Connection closed" or not at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

from tests.support.servers import ROOT, RunningServer

RUNS = 20
NOUL = {"type": "noul", "instructions": "Is it?"}


def rpc(method: str, request_id: object, params: dict[str, Any] | None = None) -> str:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if request_id is not None:
        message["id"] = request_id
    if params is not None:
        message["params"] = params
    return json.dumps(message)


def decision(request_id: int, sleep: float = 0.0) -> str:
    state = {"fake": {"tag": "eof", "sleep": sleep}}
    arguments = {"model": "laya", "state": state, "questions": {"q": NOUL}}
    return rpc("tools/call", request_id, {"name": "system_one", "arguments": arguments})


OPENING = [
    rpc(
        "initialize",
        1,
        {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "piped", "version": "0"},
        },
    ),
    rpc("notifications/initialized", None),
]
LISTING = rpc("tools/list", 2, {})
GARBAGE = "{not json"
LAST_LINES: dict[str, tuple[list[str], list[object]]] = {
    "listing": ([LISTING], [1, 2]),
    "garbage": ([GARBAGE], [1, None]),
    "decision": ([decision(2)], [1, 2]),
    "slow decision": ([decision(2, sleep=0.3)], [1, 2]),
    "all of them": ([decision(2, sleep=0.3), rpc("tools/list", 3, {}), GARBAGE], [1, 2, 3, None]),
}
"""The lines after the opening, and the ids answered (null: a line whose id cannot be read)."""


def piped(url: str, lines: list[str]) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECIDEALOT_")}
    return subprocess.run(
        [sys.executable, "-m", "decidealot", "mcp", "--url", url],
        input="".join(line + "\n" for line in [*OPENING, *lines]).encode(),
        capture_output=True,
        cwd=ROOT,
        env=env | {"DECIDEALOT_LOG_LEVEL": "warning", "OMP_NUM_THREADS": "1"},
        timeout=60,
        check=False,
    )


def test_every_line_piped_before_end_of_file_is_answered(gateway: RunningServer) -> None:
    kinds = list(LAST_LINES)
    lost: list[str] = []
    for run in range(RUNS):
        kind = kinds[run % len(kinds)]
        lines, due = LAST_LINES[kind]
        done = piped(gateway.url, lines)
        answers = [json.loads(line) for line in done.stdout.decode().splitlines()]
        answered = Counter(repr(a.get("id")) for a in answers if "method" not in a)
        if done.returncode != 0 or answered != Counter(map(repr, due)):
            lost.append(f"run {run} ({kind}): exit {done.returncode}, answered {answered}")
            continue
        for answer in answers:
            assert "error" not in answer or answer["id"] is None, (kind, answer)
            result = answer.get("result", {})
            assert not result.get("isError"), (kind, answer)
        assert b"Traceback" not in done.stderr, done.stderr.decode()[-2000:]
    assert lost == [], lost


def test_a_decision_still_running_at_end_of_file_is_finished(gateway: RunningServer) -> None:
    """The input ends while the server's provider sleeps: the answer is the decision's."""
    done = piped(gateway.url, [decision(2, sleep=0.3)])
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    [answer] = [json.loads(line) for line in done.stdout.decode().splitlines()[1:]]
    assert answer["id"] == 2
    assert answer["result"]["structuredContent"]["answers"]["q"]["type"] == "noul", answer
