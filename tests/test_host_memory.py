"""On CPU the CLI's commands serve large tensors from glibc's heap instead of a fresh mmap each (so a training step
reuses the memory the previous one freed instead of having the kernel map and zero it again), give the free pages
back at epoch ends, and leave the allocator alone for library callers and users who chose their own. Each case runs
in a fresh interpreter: the setting is process-wide."""
import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                                 reason="a glibc malloc setting"),
              pytest.mark.slow]  # a fresh interpreter (importing torch) per probe

PROBE = """
import ctypes, json, resource, sys
import torch
from tformer_cli import hardware

class MallInfo2(ctypes.Structure):  # glibc >= 2.33
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
if not hasattr(libc, "mallinfo2"):
    print(json.dumps({"skip": "glibc < 2.33"})); sys.exit()
libc.mallinfo2.restype = MallInfo2

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20

if sys.argv[1] == "cli":
    hardware.own_host_allocator()
try:
    mode = hardware.keep_freed_host_memory(torch.device(sys.argv[2]))
except Exception as exc:
    print(json.dumps({"error": str(exc)})); sys.exit()
before = libc.mallinfo2().hblks
x = torch.ones(16 * 2**20)  # 64 MB: over glibc's largest mmap threshold (32 MB)
mapped = libc.mallinfo2().hblks - before
del x
y = torch.ones(64 * 2**20)  # 256 MB, freed: kept by the heap (below the 2 GB trim threshold) until released
del y
kept = rss_mb()
hardware.release_freed_host_memory()
print(json.dumps({"mode": mode, "mapped": mapped, "kept_mb": kept, "released_mb": kept - rss_mb()}))
"""


def probe(owner="cli", device="cpu", **env) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("LD_PRELOAD", "GLIBC_TUNABLES", "TFORMER_HOST_ALLOCATOR", "THP_MEM_ALLOC_ENABLE")
             and not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PROBE, owner, device], env={**clean, **env}, capture_output=True,
                         text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    return result


def test_the_cli_serves_large_tensors_from_the_heap_and_releases_them_at_epoch_ends():
    kept, system = probe(), probe(TFORMER_HOST_ALLOCATOR="system")
    assert kept["mode"] == "retain" and kept["mapped"] == 0  # reusable by the next step
    assert system["mode"] == "system (TFORMER_HOST_ALLOCATOR=system)" and system["mapped"] >= 1
    assert kept["released_mb"] > 128, kept  # release_freed_host_memory gave the freed 256 MB back
    assert abs(system["released_mb"]) < 64, system  # nothing kept, nothing to give


@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_library_callers_and_users_own_allocator_choices_are_left_alone():
    library = probe(owner="library")
    assert library["mode"] == "system (library use)" and library["mapped"] >= 1
    assert probe(GLIBC_TUNABLES="glibc.malloc.arena_max=2")["mode"] == "system (GLIBC_TUNABLES tunes malloc)"
    assert probe(GLIBC_TUNABLES="glibc.pthread.rseq=0")["mode"] == "retain"  # not about malloc
    assert probe(MALLOC_ARENA_MAX="2")["mode"] == "system (MALLOC_ARENA_MAX is set)"
    assert probe(MALLOC_CONF="narenas:1")["mode"] == "retain"  # jemalloc's variable: glibc is still in use
    assert probe(device="meta")["mode"] == "system"
    assert probe(TFORMER_HOST_ALLOCATOR="keep")["error"] == \
        "TFORMER_HOST_ALLOCATOR=keep must be retain (the default) or system"
