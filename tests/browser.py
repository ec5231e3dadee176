"""Render a page in headless Chromium (Debian's ``chromium``) through the DevTools protocol and
report what a user would see go wrong: console errors, uncaught exceptions, failed loads and
images that did not decode. Optionally a full-page PNG screenshot."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
]
BROKEN_IMAGES = "Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.contextmanager
def _browser(width: int, height: int):
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed (apt-get install -y chromium)")
    # the profile is removed below once every chromium process has gone (ignore_cleanup_errors: then
    # the context's own cleanup finds nothing to do)
    with tempfile.TemporaryDirectory(prefix="embed-sweep-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: its helpers end with it
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 60
            while not (port_file.exists() and port_file.read_text().strip()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"chromium did not start (exit code {proc.poll()})")
                time.sleep(0.1)
            port = int(port_file.read_text().split()[0])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                pages = [t for t in json.load(r) if t["type"] == "page"]
            yield pages[0]["webSocketDebuggerUrl"]
        finally:
            _end_group(proc)
            # chromium's helpers can still be writing the profile (its Default folder) for a moment
            # after the browser exits: rmtree then fails with "Directory not empty"; retry briefly
            for _ in range(50):
                try:
                    shutil.rmtree(profile)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def _end_group(proc) -> None:
    """SIGTERM to chromium's process group and a wait for the browser (15 s), then SIGKILL to the
    group: the browser if it has not exited, and any helper of its still running."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def render(url: str, screenshot: str | Path | None = None, width: int = 1400, timeout: float = 60) -> dict:
    """Load ``url``; returns {"errors": [...], "failed": [...], "broken_images": [...], "images": n,
    "title": ...}; writes a full-page PNG to ``screenshot`` if given."""
    from websockets.sync.client import connect

    errors, failed = [], []
    with _browser(width, 1000) as ws_url, connect(ws_url, max_size=None, open_timeout=30) as ws:
        counter = iter(range(1, 10**9))

        def call(method, **params):
            mid = next(counter)
            ws.send(json.dumps({"id": mid, "method": method, "params": params}))
            while True:
                msg = json.loads(ws.recv(timeout=timeout))
                if msg.get("id") == mid:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    return msg.get("result", {})
                note(msg)

        loaded = []

        def note(msg):
            m, p = msg.get("method"), msg.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(
                    "console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"])
                )
            elif m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                errors.append("exception: " + d.get("exception", {}).get("description", d.get("text", "")))
            elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
                errors.append(f"log: {p['entry']['text']} {p['entry'].get('url', '')}")
            elif m == "Network.loadingFailed":
                failed.append(f"{p.get('errorText')} ({p.get('requestId')})")
            elif m == "Page.loadEventFired":
                loaded.append(True)

        for domain in ("Runtime", "Log", "Network", "Page"):
            call(f"{domain}.enable")
        call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while not loaded:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not finish loading in {timeout} s")
            note(json.loads(ws.recv(timeout=timeout)))
        time.sleep(0.3)  # late console messages
        call("Runtime.evaluate", expression="1")  # drains the events that came meanwhile
        broken = call("Runtime.evaluate", expression=BROKEN_IMAGES, returnByValue=True)["result"]["value"]
        images = call("Runtime.evaluate", expression="document.images.length", returnByValue=True)
        title = call("Runtime.evaluate", expression="document.title", returnByValue=True)["result"]["value"]
        if screenshot is not None:
            size = call("Page.getLayoutMetrics")["cssContentSize"]
            shot = call(
                "Page.captureScreenshot",
                format="png",
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
            )
            Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
    return {
        "errors": errors,
        "failed": failed,
        "broken_images": broken,
        "images": images["result"]["value"],
        "title": title,
    }
