"""A minimal DevTools-protocol client for headless Chromium over --remote-debugging-pipe: no port,
no package beyond the standard library (tests that load a page skip where Debian's `chromium` is
missing)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BASH = shutil.which("bash")


def _above_four(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 5)
    os.close(fd)
    return moved


class Chromium:
    """Headless Chromium driven over its DevTools pipe (fd 3 in, fd 4 out, NUL-separated JSON).

    No port is opened and nothing but the page's own file is fetched: networking features are
    off, and the test asserts every request the page made was ``file:`` or ``data:``.
    """

    def __init__(
        self,
        binary: str,
        profile: Path,
        timeout: float = 60.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.timeout = timeout
        cmd_r, self._cmd_w = os.pipe()
        self._resp_r, resp_w = os.pipe()
        # The child's ends move above 4 first: as fds 3 or 4 themselves, the redirections below
        # would close them (a process with few files open gets exactly those numbers).
        cmd_r, resp_w = (_above_four(fd) for fd in (cmd_r, resp_w))
        args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-dev-shm-usage",
            "--mute-audio",
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            *extra_args,
            "about:blank",
        ]
        # Chromium reads the pipe on fd 3 and writes on fd 4: map our two ends onto those
        # (bash, not sh: dash cannot redirect file descriptors above 9).
        script = f'exec "$0" "$@" 3<&{cmd_r} 4>&{resp_w} {cmd_r}<&- {resp_w}>&-'
        self.proc = subprocess.Popen(
            [BASH or "bash", "-c", script, binary, *args],
            pass_fds=(cmd_r, resp_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        os.close(cmd_r)
        os.close(resp_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._resp_r], [], [], left)
            if ready:
                chunk = os.read(self._resp_r, 1 << 20)
                if not chunk:
                    err = (
                        self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                    )
                    raise RuntimeError(f"chromium closed its DevTools pipe; stderr:\n{err[-2000:]}")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict[str, Any]:
        for event in self.events:
            if event.get("method") == method:
                return event
        deadline = time.monotonic() + self.timeout
        while True:
            event = self._read_message(deadline)
            self.events.append(event)
            if event.get("method") == method:
                return event

    def close(self) -> None:
        with contextlib.suppress(Exception):  # it may be gone already
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._resp_r)
        if self.proc.stderr:
            self.proc.stderr.close()
