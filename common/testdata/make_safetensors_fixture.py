#!/usr/bin/env python3
"""Writes common/testdata/interop.safetensors with the reference `safetensors` package.

The file is committed; common/safetensors_test.cc checks that our reader loads it with the values
below and that our writer reproduces it byte for byte. Regenerate (needs `pip install safetensors
numpy`) only when the values change, and update the test with them:

    python3 common/testdata/make_safetensors_fixture.py common/testdata/interop.safetensors
"""
import sys

import numpy as np
from safetensors import TensorSpec, serialize_file


def bf16_bits(values):
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (the values here are exact)."""
    u = np.asarray(values, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main(path):
    arrays = {
        "f32": (np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5 - 1.0, "float32"),
        "f64_scalar": (np.array(3.25, dtype=np.float64), "float64"),
        "bf16": (bf16_bits([1.0, -2.5, 0.15625, 1024.0]).reshape(2, 2), "bfloat16"),
        "f16": (np.array([0.5, -1.0, 65504.0], dtype=np.float16), "float16"),
        "i32": (np.array([[-7, 0], [2147483647, -2147483648]], dtype=np.int32), "int32"),
        "i64": (np.array([-(2**40), 5], dtype=np.int64), "int64"),
        "u8": (np.array([0, 1, 255], dtype=np.uint8), "uint8"),
        "bool": (np.array([True, False, True], dtype=np.bool_), "bool"),
        "empty": (np.zeros((0, 3), dtype=np.float32), "float32"),
    }
    specs = {
        name: TensorSpec(dtype=dtype, shape=list(a.shape), data_ptr=a.ctypes.data,
                         data_len=a.nbytes)
        for name, (a, dtype) in arrays.items()
    }
    # One metadata key: the reference orders several keys by a hash map, not reproducibly.
    serialize_file(specs, path, metadata={"format": "pt"})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "interop.safetensors")
