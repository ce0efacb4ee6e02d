"""CLM as the service knows it: settings, bundle, selectors, lane and how it is built."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from decidealot.config import (
    ConfigError,
    Section,
    Settings,
    boolean,
    file,
    integer,
    seconds,
    secret,
    setting,
    text,
    url,
)
from decidealot.contract import ModelInfo
from decidealot.device import request_token_limit
from decidealot.jobs import EngineSpec
from decidealot.protocols import Provider
from decidealot.providers.clm.gateway.encoder_client import EncoderClient
from decidealot.providers.clm.gateway.provider import CHECKPOINT, QWEN3_8B_WIDTH, ClmProvider
from decidealot.providers.engine.client import ProcessRuntime
from decidealot.registry import Bundle, ProviderDescriptor, Tiny

RELEASE = "2026-09-19"  # contrastive-lm 0.1.0 dates its models so (clm.worker.engine.RELEASE)
HEAD_FILE = "CLM_v0.1-8B.pt"

SELECTORS = tuple(
    ModelInfo(name, description, RELEASE)
    for name, description in (
        ("clm", "CLM System One decisions from the local Contrastive-LM/CLM-v0.1-8B head."),
        ("clm-latest", "Alias for the current CLM release."),
        ("clm-0.1", "Alias for the CLM v0.1 release."),
        ("clm-0.1-8b", "Contrastive-LM/CLM-v0.1-8B projection head over Qwen3-8B vectors."),
    )
)


class ClmSettings(Section, frozen=True, kw_only=True):
    clm_embeddings_url: Annotated[str | None, setting(url)] = None
    clm_embeddings_model: Annotated[str, setting(text)] = "qwen3-8b"
    clm_embeddings_api_key: Annotated[str | None, setting(secret)] = None
    clm_head: Annotated[Path | None, setting(file)] = None
    clm_max_text_bytes: Annotated[int, setting(integer(low=1))] = 8192
    clm_cache_size: Annotated[int, setting(integer(low=0))] = 4096
    clm_cache_ttl_seconds: Annotated[float, setting(seconds())] = 3600.0
    clm_parallel_with_local_models: Annotated[bool, setting(boolean)] = False
    clm_encoder_timeout_seconds: Annotated[float, setting(seconds())] = 30.0
    clm_encoder_retry_seconds: Annotated[float, setting(seconds(allow_zero=True))] = 10.0


def _build(settings: Settings, section: ClmSettings) -> Provider:
    if section.clm_embeddings_url is None:
        raise ConfigError("CLM needs DECIDEALOT_CLM_EMBEDDINGS_URL")
    head = section.clm_head
    spec = EngineSpec(
        factory="decidealot.providers.clm.worker.engine:create",
        checkpoints={} if head is None else {CHECKPOINT: str(head)},
        preload=[CHECKPOINT],
        options={"width": QWEN3_8B_WIDTH},
    )
    runtime = ProcessRuntime("clm", spec, settings)  # resolves the device
    encoder = EncoderClient(
        section.clm_embeddings_url,
        section.clm_embeddings_model,
        width=QWEN3_8B_WIDTH,
        api_key=section.clm_embeddings_api_key,
        timeout_seconds=section.clm_encoder_timeout_seconds,
        retry_seconds=section.clm_encoder_retry_seconds,
        cache_size=section.clm_cache_size,
        cache_ttl_seconds=section.clm_cache_ttl_seconds,
    )
    return ClmProvider(
        encoder,
        runtime,
        selectors=SELECTORS,
        max_text_bytes=section.clm_max_text_bytes,
        max_request_tokens=request_token_limit(settings, runtime.device),
        in_lane=not section.clm_parallel_with_local_models,
    )


DESCRIPTOR = ProviderDescriptor(
    name="clm",
    order=30,
    settings=ClmSettings,
    enabled=lambda section: section.clm_embeddings_url is not None,
    switch_off="unset DECIDEALOT_CLM_EMBEDDINGS_URL to turn CLM off",
    off="CLM is off: it needs DECIDEALOT_CLM_EMBEDDINGS_URL",
    only_while_on=("clm_embeddings_api_key",),
    build=_build,
    selectors=SELECTORS,
    bundles=(Bundle(CHECKPOINT, "clm_head", entry=HEAD_FILE, entry_is="head file"),),
    lane_group="clm",
    free_of_lane=lambda section: section.clm_parallel_with_local_models,
    tiny=Tiny(
        "decidealot.providers.clm.tiny:write_bundles",
        needs="CLM's head, for use with DECIDEALOT_CLM_EMBEDDINGS_URL (4096-float vectors)",
    ),
)
