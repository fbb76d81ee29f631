"""Data: the generated demo set, local file loaders, label handling, newsgroups cleaning, token storage."""
import json
import subprocess
import sys

import pandas as pd
import pytest

from helpers import ROOT, data_config, tiny
from tformer_cli.data import demo, sources
from tformer_cli.errors import TformerError


def files_cfg(**kw):
    return data_config("files", validation_fraction=0.25, **kw)


def test_demo_is_deterministic_balanced_and_disjoint():
    a, b = demo.splits(seed=3), demo.splits(seed=3)
    assert a == b
    assert demo.splits(seed=4)["train"] != a["train"]
    texts, labels = a["train"]
    assert len(texts) == 8000 and abs(sum(labels) - 4000) < 100  # balanced overall, shuffled into splits
    assert not set(a["train"][0]) & set(a["test"][0])


def test_demo_defeats_bag_of_words():
    """Unigram counts carry no signal: every sentence mixes positive and negative words."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    s = demo.splits()
    vec = CountVectorizer()
    clf = LogisticRegression(max_iter=2000).fit(vec.fit_transform(s["train"][0]), s["train"][1])
    assert clf.score(vec.transform(s["test"][0]), s["test"][1]) < 0.65


def test_demo_labels_follow_scope_rules():
    import random

    rng = random.Random(0)
    for _ in range(200):
        for label in (0, 1):
            text = demo._sentence(rng, label)
            if text.startswith("i have never seen"):
                adj = text.split(" so ")[-1].strip(".!")
                assert (adj in demo.POSITIVE) == (label == 1)


def test_csv_with_string_labels_maps_sorted_names(tmp_path):
    p = tmp_path / "train.csv"
    rows = ["review,sentiment"] + [f"text number {i},{'good' if i % 2 else 'bad'}" for i in range(40)]
    p.write_text("\n".join(rows) + "\n")
    data = sources.load(files_cfg(train_file=str(p), text_column="review", label_column="sentiment"))
    assert data.label_names == ["bad", "good"]
    assert len(data.splits["train"]) == 30 and len(data.splits["validation"]) == 10
    row = data.splits["train"][0]
    assert row["label"] == (1 if int(row["text"].split()[-1]) % 2 else 0)
    # stratified: both classes in validation, equally
    assert sorted(data.splits["validation"]["label"]).count(0) == 5


def test_a_class_seen_once_stays_in_train_and_the_rest_is_stratified(tmp_path, monkeypatch):
    """Fine-grained label sets (TREC's 50 classes) have classes with one example: carving a validation split keeps
    that row in train instead of refusing the data; data without such classes splits exactly as before."""
    p = tmp_path / "train.csv"
    rows = ["text,label"] + [f"text number {i},{'good' if i % 2 else 'bad'}" for i in range(40)]
    rows += ["only one,rare", "a class named like markup,[/]"]
    p.write_text("\n".join(rows) + "\n")
    said = []  # what the loader tells the user, whatever console an earlier test left behind

    class Said:
        def print(self, line, **kw):
            said.append(line)
    monkeypatch.setattr(sources, "output", Said)
    data = sources.load(files_cfg(train_file=str(p)))
    train, val = data.splits["train"], data.splits["validation"]
    rare = data.label_names.index("rare")
    assert train["label"].count(rare) == 1 and rare not in val["label"]
    assert len(train) + len(val) == 42 and len(val) == round(0.25 * 42)
    bad, good = data.label_names.index("bad"), data.label_names.index("good")
    assert val["label"].count(bad) == val["label"].count(good)  # the others still stratified
    assert any("2 classes with a single train example kept in train only (\\[/], rare)" in line for line in said)
    # without the rare row the split is the one datasets' stratified split gives
    p.write_text("\n".join(rows[:-2]) + "\n")
    plain = sources.load(files_cfg(train_file=str(p))).splits["validation"]["text"]
    assert plain == sources.datasets.Dataset.from_csv(str(p)).cast_column(
        "label", sources.datasets.ClassLabel(names=["bad", "good"])).train_test_split(
        test_size=0.25, seed=0, stratify_by_column="label")["test"]["text"]


def _grouped_csv(path, groups=60, seed=0):
    """Texts of `groups` authors (1 to 6 texts each), each author writing in one of 3 classes."""
    import random
    rng = random.Random(seed)
    rows = ["text,label,author"]
    for g in range(groups):
        rows += [f"post {i} by author{g},{'abc'[g % 3]},author{g}" for i in range(rng.randint(1, 6))]
    path.write_text("\n".join(rows) + "\n")
    return len(rows) - 1


def test_a_group_column_keeps_each_group_on_one_side(tmp_path, monkeypatch):
    """data.group_column: an author's (a thread's, a customer's) texts are all in train or all in validation, about
    the fraction asked is carved, stratified as far as groups allow, seeded; the column is not kept."""
    p = tmp_path / "train.csv"
    n = _grouped_csv(p)
    said = []

    class Said:
        def print(self, line, **kw):
            said.append(line)
    monkeypatch.setattr(sources, "output", Said)
    data = sources.load(files_cfg(train_file=str(p), group_column="author"))
    train, val = data.splits["train"], data.splits["validation"]
    author = lambda texts: {t.split(" by ")[1] for t in texts}  # noqa: E731
    assert not author(train["text"]) & author(val["text"]) and len(train) + len(val) == n
    assert abs(len(val) - 0.25 * n) <= 18  # (a group's texts, at most 6, either way per class)
    assert set(val["label"]) == {0, 1, 2} and set(train.column_names) == set(val.column_names) == {"text", "label"}
    assert any(f"validation split: {len(val)} texts, {len(author(val['text']))} of 60 groups by author" in line
               for line in said)
    again = sources.load(files_cfg(train_file=str(p), group_column="author")).splits["validation"]["text"]
    other = sources.load(files_cfg(train_file=str(p), group_column="author"), seed=1).splits["validation"]["text"]
    assert again == val["text"] and set(other) != set(val["text"])
    plain = sources.load(files_cfg(train_file=str(p))).splits["validation"]["text"]
    assert author(plain) & author(sources.load(files_cfg(train_file=str(p))).splits["train"]["text"])  # (what it fixes)
    # a test split carved from train keeps groups whole too; a text without a group is a group of its own
    rows = p.read_text().splitlines()
    p.write_text("\n".join(rows + ["a text of nobody,a,"]) + "\n")
    data = sources.load(files_cfg(train_file=str(p), group_column="author", test_fraction=0.2))
    sides = [author(t for t in data.splits[s]["text"] if " by " in t) for s in ("train", "validation", "test")]
    assert not (sides[0] & sides[1] or sides[0] & sides[2] or sides[1] & sides[2])
    assert sum(len(data.splits[s]) for s in data.splits) == n + 1


def test_group_column_refusals_and_multi_label(tmp_path):
    p = tmp_path / "train.csv"
    _grouped_csv(p)
    with pytest.raises(TformerError, match=r"^data.group_column='writer': no such column in the train split; it has "
                                           r"columns text, label, author; name the column"):
        sources.load(files_cfg(train_file=str(p), group_column="writer"))
    one = tmp_path / "one.csv"
    one.write_text("text,label,site\n" + "".join(f"text {i},{'ab'[i % 2]},same\n" for i in range(20)))
    refused = (r"^data.group_column='{}': the train split's 20 rows fall in {}, none of which can go to a validation "
               r"split without leaving a class no train rows \(or taking most of them\); add rows from more groups")
    with pytest.raises(TformerError, match=refused.format("site", "1 group")):
        sources.load(files_cfg(train_file=str(one), group_column="site"))
    with pytest.raises(TformerError, match=refused.format("label", "2 groups")):  # (a group per class)
        sources.load(files_cfg(train_file=str(one), group_column="label"))
    nested = tmp_path / "nested.parquet"
    pd.DataFrame({"text": ["a", "b"] * 10, "label": [0, 1] * 10, "tags": [["x"], ["y"]] * 10}).to_parquet(nested)
    with pytest.raises(TformerError, match=r"^data.group_column='tags': its cells are lists or mappings; give one"):
        sources.load(files_cfg(train_file=str(nested), group_column="tags"))
    sets = tmp_path / "sets.csv"
    sets.write_text("text,label,author\n" + "".join(f"text {i} by a{i // 3},\"x,y\",a{i // 3}\n" if i % 2 else
                                                      f"text {i} by a{i // 3},x,a{i // 3}\n" for i in range(60)))
    data = sources.load(files_cfg(train_file=str(sets), group_column="author", multi_label=True))
    by = lambda s: {t.split(" by ")[1] for t in data.splits[s]["text"]}  # noqa: E731
    assert not by("train") & by("validation") and len(data.splits["validation"]) in range(12, 19)
    texts = sources.load(files_cfg(train_file=str(p), group_column="author"), texts_only=True)  # (pretraining)
    assert {t.split(" by ")[1] for t in texts.splits["train"]["text"]}.isdisjoint(
        t.split(" by ")[1] for t in texts.splits["validation"]["text"])


def test_grouped_carves_spread_few_groups_and_keep_every_class_in_train():
    """However few a class's groups, each side gets its share in expectation (a seeded turn per class): 50 classes
    of 2 equal groups give about 20%, not all-or-nothing; a blank cell is a group of its own; a class whose rows all
    sit in other classes' groups keeps rows in train."""
    import numpy as np
    import pyarrow as pa

    codes = np.repeat(np.arange(100), 4)
    for seed in range(3):
        held = sources.carved_rows(codes, (codes // 2).astype(np.int64), 0.2, seed)
        assert 0.1 < held.mean() < 0.3 and (np.bincount((codes // 2)[~held], minlength=50) > 0).all()
    got = sources.group_codes(pa.chunked_array([pa.array(["a", "", "b", None]), pa.array([" ", "a", "b", "c"])]))
    assert got[0] == got[5] and got[2] == got[6] and len(set(got[[1, 3, 4]])) == 3 and len(set(got)) == 6
    big = np.r_[np.zeros(1000, dtype=np.int64), np.arange(1, 11)]  # one group of 1,000 rows and ten of 1
    for seed in range(20):  # (more than half its class: never carved, whatever the draw)
        assert not sources.carved_rows(big, np.zeros(1010, dtype=np.int64), 0.2, seed)[:1000].any()
    few = np.repeat(np.arange(6), 5)  # 2 classes of 3 groups: some group is carved at any seed, even at 0.1
    assert all(sources.carved_rows(few, few // 3, 0.1, seed).any() for seed in range(30))
    labels = np.array([0] * 8 + [1] * 8 + [0, 2])  # class 2 only inside a class-0 group
    codes = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8])
    for seed in range(20):
        held = sources.carved_rows(codes, labels, 0.5, seed)
        assert (np.bincount(labels[~held], minlength=3) > 0).all()


def test_a_posts_thread_is_its_subject_without_reply_prefixes(tmp_path, monkeypatch):
    """group_column=thread (20 Newsgroups' default): read from each post's header block before data.remove
    strips it, so that a thread's replies are never split between train and validation."""
    from tformer_cli.data.newsgroups import thread

    assert thread("From: a@b\nSubject: Re: RE:Fwd:  Help   with X11\n\nbody") == "help with x11"
    assert thread("subject: re^2: Help with X11\nLines: 3\n\nSubject: not this") == "help with x11"
    assert thread("From: a@b\n\nSubject: in the body only") is None
    assert thread("Subject: Re:\n\nbody") is None and thread("no header at all") is None
    rows = []
    for t in range(30):
        rows += [{"text": f"From: u{t}{r}@x\nSubject: {'Re: ' * r}Topic {t}\n\npost {r} of thread {t}",
                  "label": t % 2} for r in range(3)]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    data = sources.load(files_cfg(train_file=str(tmp_path / "train.parquet"), group_column="thread",
                                  remove="[headers]"))
    of = lambda s: {t.split()[-1] for t in data.splits[s]["text"]}  # noqa: E731
    assert not of("train") & of("validation") and "Subject" not in data.splits["train"][0]["text"]
    assert len(data.splits["validation"]) % 3 == 0 and len(data.splits["validation"]) > 0
    said = []

    class Said:
        def print(self, line, **kw):
            said.append(line)
    monkeypatch.setattr(sources, "output", Said)
    pd.DataFrame({"text": [r["text"].split("\n\n")[1] for r in rows], "label": [r["label"] for r in rows]}).to_parquet(
        tmp_path / "bare.parquet")  # (headers stripped already: no thread to read)
    sources.load(files_cfg(train_file=str(tmp_path / "bare.parquet"), group_column="thread"))
    assert any("no text of the train split has a Subject: header" in line for line in said)


def test_short_text_sets_build_from_trec_and_newsgroups(shared_data, tmp_path):
    """benchmarks/short_texts.py: TREC's questions with their fine labels, 20 Newsgroups' subject lines."""
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "short_texts.py"), "--trec", str(shared_data / "trec"),
                    "--newsgroups", str(shared_data / "twenty_newsgroups"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    trec = pd.read_parquet(tmp_path / "trec50" / "train.parquet")
    assert len(trec) == 5444 and trec["label"].nunique() > 40 and trec["label"].str.contains(":").all()
    subjects = pd.read_parquet(tmp_path / "newsgroup_subjects" / "test.parquet")
    assert len(subjects) > 7400 and subjects["label"].nunique() == 20
    assert not subjects["text"].str.match(r"(?i)\s*re\s*:").any() and subjects["text"].str.split().str.len().mean() < 8


def test_tsv_jsonl_and_parquet(tmp_path):
    (tmp_path / "a.tsv").write_text("text\tlabel\n" + "".join(f"t {i}\t{i % 3}\n" for i in range(30)))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"body": f"t {i}", "y": i % 3}) + "\n" for i in range(30)))
    pd.DataFrame({"text": [f"t {i}" for i in range(30)], "label": [i % 3 for i in range(30)]}).to_parquet(
        tmp_path / "c.parquet")
    for f, kw in (("a.tsv", {}), ("b.jsonl", {"text_column": "body", "label_column": "y"}), ("c.parquet", {})):
        data = sources.load(files_cfg(train_file=str(tmp_path / f), test_file=str(tmp_path / f), **kw))
        assert data.label_names == ["0", "1", "2"] and len(data.splits["test"]) == 30


def test_a_folder_found_through_the_data_root_is_saved_and_settings_it_would_not_read_are_refused(tmp_path,
                                                                                                  monkeypatch):
    """$TFORMER_DATA_ROOT's folder was not saved (evaluate and the resume command then went to the Hub); a
    data.train_file beside the demo data, and data.n_train beside a real dataset, were silently not read."""
    (tmp_path / "trec").mkdir()
    monkeypatch.setenv("TFORMER_DATA_ROOT", str(tmp_path))
    assert sources.absolute_locations(data_config("trec")) == {"dir": str((tmp_path / "trec").resolve())}
    assert sources.absolute_locations(data_config("demo")) == {}
    with pytest.raises(TformerError, match=r"data.train_file=my.csv is read with data=files \(data=demo generates "
                                           r"its own sentences\): add data=files"):
        sources.load(data_config("demo", train_file="my.csv"))
    with pytest.raises(TformerError, match=r"data.n_train sizes the generated demo data \(data=demo\); to use part "
                                           r"of data=files pass data.max_train_samples=N"):
        sources.load(files_cfg(train_file="my.csv", n_train=300))
    with pytest.raises(TformerError, match=r"data.dir=/nowhere is the folder of a named dataset \(data=imdb, ...\); "
                                           r"data=files does not read it: name the files with data.train_file"):
        sources.load(files_cfg(train_file="my.csv", dir="/nowhere"))  # (evaluate data_dir= of a files run: ignored)


def test_a_json_text_cell_that_is_a_number_is_read_as_written_and_a_list_is_refused(tmp_path):
    """A JSON-lines text of 42 or ["a", "b"] (datasets' Json column) was a pyarrow traceback in the data check."""
    rows = [{"text": f"text {i}", "label": i % 2} for i in range(40)]
    for name, cell in (("number", 42), ("list", ["a", "b"])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({**r, **({"text": cell} if i == 3 else {})}) + "\n"
                                                        for i, r in enumerate(rows)))
    data = sources.load(files_cfg(train_file=str(tmp_path / "number.jsonl"), test_file=str(tmp_path / "number.jsonl")))
    assert "42" in data.splits["test"]["text"][:]
    with pytest.raises(TformerError, match=r"the train split: a text is a list \(\['a', 'b'\]\), not a string"):
        sources.load(files_cfg(train_file=str(tmp_path / "list.jsonl")))


def test_a_json_file_that_cannot_be_read_names_its_line(tmp_path, monkeypatch):
    """datasets and pandas name a byte position ("Trailing data at position 61") or nothing."""
    import io

    from tformer_cli.data import given

    rows = [json.dumps({"text": f"t {i}", "label": i % 2}) for i in range(600)]
    (tmp_path / "bad.jsonl").write_text("\n".join(rows[:499] + ['{"text": "t", "label": 1} }'] + rows[500:]) + "\n")
    (tmp_path / "number.jsonl").write_text("\n".join(rows[:3] + ["7"]) + "\n")
    (tmp_path / "array.json").write_text("[\n" + ",\n".join(rows[:5]) + ",\n]\n")
    (tmp_path / "columns.json").write_text('{\n "text": ["a", "b"],\n "label": [0 1]\n}\n')
    from tformer_cli.data.given import bad_json_line

    (tmp_path / "fine.json").write_text('{\n "text": ["a", "b"],\n "label": [0, 1, 2]\n}\n')  # (fails elsewhere)
    assert bad_json_line(tmp_path / "fine.json") is None
    for name, where in (("bad.jsonl", r"line 500: Extra data \(column 27\)"),
                        ("number.jsonl", r"line 4 is a JSON number, not an object of columns \(\{\"text\": \.\.\.\}\)"),
                        ("array.json", r"line 7: Expecting value \(column 1\)"),
                        ("columns.json", r"line 3: Expecting ',' delimiter \(column 14\)")):
        with pytest.raises(TformerError, match=f"could not read .*{name} as json: {where}; check the file"):
            sources.load(files_cfg(train_file=str(tmp_path / name)))
        with pytest.raises(TformerError, match=f"could not read .*{name} as {name.split('.')[1]}: {where}; "):
            given.table_texts(tmp_path / name, "text", 1000)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a\nb\nc\n")))  # (over --max-lines: named)
    with pytest.raises(TformerError, match=r"^standard input has more than --max-lines=2 lines; split it or raise"):
        given.texts_of("-", 2, 100)


def test_a_binary_text_column_is_read_as_utf8_text_not_as_its_repr(tmp_path):
    """str(b"caf\xc3\xa9") is "b'caf\\xc3\\xa9'": a model trained on that would never see the texts predict reads."""
    texts = [f"caf\u00e9 {i}" for i in range(30)]
    pd.DataFrame({"text": [t.encode() for t in texts], "title": [b"t"] * 30, "label": [i % 3 for i in range(30)]}
                 ).to_parquet(tmp_path / "b.parquet")
    for columns, want in (("text", texts), (["title", "text"], [f"t {t}" for t in texts])):
        data = sources.load(files_cfg(train_file=str(tmp_path / "b.parquet"), test_file=str(tmp_path / "b.parquet"),
                                      text_column=columns))
        assert data.splits["test"]["text"] == want
    pd.DataFrame({"text": [b"caf\xe9"] * 30, "label": [i % 3 for i in range(30)]}).to_parquet(tmp_path / "l.parquet")
    with pytest.raises(TformerError, match="the train split: its texts are bytes that are not UTF-8 .*byte 0xe9"):
        sources.load(files_cfg(train_file=str(tmp_path / "l.parquet")))


def test_unknown_column_lists_the_columns(tmp_path):
    p = tmp_path / "train.csv"
    p.write_text("review,label\nhello,0\nbye,1\n")
    with pytest.raises(TformerError, match="column 'text' not found .* it has columns review, label"):
        sources.load(files_cfg(train_file=str(p)))
    with pytest.raises(TformerError, match=r"data.header=false: train.csv has no header line to name its columns; "
                                           r"give them in the file's order, e.g. data.column_names=\[text,label\]"):
        sources.load(files_cfg(train_file=str(p), header=False))  # (it listed __index_level_0__, ... as columns)


def test_unseen_test_labels_and_missing_file_are_clear(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"t{i},{'a' if i % 2 else 'b'}\n" for i in range(10)))
    (tmp_path / "test.csv").write_text("text,label\nx,a\ny,c\n")
    with pytest.raises(TformerError, match=r"test split \(test.csv\) has labels not seen in training: c"):
        sources.load(files_cfg(train_file=str(tmp_path / "train.csv"), test_file=str(tmp_path / "test.csv")))
    (tmp_path / "many.csv").write_text("text,label\n" + "".join(f"t{i},{c}\n" for i, c in enumerate("cdefghA")))
    with pytest.raises(TformerError, match=r"not seen in training: A, c, d, e, f and 2 more; add them .*rows "
                                           r"\('A' is the class 'a' written another way: fix its case, spacing"):
        sources.load(files_cfg(train_file=str(tmp_path / "train.csv"), test_file=str(tmp_path / "many.csv")))
    with pytest.raises(TformerError, match="data file not found"):
        sources.load(files_cfg(train_file=str(tmp_path / "nope.csv")))
    (tmp_path / "folder").mkdir()
    with pytest.raises(TformerError, match=r"data.test_file=.*folder is a folder .*; name one file of it"):
        sources.load(data_config("trec", dir=str(tmp_path), test_file="folder"))
    (tmp_path / "header.csv").write_text("text,label\n\n")
    (tmp_path / "empty.jsonl").write_text("")
    for name, words in (("header.csv", r"has no rows \(a header at most\)"), ("empty.jsonl", "has no rows;")):
        with pytest.raises(TformerError, match=words):
            sources.load(files_cfg(train_file=str(tmp_path / "train.csv"), test_file=str(tmp_path / name)))


