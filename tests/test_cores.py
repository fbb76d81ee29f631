"""The thread count: usable cores from affinity and cgroup quotas, the fixed count from the config or
OMP_NUM_THREADS, the share among busy tformer processes (a real registry, real processes), and what a run says."""
import os
import subprocess
import sys
import time

import pytest

from helpers import run_tformer, tiny
from tformer_cli import cores
from tformer_cli.errors import ConfigError


def test_a_fixed_count_comes_from_the_config_then_omp_num_threads():
    assert cores.fixed_threads(3, environ={"OMP_NUM_THREADS": "2"}) == (3, "trainer.threads")
    assert cores.fixed_threads("auto", environ={"OMP_NUM_THREADS": "2"}) == (2, "OMP_NUM_THREADS")
    assert cores.fixed_threads(None, environ={}) == (None, "")
    for ignored in ("", "0", "two", "-1", "1.5"):  # (OpenMP ignores such values too)
        assert cores.fixed_threads("auto", environ={"OMP_NUM_THREADS": ignored}) == (None, "")
    for bad in (0, -2, 1.5, True, "many"):
        with pytest.raises(ConfigError, match="must be auto or a whole number"):
            cores.parse_threads(bad)


def _cgroup_v2(root, path: str, cpu_max: dict[str, str]):
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for folder, value in cpu_max.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "cpu.max").write_text(value + "\n")
    return f"0::/{path}\n"


def test_cgroup_v2_quota_is_the_tightest_on_the_way_to_the_root(tmp_path):
    me = _cgroup_v2(tmp_path, "a/b", {"a": "150000 100000", "a/b": "max 100000"})
    assert cores.cgroup_quota(tmp_path, me) == 1.5
    me = _cgroup_v2(tmp_path, "a/b", {"a": "400000 100000", "a/b": "250000 100000"})
    assert cores.cgroup_quota(tmp_path, me) == 2.5
    assert cores.cgroup_quota(tmp_path, _cgroup_v2(tmp_path / "none", "x", {"x": "max 100000"})) is None


def test_cgroup_v1_quota_and_no_quota(tmp_path):
    folder = tmp_path / "cpu,cpuacct" / "job"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("50000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    assert cores.cgroup_quota(tmp_path, "4:cpu,cpuacct:/job\n") == 0.5
    (folder / "cpu.cfs_quota_us").write_text("-1\n")
    assert cores.cgroup_quota(tmp_path, "4:cpu,cpuacct:/job\n") is None
    assert cores.cgroup_quota(tmp_path, "garbage\n") is None


def test_usable_cores_are_the_affinity_capped_by_the_quota():
    assert cores.usable_cores({0, 1, 2, 3}, quota=None, self_cgroup="")[0] == 4
    count, why = cores.usable_cores({0, 1, 2, 3}, quota=2.5)
    assert count == 2 and "quota of 2.5" in why
    assert cores.usable_cores({0, 1}, quota=0.3)[0] == 1  # (never 0)
    assert cores.usable_cores({0, 1}, quota=8)[0] == 2


def test_the_real_affinity_is_read():
    """taskset's way: a process pinned to one CPU has one usable core."""
    code = "import os; os.sched_setaffinity(0, {0}); from tformer_cli import cores; print(cores.usable_cores()[0])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_the_share_is_even_among_busy_peers_and_within_the_free_cores():
    assert cores.choose(2, free=2.0, busy_peers=0) == 2
    assert cores.choose(2, free=1.0, busy_peers=0) == 1  # a busy core beside it
    assert cores.choose(2, free=2.0, busy_peers=1) == 1  # another tformer training
    assert cores.choose(16, free=16.0, busy_peers=1) == 8
    assert cores.choose(16, free=16.0, busy_peers=3) == 4
    assert cores.choose(16, free=5.6, busy_peers=0) == 6
    assert cores.choose(4, free=0.0, busy_peers=5) == 1  # never 0


def _spinner(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time\nt = time.time()\nwhile time.time() - t < {seconds}: pass"])


def test_registered_peers_count_while_they_compute_and_stale_files_go(tmp_path):
    """A real second process in the registry: counted while it uses a core, not once it idles; a file of a process
    that is gone is removed."""
    busy, idle = _spinner(30), subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for proc in (busy, idle):
            start = cores._process(proc.pid)[0]
            (tmp_path / str(proc.pid)).write_text(str(start))
        (tmp_path / "999999999").write_text("1")  # a process that is gone
        share = cores.Share(registry=tmp_path, cpus={0, 1}, quota=None)
        assert set(share.last.peers) == {busy.pid, idle.pid} and not (tmp_path / "999999999").exists()
        time.sleep(1.0)  # (a window long enough to see who computes; new peers count as busy at first)
        share.measure()
        time.sleep(1.5)
        free, busy_peers = share.measure()
        assert busy_peers == 1  # the spinner, not the sleeper
        assert free <= 1.6  # the spinner takes about one of the two CPUs
    finally:
        busy.kill(), idle.kill()


def test_a_claim_registers_sets_torch_and_puts_everything_back(tmp_path, monkeypatch):
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cores, "registry_dir", lambda: tmp_path)
    before = torch.get_num_threads()
    said = []
    with cores.claimed(1, say=lambda line, **kw: said.append(line)) as share:
        assert torch.get_num_threads() == 1 and cores.active() is share
        assert (tmp_path / str(os.getpid())).is_file()
        assert share.rebalance() is False  # (fixed: never changed)
    assert torch.get_num_threads() == before and cores.active() is None
    assert not (tmp_path / str(os.getpid())).exists()
    assert "1 thread (trainer.threads" in said[0]


@pytest.mark.slow  # a subprocess per case; the line comes before the data is read, so a missing file ends each
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_a_run_says_its_threads(tmp_path):
    missing = ["data=files", f"data.train_file={tmp_path / 'missing.csv'}"]
    r = run_tformer("train", *missing, "trainer.threads=1", cwd=tmp_path, env={"OMP_NUM_THREADS": ""})
    assert "cpu 1 thread (trainer.threads; " in r.stdout, r.stdout + r.stderr
    r = run_tformer("train", *missing, cwd=tmp_path, env={"OMP_NUM_THREADS": ""})
    assert "usable cores" in r.stdout and "following the load of other processes" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 2 and "data file not found" in r.stderr
    r = run_tformer("train", *tiny("trainer.threads=0"), cwd=tmp_path)
    assert r.returncode == 2 and "trainer.threads=0 must be auto or a whole number of threads >= 1" in r.stderr
