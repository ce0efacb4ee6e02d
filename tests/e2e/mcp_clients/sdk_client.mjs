// The official TypeScript SDK's client, as MCP hosts use it, run by tests/e2e/test_mcp_clients.py.
//
// node sdk_client.mjs <plan.json> connects once (streamable HTTP to plan.transport.url with its
// headers, or stdio to plan.transport.command), lists the tools, makes plan.calls in order (an
// array is a group of calls made at once on the same connection) and prints one JSON report:
// {tools, calls, oauth}. Each call reports {result} or {thrown: {name, code, message}}, so the
// test sees exactly what a host built on the SDK would. With plan.oauth, it then connects
// without a key as an OAuth-capable host does (an auth provider, no token) and reports every
// request that made and how it ended. The checks are the test's; this only drives the client.

import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));

function transport(spec) {
  if (spec.url) {
    return new StreamableHTTPClientTransport(new URL(spec.url), {
      requestInit: { headers: spec.headers ?? {} },
    });
  }
  return new StdioClientTransport({
    command: spec.command,
    args: spec.args,
    env: spec.env,
    cwd: spec.cwd,
    stderr: "inherit",
  });
}

function thrown(error) {
  return { name: error?.constructor?.name ?? "Error", code: error?.code ?? null, message: String(error?.message ?? error) };
}

async function outcome(pending) {
  try {
    return { result: await pending };
  } catch (error) {
    return { thrown: thrown(error) };
  }
}

async function calls(client, steps) {
  const made = [];
  for (const step of steps) {
    if (Array.isArray(step)) {
      made.push(await Promise.all(step.map((call) => outcome(client.callTool(call)))));
    } else {
      made.push(await outcome(client.callTool(step)));
    }
  }
  return made;
}

// An OAuth-capable host with no token yet: what it requests after the 401, and where it stops.
async function oauth(url) {
  const requests = [];
  const logged = async (target, init) => {
    const response = await fetch(target, init);
    requests.push({ method: init?.method ?? "GET", path: new URL(target).pathname, status: response.status });
    return response;
  };
  const redirect = "http://127.0.0.1:9/callback";
  const provider = {
    get redirectUrl() {
      return redirect;
    },
    get clientMetadata() {
      return { client_name: "decidealot-tests", redirect_uris: [redirect] };
    },
    clientInformation: () => undefined,
    saveClientInformation: () => {},
    tokens: () => undefined,
    saveTokens: () => {},
    redirectToAuthorization: (target) => requests.push({ redirect: String(target) }),
    saveCodeVerifier: () => {},
    codeVerifier: () => "verifier",
  };
  const client = new Client({ name: "decidealot-tests-oauth", version: "0" });
  const connected = await outcome(
    client.connect(new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: logged })),
  );
  return { requests, ...connected };
}

const report = {};
const client = new Client({ name: "decidealot-tests", version: "0" });
await client.connect(transport(plan.transport));
report.tools = (await client.listTools()).tools;
report.calls = await calls(client, plan.calls ?? []);
await client.close();
if (plan.oauth) {
  report.oauth = await oauth(plan.oauth);
}
process.stdout.write(JSON.stringify(report));