def test_named_dataset_from_local_dir(shared_data):
    cfg = data_config("imdb", dir=shared_data / "imdb", max_train_samples=200, max_eval_samples=100)
    data = sources.load(cfg, seed=1)
    assert data.label_names == ["neg", "pos"]
    assert (len(data.splits["train"]), len(data.splits["validation"]), len(data.splits["test"])) == (200, 100, 100)


def test_newsgroups_cleaning_matches_scikit_learn(shared_data):
    from sklearn.datasets import _twenty_newsgroups as sk

    from tformer_cli.data.newsgroups import clean

    texts = pd.read_parquet(shared_data / "twenty_newsgroups" / "test.parquet")["text"].tolist()[:300]
    for t in texts:
        expected = sk.strip_newsgroup_quoting(sk.strip_newsgroup_footer(sk.strip_newsgroup_header(t)))
        assert clean(t, ["headers", "footers", "quotes"]) == expected
    assert "From:" in texts[0] and "From:" not in clean(texts[0], ["headers"])


def test_tokenized_storage_is_flat_and_cached(tmp_path):
    import datasets

    from tformer_cli.data import tokenization

    texts = [f"word{i % 7} and more words {i}" for i in range(50)]
    tok = tokenization.train_wordpiece(texts, 200, max_len=6)
    path = tmp_path / "d.parquet"
    datasets.Dataset.from_dict({"text": texts, "label": [i % 2 for i in range(50)]}).to_parquet(path)
    ds = datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "c"))
    ds = ds.cast_column("label", datasets.ClassLabel(names=["a", "b"]))
    first = tokenization.tokenize_split(ds, tok, 6, "x")
    again = tokenization.tokenize_split(ds, tok, 6, "x")
    assert first.cache_files and first.cache_files == again.cache_files  # reused, not recomputed
    split = tokenization.TokenizedSplit.from_dataset(first)
    assert split.values.dtype.is_floating_point is False and split.values.dim() == 1
    assert int(split.lengths.max()) == 6  # truncation is exactly max_len, [CLS] ... [SEP] included
    assert split.values[split.offsets[0]].item() == tok.token_to_id("[CLS]")
    assert split.labels.tolist() == [i % 2 for i in range(50)]


