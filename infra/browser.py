"""Headless Debian Chromium driven over the Chrome DevTools Protocol, for the dashboard test.

Playwright cannot download its browsers here, and the CDP subset a page test needs (navigate,
evaluate, screenshot, network conditions) is small: one websocket to one page target.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

from infra.errors import InfraError

CHROMIUM_MISSING = (
    "Debian's chromium is not installed: `make test` installs it "
    "(infra/system-packages.sh chromium), or run `apt-get install chromium`"
)


class BrowserError(InfraError, RuntimeError):
    """Chromium did not start, a CDP command failed, or the page threw."""


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One page target: CDP commands in, events collected (console output, exceptions)."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self.console: list[str] = []
        self.exceptions: list[str] = []
        self.size = (0, 0)

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"CDP {method}: no answer within {timeout} s")
            message = json.loads(self._ws.recv(timeout=left))
            if message.get("id") == call_id:
                if "error" in message:
                    raise BrowserError(f"CDP {method}: {message['error']}")
                return message.get("result", {})
            self._record(message)

    def _record(self, event: dict[str, Any]) -> None:
        params = event.get("params", {})
        if event.get("method") == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.console.append(f"{params['type']}: {text}")
        elif event.get("method") == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.exceptions.append(details.get("exception", {}).get("description", str(details)))

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression (promises awaited)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(
                f"{expression!r} threw: {details.get('exception', {}).get('description', details)}"
            )
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Poll until `expression` is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except BrowserError:
                value = None  # the page may be between documents
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(
                    f"timed out after {timeout} s waiting for {expression!r}; "
                    f"console: {self.console[-10:]}; exceptions: {self.exceptions}"
                )
            time.sleep(0.1)

    def resize(self, width: int, height: int, *, mobile: bool = False) -> None:
        """Lay the page out in a ``width`` x ``height`` viewport (a phone's with ``mobile``)."""
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )
        self.size = (width, height)

    def screenshot(self, path: Path, clip_to: Sequence[str] = ()) -> Path:
        """The whole page, or the smallest rectangle holding the elements of the CSS selectors
        ``clip_to``. The viewport grows to the page's height first and the page gets a moment
        to lay out again: capturing beyond the viewport resizes it under the page's responsive
        charts, which would be caught cleared, mid-redraw."""
        width, height = self.size
        full = int(self.evaluate("document.documentElement.scrollHeight"))
        if full > height:
            self.resize(width, full)
            self.evaluate("new Promise((done) => setTimeout(done, 500))")
        params: dict[str, Any] = {"format": "png"}
        if clip_to:
            params["clip"] = self.evaluate(
                f"""(() => {{
                  window.scrollTo(0, 0);
                  const rects = {json.dumps(list(clip_to))}
                    .flatMap((s) => [...document.querySelectorAll(s)])
                    .map((e) => e.getBoundingClientRect());
                  if (!rects.length) throw new Error("nothing to clip to: {", ".join(clip_to)}");
                  const x = Math.min(...rects.map((r) => r.left)) - 8;
                  const y = Math.min(...rects.map((r) => r.top)) - 8;
                  return {{ x: Math.max(x, 0), y: Math.max(y, 0), scale: 1,
                    width: Math.max(...rects.map((r) => r.right)) + 8 - Math.max(x, 0),
                    height: Math.max(...rects.map((r) => r.bottom)) + 8 - Math.max(y, 0) }};
                }})()"""
            )
        try:
            data = self.send("Page.captureScreenshot", params)
        finally:
            if full > height:
                self.resize(width, height)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def press(self, key: str) -> None:
        """A key pressed and released on the focused element, as a keyboard sends it
        (``Enter``, ``Tab``, ``Escape``, ``ArrowDown``, ``Space``, …)."""
        code, key_code, text = _KEYS[key]
        name = " " if key == "Space" else key
        down = {"key": name, "code": code, "windowsVirtualKeyCode": key_code}
        self.send("Input.dispatchKeyEvent", {"type": "keyDown", **down, "text": text})
        self.send("Input.dispatchKeyEvent", {"type": "keyUp", **down})

    def type(self, text: str) -> None:
        """``text`` typed into the focused element."""
        self.send("Input.insertText", {"text": text})

    def allow_downloads(self, directory: Path) -> None:
        """Save what the page downloads into ``directory`` (under its suggested name)."""
        directory.mkdir(parents=True, exist_ok=True)
        self.send(
            "Browser.setDownloadBehavior",
            {"behavior": "allow", "downloadPath": str(directory), "eventsEnabled": True},
        )

    def set_offline(self, offline: bool) -> None:
        self.send(
            "Network.emulateNetworkConditions",
            {"offline": offline, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
        )


# DevTools key events: (code, Windows virtual key code, text the key types).
_KEYS: dict[str, tuple[str, int, str]] = {
    "Enter": ("Enter", 13, "\r"),
    "Tab": ("Tab", 9, ""),
    "Escape": ("Escape", 27, ""),
    "Space": ("Space", 32, " "),
    "ArrowDown": ("ArrowDown", 40, ""),
    "ArrowUp": ("ArrowUp", 38, ""),
}


@contextmanager
def chromium_page(
    profile_dir: Path, width: int = 1400, height: int = 1000, start_timeout: float = 30.0
) -> Iterator[Page]:
    """A fresh headless Chromium (own profile, debugging port chosen by Chromium) and its page."""
    binary = chromium_binary()
    if binary is None:
        raise BrowserError(CHROMIUM_MISSING)
    profile_dir.mkdir(parents=True, exist_ok=True)
    log = (profile_dir / "chromium.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            "--headless",
            "--no-sandbox",  # tests run as root, where Chromium's sandbox refuses to start
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--hide-scrollbars",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile_dir}",
            f"--window-size={width},{height}",
            "about:blank",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        port = _debugging_port(profile_dir, process, start_timeout)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            targets = json.load(answer)
        page_ws = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        with connect(page_ws, max_size=None, open_timeout=10) as ws:
            page = Page(ws)
            for domain in ("Page", "Runtime", "Network"):
                page.send(f"{domain}.enable")
            page.resize(width, height)
            # As a window a user looks at: focus and blur events fire (a headless page is never
            # the focused window otherwise).
            page.send("Emulation.setFocusEmulationEnabled", {"enabled": True})
            yield page
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _debugging_port(profile_dir: Path, process: subprocess.Popen[bytes], timeout: float) -> int:
    """Chromium writes the port it bound into DevToolsActivePort once it is listening."""
    marker = profile_dir / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = (profile_dir / "chromium.log").read_text(errors="replace")[-2000:]
            raise BrowserError(f"chromium exited with {process.returncode}: {log}")
        if marker.is_file():
            first = marker.read_text().splitlines()[:1]
            if first and first[0].isdigit():
                return int(first[0])
        time.sleep(0.1)
    raise BrowserError(f"chromium did not open its debugging port within {timeout} s")
