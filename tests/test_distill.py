"""`tformer distill`: the loss is Hinton et al.'s formula, a student learns its teacher's answers, the teacher's
logits are computed once and kept (reused, invalidated when the teacher changes, kept shard by shard when a pass is
interrupted), an interrupted run resumes to the same student, and the student is an ordinary checkpoint."""
import json
import math
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from helpers import TINY_TRAINING, compose_config, ctrl_c_at_step, run_tformer, tiny
from tformer_cli import Classifier, TformerError, train
from tformer_cli.commands import report
from tformer_cli.data.tokenization import TokenizedSplit
from tformer_cli.errors import ConfigError, TformerError
from tformer_cli.runs import distill as distill_module
from tformer_cli.runs.distill import distill
from tformer_cli.runs.pretraining import pretrain
from tformer_cli import checkpoint
from tformer_cli.store.layout import RunDir
from tformer_cli.store.mapped import ShardedRows, mapped_safetensors
from tformer_cli.data import tokenization
from tformer_cli.model.encoder import EncoderConfig, TransformerClassifier
from tformer_cli.runs.distill import Distillation, attention_loss, distillation_loss, relation_loss
from tformer_cli.typed_config import plain

TOPICS = {"sports": "goal match team score player coach league stadium referee striker".split(),
          "cooking": "recipe oven flour sugar bake kitchen pan butter dough whisk".split(),
          "space": "orbit rocket planet star galaxy comet moon launch astronaut telescope".split()}
# a student: tiny, fp32, trained on its teacher alone (alpha 1) long enough to learn it; `last` is its final state
STUDENT = tiny("model=tiny", "trainer.epochs=6", "distill.alpha=1.0", "trainer.early_stopping.patience=0",
               base=TINY_TRAINING)


def topic_rows(n: int, seed: int) -> pd.DataFrame:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = list(TOPICS)[i % 3]
        words = [rng.choice(TOPICS[label]) for _ in range(6)] + [rng.choice(TOPICS[rng.choice(list(TOPICS))])]
        rows.append({"text": " ".join(rng.sample(words, len(words))), "label": label})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def topic_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("topics")
    topic_rows(240, 0).to_csv(folder / "train.csv", index=False)
    topic_rows(60, 1).to_csv(folder / "test.csv", index=False)
    unlabeled = topic_rows(90, 2)[["text"]]
    test_copies = pd.read_csv(folder / "test.csv")[["text"]].head(5)  # copies of test texts: dropped
    pd.concat([unlabeled, test_copies]).to_csv(folder / "unlabeled.csv", index=False)
    return folder


@pytest.fixture(scope="module")
def teacher(topic_files, tmp_path_factory):
    """A tiny classifier trained on the topic texts: confident, mostly right (the students' teacher)."""
    return train(tiny("trainer.epochs=4", "data=files", f"data.train_file={topic_files / 'train.csv'}",
                      f"data.test_file={topic_files / 'test.csv'}", base=TINY_TRAINING),
                 run_dir=tmp_path_factory.mktemp("teacher") / "run", quiet=True)


def run_distill(tmp_path, name: str, *overrides: str, cache=None) -> RunDir:
    run = RunDir(tmp_path / name)
    args = [*STUDENT, *overrides, f"distill.cache_dir={cache or tmp_path / 'cache'}"]
    distill(plain(compose_config("distill", *args)), run, args)
    return run


def softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    e = [math.exp(x - top) for x in xs]
    return [v / sum(e) for v in e]


def test_the_loss_is_the_textbook_formula_on_a_hand_made_batch():
    """alpha * T^2 * KL(softmax(t/T) || softmax(s/T)) + (1 - alpha) * cross-entropy where there is a label, per row,
    averaged over the rows: written out in plain floats."""
    student = torch.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 0.0], [-0.5, 0.3, 1.2]])
    teacher = torch.tensor([[1.0, 0.0, -0.5], [0.2, 2.0, -1.0], [0.0, 0.0, 3.0]])
    labels, labelled = torch.tensor([0, 1, -1]), torch.tensor([True, True, False])  # row 3 has no label
    T, alpha = 2.0, 0.3
    expected = 0.0
    for i in range(3):
        p = softmax([x / T for x in teacher[i].tolist()])
        q = softmax([x / T for x in student[i].tolist()])
        row = alpha * T * T * sum(pc * math.log(pc / qc) for pc, qc in zip(p, q))
        if labelled[i]:
            row += (1 - alpha) * -math.log(softmax(student[i].tolist())[int(labels[i])])
        expected += row / 3
    got = distillation_loss(student, teacher, labels, labelled, temperature=T, alpha=alpha)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    # a student that answers as its teacher does has no soft loss; alpha 1 ignores the labels
    assert distillation_loss(teacher, teacher, labels, labelled, temperature=T, alpha=1.0).item() == pytest.approx(0, abs=1e-6)
    # multi-label: each label's yes/no, averaged over labels
    y = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    p, q = torch.sigmoid(teacher / T), torch.sigmoid(student / T)
    bernoulli_kl = (p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()).mean(-1)
    bce = F.binary_cross_entropy_with_logits(student, y, reduction="none").mean(-1)
    expected = (alpha * T * T * bernoulli_kl + (1 - alpha) * bce * labelled).mean()
    got = distillation_loss(student, teacher, y, labelled, temperature=T, alpha=alpha, multi_label=True)
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)


