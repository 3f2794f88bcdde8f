#!/usr/bin/env python3
"""Dequantizes raw GGUF tensor bytes with gguf-py's numpy dequantizers: the reference that
kernels/tests/quant_reference.rs compares brink's CPU dequantization with.

usage: gguf_dequantize.py TYPE IN OUT [TYPE IN OUT ...]

TYPE is a GGMLQuantizationType name (F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4); IN holds
whole blocks of that type; OUT receives the values as little-endian f32.
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize


def main(args):
    if not args or len(args) % 3:
        raise SystemExit(__doc__)
    for name, src, dst in zip(args[0::3], args[1::3], args[2::3]):
        data = np.fromfile(src, dtype=np.uint8)
        values = dequantize(data, GGMLQuantizationType[name])
        np.ascontiguousarray(values, dtype="<f4").tofile(dst)


if __name__ == "__main__":
    main(sys.argv[1:])