def test_head_tail_keeps_the_first_and_last_tokens():
    from tformer_cli.data import tokenization

    texts = [" ".join(f"w{i}" for i in range(100)), "w1 w2"]
    tok = tokenization.train_wordpiece(texts * 2, 300, max_len=512)  # every word twice: a whole token
    long_text = tokenization.LongText("head_tail", head_tokens=3)
    tokenization.configure(tok, 10, "right", long_text)
    [(ids, tokens)], [(short_ids, short_tokens)] = tokenization.encode_batch(tok, texts, 10, long_text)
    assert tokens == ["[CLS]", "w0", "w1", "w2", "w95", "w96", "w97", "w98", "w99", "[SEP]"]
    assert len(ids) == 10 and short_tokens == ["[CLS]", "w1", "w2", "[SEP]"]  # short texts are left alone
    default = tokenization.LongText("head_tail")  # a quarter of max_len from the start
    assert default.cut(list(range(50)), 22) == [0, 1, 2, 3, 4, 5] + list(range(34, 50))
    tokenization.configure(tok, 10, "left")  # truncate keeps one side
    assert tokenization.encode_batch(tok, texts, 10)[0][0][1][1:3] == ["w92", "w93"]
    with pytest.raises(TformerError, match="head_tokens=9 must be between 0 and model.max_len - 2 = 8"):
        tokenization.LongText("head_tail", 9).head(10)


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_head_tail_trains_evaluates_and_predicts_alike(tmp_path):
    from helpers import run_tformer

    # precision as the command picks it (auto): with fp32 this barely trained model's test and evaluate accuracy
    # differ (0.46 vs 0.44, seen), which this test is not about
    args = tiny("data.long_text=head_tail", "data.head_tokens=4", "model.max_len=12", without=["trainer.precision"])
    r = run_tformer("train", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    run = next(tmp_path.glob("outputs/train/*/*"))
    meta = json.loads((run / "checkpoints" / "best" / "meta.json").read_text())
    assert (meta["long_text"], meta["head_tokens"]) == ("head_tail", 4)
    r = run_tformer("evaluate", f"checkpoint={run}", cwd=tmp_path)
    test = json.loads((run / "test_metrics.json").read_text())
    out = json.loads(next(tmp_path.glob("outputs/evaluate/*/*/metrics.json")).read_text())
    assert r.returncode == 0 and out["accuracy"] == test["accuracy"]
    r = run_tformer("evaluate", f"checkpoint={run}", "long_text=chunks", "chunk_overlap=2", cwd=tmp_path)
    assert r.returncode == 0 and "long texts read as chunks of 12 tokens overlapping by 2 (trained as head_tail" in r.stdout, r.stderr[-2000:]
    chunked = max(tmp_path.glob("outputs/evaluate/*/*/metrics.json"))
    assert json.loads(chunked.read_text())["long_text"] == "chunks"
    assert json.loads(chunked.read_text())["n"] == 100  # documents, whatever their number of windows
    long = "this film was great " * 30 + "but the ending was boring"
    r = run_tformer("predict", "--explain=rollout", "--json", long, cwd=tmp_path)
    tokens = json.loads(r.stdout)["explanation"]["tokens"]
    assert len(tokens) == 12 and tokens[:5] == ["[CLS]", "this", "film", "was", "great"] and tokens[-2] == "boring"


def test_evaluate_reads_long_texts_as_trained_unless_asked_otherwise():
    from types import SimpleNamespace

    from tformer_cli.commands.evaluate import reading
    from tformer_cli.data.tokenization import LongText

    def read(trained, max_len=12, **asked):
        return reading(trained, SimpleNamespace(**{"long_text": None, "head_tokens": None, "chunk_overlap": None,
                                                   **asked}), max_len, data_side="left")

    trained = LongText("head_tail", head_tokens=4)
    assert read(trained) == (trained, None)
    assert read(trained, head_tokens=6) == (LongText("head_tail", 6), None)
    assert read(trained, long_text="chunks", chunk_overlap=2) == (LongText("chunks", None, 2), None)
    # training read head_tail and saved no truncation side: a truncate reading keeps the data's side
    assert read(trained, long_text="truncate") == (LongText("truncate"), "left")
    assert read(LongText("truncate"), long_text="truncate") == (LongText("truncate"), None)  # the file's side
    with pytest.raises(TformerError, match="long_text='windows' is not one of truncate, head_tail, chunks"):
        read(trained, long_text="windows")
    with pytest.raises(TformerError, match="head_tokens= is a setting of long_text=head_tail, and this evaluation "
                                           "reads texts as chunks"):
        read(trained, long_text="chunks", head_tokens=3)
    with pytest.raises(TformerError, match="head_tokens=11 must be between 0 and 10"):
        read(trained, head_tokens=11)
    with pytest.raises(TformerError, match=r"chunk_overlap=9 must be between 0 and 8 \(windows of 10 text tokens"):
        read(LongText("chunks"), chunk_overlap=9)  # (a 1-token stride: each text read as often as it has tokens)
    assert read(LongText("chunks", None, 9)) == (LongText("chunks", None, 9), None)  # (a checkpoint's own: as trained)
    from helpers import compose_config
    from tformer_cli.runs.classify import configure
    from tformer_cli.typed_config import plain

    typed = ["data.long_text=chunks", "data.chunk_overlap=60", "model.max_len=64"]
    with pytest.raises(TformerError, match=r"data.chunk_overlap=60 must be between 0 and 54"):
        configure(plain(compose_config("train", *typed)), typed)
    tree = plain(compose_config("train", *typed))
    assert configure(tree, None)[0].long_text.chunk_overlap == 60  # (a teacher's, a saved run's: not typed now)


def test_a_tokenizer_saved_without_truncation_truncates_on_the_side_asked(tmp_path):
    from tformer_cli.data import tokenization

    text = " ".join(f"w{i}" for i in range(100))
    tok = tokenization.train_wordpiece([text] * 2, 300, max_len=512)
    tokenization.configure(tok, 10, "left", tokenization.LongText("chunks"))  # as a chunks run saves it
    tok.save(str(tmp_path / "tokenizer.json"))
    left = tokenization.load_tokenizer(tmp_path / "tokenizer.json", 10, side="left")
    assert left.encode(text).tokens[1:3] == ["w92", "w93"]  # keeps the end, as data.truncation=left says
    plain = tokenization.load_tokenizer(tmp_path / "tokenizer.json", 10)
    assert plain.encode(text).tokens[1:3] == ["w0", "w1"]


def test_chunks_cover_the_whole_text_in_overlapping_windows():
    from tformer_cli.data.tokenization import LongText

    seq = ["[CLS]", *range(20), "[SEP]"]
    windows = LongText("chunks", chunk_overlap=2).windows(seq, 8)  # 6 body tokens a window, 4 new each
    assert windows == [["[CLS]", 0, 1, 2, 3, 4, 5, "[SEP]"], ["[CLS]", 4, 5, 6, 7, 8, 9, "[SEP]"],
                       ["[CLS]", 8, 9, 10, 11, 12, 13, "[SEP]"], ["[CLS]", 12, 13, 14, 15, 16, 17, "[SEP]"],
                       ["[CLS]", 14, 15, 16, 17, 18, 19, "[SEP]"]]  # the last window ends with the text
    assert LongText("chunks").windows(seq[:5], 8) == [seq[:5]]  # a short text is one window
    with pytest.raises(TformerError, match=r"chunk_overlap=6 must be between 0 and 5 \(windows of 6 text tokens, "
                                           r"model.max_len 8, each moving on by at least an eighth of that\)"):
        LongText("chunks", chunk_overlap=6).windows(seq, 8)


def test_chunked_evaluation_is_the_mean_of_the_window_logits():
    import torch

    from tformer_cli.data.tokenization import TokenizedSplit
    from tformer_cli.hardware import Precision
    from tformer_cli.inference import predict_proba
    from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier

    torch.manual_seed(0)
    model = TransformerClassifier(EncoderConfig(vocab_size=30, num_classes=3, d_model=16, n_heads=2, d_ff=32,
                                                max_len=8)).eval()
    windows = [[2, 5, 6, 7, 3], [2, 8, 9, 3], [2, 10, 11, 12, 13, 3], [2, 14, 3]]
    split = TokenizedSplit.from_ids(windows, labels=[0, 0, 2, 1], docs=[0, 0, 1, 2])  # doc 0 has two windows
    probs, loss = predict_proba(model, split, batch_size=2, pad_id=0, device=torch.device("cpu"),
                                precision=Precision("fp32", "cpu"))
    with torch.no_grad():
        each = [model(torch.tensor([w])) [0] for w in windows]
    expected = torch.stack([(each[0] + each[1]) / 2, each[2], each[3]]).softmax(-1)
    torch.testing.assert_close(probs, expected, rtol=1e-5, atol=1e-6)
    assert split.doc_labels.tolist() == [0, 2, 1]
    nll = -torch.log(expected[torch.arange(3), torch.tensor([0, 2, 1])]).mean()
    assert loss == pytest.approx(float(nll), rel=1e-5)


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_chunks_train_evaluate_and_predict_per_document(tmp_path):
    from helpers import run_tformer

    args = tiny("data.long_text=chunks", "data.chunk_overlap=2", "model.max_len=8", without=["trainer.precision"])
    r = run_tformer("train", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    run = next(tmp_path.glob("outputs/train/*/*"))
    test = json.loads((run / "test_metrics.json").read_text())
    assert test["n"] == 100  # documents, not windows
    r = run_tformer("evaluate", f"checkpoint={run}", cwd=tmp_path)
    out = json.loads(next(tmp_path.glob("outputs/evaluate/*/*/metrics.json")).read_text())
    assert r.returncode == 0 and (out["n"], out["accuracy"]) == (100, test["accuracy"])
    long = "this film was great " * 10 + "but the ending was boring"
    r = run_tformer("predict", "--json", "--explain=rollout", long, "short one", cwd=tmp_path)
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 0 and len(rows) == 2 and len(rows[0]["explanation"]["tokens"]) == 8


@pytest.mark.parametrize("rows, message", [
    ([("a text", 1)] * 30, "the train split has a single class"),
    ([("a text", 0.5), ("b text", 1.0)] * 15, "labels must be whole numbers or strings, found 0.5"),
    ([("a", 0), ("b", 1), ("c", 0)], "the train split has 3 rows: too few to carve a validation split"),
])
def test_data_that_cannot_train_a_classifier_is_refused(tmp_path, rows, message):
    p = tmp_path / "train.jsonl"
    p.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    with pytest.raises(TformerError, match=message):
        sources.load(files_cfg(train_file=str(p)))


def test_multi_label_class_ids_in_strings_use_label_names_and_numeric_order(tmp_path):
    rows = ["text,label"] + [f"text number {i},\"{i % 11},{(i + 2) % 11}\"" for i in range(66)] + ["no topics,"]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    names = "[" + ",".join(f"topic{i}" for i in range(11)) + "]"
    data = sources.load(data_config("files", train_file=str(tmp_path / "train.csv"), multi_label=True,
                                    validation_fraction=0.2, label_names=names))
    assert data.label_names == [f"topic{i}" for i in range(11)]  # "10" is class 10, not a name sorted before "2"
    train = data.splits["train"]
    by_text = dict(zip(train["text"], train["label"]))
    some = next(t for t in by_text if t.startswith("text number 9"))
    assert by_text[some] == sorted({9 % 11, 11 % 11})  # "9,0"


def test_class_names_in_a_split_where_train_has_ids_are_read_as_those_classes(tmp_path):
    """Train labels 0/1 named by label_names (as the demo data's are): a labelled file that writes the names
    (`tformer evaluate test_file=`, `tformer calibrate file=`) is read as those classes; a name no class has is
    refused alone."""
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"t{i},{i % 2}\n" for i in range(20)))
    (tmp_path / "test.csv").write_text("text,label\na,positive\nb,negative\nc,positive\n")
    data = sources.load(data_config("files", train_file=str(tmp_path / "train.csv"),
                                    test_file=str(tmp_path / "test.csv"), label_names="[negative,positive]"))
    assert data.label_names == ["negative", "positive"] and data.splits["test"]["label"] == [1, 0, 1]
    for written, expected in (("a,positive\nb,neutral\n", "not seen in training: neutral; the classes are "
                                                           "negative, positive"),
                              ("a,true\nb,false\n", "labels are true/false, which name none of the classes"),
                              ("a,1\nb,\nc,0\nd,\n", r"has an empty label \(row 2, and 1 more\)"),
                              ("a,positive\nb,\nc,negative\n", r"has an empty label \(row 2\)")):  # (not 'None')
        (tmp_path / "other.csv").write_text("text,label\n" + written)
        with pytest.raises(TformerError, match=expected):
            sources.load(data_config("files", train_file=str(tmp_path / "train.csv"),
                                     test_file=str(tmp_path / "other.csv"), label_names="[negative,positive]"))


