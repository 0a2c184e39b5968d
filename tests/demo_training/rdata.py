"""Read R's lazy-load data (``Rdata.rdx`` + ``Rdata.rdb``) without R: just enough of R's
serialization format for the character vectors of the ``janeaustenr`` package.

R stores a package's datasets as a database: ``Rdata.rdb`` is a concatenation of serialized,
zlib-compressed objects, and ``Rdata.rdx`` (gzip) is a serialized named list whose
``variables`` entry maps each dataset's name to its ``(offset, length)`` in the ``.rdb``.

A serialized object is big-endian ("XDR"): a header (``X\\n``, format version, two R versions,
and in version 3 a native-encoding string), then items. Each item starts with a 32-bit flags
word: the low byte is the type, bit 9 says an attribute pairlist follows the item, bit 10 says a
tag precedes the value of a pairlist cell.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Type codes (R internals, "SEXPTYPE").
_SYM, _LIST, _LGL, _INT, _REAL, _STR, _VEC, _CHAR = 1, 2, 10, 13, 14, 16, 19, 9
_NIL, _REF = 254, 255
_HAS_ATTR, _HAS_TAG = 1 << 9, 1 << 10


@dataclass
class RVector:
    """A vector with attributes (e.g. a named list: ``attributes["names"]``)."""

    values: list[Any]
    attributes: dict[str, Any] = field(default_factory=dict)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos, self.symbols = data, 0, []

    def int32(self) -> int:
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def document(self) -> Any:
        if self.data[:2] != b"X\n":
            raise ValueError("not an XDR-serialized R object")
        self.pos = 2
        version = self.int32()
        self.int32(), self.int32()  # writer's and minimal reader's R versions
        if version == 3:
            encoding_length = self.int32()  # then the native encoding's name
            self.pos += encoding_length
        return self.item()

    def item(self) -> Any:
        flags = self.int32()
        kind = flags & 0xFF
        if kind == _NIL:
            return None
        if kind == _REF:  # a symbol seen before, by 1-based index
            return self.symbols[(flags >> 8) - 1]
        if kind == _SYM:
            name = self.item()
            self.symbols.append(name)
            return name
        if kind == _CHAR:
            n = self.int32()
            if n == -1:  # NA_character_
                return None
            text = self.data[self.pos : self.pos + n].decode("utf-8", "replace")
            self.pos += n
            return text
        if kind == _LIST:
            return self.pairlist(flags)
        if kind in (_STR, _VEC):
            values = [self.item() for _ in range(self.int32())]
        elif kind in (_INT, _LGL):
            n = self.int32()
            values = list(struct.unpack_from(f">{n}i", self.data, self.pos))
            self.pos += 4 * n
        elif kind == _REAL:
            n = self.int32()
            values = list(struct.unpack_from(f">{n}d", self.data, self.pos))
            self.pos += 8 * n
        else:
            raise ValueError(f"R type {kind} is not supported (at byte {self.pos})")
        if flags & _HAS_ATTR:
            return RVector(values, self.item())
        return values

    def pairlist(self, flags: int) -> dict[str, Any]:
        """A pairlist of tagged cells, as a dict (attribute lists are such pairlists)."""
        cells: dict[str, Any] = {}
        while True:
            if flags & _HAS_ATTR:
                self.item()
            tag = self.item() if flags & _HAS_TAG else f"#{len(cells)}"
            cells[tag] = self.item()
            flags = self.int32()
            if flags & 0xFF == _NIL:
                return cells
            if flags & 0xFF != _LIST:
                raise ValueError("a pairlist ends with something other than NULL")


def unserialize(data: bytes) -> Any:
    """One R object from its XDR serialization (character/int/real vectors, lists, pairlists)."""
    return _Reader(data).document()


def read_lazyload_db(base: str | Path) -> dict[str, Any]:
    """All datasets of a lazy-load database ``base.rdx``/``base.rdb``, by name."""
    base = Path(base)
    index = unserialize(gzip.decompress(base.with_suffix(".rdx").read_bytes()))
    variables = index.values[index.attributes["names"].index("variables")]
    db = base.with_suffix(".rdb").read_bytes()
    out: dict[str, Any] = {}
    for name, (offset, length) in zip(variables.attributes["names"], variables.values):
        # Each record: the uncompressed length (4 bytes, big-endian), then a zlib stream.
        out[name] = unserialize(zlib.decompress(db[offset + 4 : offset + length]))
    return out
