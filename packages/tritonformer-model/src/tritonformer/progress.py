"""A one-line progress bar for terminals; periodic plain lines when the output is a file or a pipe."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

WIDTH = 24
# Off a terminal: one line per this share of the run.
LOG_EVERY_FRACTION = 0.1


class ProgressBar:
    def __init__(self, total: int, start: int = 0, stream: Optional[TextIO] = None):
        self.total, self.start = total, start
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.every = max(1, int((total - start) * LOG_EVERY_FRACTION))
        self.started = time.perf_counter()
        self.line = ""

    def _eta(self, step: int) -> str:
        done = step - self.start
        if done <= 0:
            return "?"
        seconds = int((time.perf_counter() - self.started) / done * (self.total - step))
        return f"{seconds // 60}:{seconds % 60:02d}"

    def update(self, step: int, text: str = "") -> None:
        filled = int(WIDTH * step / max(1, self.total))
        self.line = f"[{'#' * filled}{'.' * (WIDTH - filled)}] {step}/{self.total} {text} eta {self._eta(step)}"
        if self.tty:
            self.stream.write("\r\033[K" + self.line)
            self.stream.flush()
        elif (step - self.start) % self.every == 0 or step == self.total:
            self.stream.write(self.line + "\n")
            self.stream.flush()

    def write(self, text: str) -> None:
        """A line of its own above the bar."""
        if self.tty:
            self.stream.write("\r\033[K" + text + "\n" + self.line)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
