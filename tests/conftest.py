import pytest

from helpers import SHARED_DATA


@pytest.fixture(scope="session")
def shared_data():
    if not (SHARED_DATA / "imdb" / "train.parquet").is_file():
        pytest.skip("../shared/data is not beside this checkout")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _isolated_datasets_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.getbasetemp() / "hf_datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
