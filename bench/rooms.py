"""The rooms one decision passes through: the project files whose code runs while one Laya
request is answered, in the gateway and in the worker, and the threads that run it.

    .venv/bin/python bench/rooms.py [--checkout DIR]

Starts the real `decidealot serve` of the checkout (DIR defaults to this one; point it at another
checkout to compare layouts) on tiny random checkpoints, with both the gateway and its worker run
under a profiling hook that notes, per call, the time, the thread and the file. After a warm-up
request it times a second one (a noul and a choice on `laya`, routed to the english checkpoint)
and counts the checkout's files, the installed libraries' files (per top-level package) and the
threads that ran code inside that window, and two measures of the walk: hops (calls from one
project file into another, on each thread) and thread switches (consecutive calls in one
process made on different threads). A counting tool for docs/architecture.md, not a speed
benchmark: the hook slows everything down.

Another checkout's `decidealot.providers` and `decidealot.bundles` (folders at its root,
mapped by pyproject.toml's `package-dir`) are imported from that checkout, not from this one's
editable install.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

TRACER = textwrap.dedent(
    """
    import os, runpy, sys, threading, time
    out, root = sys.argv[1], sys.argv[2]
    args = [a for a in sys.argv[3:] if a != "-P"]
    if "-P" in sys.argv[3:]:
        sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
    sys.path.insert(0, root)
    import importlib.util, decidealot
    for name, folder in (("decidealot.providers", "providers"), ("decidealot.bundles", "bundles")):
        spec = importlib.util.spec_from_file_location(
            name, f"{root}/{folder}/__init__.py", submodule_search_locations=[f"{root}/{folder}"]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        setattr(decidealot, folder, module)
        spec.loader.exec_module(module)
    events, last = [], {}

    def hook(frame, event, arg):
        if event != "call":
            return
        name = frame.f_code.co_filename
        if "/site-packages/" not in name and (not name.startswith(root) or "/tests/" in name):
            return
        thread = threading.get_ident()
        if last.get(thread) != name:
            last[thread] = name
            events.append((time.monotonic(), thread, name))

    def flush():
        with open(out, "a") as sink:
            while True:
                time.sleep(0.1)
                batch, events[:] = events[:], []
                sink.writelines(f"{t} {th} {n}\\n" for t, th, n in batch)
                sink.flush()

    threading.Thread(target=flush, daemon=True).start()
    sys.setprofile(hook)
    threading.setprofile(hook)
    sys.argv = [args[1], *args[2:]]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    """
)

REQUEST = {
    "model": "laya",
    "state": "I was charged twice for my order and I want my money back.",
    "questions": {
        "refund": {"type": "noul", "instructions": "Is this a refund request?"},
        "queue": {"type": "choice", "criteria": {"billing": "Payments", "tech": "Software"}},
    },
}


def rooms(checkout: Path, work: Path) -> dict[str, object]:
    tracer = work / "tracer.py"
    tracer.write_text(TRACER)
    gateway_log, worker_log = work / "gateway.events", work / "worker.events"
    python = sys.executable
    wrapper = work / "worker-python"
    wrapper.write_text(f'#!/bin/sh\nexec {python} {tracer} {worker_log} {checkout} "$@"\n')
    wrapper.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DECIDEALOT_")}
    tiny = subprocess.run(
        [python, "-m", "decidealot", "checkpoints", "tiny", str(work / "tiny")],
        cwd=Path(__file__).resolve().parents[1],  # this checkout's writers: the same files
        env=clean,
        capture_output=True,
        text=True,
        check=True,
    )
    env = clean | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(checkout)}
    for line in tiny.stdout.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = value.strip("'")
    port = 18000 + os.getpid() % 1000
    env |= {
        "DECIDEALOT_PORT": str(port),
        "DECIDEALOT_VON_ENABLED": "false",
        "DECIDEALOT_DEVICE": "cpu",
        "DECIDEALOT_MODEL_DIR": str(work / "models"),
        "DECIDEALOT_WORKER_PYTHON": str(wrapper),
    }
    env.pop("DECIDEALOT_VON_CHECKPOINT", None)
    command = [python, str(tracer), str(gateway_log), str(checkout), "-m", "decidealot", "serve"]
    server_log = (work / "server.log").open("wb")
    server = subprocess.Popen(command, cwd=checkout, env=env, stdout=server_log, stderr=server_log)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert httpx.post(f"{url}/v1/systemone", json=REQUEST, timeout=300).status_code == 200
        time.sleep(1.0)
        started = time.monotonic()
        answered = httpx.post(f"{url}/v1/systemone", json=REQUEST, timeout=300)
        ended = time.monotonic()
        assert answered.status_code == 200, answered.text
        time.sleep(0.5)  # the tracers flush every 0.1 s
    except Exception:
        print((work / "server.log").read_text()[-4000:], file=sys.stderr)
        raise
    finally:
        server.terminate()
        server.wait(60)
        server_log.close()
    result: dict[str, object] = {}
    for side, log in (("gateway", gateway_log), ("worker", worker_log)):
        files, libraries, threads = set(), set(), set()
        last_file: dict[str, str] = {}
        last_thread, hops, switches = None, 0, 0
        lines = (line.split(" ", 2) for line in log.read_text().splitlines())
        events = sorted(lines, key=lambda event: float(event[0]))
        for at, thread, name in events:
            if started <= float(at) <= ended:
                if "/site-packages/" in name:
                    libraries.add(name.partition("/site-packages/")[2])
                else:
                    files.add(str(Path(name).relative_to(checkout)))
                    hops += thread in last_file and last_file[thread] != name
                    last_file[thread] = name
                switches += last_thread is not None and thread != last_thread
                last_thread = thread
                threads.add(thread)
        by_package: dict[str, int] = {}
        for name in libraries:
            top = name.split("/")[0]
            by_package[top] = by_package.get(top, 0) + 1
        result[side] = {
            "files": sorted(files),
            "threads": len(threads),
            "hops": hops,
            "thread_switches": switches,
            "library_files": dict(sorted(by_package.items(), key=lambda kv: -kv[1])),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        result = rooms(args.checkout.resolve(), Path(work))
    gateway, worker = result["gateway"], result["worker"]
    assert isinstance(gateway, dict) and isinstance(worker, dict)
    both = sorted(set(gateway["files"]) | set(worker["files"]))
    print(json.dumps(result, indent=2))
    libraries = {
        side: sum(result[side]["library_files"].values())  # type: ignore[index]
        for side in ("gateway", "worker")
    }
    print(
        f"{len(both)} files ({len(gateway['files'])} in the gateway, {len(worker['files'])} in "
        f"the worker), {gateway['threads']} + {worker['threads']} threads; library files run: "
        f"{libraries['gateway']} in the gateway, {libraries['worker']} in the worker; hops "
        f"{gateway['hops']} + {worker['hops']}, thread switches {gateway['thread_switches']} + "
        f"{worker['thread_switches']}"
    )


if __name__ == "__main__":
    main()
