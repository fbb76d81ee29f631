"""Options and texts are never confused: predict takes flags only (every other argument is a text, and one that
looks like an old `key=value` option is refused rather than guessed); export, serve and push take `key=value` and
`--key=value` through the one parser."""
import pytest

from helpers import run_tformer
from tformer_cli.commands import export, predict, push, serve, suggest
from tformer_cli.errors import TformerError
from tformer_cli.typed_config import given_twice, typed_keys, typed_values


def test_predict_flags_in_both_spellings_and_with_or_without_equals():
    opts, texts = predict.parse_args(["--top-k", "3", "--batch_size=8", "--max-chars=50", "--json", "a text",
                                      "--checkpoint=run", "-f", "in.txt", "--explain=false", "--outputs-dir", "o"])
    assert texts == ["a text"]
    assert (opts["top_k"], opts["batch_size"], opts["max_chars"], opts["json"], opts["explain"], opts["checkpoint"],
            opts["file"], opts["outputs_dir"]) == (3, 8, 50, True, False, "run", "in.txt", "o")


@pytest.mark.parametrize("arg", ["checkpoint=other", "file=/etc/hostname", "top-k=3", "json=true", "outputs_dir=x"])
def test_predict_refuses_a_text_that_looks_like_an_option(arg):
    key = arg.split("=")[0]
    with pytest.raises(TformerError, match=f"'{arg}' looks like an option: write --{key}="):
        predict.parse_args(["a real text", arg])
    opts, texts = predict.parse_args(["a real text", "--", arg, "--json"])  # after --: texts, all of them
    assert texts == ["a real text", arg, "--json"] and opts == predict.DEFAULTS


def test_a_batch_size_past_what_torch_can_index_is_refused_at_start_up():
    """1e20 texts per batch overflowed torch's split (a 500 on every request, a traceback in predict and suggest)."""
    huge = str(10 ** 20)
    with pytest.raises(TformerError, match=f"--batch-size={huge} must be at most 1048576"):
        predict.parse_args([f"--batch-size={huge}", "a text"])
    with pytest.raises(TformerError, match=rf"max_batch={huge} is out of range \(1-1048576\)"):
        serve.parse_args([f"max_batch={huge}"])
    with pytest.raises(TformerError, match=f"batch_size={huge} must be at most 1048576"):
        suggest.parse_args(["file=pool.txt", f"batch_size={huge}"])
    assert predict.parse_args(["--batch-size=1048576", "a text"])[0]["batch_size"] == 1 << 20
    assert serve.parse_args(["max_batch=1048576"])["max_batch"] == 1 << 20


def test_predict_keeps_other_equals_signs_as_text_and_refuses_unknown_flags():
    assert predict.parse_args(["2+2=4", "Checkpoint=x is a word", "-5 stars", "--great film--"])[1] == [
        "2+2=4", "Checkpoint=x is a word", "-5 stars", "--great film--"]
    with pytest.raises(TformerError, match="unknown flag '--topk'; predict knows --checkpoint, --top-k"):
        predict.parse_args(["--topk", "3", "x"])
    with pytest.raises(TformerError, match="--file needs a value"):
        predict.parse_args(["x", "--file"])


def test_predict_explain_takes_a_method_after_equals_and_says_so_when_it_is_spaced():
    assert predict.parse_args(["--explain=rollout", "x"])[0]["explain"] == "rollout"
    assert predict.parse_args(["--explain", "x"])[0]["explain"] is True
    with pytest.raises(TformerError, match="must be occlusion or rollout"):
        predict.parse_args(["--explain=Rollout", "x"])
    with pytest.raises(TformerError, match="would read 'rollout' as a text: say --explain=rollout"):
        predict.parse_args(["--explain", "rollout", "x"])
    assert predict.parse_args(["--explain", "--", "rollout"])[1] == ["rollout"]  # the text itself, after --


def test_predict_decodes_undecodable_argv_bytes_with_replacement():
    undecodable = b"caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of a latin-1 argv byte
    assert predict.parse_args([undecodable])[1] == ["caf\ufffd"]


def test_the_other_commands_take_key_value_and_dashed_flags():
    assert serve.parse_args(["--max-batch=8", "port=0", "--access_log=yes"])[
        "max_batch"] == 8 and serve.parse_args(["--port=0"])["port"] == 0
    assert export.parse_args(["--checkpoint=run", "opset=18"])["checkpoint"] == "run"
    with pytest.raises(TformerError, match="--port needs a value: write --port=VALUE"):
        serve.parse_args(["--port", "9000"])
    with pytest.raises(TformerError, match="unknown flag '--colour'; export knows --checkpoint"):
        export.parse_args(["--colour=red"])
    with pytest.raises(TformerError, match="unknown argument 'repo'; push takes checkpoint="):
        push.main(["repo"])


