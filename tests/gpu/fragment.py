"""A workload that fragments PyTorch's CUDA caching allocator (run by test_llm_oom.py).

With the process capped at C bytes (memcap/): one 70 % block is allocated and freed (its segment
stays cached), 20 blocks are carved from that segment and every other one freed — 35 % of C held,
35 % free in 20 separate holes — then a 40 % block is asked for. No hole is large enough, the
segment cannot be released while half of it is in use, and only 30 % is left outside it: out of
memory, with as much reserved-but-unallocated as allocated (fragmentation). With
`PYTORCH_ALLOC_CONF=expandable_segments:True` the free pages are unmapped and mapped again where
the large block needs them: it fits.
"""

import os

import torch


def main() -> None:
    fraction = float(os.environ.get("GPUCHECK_MEMORY_FRACTION", "1"))
    cap = int(fraction * torch.cuda.get_device_properties(0).total_memory)
    mib = 2**20
    big = int(0.70 * cap) // (20 * mib) * 20 * mib
    first = torch.empty(big, dtype=torch.uint8, device="cuda")
    del first
    blocks = [torch.empty(big // 20, dtype=torch.uint8, device="cuda") for _ in range(20)]
    held = blocks[::2]
    del blocks
    stats = torch.cuda.memory_stats()
    print(
        f"cap {cap / 2**30:.2f} GiB: allocated {stats['allocated_bytes.all.current'] / 2**30:.2f} GiB, "
        f"reserved {stats['reserved_bytes.all.current'] / 2**30:.2f} GiB",
        flush=True,
    )
    large = torch.empty(int(0.40 * cap), dtype=torch.uint8, device="cuda")
    print(f"fits: the large block was allocated ({large.numel() / 2**30:.2f} GiB beside {len(held)} held)")


if __name__ == "__main__":
    main()
