"""A headless Chromium the docs tests drive as a user would (click, type), over the DevTools protocol on
a pipe (`--remote-debugging-pipe`: no port, no websocket library): Chromium reads commands on its fd 3
and writes answers on its fd 4, each a JSON message ended by a NUL byte."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path


class Browser:
    def __init__(self, executable: str, flags: tuple[str, ...], profile: Path) -> None:
        commands_r, self._commands = os.pipe()
        self._answers, answers_w = os.pipe()

        def on_fds_3_and_4() -> None:  # in the child: the pipe ends where Chromium looks for them
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (commands_r, answers_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.process = subprocess.Popen(
            [executable, *flags, "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(3, 4, commands_r, answers_w), preexec_fn=on_fds_3_and_4,  # noqa: PLW1509 - only dup2s
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(commands_r)
        os.close(answers_w)
        self._pending, self._next_id, self.session = b"", 0, None

    def close(self) -> None:
        os.close(self._commands)
        os.close(self._answers)
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def send(self, method: str, **params) -> dict:
        """One command, and its answer (events that come before it are dropped)."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._pending:
                chunk = os.read(self._answers, 1 << 16)
                if not chunk:
                    raise AssertionError(f"Chromium exited (code {self.process.poll()}) during {method}")
                self._pending += chunk
            raw, self._pending = self._pending.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise AssertionError(f"{method}: {answer['error']}")
                return answer["result"]

    def open(self, url: str, timeout: float = 60) -> None:
        """A new tab on `url`, driven from now on, once the page has loaded."""
        target = self.send("Target.createTarget", url=url)["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.wait_for("document.readyState === 'complete'", timeout)

    def evaluate(self, expression: str):
        return self.send("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60):
        """The expression's value once it is truthy; fails after `timeout` seconds saying which."""
        deadline = time.monotonic() + timeout
        while not (value := self.evaluate(expression)):
            if time.monotonic() > deadline:
                raise AssertionError(f"still false after {timeout}s: {expression}")
            time.sleep(0.2)
        return value

    def type(self, text: str) -> None:
        """Keys pressed one by one into whatever has the focus, as a keyboard would."""
        for key in text:
            self.send("Input.dispatchKeyEvent", type="keyDown", key=key, text=key)
            self.send("Input.dispatchKeyEvent", type="keyUp", key=key)

    def click(self, selector: str) -> None:
        """A mouse click in the middle of the first element `selector` finds, once it is visible."""
        found = json.dumps(selector)
        x, y = self.wait_for(f"""(() => {{ const e = document.querySelector({found});
            if (e) e.scrollIntoView({{block: "center"}});
            const r = e && e.getBoundingClientRect();
            return r && r.width > 0 && r.height > 0 ? [r.x + r.width / 2, r.y + r.height / 2] : null; }})()""")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)
