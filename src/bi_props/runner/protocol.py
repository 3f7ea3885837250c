"""Length-prefixed pickle frames over a pipe, shared by controller and worker (imports nothing)."""

from __future__ import annotations

import pickle
import struct
from typing import Any, BinaryIO

_HEADER = struct.Struct("!Q")


def send(stream: BinaryIO, message: Any) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(payload)) + payload)
    while view:  # an unbuffered pipe may take a large frame in several writes
        written = stream.write(view)
        view = view[written if written is not None else len(view) :]
    stream.flush()


def read_exact(stream: BinaryIO, size: int) -> bytes:
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def receive(stream: BinaryIO) -> Any:
    (size,) = _HEADER.unpack(read_exact(stream, _HEADER.size))
    return pickle.loads(read_exact(stream, size))
