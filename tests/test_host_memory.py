"""The CPU commands keep the memory freed tensors give back (glibc mallopt), so a training step stops paying the
kernel to map and zero its activations again. Each case runs in a fresh interpreter: the setting is process-wide."""
import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                                reason="a glibc malloc setting")

PROBE = """
import json, resource, sys
import torch
from tformer_cli.hardware import keep_freed_host_memory
mode = keep_freed_host_memory(torch.device(sys.argv[1]))
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(128, 4, 512, batch_first=True)
x = torch.randn(16, 512, 128)  # attention scores 16 x 4 x 512 x 512: 64 MB, beyond glibc's mmap thresholds
layer(x).sum().backward()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    layer(x).sum().backward()
print(json.dumps({"mode": mode, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def probe(device="cpu", **env) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("LD_PRELOAD", "GLIBC_TUNABLES", "TFORMER_HOST_ALLOCATOR") and not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PROBE, device], env={**clean, **env}, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_training_step_reuses_freed_memory_instead_of_faulting_it_in_again():
    kept, system = probe(), probe(TFORMER_HOST_ALLOCATOR="system")
    assert kept["mode"] == "retain"
    assert system["mode"].startswith("system")
    assert system["faults"] > 3 * 64 * 2**20 // 4096 // 4  # the scores alone, mapped again each step
    assert kept["faults"] < system["faults"] // 4, (kept, system)  # 10x fewer on the machine this was written on


def test_a_users_allocator_choice_and_accelerators_are_left_alone():
    assert probe(GLIBC_TUNABLES="glibc.malloc.arena_max=2")["mode"] == "system (GLIBC_TUNABLES is set)"
    assert probe(MALLOC_ARENA_MAX="2")["mode"] == "system (MALLOC_ARENA_MAX is set)"
    assert probe(device="meta")["mode"] == "system"
