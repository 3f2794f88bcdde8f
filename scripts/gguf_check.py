#!/usr/bin/env python3
"""Cross-check of brink's GGUF reader and writer against gguf-py, the reference implementation.

    gguf_check.py read PATH                       dump PATH as gguf-py's GGUFReader sees it (JSON)
    gguf_check.py write PATH [--split-max-tensors N]
                                                  write a model with gguf-py's GGUFWriter, then dump it

The dump lists every metadata field (gguf-py's `types` and its leaf values, flattened as gguf-py
flattens nested arrays) and every tensor (type id, ggml-order shape, byte size, absolute data
offset, data as hex). Leaves are "TYPE:value" strings: integers in decimal, floats as the hex of
their little-endian bytes (exact, NaN and infinities included), strings as text.
"""

import json
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V


def leaf(part, vtype):
    if vtype == V.STRING:
        return "STRING:" + bytes(part).decode("utf-8")
    if vtype == V.BOOL:
        return "BOOL:" + ("true" if int(part[0]) else "false")
    if vtype in (V.FLOAT32, V.FLOAT64):
        return f"{vtype.name}:{part.tobytes().hex()}"
    return f"{vtype.name}:{int(part[0])}"


def dump(path):
    r = gguf.GGUFReader(path)
    fields = []
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        leaf_type = f.types[-1]
        fields.append({
            "key": name,
            "types": [t.name for t in f.types],
            "leaves": [leaf(f.parts[i], leaf_type) for i in f.data] if f.types[0] == V.ARRAY or f.data else [],
        })
    tensors = [{
        "name": t.name,
        "type": int(t.tensor_type),
        "shape": [int(d) for d in t.shape],
        "n_bytes": int(t.n_bytes),
        "data_offset": int(t.data_offset),
        "hex": t.data.tobytes().hex(),
    } for t in r.tensors]
    version = int(r.fields["GGUF.version"].parts[-1][0])
    return {"version": version, "alignment": int(r.alignment), "fields": fields, "tensors": tensors}


def pattern(n, seed):
    """Deterministic bytes the Rust test recomputes: (i * 31 + seed) % 251."""
    return ((np.arange(n, dtype=np.int64) * 31 + seed) % 251).astype(np.uint8)


def write(path, split_max_tensors):
    w = gguf.GGUFWriter(path, arch="qwen3moe", split_max_tensors=split_max_tensors)
    if not split_max_tensors:
        # gguf-py writes general.alignment into the first shard only, so only unsplit files
        # may use a custom alignment.
        w.add_custom_alignment(64)
    w.add_uint8("p.u8", 200)
    w.add_int8("p.i8", -5)
    w.add_uint16("p.u16", 60000)
    w.add_int16("p.i16", -30000)
    w.add_uint32("p.u32", 4000000000)
    w.add_int32("p.i32", -2000000000)
    w.add_float32("p.f32", 0.1)
    w.add_uint64("p.u64", 2**64 - 1)
    w.add_int64("p.i64", -(2**63))
    w.add_float64("p.f64", -2.5e-300)
    w.add_bool("p.bool", True)
    w.add_string("p.str", "ünïcödé \u4e16")
    w.add_array("p.arr_str", ["a", "", "bc"])
    w.add_array("p.arr_i32", [1, -2, 3])
    w.add_array("p.arr_f32", [1.5, -0.25])
    w.add_array("p.arr_bool", [True, False])
    w.add_key_value("p.arr_u8", [1, 2, 255], V.ARRAY, sub_type=V.UINT8)
    w.add_key_value("p.arr_u64", [0, 2**64 - 1], V.ARRAY, sub_type=V.UINT64)
    w.add_array("p.nested", [[1, 2], [3]])
    w.add_tensor("w.f32", (np.arange(24, dtype=np.float32) - 7.5).reshape(3, 8))
    w.add_tensor("w.f16", np.linspace(-1, 1, 16, dtype=np.float16))
    w.add_tensor("w.i32", np.arange(-3, 5, dtype=np.int32))
    w.add_tensor("w.q8_0", pattern(2 * 34, 1).reshape(2, 34), raw_dtype=Q.Q8_0)
    w.add_tensor("w.q4_0", pattern(3 * 18, 2).reshape(3, 18), raw_dtype=Q.Q4_0)
    w.add_tensor("w.q4_k", pattern(144, 3).reshape(1, 144), raw_dtype=Q.Q4_K)
    w.add_tensor("w.q6_k", pattern(2 * 210, 4).reshape(2, 210), raw_dtype=Q.Q6_K)
    w.add_tensor("w.bf16", pattern(4 * 16, 5).reshape(4, 16), raw_dtype=Q.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv):
    if len(argv) >= 3 and argv[1] == "read":
        json.dump(dump(argv[2]), sys.stdout)
    elif len(argv) >= 3 and argv[1] == "write":
        split = int(argv[4]) if len(argv) >= 5 and argv[3] == "--split-max-tensors" else 0
        write(argv[2], split)
        if not split:
            json.dump(dump(argv[2]), sys.stdout)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
