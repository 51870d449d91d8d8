"""TensorBoard event files read back independently of plexus's writer: the
TFRecord framing (u64 length, masked CRC-32C of the length, data, masked
CRC-32C of the data), with a bitwise CRC-32C that shares no table with the
C code.  Used by the tests that decode plexus's event files."""

import struct


def crc32c(data):
    # Bitwise, reflected Castagnoli polynomial.
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def records(blob, check):
    """The records of an event file's bytes; every framing fault is reported
    through check(cond, msg) (cli_util.check) naming its offset."""
    out, pos = [], 0
    while pos < len(blob):
        if not check(pos + 12 <= len(blob), "truncated header at %d" % pos):
            break
        hdr = blob[pos:pos + 8]
        (n,) = struct.unpack("<Q", hdr)
        (hcrc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        check(hcrc == masked(hdr), "length CRC at %d" % pos)
        data = blob[pos + 12:pos + 12 + n]
        check(len(data) == n, "truncated data at %d" % pos)
        (dcrc,) = struct.unpack("<I", blob[pos + 12 + n:pos + 16 + n])
        check(dcrc == masked(data), "data CRC at %d" % pos)
        out.append(data)
        pos += 16 + n
    check(pos == len(blob), "trailing bytes")
    return out
