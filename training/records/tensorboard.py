"""A minimal TensorBoard event-file writer for scalars (no tensorboard dependency).

An event file is a sequence of records: length (uint64), masked CRC-32C of
the length, an `Event` protobuf, masked CRC-32C of the data. Only the few
protobuf fields needed for scalar summaries are encoded here.
"""
from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

from gpusim.errors import GpusimError, reading, writing


def _crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    key = _varint((number << 3) | wire_type)
    if wire_type == 2:  # length-delimited
        return key + _varint(len(payload)) + payload
    return key + payload


def encode_event(wall_time: float, step: int, *, file_version: str | None = None,
                 scalars: dict | None = None) -> bytes:
    event = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
    if file_version is not None:
        event += _field(3, 2, file_version.encode())
    if scalars:
        values = b"".join(
            _field(1, 2, _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", value)))
            for tag, value in scalars.items())
        event += _field(5, 2, values)
    return event


def frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc(length)) + data
            + struct.pack("<I", masked_crc(data)))


class ScalarWriter:
    """Appends scalar summaries to a new event file in `log_dir`."""

    def __init__(self, log_dir: Path):
        log_dir = Path(log_dir)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.gpusim"
        self.path = log_dir / name
        with writing(self.path):
            log_dir.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")
        self._write(frame(encode_event(time.time(), 0, file_version="brain.Event:2")))

    def add_scalars(self, step: int, scalars: dict):
        finite = {k: float(v) for k, v in scalars.items() if v is not None}
        self._write(frame(encode_event(time.time(), step, scalars=finite)))

    def _write(self, record: bytes):
        with writing(self.path):
            self._file.write(record)
            self._file.flush()

    def close(self):
        self._file.close()


def records(data: bytes):
    """(start, end, step, body) of each whole record of an event file's bytes.

    Stops at a torn or corrupt record (a write cut short by a kill).
    """
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        (length_crc,) = struct.unpack_from("<I", data, pos + 8)
        end = pos + 16 + length
        if length_crc != masked_crc(data[pos:pos + 8]) or end > len(data):
            return
        body = data[pos + 12:pos + 12 + length]
        if struct.unpack_from("<I", data, end - 4)[0] != masked_crc(body):
            return
        yield pos, end, _parse(body).get(2, [0])[0], body
        pos = end


def drop_steps_after(log_dir: Path, last_step: int):
    """On resume: keep only the events up to `last_step` (the checkpoint's), so the
    iterations that run again are not shown twice."""
    for path in Path(log_dir).glob("events.out.tfevents.*"):
        if not path.is_file():
            raise GpusimError(f"{path} is not a file: move it away to resume")
        with reading(path):
            data = path.read_bytes()
        kept = b"".join(data[start:end] for start, end, step, _ in records(data)
                        if step <= last_step)
        if kept != data:
            temp = path.with_name(path.name + ".tmp")
            with writing(path, cleanup=lambda: temp.unlink(missing_ok=True)):
                temp.write_bytes(kept)
                os.replace(temp, path)


def read_scalars(path) -> list:
    """Decode an event file written by ScalarWriter: [(step, {tag: value})] (for tests)."""
    out = []
    for _, _, step, body in records(Path(path).read_bytes()):
        scalars = {}
        for summary in _parse(body).get(5, []):
            for value in _parse(summary).get(1, []):
                v = _parse(value)
                scalars[v[1][0].decode()] = struct.unpack("<f", v[2][0])[0]
        if scalars:
            out.append((step, scalars))
    return out


def _parse(buf: bytes) -> dict:
    fields, pos = {}, 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            length, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        fields.setdefault(number, []).append(value)
    return fields


def _read_varint(buf, pos):
    shift = value = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
