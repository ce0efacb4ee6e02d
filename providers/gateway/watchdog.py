"""The pass watchdog: a worker counts as hung when one forward pass runs past
`DECIDEALOT_PROVIDER_TIMEOUT_SECONDS`, or when jobs wait, no pass runs and it has said nothing
for as long as a start may take (`DECIDEALOT_PROVIDER_START_TIMEOUT_SECONDS`: preparing a job
may load a checkpoint on first use). It times passes, not jobs (the worker announces each pass
with `PassBegun` and reports it with `PassDone`), so a request of many passes never trips it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from decidealot.config import Settings
from decidealot.providers.gateway.job_channel import JobChannel


def overdue(
    channel: JobChannel, now: float, pass_timeout: float, silence_timeout: float
) -> str | None:
    """Why the worker counts as hung: a pass ran past `pass_timeout`, or jobs wait while
    no pass runs and it has said nothing for `silence_timeout` (preparing a job, which may
    load a checkpoint on first use, gets as long as a start)."""
    if any(now - began > pass_timeout for began in channel.passes.values()):
        return f"ran one pass for over {pass_timeout:g} s"
    if channel.inflight and not channel.passes and now - channel.heard_at > silence_timeout:
        return f"answered nothing for over {silence_timeout:g} s"
    return None


async def watch(channel: JobChannel, alive: Callable[[], bool], settings: Settings) -> str | None:
    """Check `channel` a few times per pass timeout while `alive()`; why the worker is hung,
    or None once it is no longer alive."""
    timeout = settings.provider_timeout_seconds
    silence = max(timeout, settings.provider_start_timeout_seconds)
    loop = asyncio.get_running_loop()
    while alive():
        await asyncio.sleep(min(timeout / 4, 1.0))
        why = overdue(channel, loop.time(), timeout, silence) if alive() else None
        if why is not None:
            return why
    return None
