"""Headless Chromium driven over the DevTools protocol on a pipe (standard library only).

Chromium started with ``--remote-debugging-pipe`` reads protocol commands from
its fd 3 and writes replies and events to its fd 4, each a JSON text ended by
a NUL byte. ``Chromium`` opens one page, navigates, evaluates JavaScript
(awaiting promises, so a test waits on a condition inside the page rather than
sleeping) and captures PNG screenshots. Every wait is bounded; ``close`` ends
the browser by its own pid.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = ["Chromium", "ChromiumError", "find_chromium"]

_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class ChromiumError(RuntimeError):
    """Chromium failed, answered with a protocol error, or did not answer in time."""


def find_chromium() -> str | None:
    """The path of a Chromium binary on ``$PATH`` (or ``$CHROMIUM``), else None."""
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        return shutil.which(explicit)
    for name in _NAMES:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


class Chromium:
    """One headless browser with one page, ``width`` x ``height`` CSS pixels."""

    def __init__(
        self, binary: str, profile_dir: Path, width: int = 1280, height: int = 900
    ) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # Park the child's ends above 10 (close-on-exec) so that moving them to 3
        # and 4 in the child cannot overwrite one with the other.
        high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
        high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def child_fds() -> None:  # runs in the child between fork and exec
            os.dup2(high_r, 3)  # inheritable copies; every other fd is close-on-exec
            os.dup2(high_w, 4)

        args = [
            binary,
            "--headless=new",
            "--remote-debugging-pipe",
            "--no-sandbox",  # tests may run as root, where the sandbox refuses to start
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--hide-scrollbars",
            "--mute-audio",
            f"--user-data-dir={profile_dir}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,  # keeps fds 3 and 4; Python's own fds are close-on-exec
            preexec_fn=child_fds,
        )
        os.close(high_r)
        os.close(high_w)
        self._out = to_child_w
        self._in = from_child_r
        self._buf = b""
        self._next_id = 0
        self.width, self.height = width, height
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        self.page("Page.enable")
        self.page("Runtime.enable")
        self.set_viewport(width, height)

    # -- protocol -----------------------------------------------------------------------
    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout_s: float = 30.0,
    ) -> dict[str, Any]:
        """Send one command; its result, or ``ChromiumError`` naming the method."""
        self._next_id += 1
        msg_id = self._next_id
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._read_message(deadline, method)
            if reply.get("id") != msg_id:
                continue  # an event, or the reply to an abandoned command
            if "error" in reply:
                raise ChromiumError(f"{method}: {reply['error']}")
            return dict(reply.get("result", {}))

    def _read_message(self, deadline: float, method: str) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChromiumError(f"{method}: no reply from chromium in time")
            ready, _, _ = select.select([self._in], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise ChromiumError(f"{method}: chromium closed its pipe (exit {self.proc.poll()})")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return dict(json.loads(raw))

    def page(
        self, method: str, params: dict[str, Any] | None = None, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """A command to the page's session."""
        return self.call(method, params, self._session, timeout_s)

    # -- page ---------------------------------------------------------------------------
    def set_viewport(self, width: int, height: int) -> None:
        self.page(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.width, self.height = width, height

    def navigate(self, url: str) -> None:
        result = self.page("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise ChromiumError(f"navigate to {url!r}: {result['errorText']}")

    def evaluate(self, expression: str, timeout_s: float = 30.0) -> Any:
        """The JSON value of ``expression`` (a promise is awaited), evaluated in the page."""
        result = self.page(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            timeout_s=timeout_s,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise ChromiumError(f"evaluate {expression[:80]!r}: {text}")
        return result["result"].get("value")

    def wait_for(self, condition_js: str, timeout_s: float) -> None:
        """Wait (inside the page, polling every 100 ms) until ``condition_js`` is
        truthy; ``ChromiumError`` after ``timeout_s`` seconds."""
        ms = int(timeout_s * 1000)
        script = (
            "new Promise((resolve, reject) => { const t0 = Date.now(); (function check() {"
            f" let ok = false; try {{ ok = Boolean({condition_js}); }} catch (e) {{}}"
            " if (ok) resolve(true);"
            f" else if (Date.now() - t0 > {ms}) reject(new Error('timed out'));"
            " else setTimeout(check, 100); })(); })"
        )
        try:
            self.evaluate(script, timeout_s=timeout_s + 10)
        except ChromiumError as exc:
            raise ChromiumError(f"waited {timeout_s} s for {condition_js!r}: {exc}") from None

    def screenshot(self, path: Path, full_page: bool = True) -> bytes:
        """Save a PNG of the page (all of it if ``full_page``) at ``path``; its bytes."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = self.page("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": self.width,
                "height": min(int(size["height"]) + 1, 16000),
                "scale": 1,
            }
            params["captureBeyondViewport"] = True
        data = base64.b64decode(self.page("Page.captureScreenshot", params)["data"])
        path.write_bytes(data)
        return data

    def close(self) -> None:
        """Ask the browser to close, then kill it by pid if it lingers (bounded)."""
        try:
            if self.proc.poll() is None:
                self.call("Browser.close", timeout_s=5)
        except (ChromiumError, OSError):
            pass
        finally:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            os.close(self._out)
            os.close(self._in)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
