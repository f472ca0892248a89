"""Allocation patterns that several GPU programs make with PyTorch, in one place so that they
make the same one: torch_modes.py and pools/pools_probe.py (cuda-facts.md's twenty tensors),
oom/torch_oom.py and lens/stacks_oom.py (a cache of whole 1 GiB segments). The programs in
subfolders put scripts/gpu on sys.path to import it."""
import torch

GiB = 1 << 30


def twenty_every_other_freed():
    """Twenty tensors of 7..140 MiB, then every other one freed, then a synchronize. Returns
    the list (freed places None): it keeps the other ten alive."""
    tensors = []
    for i in range(20):
        tensors.append(torch.empty((7 * (i + 1)) << 20, dtype=torch.uint8, device="cuda"))
    for i in range(0, 20, 2):
        tensors[i] = None
    torch.cuda.synchronize()
    return tensors


def whole_gib_segments_cached():
    """1 GiB tensors until the device is full, then all freed: every 1 GiB segment goes back
    to PyTorch's cache, whole. Returns how many there are."""
    big = []
    try:
        while True:
            big.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        pass
    n = len(big)
    big.clear()
    return n
