"""`JobChannel.end`: when the engine behind a channel goes, so do the gauges of the checkpoints
it reported, and a `Loaded` frame that arrives after that (a dying worker's last words) sets
none. tests/e2e/test_switching.py checks the same over every unload path of a real server."""

from __future__ import annotations

import logging

from decidealot import metrics
from decidealot.errors import ProviderUnavailable
from decidealot.frames import Loaded
from decidealot.providers.gateway.job_channel import JobChannel

GAUGE = "decidealot_int8_linear_share"


def share(provider: str, checkpoint: str) -> float | None:
    labels = {"provider": provider, "checkpoint": checkpoint}
    return metrics.REGISTRY.collectors.get_sample_value(GAUGE, labels)


def loaded(checkpoint: str, int8_layers: int) -> Loaded:
    return Loaded(
        checkpoint, f"/models/{checkpoint}", "int8", 4, int8_layers, [], "int8", "requested"
    )


def precision_series(provider: str) -> list[dict[str, str]]:
    """`decidealot_precision_info`'s label sets for `provider`."""
    (family,) = [
        f for f in metrics.REGISTRY.collectors.collect() if f.name == "decidealot_precision_info"
    ]
    return [s.labels for s in family.samples if s.labels["provider"] == provider]


async def test_ending_a_channel_removes_its_checkpoints_gauges_and_fails_its_jobs() -> None:
    log = logging.getLogger("test")
    channel, other = JobChannel("gauged", log), JobChannel("other", log)
    channel.deliver(loaded("first", 4))
    channel.deliver(loaded("second", 2))
    other.deliver(loaded("first", 1))
    waiting = channel.open(1)
    assert (share("gauged", "first"), share("gauged", "second")) == (1.0, 0.5)
    assert sorted(s["checkpoint"] for s in precision_series("gauged")) == ["first", "second"]
    assert set(channel.loads) == {"first", "second"}  # what GET /v1/status shows
    channel.deliver(Loaded("first", "/models/first", "fp32", 4, 0, [], "auto", "auto on a CPU"))
    (first,) = [s for s in precision_series("gauged") if s["checkpoint"] == "first"]
    assert (first["precision"], first["reason"]) == ("fp32", "auto on a CPU")  # one series a key

    channel.end("gone")
    assert (share("gauged", "first"), share("gauged", "second")) == (None, None)
    assert precision_series("gauged") == [] and channel.loads == {}
    assert share("other", "first") == 0.25  # another provider's checkpoint of the same name
    assert isinstance(waiting.exception(), ProviderUnavailable)

    channel.deliver(loaded("third", 4))  # after the end: no series for it
    assert share("gauged", "third") is None
    other.end("gone")
    assert share("other", "first") is None
