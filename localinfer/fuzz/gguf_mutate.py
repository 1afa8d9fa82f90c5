"""The GGUF fuzzer without atheris (no wheel for this Python or platform): random mutations of
the seeds, in this process. Blind where libFuzzer is coverage-guided, but it aims at what a
GGUF header is made of: 4- and 8-byte counts and lengths set to boundary values, bytes
flipped, chunks cut, duplicated or spliced from another seed, the tail size changed."""

from __future__ import annotations

import random
import struct

_BOUNDARIES = (0, 1, 2, 3, 31, 32, 33, 63, 64, 255, 256, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
               2**62, 2**63 - 1, 2**63, 2**64 - 1)


def mutate(data: bytes, seeds: list[bytes], rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        at = rng.randrange(len(buf) + 1)
        if op == 0 and buf:  # flip a bit
            i = min(at, len(buf) - 1)
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and len(buf) >= 4:  # a 4-byte boundary value
            i = min(at, len(buf) - 4)
            buf[i:i + 4] = struct.pack("<I", rng.choice(_BOUNDARIES) & 0xFFFFFFFF)
        elif op == 2 and len(buf) >= 8:  # an 8-byte boundary value
            i = min(at, len(buf) - 8)
            buf[i:i + 8] = struct.pack("<Q", rng.choice(_BOUNDARIES))
        elif op == 3:  # cut a chunk
            del buf[at:at + rng.randint(1, 64)]
        elif op == 4:  # duplicate a chunk
            buf[at:at] = buf[at:at + rng.randint(1, 64)]
        elif op == 5:  # splice another seed's bytes in
            other = rng.choice(seeds)
            start = rng.randrange(len(other) + 1)
            buf[at:at + rng.randint(0, 64)] = other[start:start + rng.randint(1, 256)]
        else:  # truncate
            del buf[at:]
    return bytes(buf)
