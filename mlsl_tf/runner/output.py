"""A rank's output: its command's stdout and stderr copied to files and to the console, tagged by line.

Files get the bytes raw; the console gets them raw or line by line behind Horovod's ``[R]<stdout>:``
tags in whole-line writes.  Standard library only: the rank wrapper (task.py) loads it."""

import os
import select
from typing import BinaryIO, Optional, Sequence

LINE_WRITE_MAX = getattr(select, "PIPE_BUF", 4096)  # a pipe write this size is atomic
LINE_MAX = 1 << 16  # a longer line without newline is written on in pieces of this size


def rank_dir_name(rank: int, num_proc: Optional[int]) -> str:
    """``rank.R`` with R zero-padded to the digits of num_proc - 1 (horovodrun's layout)."""
    width = len(str(num_proc - 1)) if num_proc and num_proc > 1 else 1
    return f"rank.{rank:0{width}d}"


def output_tag(rank: int, stream: str) -> bytes:
    """Horovod's prefix of a rank's output line: ``[1]<stdout>:``."""
    return f"[{rank}]<{stream}>:".encode()


def tag_lines(pending: bytes, data: bytes, tag: bytes, final: bool = False) -> tuple[list[bytes], bytes]:
    """(tagged complete lines, bytes still waiting for their newline) after ``data`` arrived
    behind ``pending`` (pure).  ``final``: the stream ended, so a last partial line is
    tagged too and given its newline.  A line longer than LINE_MAX without newline
    is passed on in LINE_MAX pieces, each a tagged line of its own."""
    buf = pending + data
    lines = buf.split(b"\n")
    rest = lines.pop()
    out = [tag + line + b"\n" for line in lines]
    while len(rest) >= LINE_MAX:
        out.append(tag + rest[:LINE_MAX] + b"\n")
        rest = rest[LINE_MAX:]
    if final and rest:
        out.append(tag + rest + b"\n")
        rest = b""
    return out, rest


def batch_lines(lines: Sequence[bytes], limit: int = LINE_WRITE_MAX) -> list[bytes]:
    """Whole lines joined into writes of at most ``limit`` bytes (a longer line alone) (pure)."""
    writes: list[bytes] = []
    for line in lines:
        if writes and len(writes[-1]) + len(line) <= limit:
            writes[-1] += line
        else:
            writes.append(line)
    return writes


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


class Pump:
    """Copies the command's stdout or stderr (a pipe) to a file, raw, and to the console, tagged
    line by line or raw, until EOF."""

    def __init__(self, src_fd: int, console_fd: int, file: Optional[BinaryIO], tag: Optional[bytes]):
        self.src_fd, self.console_fd, self.file, self.tag = src_fd, console_fd, file, tag
        self.console_ok = True

    def run(self) -> None:
        pending = b""
        try:
            while True:
                data = os.read(self.src_fd, 65536)
                if self.file is not None and data:
                    try:
                        self.file.write(data)
                        self.file.flush()
                    except (OSError, ValueError):
                        pass
                if self.tag is None:
                    self._console([data] if data else [])
                else:
                    lines, pending = tag_lines(pending, data, self.tag, final=not data)
                    self._console(batch_lines(lines))
                if not data:
                    return
        finally:
            os.close(self.src_fd)

    def _console(self, writes: Sequence[bytes]) -> None:
        for chunk in writes:
            if not self.console_ok:
                return
            try:
                _write_all(self.console_fd, chunk)
            except OSError:
                self.console_ok = False  # a closed console must not stop the file copy