def test_export_reads_quantize_in_any_case_and_refuses_others_before_saying_what_it_exports(tmp_path):
    from tformer_cli.deploy.export import quantization

    assert [quantization(v) for v in ("INT8", " int8", "None", "", None)] == ["int8", "int8", None, None, None]
    r = run_tformer("export", "quantize=int4", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr == "error: quantize='int4' is not one of none, int8\n" and not r.stdout


def test_suggest_reads_labelled_as_yes_no_or_a_path_and_refuses_a_folder_as_out(tmp_path, monkeypatch):
    """labelled=no was read as a file named no; out=<folder> failed only after the whole pool was scored."""
    monkeypatch.chdir(tmp_path)
    read = {v: suggest.parse_args(["file=pool.txt", f"labelled={v}"])["labelled"]
            for v in ("no", "OFF", "false", "none", "", "yes", "auto", "seen.csv")}
    assert read == {"no": None, "OFF": None, "false": None, "none": None, "": None, "yes": "auto", "auto": "auto",
                    "seen.csv": "seen.csv"}
    (tmp_path / "no").write_text("text\nseen\n")
    with pytest.raises(TformerError, match="labelled=no is ambiguous"):
        suggest.parse_args(["file=pool.txt", "labelled=no"])
    (tmp_path / "pool.txt").write_text("a text\n")
    with pytest.raises(TformerError, match=f"out={tmp_path} is a folder; pass the path of the CSV"):
        suggest.out_path(suggest.parse_args(["file=pool.txt", f"out={tmp_path}", "overwrite=true"]))


def test_a_text_shaped_like_an_option_is_refused_in_one_line(tmp_path):
    r = run_tformer("predict", "checkpoint=/tmp/other", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "put -- before texts" in r.stderr
    assert "Traceback" not in r.stderr


def test_an_option_given_twice_with_two_values_is_refused_naming_both(tmp_path):
    """`serve checkpoint=A checkpoint=B` served B, unsaid; so did Hydra's commands for any key."""
    with pytest.raises(TformerError, match=r"checkpoint is given twice \(checkpoint=A and --checkpoint=B\); give it "
                                           r"once"):
        serve.parse_args(["checkpoint=A", "--checkpoint=B"])
    assert serve.parse_args(["port=0", "--port=0"])["port"] == 0  # (the same value twice chooses nothing)
    with pytest.raises(TformerError, match=r"top_k is given twice \(--top-k 3 and -k 5\)"):
        predict.parse_args(["--top-k", "3", "-k", "5", "a text"])
    with pytest.raises(TformerError, match=r"explain is given twice \(--explain and --explain=rollout\)"):
        predict.parse_args(["--explain", "--explain=rollout", "a text"])
    assert predict.parse_args(["--json", "--json", "a text"])[0]["json"] is True
    assert predict.parse_args(["--json", "--json=yes", "a text"])[0]["json"] is True  # (one yes, two spellings)
    assert predict.parse_args(["--coverage", "0.9", "--coverage", "0.90", "a text"])[0]["coverage"] is not None
    with pytest.raises(TformerError, match=r"coverage is given twice \(--coverage 0.9 and --coverage 0.8\)"):
        predict.parse_args(["--coverage", "0.9", "--coverage", "0.8", "a text"])
    with pytest.raises(TformerError, match=r"json is given twice \(--json and --json=no\)"):
        predict.parse_args(["--json", "--json=no", "a text"])
    given_twice(["trainer.epochs=2", "model=small", "trainer.epochs=5", "resume=outputs/train/x"])  # (the hints'
    # way to train longer: the run's overrides, then the change)
    given_twice(["trainer.epochs=2", "trainer.epochs=5", "resume=Yes"])
    for no in ("false", "OFF", "0", "null", ""):  # (a resume= that resumes nothing is no resume)
        with pytest.raises(TformerError, match=r"trainer.epochs is given twice"):
            given_twice(["trainer.epochs=2", "trainer.epochs=5", f"resume={no}"])
    r = run_tformer("evaluate", "checkpoint=A", "checkpoint=B", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr == "error: checkpoint is given twice (checkpoint=A and checkpoint=B); " \
                                             "give it once\n"
    r = run_tformer("train", "model=tiny", "+model=small", cwd=tmp_path)
    assert r.returncode == 2 and "model is given twice (model=tiny and +model=small)" in r.stderr
    assert not (tmp_path / "outputs").exists()


def test_typed_overrides_are_read_one_way_with_their_prefixes():
    typed = ["-m", "+trainer.devices=2", "~data.dir=x", "++model.dropout=0.1", "model=tiny", "trainer.devices=3",
             "--cfg=job", "a text"]
    assert typed_keys(typed) == ["trainer.devices", "data.dir", "model.dropout", "model", "trainer.devices"]
    assert typed_values(typed, "trainer.devices") == ["2", "3"] and typed_values(typed, "seed") == []


def test_two_spellings_of_one_number_choose_nothing_but_two_numbers_are_refused():
    from tformer_cli.typed_config import given_twice, same_number

    given_twice(["trainer.epochs=3", "trainer.epochs=03", "optimizer.lr=0.0010", "optimizer.lr=.001"])
    with pytest.raises(TformerError, match=r"optimizer.lr is given twice \(optimizer.lr=1e-3 and optimizer.lr=0.002\)"):
        given_twice(["optimizer.lr=1e-3", "optimizer.lr=0.002"])
    assert not same_number("1e3", "1000") and not same_number("nan", "nan") and not same_number("inf", "inf")
    assert same_number("0.9", "0.90") and not same_number("0.9", "0.91")
