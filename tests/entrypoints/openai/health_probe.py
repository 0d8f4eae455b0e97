"""/health polled every 50 ms while a case runs, from a process of its own: a thread of the
test process measured that process's pauses too (a full garbage collection of a large test
process held every thread for seconds), and counted them against the server. One probe
process serves a module; each `window()` reports the slowest answer and the failures seen
between its start and its end."""
from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager

_POLL = r"""
import json, select, sys, time
import httpx
url, worst, failures, polling = sys.argv[1], 0.0, [], False
with httpx.Client(timeout=5) as client:
    while True:
        if select.select([sys.stdin], [], [], 0.05 if polling else None)[0]:
            command = sys.stdin.readline().strip()
            if not command:
                break
            if command == "stop":
                polling = False
                print(json.dumps([worst, failures]), flush=True)
                continue
            worst, failures, polling = 0.0, [], True
        start = time.monotonic()
        try:
            status = client.get(url).status_code
            if status != 200:
                failures.append(status)
        except httpx.HTTPError as e:
            failures.append(repr(e))
        worst = max(worst, time.monotonic() - start)
        if command == "start":
            command = ""
            print("polling", flush=True)
"""


class Window:
    worst: float = 0.0
    failures: list = []


class HealthProbe:
    def __init__(self, url: str):
        self._proc = subprocess.Popen([sys.executable, "-c", _POLL, url + "/health"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)

    def _ask(self, command: str) -> str:
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        return self._proc.stdout.readline()

    @contextmanager
    def window(self):
        """Polling from the first answer on (before the body runs) to the end of the body."""
        window = Window()
        assert self._ask("start").strip() == "polling"
        try:
            yield window
        finally:
            window.worst, window.failures = json.loads(self._ask("stop"))

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(30)
