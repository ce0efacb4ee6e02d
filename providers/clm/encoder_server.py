"""`decidealot encoder`: a local OpenAI-compatible `/v1/embeddings` server for CLM.

Last-token pooling and unit norm (as vLLM's pooler): the vectors the CLM head was trained on.
Over-long inputs keep their tail (CLM puts the question last). Importing this module is
torch-free: the model loads in the server's worker.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, get_args

import msgspec
from litestar import Litestar, Request, get, post
from litestar.datastructures import State
from litestar.params import JSONBody
from litestar.response import Response

from decidealot import config, tracing

if TYPE_CHECKING:
    import numpy as np

Dtype = Literal["auto", "float32", "bfloat16", "float16"]


class EncoderOptions(msgspec.Struct, frozen=True):
    model: str = "Qwen/Qwen3-8B"
    served_name: str = "qwen3-8b"
    device: str = "auto"
    dtype: Dtype = "auto"  # bfloat16 on CUDA (as the reference encoder runs), float32 on CPU
    max_tokens: int = 2048
    batch_size: int = 32


class LastTokenEncoder:
    """The sentence-transformers pipeline: transformer, last-token pooling, unit norm."""

    def __init__(self, options: EncoderOptions):
        import torch
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer import modules

        device = options.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = options.dtype
        if dtype == "auto":
            dtype = "bfloat16" if device == "cuda" else "float32"
        transformer = modules.Transformer(
            options.model,
            max_seq_length=options.max_tokens,
            model_kwargs={"dtype": getattr(torch, dtype)},
        )
        transformer.tokenizer.truncation_side = "left"
        width = transformer.get_embedding_dimension()
        pooling = modules.Pooling(width, pooling_mode="lasttoken")
        stack = [transformer, pooling, modules.Normalize()]
        self._model = SentenceTransformer(modules=stack, device=device)
        self._batch_size = options.batch_size
        self.width = width

    def encode(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        """-> ([n, width] float32 unit vectors, tokens used per text)."""
        features = self._model.preprocess(texts)
        tokens = [int(n) for n in features["attention_mask"].sum(dim=1).tolist()]
        vectors = self._model.encode(
            texts, batch_size=self._batch_size, convert_to_numpy=True, show_progress_bar=False
        )
        return vectors.astype("float32", copy=False), tokens


class EmbeddingsRequest(msgspec.Struct):
    """OpenAI's request; fields it does not use (`user`, …) are ignored."""

    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


def _error(status: int, message: str, kind: str) -> Response[dict[str, Any]]:
    return Response({"error": {"message": message, "type": kind}}, status_code=status)


@post("/v1/embeddings", status_code=200)
async def embeddings(
    data: JSONBody[EmbeddingsRequest], state: State, request: Request[Any, Any, Any]
) -> Response[dict[str, Any]]:
    with tracing.span(
        "POST /v1/embeddings",
        kind="server",
        parent=tracing.extract(dict(request.scope["headers"])),
        attributes={"http.request.method": "POST", "http.route": "/v1/embeddings"},
    ) as span:
        response = await _embeddings(data, state)
        status = response.status_code or 200  # unset: the route's own
        span.set({"http.response.status_code": status})
        if status >= 400:
            span.fail(str(status))
        return response


async def _embeddings(data: EmbeddingsRequest, state: State) -> Response[dict[str, Any]]:
    encoder: LastTokenEncoder = state.encoder
    served: str = state.served_name
    if data.model is not None and data.model != served:
        return _error(404, f"model {data.model!r} is not served here; use {served!r}", "NotFound")
    if data.dimensions is not None and data.dimensions != encoder.width:
        return _error(400, f"dimensions must be {encoder.width} for this model", "BadRequest")
    texts = [data.input] if isinstance(data.input, str) else data.input
    if not texts:
        return _error(400, "input must not be empty", "BadRequest")
    async with state.lock:  # one forward pass at a time
        with tracing.span("encode", texts=len(texts)) as span:
            vectors, tokens = await asyncio.to_thread(encoder.encode, texts)
            span.set(tokens=sum(tokens))
    if data.encoding_format == "base64":
        embeddings = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
    else:
        embeddings = vectors.tolist()
    items = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(embeddings)]
    usage = {"prompt_tokens": sum(tokens), "total_tokens": sum(tokens)}
    return Response({"object": "list", "data": items, "model": served, "usage": usage})


@get("/v1/models")
async def models(state: State) -> dict[str, Any]:
    model = {"id": state.served_name, "object": "model", "owned_by": "decidealot"}
    return {"object": "list", "data": [model]}


@get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


def create_encoder_app(options: EncoderOptions) -> Litestar:
    """Load the model and build the app, in the server's worker (where the tracer must live)."""
    tracing.setup(config.Settings(trace_exporters=config.trace_exporters(os.environ)))
    encoder = LastTokenEncoder(options)
    state = State({"encoder": encoder, "served_name": options.served_name, "lock": asyncio.Lock()})
    return Litestar([embeddings, models, health], state=state, on_shutdown=[tracing.shutdown])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="decidealot encoder",
        description="Serve an OpenAI-compatible /v1/embeddings endpoint for CLM.",
        argument_default=argparse.SUPPRESS,  # an option not given keeps EncoderOptions' default
    )
    parser.add_argument("--model", help="local path or hub id")
    parser.add_argument(
        "--served-model-name", dest="served_name", help="the model name requests must use"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", choices=get_args(Dtype))
    parser.add_argument("--max-tokens", type=int, help="longer inputs keep their last tokens")
    parser.add_argument("--batch-size", type=int)
    args = parser.parse_args(argv)
    try:  # checked here, before the worker starts, so a bad value is one line
        config.trace_exporters(os.environ)
    except config.ConfigError as exc:
        print(f"decidealot encoder: {exc}", file=sys.stderr)
        return 2
    options = msgspec.convert(vars(args), EncoderOptions)  # host and port are the server's
    from granian.constants import Interfaces
    from granian.server import Server

    server = Server(
        target="decidealot.providers.clm.encoder_server:create_encoder_app",
        address=args.host,
        port=args.port,
        interface=Interfaces.ASGI,
        workers=1,
    )
    server.serve(target_loader=partial(create_encoder_app, options), wrap_loader=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
