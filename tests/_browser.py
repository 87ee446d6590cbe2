"""A real headless Chromium (Debian's) driven over the DevTools protocol: load a page, collect console errors,
read the DOM, take a screenshot."""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Without the background-networking flags Chromium keeps dialling hosts this closed network refuses.
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0", "--window-size=1280,900")


@dataclass
class Page:
    """What a page did while it loaded."""

    errors: list[str] = field(default_factory=list)
    value: Any = None
    """What the ``probe`` expression evaluated to, once loaded."""


class Browser:
    """One Chromium process; ``close`` ends it."""

    def __init__(self) -> None:
        if CHROMIUM is None:
            raise RuntimeError("Debian's chromium is not installed (apt-get install chromium)")
        self.profile = tempfile.mkdtemp(prefix="agent-gravity-chromium-")
        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port = self._devtools_port()
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # keep its log pipe from filling
        self.ids = itertools.count(1)

    def _devtools_port(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        for line in self.proc.stderr:
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if found:
                return int(found.group(1))
            if time.monotonic() > deadline:
                break
        self.close()
        raise RuntimeError("Chromium did not open its DevTools port")

    def _call(self, ws: Any, method: str, **params: Any) -> dict[str, Any]:
        """Send one command; events that arrive meanwhile go to ``self.events``."""
        ident = next(self.ids)
        ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(ws.recv(timeout=60))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def load(self, url: str, probe: str, screenshot: Path | None = None, settle: float = 0.0) -> Page:
        """Open ``url``, wait for its load event (and ``settle`` seconds), evaluate ``probe``, maybe screenshot."""
        from websockets.sync.client import connect

        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?about:blank", method="PUT")
        with urllib.request.urlopen(req, timeout=30) as r:
            target = json.loads(r.read())
        self.events: list[dict[str, Any]] = []
        with connect(target["webSocketDebuggerUrl"], max_size=None) as ws:
            for domain in ("Page", "Runtime", "Log"):
                self._call(ws, f"{domain}.enable")
            self._call(ws, "Page.navigate", url=url)
            deadline = time.monotonic() + 60
            while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} did not finish loading within 60 s")
                self.events.append(json.loads(ws.recv(timeout=60)))
            end = time.monotonic() + settle
            while time.monotonic() < end:
                try:
                    self.events.append(json.loads(ws.recv(timeout=max(0.01, end - time.monotonic()))))
                except TimeoutError:
                    break
            value = self._call(ws, "Runtime.evaluate", expression=probe, returnByValue=True)["result"].get("value")
            if screenshot is not None:
                shot = self._call(ws, "Page.captureScreenshot", format="png", captureBeyondViewport=True)
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
        return Page(errors=_errors(self.events), value=value)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


def _errors(events: list[dict[str, Any]]) -> list[str]:
    """Console errors, uncaught exceptions and error log entries among DevTools events."""
    out = []
    for e in events:
        p = e.get("params", {})
        if e.get("method") == "Runtime.exceptionThrown":
            out.append(p["exceptionDetails"].get("text", "exception"))
        elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") == "error":
            out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif e.get("method") == "Log.entryAdded" and p["entry"].get("level") == "error":
            out.append(p["entry"].get("text", ""))
    return out
