"""The matrix-product roof of this device, the yardstick for the learner's achieved FLOP/s:
a square product timed after warm-ups (bf16 on CUDA; fp32 on the CPU, at a small size).

    python benchmarks/matmul_roof.py [--size 8192] [--json PATH]

``--json PATH`` writes {"device", "dtype", "size", "flops_per_s"}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def roof(size: int, device: torch.device, dtype: torch.dtype, repeats: int = 10) -> float:
    """FLOP/s of size x size x size products, the mean of ``repeats`` after three warm-ups."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - started)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=0, help="0: 8192 on CUDA, 512 on the CPU")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    size = args.size or (8192 if device.type == "cuda" else 512)
    flops = roof(size, device, dtype)
    name = device_name(device)
    print(
        f"{name}: {str(dtype).removeprefix('torch.')} matmul {size}^3: {flops / 1e12:.1f} TFLOP/s"
    )
    if args.json:
        payload = {"device": name, "dtype": str(dtype), "size": size, "flops_per_s": flops}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
