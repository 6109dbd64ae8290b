"""Headless Chromium driven over the DevTools protocol, for page tests that measure the layout.

``--dump-dom`` gives the document but no layout: element widths, what overflows a viewport and
what a click does need a browser that runs script on request. Chromium speaks the DevTools
protocol over a pipe (``--remote-debugging-pipe``: it reads commands on file descriptor 3 and
writes replies on 4, each message JSON ended by a NUL byte), so this needs nothing but the
standard library and the browser.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
# every headless Chromium the tests start: no sandbox (containers run as root), no GPU, /tmp for
# shared memory (a container's /dev/shm is small), no scrollbars in the measured widths
HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--no-first-run",
)


class BrowserError(RuntimeError):
    """Chromium ended, timed out, or a script threw."""


class HeadlessPage:
    """One tab of a headless Chromium with a fixed viewport (a context manager).

    Parameters
    ----------
    width, height : int
        The viewport in CSS pixels.
    timeout : float
        Seconds a command may take.
    """

    def __init__(self, width: int = 1400, height: int = 1000, timeout: float = 60.0) -> None:
        if CHROMIUM is None:
            raise BrowserError("no chromium on PATH")
        self.timeout = timeout
        self._id = 0
        self._buffer = b""
        self._profile = tempfile.TemporaryDirectory(prefix="tfooc-chromium-", ignore_cleanup_errors=True)
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:  # the browser's fd 3 reads our commands, its fd 4 writes the replies
            # copied above 10 first: a pipe end may itself sit at 3 or 4
            r, w = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)  # inheritable, unlike the pipes (PEP 446): nothing else of ours leaks
            os.dup2(w, 4)

        self._proc = subprocess.Popen(
            [
                CHROMIUM,
                *HEADLESS_FLAGS,
                "--remote-debugging-pipe",
                f"--user-data-dir={self._profile.name}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=fds,
            close_fds=False,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        try:
            target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            self.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            )
        except BaseException:
            self.close()
            raise

    # --- protocol ------------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise BrowserError("no reply from chromium in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise BrowserError(f"chromium ended (exit status {self._proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:  # events and other replies are skipped
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def call(self, method: str, params: dict | None = None) -> dict:
        """A DevTools command in this tab; its result."""
        return self._call(method, params, self._session)

    # --- what tests use ------------------------------------------------------------------------
    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when a promise; JSON values)."""
        out = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in out:
            raise BrowserError(f"{expression[:80]!r} threw: {out['exceptionDetails'].get('exception', out)}")
        return out["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, what: str | None = None) -> Any:
        """Poll until ``expression`` is truthy in the page; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except BrowserError:  # navigating: the page's context is being replaced
                value = None
            if value:
                return value
            time.sleep(0.1)
        raise BrowserError(f"timed out after {timeout:g} s waiting for {what or expression}")

    def open(self, url: str, ready: str = "document.body && document.body.dataset.state === 'ready'") -> None:
        """Load ``url`` and wait until ``ready`` holds (the tfooc page sets ``data-state="ready"``
        once it has drawn what it fetched)."""
        # a mark on the document being left: until it is gone, "ready" is the old page's
        self.evaluate("window.__leaving = true")
        self.call("Page.navigate", {"url": url})
        self.wait_for(f"!window.__leaving && location.href === {json.dumps(url)} && ({ready})", what=f"{url} ready")

    def close(self) -> None:
        if self._proc.poll() is None:
            try:  # the browser's own way out: it ends its renderers and leaves its profile alone
                self._call("Browser.close")
            except (BrowserError, OSError):
                pass
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self._profile.cleanup()

    def __enter__(self) -> HeadlessPage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
