"""Kafka's framing on a byte stream: whole frames in, frames out in as few writes as fit."""

from __future__ import annotations

from typing import Any, Final

from quotastream.proxy import wire
from quotastream.proxy.transports import Transport

#: Frames that leave in one write when they arrived together (small requests, pipelined).
_JOINED_WRITE_BYTES: Final = 256 * 1024


class FrameReader:
    """Splits a byte stream into whole frames (each with its 4-byte length prefix).

    A chunk holding whole frames is sliced without copying; a frame spread over chunks is joined
    once, when its last byte arrives.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self._max = max_frame_bytes
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._needed = 4

    @property
    def partial(self) -> bool:
        """Part of a frame is buffered (its sender stopped mid-frame if the stream ends here)."""
        return self._buffered > 0

    def feed(self, data: bytes) -> list[memoryview]:
        if self._chunks:
            self._chunks.append(data)
            self._buffered += len(data)
            if self._buffered < self._needed:
                return []
            data = b"".join(self._chunks)
            self._chunks, self._buffered = [], 0
        view = memoryview(data)
        frames = []
        offset, end = 0, len(data)
        self._needed = 4
        while end - offset >= 4:
            size = wire.frame_size(view[offset : offset + 4])
            if not 0 <= size <= self._max:
                raise wire.MalformedFrameError(
                    f"a frame of {size} bytes (the most accepted is {self._max})"
                )
            if end - offset < 4 + size:
                self._needed = 4 + size
                break
            frames.append(view[offset : offset + 4 + size])
            offset += 4 + size
        if offset < end:
            self._chunks = [data[offset:]]
            self._buffered = end - offset
        return frames


def write_frames(transport: Transport, frames: list[Any]) -> None:
    """Frames that arrived together leave together: one send for pipelined small ones."""
    if len(frames) == 1:
        transport.write(frames[0])
    elif sum(len(frame) for frame in frames) <= _JOINED_WRITE_BYTES:
        transport.write(b"".join(frames))
    else:
        for frame in frames:
            transport.write(frame)