def test_split_labels_of_another_type_than_train_are_one_line(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"t{i},{i % 2}\n" for i in range(20)))
    (tmp_path / "test.csv").write_text("text,label\na,0\nb,positive\n")
    with pytest.raises(TformerError, match="not seen in training: positive"):
        sources.load(files_cfg(train_file=str(tmp_path / "train.csv"), test_file=str(tmp_path / "test.csv")))
    (tmp_path / "mtrain.csv").write_text("text,label\n" + "".join(f"t{i},\"{i % 2},2\"\n" for i in range(20)))
    (tmp_path / "mtest.csv").write_text("text,label\na,\"0,2\"\nb,\"1,sports\"\n")
    with pytest.raises(TformerError, match="labels not seen in training"):
        sources.load(files_cfg(train_file=str(tmp_path / "mtrain.csv"), test_file=str(tmp_path / "mtest.csv"),
                               multi_label=True))


def test_a_named_file_without_labels_is_refused_and_an_unnamed_split_without_them_is_said(tmp_path, monkeypatch):
    """A validation or test file the user named whose label cells are all empty or -1 would be left out: a
    validation split carved from train instead, or no test pass, unasked. It is refused in one line; evaluate and
    calibrate (unlabelled_files="drop") say it their own way; a dataset folder's unlabelled test split (GLUE's)
    is left out with a line that says so."""
    said = []

    class Said:
        def print(self, line, **kw):
            said.append(line)
    monkeypatch.setattr(sources, "output", Said)
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "".join(f"text number {i},{'good' if i % 2 else 'bad'}\n" for i in range(40)))
    hidden = tmp_path / "hidden.csv"
    hidden.write_text("text,label\n" + "".join(f"another text {i},-1\n" for i in range(10)))
    for split in ("validation", "test"):
        with pytest.raises(TformerError, match=f"data.{split}_file={hidden} has no labels .* or drop "
                                               f"data.{split}_file="):
            sources.load(files_cfg(train_file=str(train), **{f"{split}_file": str(hidden)}))
    data = sources.load(files_cfg(train_file=str(train), test_file=str(hidden)), unlabelled_files="quiet")
    assert "test" not in data.splits and said == []  # (evaluate and calibrate refuse it in their own words)
    data = sources.load(files_cfg(train_file=str(train), test_file=str(hidden)), unlabelled_files="drop")  # (resumed)
    assert "test" not in data.splits and said == ["test: no labels (every label cell is empty or -1), left out"]
    folder = tmp_path / "glue"
    folder.mkdir()
    (folder / "train.csv").write_text(train.read_text())
    (folder / "test.csv").write_text(hidden.read_text())
    said.clear()
    data = sources.load(data_config("trec", dir=str(folder), label_names="null", validation_fraction=0.25))
    assert set(data.splits) == {"train", "validation"} and said == ["test: no labels (every label cell is empty or "
                                                                    "-1), left out"]


