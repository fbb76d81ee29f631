import os

# One CPU thread in every test process and every `tformer` a test starts (before torch is imported): pytest runs a
# worker per core, so more would only wait on each other, and the tests that compare runs bit for bit (a resume, the
# same seed twice) need a fixed thread count; with `auto` it follows the machine's load (tformer_cli/cores.py,
# tested in tests/test_cores.py with the variable unset).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import logging  # noqa: E402
import signal  # noqa: E402

import pytest  # noqa: E402

from helpers import SHARED_DATA, TINY_RUN, copy_run  # noqa: E402


@pytest.fixture(scope="session")
def shared_data():
    if not (SHARED_DATA / "imdb" / "train.parquet").is_file():
        pytest.skip("../shared/data is not beside this checkout")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One tiny run (helpers.TINY_RUN), trained once per session in-process with the Python API, as a `tformer
    train` would: the TrainResult. Tests only read it; a test that changes a run takes `tiny_run_copy` (or
    helpers.copy_run). Only `slow` tests may use it (it trains)."""
    from tformer_cli import train

    with pytest.MonkeyPatch.context() as mp:  # (session fixtures run before the autouse one below)
        mp.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.getbasetemp() / "hf_datasets"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        return train(TINY_RUN, run_dir=tmp_path_factory.mktemp("tiny_run") / "run", quiet=True)  # (whatever screen an
        # earlier test captured and closed)


@pytest.fixture
def tiny_run_copy(tiny_run, tmp_path):
    """A copy of the shared tiny run's folder in this test's tmp_path, free to change."""
    return copy_run(tiny_run.run_dir, tmp_path / "tiny_run")


@pytest.fixture(autouse=True)
def _isolated_datasets_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.getbasetemp() / "hf_datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _process_state_put_back():
    """What the CLI changes as a command ends (tformer_cli/cli.py `_exiting`: stop signals ignored, library info
    logs off) or a test's own handlers change, put back after each test that calls it in-process."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    disabled = logging.root.manager.disable
    yield
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)
    logging.disable(disabled)


def pytest_collection_modifyitems(config, items):
    """A test that uses the shared trained run must be marked slow: -m 'not slow' never trains."""
    unmarked = [item.nodeid for item in items if {"tiny_run", "tiny_run_copy"} & set(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("slow") is None]
    if unmarked:
        raise pytest.UsageError("these tests use the trained tiny_run but are not marked slow: " + ", ".join(unmarked))
