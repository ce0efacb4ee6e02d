"""`/docs` as a person uses it, over `decidealot serve` on tiny checkpoints with a key set.

The page opens on the operations and Swagger's own Authorize button (the document it loads is
public and holds no secret); a person authorizes, tries the pre-filled example and gets a
decision, in headless Chromium driven by Playwright (Debian's `chromium`, no browser
download; .ci/run installs it). Every named example of the document is sent to the same real
server and answered, in the shape of the response example beside it. The same server, run on
a terminal as a person starts it, shows what startup logs there.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from tests.support.checkpoints import TinyCheckpoints, laya_settings
from tests.support.fake_embeddings import FakeEmbeddings
from tests.support.mcp_clients import MCP_HEADERS, sse_json
from tests.support.servers import RunningServer, start_server

ROOT = Path(__file__).resolve().parents[2]
KEY = "docs-page-key-Qe4Xv7"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR|DEBUG) \S+ \[")


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyCheckpoints
) -> Iterator[RunningServer]:
    """Laya, Von and CLM (over a fake encoder) on tiny checkpoints, keyed, on a terminal, with
    every logging and device setting left to its default (tests/support/servers.py sets
    none)."""
    embeddings = FakeEmbeddings(4096).start()
    laya = laya_settings(tiny.laya_all())
    server = start_server(
        tmp_path_factory.mktemp("docs"),
        launcher="decidealot",
        args=("serve",),
        terminal=True,
        **laya,
        DECIDEALOT_VON_CHECKPOINT=str(tiny.von(independent_options=False)),
        DECIDEALOT_CLM_HEAD=str(tiny.clm(hidden=4096, width=24, proj=8, seed=3)),
        DECIDEALOT_CLM_EMBEDDINGS_URL=embeddings.url,
        DECIDEALOT_API_KEY=KEY,
        DECIDEALOT_MAX_RESIDENT_PROVIDERS="3",
        DECIDEALOT_TORCH_THREADS="1",
    )
    try:
        yield server
        assert server.stop() == 0
    finally:
        embeddings.stop()


def _shape(value: Any) -> Any:
    """What an answer's numbers leave out: keys, answer types, the model that answered."""
    if isinstance(value, dict):
        return {k: v if k in ("type", "model") else _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value]
    return type(value).__name__ if not isinstance(value, int | float) else "number"


def test_the_document_and_the_page_are_public_and_hold_no_key(served: RunningServer) -> None:
    document = httpx.get(served.url + "/openapi.json")
    assert document.status_code == 200
    assert KEY not in document.text
    assert document.json()["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert httpx.get(served.url + "/v1/models").status_code == 401  # the operations still ask
    slash = httpx.get(served.url + "/docs/")
    assert slash.status_code == 308 and slash.headers["location"] == "../docs"
    followed = httpx.get(served.url + "/docs/", follow_redirects=True)
    assert followed.status_code == 200 and str(followed.url) == served.url + "/docs"
    assert followed.text == httpx.get(served.url + "/docs").text


def test_every_example_is_answered_as_the_document_shows(served: RunningServer) -> None:
    """Each named request example, sent as it is, gets a 200 whose shape is its response
    example's; every response example is valid under the document's own schema."""
    document = httpx.get(served.url + "/openapi.json").json()
    sent = 0
    for path, operations in document["paths"].items():
        body = operations.get("post", {}).get("requestBody", {}).get("content", {})
        named = body.get("application/json", {}).get("examples", {})
        answers = operations.get("post", {}).get("responses", {}).get("200", {}).get("content", {})
        for name, example in named.items():
            headers = {**MCP_HEADERS, **AUTH} if path == "/mcp" else AUTH
            response = httpx.post(
                served.url + path, json=example["value"], headers=headers, timeout=120
            )
            assert response.status_code == 200, (path, name, response.text)
            sent += 1
            if path == "/mcp":
                reply = sse_json(response)
                assert "error" not in reply and not reply["result"].get("isError"), reply
                continue
            (media,) = answers.values()
            root = {"components": document["components"], **media["schema"]}
            shown = media["examples"][name]["value"]
            jsonschema.Draft202012Validator(root).validate(shown)
            assert _shape(response.json()) == _shape(shown), (path, name)
    assert sent == 4 + 1 + 2  # choice, score, noul, CLM; a batch; MCP's tools/list and a call
    names = list(document["paths"]["/v1/systemone"]["post"]["requestBody"]["content"][
        "application/json"]["examples"])  # fmt: skip
    assert names == ["choice", "score", "noul", "clm-temperature"]


def _chromium() -> str:
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing; .ci/run installs Debian's chromium")
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")


def test_a_person_authorizes_tries_the_example_and_gets_a_decision(
    served: RunningServer, tmp_path: Path, record_property: Any
) -> None:
    from playwright.sync_api import expect, sync_playwright

    executable = _chromium()
    screenshot = tmp_path / "docs-page.png"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            page.goto(served.url + "/docs/")  # the trailing slash reaches the same page
            assert page.url == served.url + "/docs"
            operation = page.locator("#operations-default-post_v1_systemone")
            expect(operation).to_be_visible()  # the operations, at once, with no token yet
            assert page.get_by_text("Failed to load API definition").count() == 0
            authorize = page.locator(".auth-wrapper button.authorize")
            expect(authorize).to_have_count(1)  # one token control: Swagger's own
            authorize.click()
            dialog = page.locator(".modal-ux")
            dialog.locator("input#auth-bearer-value").fill(KEY)
            dialog.locator("button.modal-btn.authorize").click()
            dialog.locator("button.btn-done").click()

            operation.locator(".opblock-summary").click()
            operation.get_by_role("button", name="Try it out").click()
            prefilled = json.loads(operation.locator("textarea.body-param__text").input_value())
            assert prefilled["model"] == "laya" and "config" not in prefilled
            operation.get_by_role("button", name="Execute").click()
            live = operation.locator(".live-responses-table tr.response")
            expect(live.locator(".response-col_status")).to_have_text("200", timeout=120_000)
            shown = live.locator(".response-col_description pre").first.inner_text()
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    print(f"screenshot: {screenshot}")
    record_property("screenshot", str(screenshot))
    answer = json.loads(shown)["answers"]["handling"]
    assert answer["type"] == "choice"
    assert answer["choice"] in prefilled["questions"]["handling"]["criteria"]
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0, abs=1e-3)
    access = [line for line in served.log_lines() if "POST /v1/systemone 200" in line]
    assert access  # the page's call reached the service with the key


