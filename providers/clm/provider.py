"""The CLM provider (gateway side; never imports torch, even indirectly).

A decision renders every question's state text and option texts, bounds each by
`clm_max_text_bytes` UTF-8 bytes (422, never truncated), embeds state texts (always fresh) and
option texts (cached) at the configured endpoint, and sends the raw vectors to the head in its
worker (`providers.clm.engine`, layout documented there). `usage.input_tokens` is the
encoder's `prompt_tokens` for the calls actually made.

Serial lane: by default the whole decision (encoder calls in `prepare`, and the head pass)
runs inside one residency hold of the CLM runtime (`prepares_in_lane`), on the lane the service
gives it, which it shares with Laya and Von, so the encoder (which may share the GPU or the
cores) and the head never overlap another local model's forward pass. With
`clm_parallel_with_local_models` the runtime takes no lane, the encoder calls run before the
residency hold, and only the head pass holds a slot.
"""

from __future__ import annotations

from typing import Self

from decidealot.config import Settings
from decidealot.contract import ModelInfo, SystemOneRequest
from decidealot.errors import DecisionInputError
from providers.base import LocalRuntime, PreparedRequest
from providers.clm.encoder_client import EncoderClient
from providers.clm.render import RenderedQuestion, render_question
from providers.engine import EngineSpec, Job
from providers.local import WorkerRuntime

CHECKPOINT = "clm-0.1-8b"
QWEN3_8B_WIDTH = 4096
"""The contract: exactly 4096 floats per input, Qwen3-8B's hidden size."""
RELEASE = "2026-09-19"  # contrastive-lm 0.1.0 dates its models so (clm.engine.RELEASE)

SELECTORS = (
    ModelInfo(
        "clm",
        "CLM System One decisions from the local Contrastive-LM/CLM-v0.1-8B head.",
        RELEASE,
    ),
    ModelInfo("clm-latest", "Alias for the current CLM release.", RELEASE),
    ModelInfo("clm-0.1", "Alias for the CLM v0.1 release.", RELEASE),
    ModelInfo(
        "clm-0.1-8b",
        "Contrastive-LM/CLM-v0.1-8B projection head over Qwen3-8B vectors.",
        RELEASE,
    ),
)


class ClmProvider:
    name = "clm"
    local = True
    accepts_temperature = True
    selectors = SELECTORS

    def __init__(
        self,
        encoder: EncoderClient,
        runtime: LocalRuntime,
        *,
        max_text_bytes: int,
        prepares_in_lane: bool = True,
    ):
        """`prepares_in_lane`: the encoder calls run inside the residency hold, on the lane."""
        self._encoder = encoder
        self.runtime = runtime
        self._max_text_bytes = max_text_bytes
        self.prepares_in_lane = prepares_in_lane

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        """The head's worker runtime and the encoder client for the configured URL."""
        head = settings.clm_head
        spec = EngineSpec(
            factory="providers.clm.engine:create",
            checkpoints={} if head is None else {CHECKPOINT: str(head)},
            preload=[CHECKPOINT],
            torch_threads=settings.torch_threads,
            options={"width": QWEN3_8B_WIDTH},
        )
        return cls(
            EncoderClient.from_settings(settings, width=QWEN3_8B_WIDTH),
            WorkerRuntime(cls.name, spec, settings),  # resolves the device
            max_text_bytes=settings.clm_max_text_bytes,
            prepares_in_lane=not settings.clm_parallel_with_local_models,
        )

    async def start(self) -> None:
        await self._encoder.start()

    async def close(self) -> None:
        await self._encoder.close()
        await self.runtime.unload()

    async def models(self) -> list[ModelInfo]:
        return list(self.selectors)

    async def prepare(self, selector: str, request: SystemOneRequest) -> PreparedRequest:
        """Render and bound every text, embed them, and pack the vectors into the head's job;
        the encoder's prompt tokens are the gateway's share of `usage.input_tokens`."""
        rendered = {
            name: self._bounded(name, render_question(request.state, question))
            for name, question in request.questions.items()
        }
        states = await self._encoder.embed([r.state_text for r in rendered.values()], cache=False)
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
        return PreparedRequest(job, states.prompt_tokens + options.prompt_tokens)

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