def test_a_column_of_true_and_false_is_read_as_the_words_written(tmp_path):
    """pandas reads a CSV column of true / false as booleans, which no label can be: a binary label column written
    that way is two class names, as written (whatever their case)."""
    p = tmp_path / "train.csv"
    p.write_text("text,label\n" + "".join(f"text number {i},{'true' if i % 2 else 'FALSE'}\n" for i in range(40)))
    data = sources.load(files_cfg(train_file=str(p)))
    assert data.label_names == ["FALSE", "true"]
    assert all((row["label"] == 1) == (int(row["text"].split()[-1]) % 2 == 1) for row in data.splits["train"])


def test_an_unlabeled_file_without_the_text_column_is_told_to_name_it_not_to_change_the_data(tmp_path):
    """data.text_column is the labelled data's too: the fix for an unlabeled file is its own column's name."""
    (tmp_path / "u.csv").write_text("body\nthe movie was great\n")
    with pytest.raises(TformerError, match="u.csv has no 'text' column \\(it has body\\); distill.unlabeled files "
                                           "are read with the labelled data's text column .*: name the file's "
                                           "column 'text'"):
        sources.read_texts(tmp_path / "u.csv", ["text"], key=sources.UNLABELED_KEY)


def test_a_header_that_names_a_column_twice_is_refused(tmp_path):
    """pandas would read `text,label,label` as label and label.1: which one is the label is a guess."""
    p = tmp_path / "train.csv"
    p.write_text("text,label,label\n" + "".join(f"text number {i},{'ab'[i % 2]},{'ba'[i % 2]}\n" for i in range(20)))
    with pytest.raises(TformerError, match="the header of .*train.csv names the column 'label' twice \\(pandas would "
                                           "read the second as 'label.1'\\); give each column its own name"):
        sources.load(files_cfg(train_file=str(p)))
    p.write_text("text,label,,\n" + "".join(f"text number {i},{'ab'[i % 2]},,\n" for i in range(20)))
    assert len(sources.load(files_cfg(train_file=str(p))).label_names) == 2  # (unnamed columns are no names)
