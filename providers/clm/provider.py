"""The CLM provider (gateway side; never imports torch, even indirectly).

A decision renders every question's state text and option texts, bounds each by
`clm_max_text_bytes` UTF-8 bytes (422, never truncated), embeds state texts (always fresh) and
option texts (cached) at the configured endpoint, and sends the raw vectors to the head in its
worker (`providers.clm.engine`, layout documented there). `usage.input_tokens` is the
encoder's `prompt_tokens` for the calls actually made.

Serial lane: by default the whole decision (encoder calls and head pass) runs inside one
residency hold of the CLM runtime, on the lane `providers.local.lane_for` gives it, which it
shares with Laya and Von, so the encoder (which may share the GPU or the cores) and the head
never overlap another local model's forward pass. With `clm_parallel_with_local_models` the
runtime takes no lane, the encoder calls run outside residency, and only the head pass holds
a slot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol, Self

from decidealot.catalog import LOCAL_MODELS
from decidealot.config import Settings
from decidealot.contract import ModelInfo, SystemOneRequest, SystemOneResponse, Usage
from decidealot.errors import DecisionInputError
from decidealot.residency import Residency
from providers.base import JobRunner, LocalRuntime
from providers.clm.encoder_client import EncoderClient
from providers.clm.render import RenderedQuestion, render_question
from providers.engine import Decision, EngineSpec, Job

CHECKPOINT = "clm-0.1-8b"
QWEN3_8B_WIDTH = 4096
"""The contract: exactly 4096 floats per input, Qwen3-8B's hidden size."""


class _Submitter(Protocol):
    async def submit(self, job: Job) -> Decision: ...


class _Submit:
    """Runs a job on the runtime directly, for callers already inside its residency hold."""

    def __init__(self, runtime: _Submitter):
        self._runtime = runtime

    async def run(self, job: Job) -> Decision:
        return await self._runtime.submit(job)


class ClmProvider:
    name = "clm"
    local = True

    def __init__(
        self,
        encoder: EncoderClient,
        runner: JobRunner,
        *,
        max_text_bytes: int,
        hold: Callable[[], AbstractAsyncContextManager[object]] | None = None,
        runtime: LocalRuntime | None = None,
    ):
        """`hold` opens the scope the encoder calls and `runner` run in together (the
        residency hold in the serial-lane setup); `runtime` is unloaded on close."""
        self._encoder = encoder
        self._runner = runner
        self._max_text_bytes = max_text_bytes
        self._hold = hold or contextlib.nullcontext
        self._runtime = runtime

    @classmethod
    def from_settings(cls, settings: Settings, residency: Residency) -> Self:
        """The head's worker runtime, registered with residency on its lane (none when CLM may
        overlap local models), and the encoder client for the configured URL."""
        from decidealot.bundles import checkpoint_path
        from providers.local import ResidentRunner, WorkerRuntime, lane_for

        spec = EngineSpec(
            factory="providers.clm.engine:create",
            checkpoints={CHECKPOINT: str(checkpoint_path(settings, CHECKPOINT))},
            preload=[CHECKPOINT],
            torch_threads=settings.torch_threads,
            options={"width": QWEN3_8B_WIDTH},
        )
        runtime = WorkerRuntime(cls.name, spec, settings)  # resolves the device
        encoder = EncoderClient.from_settings(settings, width=QWEN3_8B_WIDTH)
        residency.register(runtime, *lane_for(cls.name, runtime.device, settings))
        if settings.clm_parallel_with_local_models:
            runner: JobRunner = ResidentRunner(runtime, residency)
            return cls(encoder, runner, max_text_bytes=settings.clm_max_text_bytes, runtime=runtime)
        return cls(
            encoder,
            _Submit(runtime),
            max_text_bytes=settings.clm_max_text_bytes,
            hold=lambda: residency.use(runtime),
            runtime=runtime,
        )

    async def start(self) -> None:
        await self._encoder.start()

    async def close(self) -> None:
        await self._encoder.close()
        if self._runtime is not None:
            await self._runtime.unload()

    async def models(self) -> list[ModelInfo]:
        return list(LOCAL_MODELS[self.name])

    async def decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        rendered = {
            name: self._bounded(name, render_question(request.state, question))
            for name, question in request.questions.items()
        }
        async with self._hold():
            states = await self._encoder.embed(
                [r.state_text for r in rendered.values()], cache=False
            )
            options = await self._encoder.embed(
                [c.text for r in rendered.values() for c in r.candidates], cache=True
            )
            vectors = bytearray()
            option_at = 0
            for state_row, question in zip(states.rows, rendered.values(), strict=True):
                count = len(question.candidates)
                vectors += state_row + b"".join(options.rows[option_at : option_at + count])
                option_at += count
            job = Job(
                checkpoint=CHECKPOINT,
                state=request.state,
                questions=request.questions,
                config=request.config,
                vectors=bytes(vectors),
            )
            decision = await self._runner.run(job)
        tokens = states.prompt_tokens + options.prompt_tokens + decision.input_tokens
        return SystemOneResponse(
            model=decision.model, answers=decision.answers, usage=Usage(input_tokens=tokens)
        )

    def _bounded(self, name: str, question: RenderedQuestion) -> RenderedQuestion:
        """Reject, never truncate: the encoder only ever sees whole texts."""
        limit = self._max_text_bytes
        size = len(question.state_text.encode())
        if size > limit:
            raise DecisionInputError(
                name,
                f"state plus instructions render to {size} UTF-8 bytes; CLM accepts at most "
                f"{limit} (DECIDEALOT_CLM_MAX_TEXT_BYTES)",
            )
        for candidate in question.candidates:
            size = len(candidate.text.encode())
            if size > limit:
                raise DecisionInputError(
                    name,
                    f"option text renders to {size} UTF-8 bytes; CLM accepts at most {limit} "
                    "(DECIDEALOT_CLM_MAX_TEXT_BYTES)",
                    loc=candidate.loc,
                )
        return question