def _readme_calls() -> list[tuple[str, str, bytes | None]]:
    """Every `curl` the README shows: (method, path, body)."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    words = [word for block in blocks for word in shlex.split(block, comments=True)]
    starts = [i for i, word in enumerate(words) if word == "curl"] + [len(words)]
    calls = []
    for start, end in itertools.pairwise(starts):
        command = words[start:end]
        (url,) = [w for w in command if w.startswith("http://127.0.0.1:8080")]
        body = command[command.index("-d") + 1].encode() if "-d" in command else None
        method = "POST" if body is not None or "-X" in command else "GET"
        calls.append((method, url.removeprefix("http://127.0.0.1:8080"), body))
    return calls


def test_the_readme_calls_each_get_an_answer(served: RunningServer) -> None:
    """The README's quick tour, a batch and an unload included, against a real server."""
    calls = _readme_calls()
    assert {path for _, path, _ in calls} >= {"/v1/systemone/batch", "/v1/models/unload"}
    for method, path, body in calls:
        headers = {"Content-Type": "application/json", **AUTH}
        response = httpx.request(
            method, served.url + path, content=body, headers=headers, timeout=120
        )
        assert response.status_code == 200, (path, response.text)
    assert httpx.post(served.url + "/v1/models/unload", headers=AUTH).json()["status"] == "unloaded"


def test_startup_on_a_terminal_logs_text_and_tells_the_device_once(
    served: RunningServer,
) -> None:
    lines = [line for line in served.log_lines() if line.strip()]
    assert lines and not any(line.lstrip().startswith("{") for line in lines)
    assert any(TEXT_LINE.match(line) for line in lines), lines[:5]
    told = [line for line in lines if "DECIDEALOT_DEVICE=auto resolved to" in line]
    assert len(told) == 1, told


def test_on_a_terminal_the_setting_still_decides(tmp_path: Path) -> None:
    """DECIDEALOT_LOG_FORMAT=json on a terminal: JSON. (Off a terminal, with the setting
    unset, every server tests/support/servers.py starts writes JSON.)"""
    server = start_server(tmp_path, terminal=True, DECIDEALOT_LOG_FORMAT="json")
    httpx.get(server.url + "/health")
    assert server.stop() == 0
    lines = [line for line in server.log_lines() if line.strip()]
    assert lines and all(json.loads(line)["message"] for line in lines)