def test_the_relation_loss_compares_cosine_similarities_whatever_the_widths():
    """Off the diagonal, the mean squared difference of the two batches' cosine-similarity matrices (vectors centred
    on the batch's mean), in plain floats; zero for a student whose vectors are the teacher's rotated, scaled,
    shifted and embedded in another width."""
    gen = torch.Generator().manual_seed(0)
    teacher, student = torch.randn(4, 6, generator=gen), torch.randn(4, 3, generator=gen)

    def centred(rows):
        return [[x - sum(col) / len(rows) for x, col in zip(row, zip(*rows))] for row in rows]

    def cos(a, b):
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

    s, t = centred(student.tolist()), centred(teacher.tolist())
    pairs = [(i, j) for i in range(4) for j in range(4) if i != j]
    expected = sum((cos(s[i], s[j]) - cos(t[i], t[j])) ** 2 for i, j in pairs) / len(pairs)
    assert relation_loss(student, teacher).item() == pytest.approx(expected, rel=1e-5)
    rotation, _ = torch.linalg.qr(torch.randn(6, 6, generator=gen))
    same = torch.cat([teacher @ rotation, torch.zeros(4, 2)], 1) * 3.0 + torch.randn(8, generator=gen)
    assert relation_loss(same, teacher).item() == pytest.approx(0, abs=1e-6)
    assert relation_loss(student[:2], teacher[:2]).item() == 0  # two centred vectors are opposite: nothing to relate
    # windows of one document (rows 0 and 1) are not related to each other, only to the other documents
    docs = torch.tensor([0, 0, 1, 2])
    s, t = centred(student.tolist()), centred(teacher.tolist())
    kept = [(i, j) for i, j in pairs if docs[i] != docs[j]]
    expected = sum((cos(s[i], s[j]) - cos(t[i], t[j])) ** 2 for i, j in kept) / len(kept)
    assert relation_loss(student, teacher, docs).item() == pytest.approx(expected, rel=1e-5)
    assert relation_loss(student[:2], teacher[:2], docs[:2]).item() == 0
    student.requires_grad_(True)
    relation_loss(student, teacher).backward()
    assert student.grad.abs().sum() > 0


