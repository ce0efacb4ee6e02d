"""The peer for bench/validation.py: FastAPI + pydantic with Decidealot's validation rules.

The same request schema (strict unknown fields, discriminated questions, 1-255 choice options,
2-10 score levels, noul criteria keyed by true/false, up to 1024 questions, the unknown-model
value error, the config schema) and the same static /v1/models listing, served by uvicorn with
one worker. Decisions are not implemented: only the validation path is measured.

    python bench/peer_fastapi.py --port 8090
"""

import argparse
import math
from typing import Annotated, Any, Literal

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from decidealot import registry

Text = str | dict[str, Any] | list[Any]
MODELS = [info for name in ("laya", "von") for info in registry.descriptor(name).selectors]
NAMES = {info.name for info in MODELS}
Name = Annotated[str, StringConstraints(min_length=1, max_length=128)]
Label = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoulCriteria(Strict):
    true: Text | None = None
    false: Text | None = None


class Choice(Strict):
    type: Literal["choice"]
    instructions: Text | None = None
    criteria: Annotated[dict[Label, Text | None], Field(min_length=1, max_length=255)]


class Score(Strict):
    type: Literal["score"]
    instructions: Text | None = None
    criteria: Annotated[list[Text], Field(min_length=2, max_length=10)]


class Noul(Strict):
    type: Literal["noul"]
    instructions: Text | None = None
    criteria: NoulCriteria | None = None


Question = Annotated[Choice | Score | Noul, Field(discriminator="type")]


class SystemOneRequest(Strict):
    model: str
    state: Text
    questions: Annotated[dict[Name, Question], Field(min_length=1, max_length=1024)]
    config: dict[str, Any] = {}

    @model_validator(mode="after")
    def known_model(self) -> "SystemOneRequest":
        if self.model not in NAMES:
            raise ValueError(f"unknown model {self.model!r}; use a name returned by GET /v1/models")
        temperature = self.config.get("temperature")
        if set(self.config) - {"temperature"} or (self.config and not self.model.startswith("clm")):
            raise ValueError("config accepts only temperature, and only for CLM")
        if temperature is not None and not (
            isinstance(temperature, int | float) and math.isfinite(temperature)
            and 0 < temperature <= 100
        ):  # fmt: skip
            raise ValueError("temperature must be a finite number in (0, 100]")
        return self


app = FastAPI()


@app.get("/health")
def health() -> dict[str, Any]:
    return {"status": "ok", "providers": ["laya", "von"]}


@app.get("/v1/models")
def models() -> dict[str, Any]:
    return {"models": [{"name": m.name, "description": m.description,
                        "release_date": m.release_date} for m in MODELS]}  # fmt: skip


@app.post("/v1/systemone")
def systemone(request: SystemOneRequest) -> dict[str, Any]:
    return {"model": request.model, "answers": {}, "usage": {"input_tokens": 0, "output_tokens": 0}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8090)
    port = parser.parse_args().port
    uvicorn.run(app, host="127.0.0.1", port=port, workers=1, log_level="warning", access_log=False)
