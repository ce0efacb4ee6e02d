"""Laya's routing of a huge state over a real `decidealot serve` (tiny random checkpoints, CPU).

Routing reads every line of every string value, as upstream `laya.lang.analyse` does (about
1 s for a 2 MiB structured state on one core), so a state past `INLINE_DETECTION_COST` is
routed off the event loop: while such a request routes, `/health` keeps answering at once, and
the request routes where upstream's router sends the same state.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import msgspec
import pytest

from tests.support.checkpoints import TinyCheckpoints, laya_settings
from tests.support.servers import RunningServer, start_server, while_health_polls

upstream_router = pytest.importorskip("laya.router")

STALL_SECONDS = 1.0
"""A /health answer slower than this means the loop was held (routing holds it for seconds)."""

LINE = "The customer says the invoice was charged twice and wants a refund today."
NOUL = {"type": "noul", "instructions": "Is this a billing question?"}


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyCheckpoints
) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("laya-routing")
    checkpoints = laya_settings(tiny.laya_all())
    server = start_server(
        folder,
        launcher="decidealot",
        args=("serve",),
        DECIDEALOT_VON_ENABLED="false",
        DECIDEALOT_DEVICE="cpu",
        DECIDEALOT_TORCH_THREADS="1",
        **checkpoints,
    )
    yield server
    assert server.stop() == 0


def _huge_state(limit: int) -> dict[str, str]:
    """Close to the body limit, in many English fields, one German message near the end."""
    fields = {f"note{i}": f"{LINE} ({i})" for i in range(limit // (len(LINE) + 27))}
    fields["note3"] = "Mein Konto wurde zweimal belastet, bitte helfen Sie mir heute."
    return dict(reversed(fields.items()))


def test_routing_a_huge_state_does_not_hold_the_loop(served: RunningServer) -> None:
    small = {"model": "laya", "state": LINE, "questions": {"billing": NOUL}}
    warm = httpx.post(served.url + "/v1/systemone", json=small, timeout=120)
    assert warm.status_code == 200, warm.text

    state = _huge_state(2 * 1024 * 1024 - 4096)
    body = msgspec.json.encode({"model": "laya", "state": state, "questions": {"billing": NOUL}})
    assert len(body) < 2 * 1024 * 1024
    timed = while_health_polls(served.url, "/v1/systemone", body)

    assert timed.response.status_code == 200, timed.response.text[:500]
    assert timed.health_polls > 5
    slowest = timed.slowest_health
    assert slowest < STALL_SECONDS, f"/health took {slowest:.2f} s while the state routed"
    # Routing on the loop holds one /health for all of the routing, a good part of the request,
    # on a fast machine as on a slow one: a quiet Zen 4 answers this state in 2.1 s, of which
    # routing inline held /health for 0.78 s, under STALL_SECONDS; only the ratio caught it.
    assert slowest < timed.seconds / 5, (slowest, timed.seconds)

    upstream = upstream_router.Router(auto_task_detection=True)
    expected = upstream.route(state, {"billing": NOUL})["model"]
    assert expected == "multilingual"  # the German field, far past the 4000-character window
    assert timed.response.json()["model"] == f"laya-{expected}"