def test_the_attention_loss_is_minilmv2s_relation_kl_whatever_the_widths():
    """Per text: for each of Q, K, V and each relation head, KL(teacher || student) of the softmaxed scaled dot
    products among the text's real tokens, averaged over real tokens, heads and the three, in plain floats. Zero
    for a teacher of another width whose relation heads hold the student's vectors (zeros added, rescaled); padded
    tokens change nothing."""
    gen = torch.Generator().manual_seed(0)
    B, T, D, R = 2, 5, 8, 2
    student, teacher = torch.randn(B, T, 3 * D, generator=gen), torch.randn(B, T, 3 * D, generator=gen)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])

    def relations(x, n):  # one text's (n, D) vectors, one relation head -> n x n probabilities
        d = len(x[0])
        rows = [[sum(a * b for a, b in zip(x[i], x[j])) / math.sqrt(d) for j in range(n)] for i in range(n)]
        return [softmax(r) for r in rows]

    expected = []
    for b in range(B):
        n, total = int(mask[b].sum()), 0.0
        for part in range(3):
            for h in range(R):
                cols = slice(part * D + h * D // R, part * D + (h + 1) * D // R)
                ps, pt = relations(student[b, :n, cols].tolist(), n), relations(teacher[b, :n, cols].tolist(), n)
                total += sum(sum(t * math.log(t / s) for s, t in zip(rs, rt)) for rs, rt in zip(ps, pt)) / n
        expected.append(total / (3 * R))
    assert attention_loss(student, teacher, mask, R).tolist() == pytest.approx(expected, rel=1e-4)
    # another width: each relation head of the teacher is the student's with zeros added, scaled so that the dot
    # products over sqrt(width) stay the same
    heads = student.view(B, T, 3, R, D // R)
    wide = torch.cat([heads, torch.zeros(B, T, 3, R, 3)], -1) * ((D // R + 3) / (D // R)) ** 0.25
    assert attention_loss(student, wide.reshape(B, T, -1), mask, R).abs().max().item() < 1e-5
    junk = torch.where(mask[..., None], student, 1e4 * torch.randn(B, T, 3 * D, generator=gen))
    assert attention_loss(junk, teacher, mask, R).tolist() == pytest.approx(expected, rel=1e-4)
    student.requires_grad_(True)
    attention_loss(student, teacher, mask, R).mean().backward()
    assert student.grad.abs().sum() > 0 and torch.isfinite(student.grad).all()
    assert student.grad[1, 3:].abs().sum() == 0  # padding learns nothing


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_the_encoder_gives_its_last_blocks_queries_keys_and_values(norm):
    """forward(with_qkv=True): the logits of a plain forward, and the (B, T, 3D) the last block's attention
    projection computes (the batch padded: the CPU runs it on its real tokens only)."""
    torch.manual_seed(0)
    model = TransformerClassifier(EncoderConfig(vocab_size=50, num_classes=3, d_model=16, n_layers=2, n_heads=2,
                                                d_ff=32, norm=norm, dropout=0.0)).eval()
    ids = torch.randint(1, 50, (3, 7))
    ids[1, 2:], ids[2, 4:] = 0, 0
    mask = ids.ne(0)
    seen = []
    hook = model.blocks[-1].attn.qkv.register_forward_hook(lambda m, i, out: seen.append(out))
    logits, features, qkv = model(ids, mask, with_qkv=True)
    hook.remove()
    assert torch.allclose(logits, model(ids, mask), atol=1e-6)
    assert features.shape == (3, 16) and qkv.shape == (3, 7, 48)
    inside = seen[-1]  # what the block itself computed: its real tokens first (N rounded up to 16 with padding)
    assert inside.dim() == 2 and torch.allclose(qkv[mask], inside[:int(mask.sum())], atol=1e-6)


def test_cached_teacher_rows_are_read_in_place_as_one_table(tmp_path):
    """The teacher's logits are read from the cache's files memory-mapped (rows x classes never in the process):
    the shards read as one table give the rows the concatenated tensors give, in the index's order."""
    import safetensors.torch

    gen = torch.Generator().manual_seed(0)
    logits, vectors = torch.randn(11, 7, generator=gen), torch.randn(11, 5, generator=gen).to(torch.bfloat16)
    shards = []
    for k, start in enumerate(range(0, 11, 4)):  # shards of 4, 4 and 3 rows
        path = tmp_path / f"shard{k}.safetensors"
        safetensors.torch.save_file({"logits": logits[start:start + 4].contiguous(),
                                     "features": vectors[start:start + 4].contiguous()}, str(path))
        shards.append(mapped_safetensors(path))
    pointer, maps = shards[0]["logits"].data_ptr(), Path("/proc/self/maps").read_text().splitlines()
    assert any(line.endswith(str(tmp_path / "shard0.safetensors")) and
               int(line.split("-")[0], 16) <= pointer < int(line.split()[0].split("-")[1], 16) for line in maps)
    table = ShardedRows([s["logits"] for s in shards], 4, 7, torch.float32)
    index = torch.tensor([10, 0, 5, 5, 3, 8])
    assert len(table) == 11 and table.shape == (11, 7) and torch.equal(table[index], logits[index])
    features = ShardedRows([s["features"] for s in shards], 4, 5, torch.bfloat16)
    assert features[index].dtype == torch.bfloat16 and torch.equal(features[index], vectors[index])
    with pytest.raises(IndexError):
        table[torch.tensor([11])]
    whole = (tmp_path / "shard0.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(whole[:-8])  # (a shard cut short: computed again, never misread)
    with pytest.raises(ValueError):
        mapped_safetensors(tmp_path / "cut.safetensors")


def test_splits_concatenate_with_their_documents_numbered_on():
    a = TokenizedSplit.from_ids([[1, 2], [3], [4, 5, 6]], labels=[0, 1, 0], docs=[0, 0, 1])
    b = TokenizedSplit.from_ids([[7], [8, 9]], labels=[-1, -1])
    c = TokenizedSplit.concat([a, b])
    assert c.n_docs == 4 and c.docs.tolist() == [0, 0, 1, 2, 3] and c.labels.tolist() == [0, 1, 0, -1, -1]
    assert [c.values[c.offsets[i]:c.offsets[i + 1]].tolist() for i in range(len(c))] == \
        [[1, 2], [3], [4, 5, 6], [7], [8, 9]]
    assert TokenizedSplit.concat([b, b]).docs is None  # one sequence per document stays so


@pytest.mark.parametrize("args,expected", [
    (["distill.alpha=1.5"], "distill.alpha=1.5 must be"),
    (["distill.temperature=0"], "distill.temperature=0"),
    (["distill.embeddings=mine"], "distill.embeddings=mine is not one of auto, teacher, own"),
    (["distill.layers=[2,0]"], "lowest first, each once"),
    (["distill.layers=[]"], "lowest first, each once"),
    (["distill.relations=-1"], "distill.relations=-1"),
    (["distill.attention=-1"], "distill.attention=-1"),
    (["distill.attention_heads=0"], "distill.attention_heads=0"),
    ([], "tformer distill needs teacher=<run dir>"),
    (["teacher=/nowhere/at/all"], "teacher=/nowhere/at/all does not exist; pass teacher=<run dir>"),
    ([f"teacher={__file__}"], "is a file, not a run or checkpoint folder; pass teacher=<run dir>"),
    (["teacher=hf://a/b..c"], "teacher=hf://a/b..c is not a Hub reference"),
])
def test_bad_settings_are_one_line_before_anything_runs(tmp_path, args, expected):
    from tformer_cli import distill as distill_api

    with pytest.raises(TformerError, match=expected):
        distill(plain(compose_config("distill", *args)), RunDir(tmp_path / "run"), args)
    with pytest.raises(TformerError, match=expected):  # the Python API: the same line, no folder left
        distill_api(args, run_dir=tmp_path / "api")
    assert not (tmp_path / "run").exists() and not (tmp_path / "api").exists()


@pytest.mark.slow  # a two-job sweep of real `tformer distill` processes, then its resume
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_a_distill_sweep_is_continued_as_a_sweep_and_its_finished_jobs_are_read_not_retrained(teacher, tmp_path):
    """`tformer distill -m ... resume=<sweep dir>` was refused per job ("no last checkpoint with training state")."""
    sweep = tmp_path / "sweep"
    args = ["distill", "-m", f"teacher={teacher.run_dir}", "distill.alpha=0.5,1.0", *tiny("model=tiny",
            "trainer.epochs=1", base=TINY_TRAINING), f"distill.cache_dir={tmp_path / 'cache'}"]
    r = run_tformer(*args, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    stamps = [(job / "checkpoints" / "best" / "model.safetensors").stat().st_mtime_ns for job in jobs]
    r = run_tformer(*args, f"resume={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [(job / "checkpoints" / "best" / "model.safetensors").stat().st_mtime_ns for job in jobs] == stamps
    assert all("not retrained" in (job / "distill.log").read_text() for job in jobs) and len(jobs) == 2
    r = run_tformer(*[a.replace("0.5,1.0", "0.5,0.9") for a in args], f"resume={sweep}", cwd=tmp_path)
    assert r.returncode == 2 and "continue it with `tformer distill -m" in r.stderr, r.stderr


@pytest.mark.slow
def test_a_student_learns_its_teachers_answers_and_is_an_ordinary_checkpoint(teacher, topic_files, tmp_path):
    """On the texts it learned from, the student gives the teacher's label; evaluate, predict and export (the
    real commands) read it like any run."""
    run = run_distill(tmp_path, "student", f"teacher={teacher.run_dir}", f"distill.unlabeled=[{topic_files / 'unlabeled.csv'}]")
    log = (run.root / "distill.log").read_text()
    assert "90 texts from" in log and "(5 copies of the data's own texts dropped)" in log
    assert "embeddings from the teacher's token table" in log
    texts = pd.read_csv(topic_files / "train.csv")["text"].tolist() + pd.read_csv(topic_files / "unlabeled.csv")["text"].tolist()[:90]
    mine, theirs = Classifier.load(run.last, device="cpu"), Classifier.load(teacher.run_dir, device="cpu")
    agree = (mine.predict_proba(texts).argmax(1) == theirs.predict_proba(texts).argmax(1)).mean()
    assert agree >= 0.97
    assert json.loads(run.best.meta.read_text())["distilled_from"] == str(teacher.best_checkpoint)
    assert json.loads(run.test_metrics.read_text())["accuracy"] > 0.8
    done = run_tformer("evaluate", f"checkpoint={run.root}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = run_tformer("predict", f"--checkpoint={run.root}", "--json", "rocket orbit launch", cwd=tmp_path)
    assert said.returncode == 0 and json.loads(said.stdout)["label"] == "space", said.stderr
    pytest.importorskip("onnxruntime")
    exported = run_tformer("export", f"checkpoint={run.root}", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr


def test_a_student_pretrained_first_starts_from_its_pretraining_run(teacher, topic_files, tmp_path):
    """A student pretrained by `tformer pretrain` on the task's texts, then distilled (model.init=): its tokenizer
    and encoder are the pretraining run's (the teacher's token table is not laid over them), and the log names the
    chain."""
    pre = RunDir(tmp_path / "pre")
    pretrain(plain(compose_config("pretrain", *tiny("model=tiny", "data=files", "trainer.epochs=1",
                                                    f"data.train_file={topic_files / 'train.csv'}",
                                                    base=TINY_TRAINING))), pre)
    run = run_distill(tmp_path, "student", f"teacher={teacher.run_dir}", f"model.init={pre.root}")
    log = (run.root / "distill.log").read_text()
    assert f"encoder from the pretraining run {pre.root}" in log and "teacher's token table" not in log
    assert json.loads(run.best.tokenizer.read_text())["model"]["vocab"] == \
        json.loads(pre.best.tokenizer.read_text())["model"]["vocab"]
    assert json.loads(run.test_metrics.read_text())["accuracy"] > 0.8


def test_a_student_cut_from_its_teacher_starts_as_its_blocks_and_head(teacher, topic_files, tmp_path):
    """distill.layers=[1]: the teacher's tokenizer, embeddings, block 1 (renumbered 0) and head, before any step;
    a block the teacher lacks is one line."""
    from tformer_cli.runs.distill import teacher_layers

    student = teacher_layers(distill_module.find_teacher(teacher.run_dir), [1])
    theirs = checkpoint.load(teacher.run_dir, "cpu").model.state_dict()
    assert student.model_config["n_layers"] == 1 and not any(k.startswith("blocks.1.") for k in student.state)
    for key, value in student.state.items():
        source = key.replace("blocks.0.", "blocks.1.") if key.startswith("blocks.") else key
        assert torch.equal(value, theirs[source]), key
    run = run_distill(tmp_path, "cut", f"teacher={teacher.run_dir}", "distill.layers=[1]", "trainer.epochs=2",
                      "model.dropout=0.2")
    assert "started as the teacher's blocks 1 of 2" in (run.root / "distill.log").read_text()
    saved = checkpoint.load(run.best, "cpu")
    assert saved.model_config["n_layers"] == 1 and saved.model_config["dropout"] == 0.2  # (a key of its own)
    teacher_ckpt = distill_module.find_teacher(teacher.run_dir)
    length = json.loads(teacher_ckpt.model_config.read_text())["max_len"]
    assert checkpoint.read_config(run.best)["model"]["max_len"] == saved.model_config["max_len"] == length
    resumed = run_distill(tmp_path, "unused", f"teacher={teacher.run_dir}", "distill.layers=[1]", "trainer.epochs=3",
                          "model.dropout=0.2", f"resume={run.root}")  # (the same config: it goes on)
    assert not resumed.root.exists() and len(json.loads(run.history.read_text())) == 3
    assert saved.tokenizer_file.read_text() == checkpoint.load(teacher.run_dir, "cpu").tokenizer_file.read_text()
    with pytest.raises(TformerError, match="names block 5, but the teacher has 2 blocks"):
        run_distill(tmp_path, "five", f"teacher={teacher.run_dir}", "distill.layers=[0,5]")
    tree = plain(compose_config("distill"))
    tree["optimizer"]["lr"] = 123.0  # (the default preset's, resolved when the config was composed)
    tree = distill_module.with_teacher_model(tree, [], teacher_ckpt, [1])
    theirs_saved = checkpoint.read_config(teacher_ckpt)
    assert tree["optimizer"]["lr"] == theirs_saved["optimizer"]["lr"]  # the teacher's recipe without model=
    assert tree["model"]["pooling"] == theirs_saved["model"]["pooling"] and tree["model"]["max_len"] == length
    with pytest.raises(TformerError, match="the teacher is single-label and the data multi-label"):
        run_distill(tmp_path, "multi", f"teacher={teacher.run_dir}", "distill.layers=[0]", "data.multi_label=true")
    with pytest.raises(TformerError, match="so model.d_model= cannot apply"):
        run_distill(tmp_path, "wide", f"teacher={teacher.run_dir}", "distill.layers=[0]", "model.d_model=32")
    with pytest.raises(TformerError, match="so model.max_len= cannot apply"):
        run_distill(tmp_path, "long", f"teacher={teacher.run_dir}", "distill.layers=[0]", "model.max_len=32")
    with pytest.raises(TformerError, match="a static model has none; drop distill.layers"):
        run_distill(tmp_path, "static", f"teacher={teacher.run_dir}", "distill.layers=[0]", "model=static")
    with pytest.raises(TformerError, match="model.freeze_layers=2 is more than the student's 1 blocks"):
        run_distill(tmp_path, "frozen", f"teacher={teacher.run_dir}", "distill.layers=[0]", "model.freeze_layers=2")


@pytest.mark.parametrize("layers,refused", [
    ([0, 1, 2], None), ([0, 4, 5], None), ([0, 2], None),
    ([0, 3], "block 3 attends globally, but as the student's block 1"),
    ([1, 2], "block 0 reads the normalised embeddings"),  # ModernBERT's first block has no norm of its own
    ([0, 1, 2, 4], "block 4 attends locally, but as the student's block 3"),  # (the student's block 3: global)
    ([0, 1, 3], "block 3 attends globally, but as the student's block 2")])
def test_a_cut_keeps_what_each_block_computes(layers, refused):
    modernbert = {"n_layers": 6, "first_block_norm": False, "local_window": 8, "global_every": 3}
    if refused is None:
        distill_module.check_cut(modernbert, layers, "t")
    else:
        with pytest.raises(ConfigError, match=refused):
            distill_module.check_cut(modernbert, layers, "t")


def test_a_static_student_has_no_attention_and_learns_its_teachers_answers(teacher, topic_files, tmp_path):
    """model=static: token vectors (from the teacher's table) and hashed token pairs, their means and an MLP head;
    an ordinary checkpoint whose answers follow the teacher's, explained by occlusion."""
    run = run_distill(tmp_path, "static", f"teacher={teacher.run_dir}", "model=static", "model.d_model=32",
                      "model.head_hidden=32", "model.max_len=64", "optimizer.lr=5e-3", "trainer.epochs=12",
                      f"distill.unlabeled=[{topic_files / 'unlabeled.csv'}]")
    weights = checkpoint.load(run.best, "cpu").model.state_dict()
    assert not [k for k in weights if k.startswith("blocks.")] and "head.0.weight" in weights
    assert weights["pair_embedding.weight"].shape == (262144, 32) and weights["pair_embedding.weight"].abs().sum() > 0
    texts = pd.read_csv(topic_files / "train.csv")["text"].tolist()
    mine, theirs = Classifier.load(run.last, device="cpu"), Classifier.load(teacher.run_dir, device="cpu")
    assert (mine.predict_proba(texts).argmax(1) == theirs.predict_proba(texts).argmax(1)).mean() >= 0.95
    assert mine.explain(["rocket orbit launch"])[0]["explanation"]["method"] == "occlusion"
    with pytest.raises(TformerError, match="static model"):
        mine.explain(["rocket orbit launch"], method="rollout")


@pytest.mark.slow
def test_an_interrupted_distillation_resumes_to_the_same_student(teacher, tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file

    from tformer_cli.training.loop import Interrupted

    settings = [f"teacher={teacher.run_dir}", "trainer.epochs=2", "trainer.batch_size=16"]
    whole = run_distill(tmp_path, "whole", *settings)
    ctrl_c_at_step(monkeypatch, Distillation)  # in the middle of the first epoch
    stopped = RunDir(tmp_path / "stopped")
    with pytest.raises(Interrupted, match=f"step 6.*resume with: tformer distill .*resume={stopped}"):
        run_distill(tmp_path, "stopped", *settings)
    monkeypatch.undo()
    assert stopped.last.has_training_state() and not stopped.finished
    report.main([str(stopped.root)])  # `tformer report` of the stopped run says which command continues it
    assert f"tformer distill <its overrides> resume={stopped}" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(TformerError, match="that is a `tformer distill` run; continue it with tformer distill"):
        train([*TINY_TRAINING, f"resume={stopped}"], run_dir=tmp_path / "not_train")
    run_distill(tmp_path, "fresh", *settings, f"resume={stopped}")
    assert "weights of the run being resumed" in (stopped.root / "distill.log").read_text()  # not "random"
    a, b = load_file(str(whole.last.weights)), load_file(str(stopped.last.weights))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = lambda run: [(h["train_loss"], h["val_loss"]) for h in json.loads(run.history.read_text())]  # noqa: E731
    assert losses(whole) == losses(stopped) and len(losses(whole)) == 2


@pytest.mark.slow
def test_a_resume_on_rewritten_unlabeled_files_is_refused_unless_asked(teacher, topic_files, tmp_path):
    """distill.unlabeled names files: one rewritten since the run began taught its remaining epochs other texts."""
    unlabeled = tmp_path / "unlabeled.csv"
    unlabeled.write_bytes((topic_files / "unlabeled.csv").read_bytes())
    given = [f"teacher={teacher.run_dir}", "trainer.epochs=1", f"distill.unlabeled=[{unlabeled}]"]
    run = run_distill(tmp_path, "run", *given)
    moved = tmp_path / "moved" / "u.csv"  # the same texts under another name, another cache folder: they go on
    moved.parent.mkdir()
    moved.write_bytes(unlabeled.read_bytes())
    run_distill(tmp_path, "unused", f"teacher={teacher.run_dir}", f"distill.unlabeled=[{moved}]", "trainer.epochs=2",
                f"distill.cache_dir={tmp_path / 'other_cache'}", f"resume={run.root}")
    topic_rows(90, 7)[["text"]].to_csv(unlabeled, index=False)  # other texts, as many
    again = [*given, "trainer.epochs=3", f"resume={run.root}"]
    with pytest.raises(TformerError, match=r"the unlabeled texts changed since the distillation began \(unlabeled: "
                                           r"same 90 rows, different texts.*resume_ignore_data_change=true"):
        run_distill(tmp_path, "unused", *again)
    run_distill(tmp_path, "unused", *again, "resume_ignore_data_change=true")
    assert "resuming on changed unlabeled texts" in (run.root / "distill.log").read_text()


@pytest.mark.slow
def test_the_teachers_logits_are_kept_reused_and_recomputed_for_a_changed_teacher(teacher, topic_files, tmp_path,
                                                                                   monkeypatch):
    calls = []
    real = distill_module.logit_blocks

    def counted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3 and interrupt:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(distill_module, "logit_blocks", counted)
    monkeypatch.setattr(distill_module, "SHARD_TEXTS", 40)  # 192 train texts: 5 shards
    interrupt = True
    with pytest.raises(TformerError, match="interrupted while the teacher scored the texts; 80 of 192 are kept"):
        run_distill(tmp_path, "a", f"teacher={teacher.run_dir}", "trainer.epochs=1")
    interrupt, calls[:] = False, []
    reads, read = [], distill_module._read_shard
    monkeypatch.setattr(distill_module, "_read_shard", lambda *a: reads.append(read(*a)) or reads[-1])
    first = run_distill(tmp_path, "b", f"teacher={teacher.run_dir}", "trainer.epochs=1")
    assert len(calls) == 3 and "112 texts" in (first.root / "distill.log").read_text()  # only the 3 shards not kept
    # the 2 kept shards, then the 3 new ones read back as they are written: all 5 memory-mapped, none held in memory
    assert [r is not None for r in reads] == [True, True, False, False, False, True, True, True]
    calls.clear()
    again = run_distill(tmp_path, "c", f"teacher={teacher.run_dir}", "trainer.epochs=1", "distill.temperature=4")
    assert calls == [] and "logits of 192 texts read from the cache" in (again.root / "distill.log").read_text()
    # the same texts and 90 more: the 4 whole shards of the train texts are shared, the rest is scored
    run_distill(tmp_path, "e", f"teacher={teacher.run_dir}", "trainer.epochs=1",
                f"distill.unlabeled=[{topic_files / 'unlabeled.csv'}]")
    assert len(calls) == 4  # (282 texts: 8 shards of 40)
    calls.clear()
    # the same teacher retrained (other weights): its logits are computed again, never read from the old cache
    changed = RunDir(tmp_path / "teacher2")
    loaded = checkpoint.load(teacher.best_checkpoint)
    with torch.no_grad():
        loaded.model.head.weight.mul_(-1.0)
    shutil.copytree(teacher.run_dir, changed.root)
    checkpoint.save(changed.best, loaded.model, model_config=loaded.model_config,
                    tokenizer_json=loaded.tokenizer_file.read_text(), label_names=loaded.label_names,
                    config_yaml=loaded.files.config.read_text(), metrics=loaded.metrics, meta=loaded.meta)
    monkeypatch.setattr(distill_module, "_read_shard", lambda *a: None)  # (a file system that cannot map them)
    run_distill(tmp_path, "d", f"teacher={changed.root}", "trainer.epochs=1")
    assert len(calls) == 5
    said = " ".join((tmp_path / "d" / "distill.log").read_text().split())
    assert said.count("was written but cannot be memory-mapped back; its rows stay in memory") == 1  # (once)
    # that teacher trained further since (its best replaced): the distillation from it is not resumed
    with torch.no_grad():
        loaded.model.head.weight.mul_(0.5)
    checkpoint.save(changed.best, loaded.model, model_config=loaded.model_config,
                    tokenizer_json=loaded.tokenizer_file.read_text(), label_names=loaded.label_names,
                    config_yaml=loaded.files.config.read_text(), metrics=loaded.metrics, meta=loaded.meta)
    with pytest.raises(TformerError, match="the teacher's weights changed since the distillation began"):
        run_distill(tmp_path, "d", f"teacher={changed.root}", "trainer.epochs=2", f"resume={tmp_path / 'd'}")


@pytest.mark.slow
def test_a_teacher_saved_before_a_data_key_existed_is_distilled_from(teacher, tmp_path):
    """A teacher's saved data config lacks the keys added since (data.group_column): the student's data takes
    the defaults that teacher trained with, not a refusal that the key is missing."""
    import yaml

    old = RunDir(tmp_path / "old_teacher")
    loaded = checkpoint.load(teacher.best_checkpoint)
    saved = yaml.safe_load(loaded.files.config.read_text())
    del saved["data"]["group_column"]
    shutil.copytree(teacher.run_dir, old.root)
    checkpoint.save(old.best, loaded.model, model_config=loaded.model_config,
                    tokenizer_json=loaded.tokenizer_file.read_text(), label_names=loaded.label_names,
                    config_yaml=yaml.safe_dump(saved), metrics=loaded.metrics, meta=loaded.meta)
    student = run_distill(tmp_path, "s", f"teacher={old.root}", "trainer.epochs=1")
    assert yaml.safe_load(student.best.config.read_text())["data"]["group_column"] is None


def test_a_student_matching_its_teachers_relations_relates_texts_as_the_teacher_does(teacher, topic_files,
                                                                                       tmp_path):
    """distill.relations: the teacher's pooled vectors are cached beside its logits (a cache written without them
    is computed again), and the student trained to match how they relate texts ends closer to the teacher's
    similarities than the same student trained on the logits alone."""
    from safetensors.torch import load_file, save_file

    settings = [f"teacher={teacher.run_dir}", "trainer.epochs=4", "model.d_model=24"]
    plain_run = run_distill(tmp_path, "plain", *settings)
    shards = list((tmp_path / "cache").glob("*/logits-*.safetensors"))
    width = json.loads((teacher.best_checkpoint / "model.json").read_text())["d_model"]  # not the 24
    assert len(shards) == 1 and load_file(str(shards[0]))["features"].shape == (192, width)
    save_file({"logits": load_file(str(shards[0]))["logits"]}, str(shards[0]))  # a shard without the vectors
    matched = run_distill(tmp_path, "matched", *settings, "distill.relations=20")
    log = (matched.root / "distill.log").read_text()
    assert "relations 20" in log and "scoring 192 texts" in log
    assert "features" in load_file(str(shards[0]))
    again = run_distill(tmp_path, "again", *settings, "distill.relations=20", "trainer.epochs=1")
    assert "logits and pooled vectors of 192 texts read from the cache" in (again.root / "distill.log").read_text()
    texts = pd.read_csv(topic_files / "test.csv")["text"].tolist()

    def similarities(run_or_checkpoint) -> np.ndarray:
        v = Classifier.load(run_or_checkpoint, device="cpu").embed(texts)
        v = v / np.linalg.norm(v, axis=1, keepdims=True)
        return v @ v.T

    target = similarities(teacher.run_dir)
    gap = {name: float(np.abs(similarities(run.last) - target).mean()) for name, run in
           (("plain", plain_run), ("matched", matched))}
    assert gap["matched"] < 0.8 * gap["plain"], gap  # (0.104 against 0.170 on a 2-core AMD EPYC)
    with pytest.raises(TformerError, match="distill.relations"):  # a resume that would change the objective
        run_distill(tmp_path, "matched", *settings, "distill.relations=5", "trainer.epochs=5",
                    f"resume={matched.root}")
    # so would other slices of a batch (a step relates the texts of one micro-batch), which train's resume allows
    with pytest.raises(TformerError, match=r"trainer.micro_batches=2 \(the run had 1\) would change what the student"):
        run_distill(tmp_path, "matched", *settings, "distill.relations=20", "trainer.epochs=5",
                    "trainer.micro_batches=2", f"resume={matched.root}")
    from types import SimpleNamespace

    from tformer_cli.runs.session import _out_of_memory  # the out-of-memory hint does not offer it for resume=
    from tformer_cli.training.distributed import Dist

    config = SimpleNamespace(trainer=SimpleNamespace(micro_batches=1, batch_size=16, eval_batch_size=32),
                             model={"max_len": 64})
    hint = str(_out_of_memory(config, Dist(), "host", exact_slices=False))
    assert "trainer.micro_batches=2 (in a new run" in hint and "resume=" not in hint


def test_a_student_matching_its_teachers_attention_relates_tokens_as_the_teacher_does(teacher, topic_files,
                                                                                       tmp_path):
    """distill.attention: the teacher runs on every batch and the student of another width (24, teacher 64) learns
    how its last attention layer relates a text's tokens: on test texts its relations end closer to the teacher's
    than those of the same student trained on the logits alone. Students it cannot be compared with are refused."""
    settings = [f"teacher={teacher.run_dir}", "trainer.epochs=4", "model.d_model=24"]
    plain_run = run_distill(tmp_path, "plain", *settings)
    matched = run_distill(tmp_path, "matched", *settings, "distill.attention=20")
    assert "attention 20 over 4 relation heads" in (matched.root / "distill.log").read_text()
    texts = pd.read_csv(topic_files / "test.csv")["text"].tolist()
    loaded = checkpoint.load(teacher.best_checkpoint, "cpu")
    tok = tokenization.load_tokenizer(loaded.tokenizer_file, 64)
    encoded = [e.ids for e in tok.encode_batch(texts)]
    ids = torch.zeros(len(texts), max(map(len, encoded)), dtype=torch.long)
    for i, e in enumerate(encoded):
        ids[i, :len(e)] = torch.tensor(e)
    mask = ids.ne(tokenization.pad_id(tok))

    def gap(model) -> float:
        with torch.no_grad():
            return attention_loss(model.eval()(ids, mask, with_qkv=True)[2], loaded.model.eval()(
                ids, mask, with_qkv=True)[2], mask, 4).mean().item()

    gaps = {name: gap(checkpoint.load(run.last, "cpu").model) for name, run in
            (("plain", plain_run), ("matched", matched))}
    assert gaps["matched"] < 0.8 * gaps["plain"], gaps  # (0.121 against 0.176 on a 2-core AMD EPYC)
    for extra, refused in ((["model=static"], "a static student has none"),
                           (["distill.attention_heads=5"], "must divide both widths"),
                           (["model.max_len=128"], "the teacher at most 64"),
                           (["distill.embeddings=own", "embedding_init.vocab_size=60"],
                            "must read with the teacher's tokenizer")):
        with pytest.raises(TformerError, match=refused):
            run_distill(tmp_path, "refused", *settings, "distill.attention=1", *extra)


@pytest.mark.slow
def test_a_teacher_of_other_classes_or_a_conflicting_table_is_refused(teacher, tmp_path):
    with pytest.raises(TformerError, match="the teacher's classes .* are not the data's"):
        run_distill(tmp_path, "demo", f"teacher={teacher.run_dir}", "data=demo", "data.n_train=300",
                    "data.n_validation=100", "data.n_test=100")
    with pytest.raises(ConfigError, match="distill.embeddings=teacher .* embedding_init=minilm gives it its own"):
        run_distill(tmp_path, "minilm", f"teacher={teacher.run_dir}", "embedding_init=minilm",
                    "distill.embeddings=teacher")
    assert not (tmp_path / "minilm").exists()


@pytest.mark.slow
def test_imdb_unsupervised_split_is_read_by_name(shared_data):
    from tformer_cli.data.sources import unlabeled_texts
    from helpers import data_config

    texts, where = unlabeled_texts(data_config("imdb", dir=str(shared_data / "imdb")), "unsupervised")
    assert len(texts) == 50_000 and where.endswith("unsupervised.parquet")
    with pytest.raises(TformerError, match="no nothing.parquet"):
        unlabeled_texts(data_config("imdb", dir=str(shared_data / "imdb")), "nothing")


@pytest.mark.slow
def test_a_teacher_and_a_student_that_read_long_texts_as_windows(tiny_run, tmp_path):
    """The shared tiny run reads texts longer than 24 tokens as windows (its logits: their mean); a student that
    reads 12-token windows learns each window from its document's teacher logits."""
    from tformer_cli import distill as distill_api  # (the Python API: the same run)

    student = distill_api({"teacher": str(tiny_run.run_dir), "trainer.epochs": 1, "model.max_len": 12,
                           "data.long_text": "chunks", "distill.cache_dir": str(tmp_path / "cache"),
                           **dict(o.split("=", 1) for o in STUDENT if not o.startswith("trainer.epochs"))},
                          run_dir=tmp_path / "windows", quiet=True)
    run = RunDir(student.run_dir)
    assert student.test_metrics is not None and student.monitor == "val_accuracy"
    log = (run.root / "distill.log").read_text()
    assert "300 labelled + 0 unlabeled texts" in log and "chunks of 24 tokens" in log  # (the teacher's reading)
    assert re.search(r"test \(100 examples, \d+ windows; best checkpoint\)", log)  # (the student's)
    assert json.loads(run.best.meta.read_text())["long_text"] == "chunks"
    assert Classifier.load(run.root, device="cpu").predict(["a film i will not forget"])[0]["label"] in ("negative",
                                                                                                         "positive")


@pytest.mark.slow
def test_a_runs_checkpoints_folder_is_named_with_the_two_that_would_do(teacher):
    """teacher=<run>/checkpoints (or checkpoint=) is neither a run nor a checkpoint: one line names both."""
    from tformer_cli.store.locate import locate

    folder = teacher.run_dir / "checkpoints"
    with pytest.raises(TformerError, match=f"teacher={folder} is a run's checkpoints folder, not a checkpoint; pass "
                                           f"the run dir \\({teacher.run_dir}\\) or one of its checkpoints "
                                           f"\\({folder / 'best'}\\)"):
        locate(folder, key="teacher")


def test_unlabeled_texts_that_repeat_one_another_are_said(tmp_path):
    """A file listed twice, or texts repeated in one, weigh each copy as a text: kept (the fingerprint is of what
    was given) and said in the log line."""
    from types import SimpleNamespace

    from helpers import data_config
    from tformer_cli.data import sources

    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"train text {i},{'ab'[i % 2]}\n" for i in range(20)))
    (tmp_path / "u.csv").write_text("text\n" + "".join(f"other text {i % 5}\n" for i in range(15)))
    cfg = data_config("files", train_file=str(tmp_path / "train.csv"))
    said = []
    console = SimpleNamespace(print=lambda line, **kw: said.append(line))
    options = SimpleNamespace(unlabeled=[str(tmp_path / "u.csv")], max_unlabeled=None)
    kept = distill_module.unlabeled_texts(SimpleNamespace(data=cfg, seed=0), options, sources.load(cfg), console)
    assert len(kept) == 15 and said[-1].endswith("; 10 of them repeat another (each copy counts as a text)")
