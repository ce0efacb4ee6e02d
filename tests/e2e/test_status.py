"""`GET /v1/status`, the `decidealot_precision_info` gauge and the load log line: an operator
sees what runs, in what precision and why.

The real `decidealot serve` runs the tiny Laya and Von checkpoints under the default
`DECIDEALOT_PRECISION=auto`. What `auto` chooses depends on this machine's CPU, so the expected
answers are computed from its flags (tests/worker/test_bf16.py covers every CPU kind by
injecting them): on a CPU with bf16 units Von's tiny checkpoint runs bf16, and Laya's wide one
moves the probe too far under bf16 and falls back to fp32 (a warning says so); elsewhere both
run fp32.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from decidealot import cpu
from decidealot.providers.laya import calibration as laya_file
from tests.support.app import in_process
from tests.support.checkpoints import TinyCheckpoints, laya_settings
from tests.support.servers import GATEWAY, RunningServer, start_server

KEY = "st4tus-Key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CALIBRATION: dict[str, Path] = {}
"""The calibration file the server's english checkpoint runs with (`path`)."""
DECISION = {"state": "Ticket: charged twice.", "questions": {"refund": {"type": "noul"}}}


@pytest.fixture(scope="module")
def server(
    tiny: TinyCheckpoints, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    laya = tiny.laya_all()
    folder = tmp_path_factory.mktemp("status")
    fitted = laya_file.payload([1.2, 0.8, 1.5], {}, model_id_or_path=None, config=None)
    CALIBRATION.update(path=folder / "english-calibration.json")
    CALIBRATION["path"].write_text(json.dumps(fitted))
    started = start_server(
        folder,
        launcher="decidealot",
        args=("serve",),
        DECIDEALOT_API_KEY=KEY,
        DECIDEALOT_DEVICE="cpu",
        DECIDEALOT_TORCH_THREADS="1",
        DECIDEALOT_MAX_RESIDENT_PROVIDERS="2",
        DECIDEALOT_VON_CHECKPOINT=str(tiny.von(independent_options=False)),
        DECIDEALOT_LAYA_ENGLISH_CALIBRATION=str(CALIBRATION["path"]),
        **laya_settings(laya),
    )
    try:
        yield started
    finally:
        started.stop()


def _expected() -> dict[str, tuple[str, str]]:
    """(precision, start of the reason) per provider on this machine's CPU."""
    units = cpu.bf16_units(cpu.flags())
    if not units:
        reason = "auto on a CPU with none of amx_bf16, avx512_bf16"
        return {"laya": ("fp32", reason), "von": ("fp32", reason)}
    reason = f"auto on a CPU with {', '.join(units)}"
    return {"laya": ("fp32", reason + "; the load probe moved"), "von": ("bf16", reason)}


@pytest.mark.slow  # a real server: the full suite, not the quick loop
def test_status_says_what_runs_and_why(server: RunningServer) -> None:
    assert httpx.get(server.url + "/v1/status").status_code == 401  # behind the key
    for model in ("laya-english", "von"):
        body = {"model": model, **DECISION}
        response = httpx.post(server.url + "/v1/systemone", json=body, headers=AUTH, timeout=120)
        assert response.status_code == 200, response.text
    status = httpx.get(server.url + "/v1/status", headers=AUTH).json()
    assert status["status"] == "ok" and status["precision"] == "auto"
    flags = cpu.flags()
    assert status["cpu"] == {
        "bf16_units": list(cpu.bf16_units(flags)),
        "int8_units": list(cpu.int8_units(flags)),
    }
    providers = {p["name"]: p for p in status["providers"]}
    assert providers["clm"] == {
        "name": "clm", "enabled": False, "local": True, "loaded": None, "device": None,
        "running": 0, "checkpoints": [], "details": {},
    }  # fmt: skip
    assert providers["jev"]["enabled"] is False
    expected = _expected()
    for name in ("laya", "von"):
        provider = providers[name]
        assert provider["enabled"] and provider["local"] and provider["loaded"]
        assert provider["device"] == "cpu" and provider["running"] == 0
        (checkpoint,) = provider["checkpoints"]
        precision, reason = expected[name]
        assert checkpoint["precision"] == precision and checkpoint["requested"] == "auto"
        assert checkpoint["reason"].startswith(reason), checkpoint
        assert checkpoint["verified"] is None  # local checkpoints: no install record
        assert checkpoint["int8_share"] == 0.0
        assert Path(checkpoint["folder"]).is_dir()
    (english,) = providers["laya"]["checkpoints"]
    assert english["calibration"] == str(CALIBRATION["path"])  # the setting's file
    assert providers["von"]["checkpoints"][0]["calibration"] is None  # its shipped map
    assert sorted(status["slots"]["held_by"]) == ["laya", "von"]
    assert status["slots"]["total"] == 2
    assert status["decisions"] == {"queued": 0, "running": 0, "limit": 64}


@pytest.mark.slow  # a real server: the full suite, not the quick loop
def test_the_gauge_and_the_log_line_say_the_same_per_checkpoint(server: RunningServer) -> None:
    for model in ("laya-english", "von"):
        body = {"model": model, **DECISION}
        assert httpx.post(server.url + "/v1/systemone", json=body, headers=AUTH).status_code == 200
    status = httpx.get(server.url + "/v1/status", headers=AUTH).json()
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "decidealot_precision_info"
    ]
    series = {(s.labels["provider"], s.labels["checkpoint"]): s for s in family.samples}
    lines = server.log_lines()
    for provider in ("laya", "von"):
        (checkpoint,) = next(p for p in status["providers"] if p["name"] == provider)["checkpoints"]
        sample = series[(provider, checkpoint["name"])]
        assert sample.value == 1
        assert {k: sample.labels[k] for k in ("precision", "requested", "reason")} == {
            k: checkpoint[k] for k in ("precision", "requested", "reason")
        }
        said = [line for line in lines if f"{provider} checkpoint {checkpoint['name']} (" in line]
        assert len(said) == 1, said  # once per load
        assert f"runs {checkpoint['precision']} (DECIDEALOT_PRECISION=auto: " in said[0]
        fell_back = "load probe" in checkpoint["reason"]
        assert ('"warning"' in said[0]) == fell_back, said[0]


def test_status_on_the_fakes_lists_every_provider_the_slots_and_the_admission_limit(
    tmp_path: Path,
) -> None:
    """In-process, on the fakes (the real providers' details: tests/unit/test_jev.py,
    tests/worker/test_clm_provider.py): every registered provider enabled, nothing loaded."""
    with in_process(tmp_path, **GATEWAY, DECIDEALOT_MAX_PENDING_REQUESTS="7") as app:
        status = app.client.get("/v1/status").json()
        providers = {p["name"]: p for p in status["providers"]}
        assert {name for name, p in providers.items() if p["enabled"]} >= {
            "laya",
            "von",
            "clm",
            "jev",
        }
        assert providers["jev"]["local"] is False and providers["jev"]["loaded"] is None
        assert not any(providers[name]["loaded"] for name in ("laya", "von", "clm"))
        assert status["decisions"] == {"queued": 0, "running": 0, "limit": 7}
        assert status["slots"] == {"total": 3, "held_by": []}
