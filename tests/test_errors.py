"""Each kind of bad input gets one line naming the problem and the fix, exit code 2, and no traceback."""
import json
import shutil

import pytest

from helpers import copy_run, run_tformer, tiny
from tformer_cli.deploy.export import export_onnx

pytestmark = pytest.mark.slow  # subprocess runs of the installed command

FAST = tiny("trainer.test_after_fit=false")


def check(r, message, code=2):
    text = r.stderr + r.stdout
    assert r.returncode == code, text[-2000:]
    assert message in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in text


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    (d / "ok.csv").write_text("text,label\n" + "".join(f"sample text {i},{i % 2}\n" for i in range(40)))
    (d / "outside.csv").write_text("text,label\n" + "".join(f"sample text {i},{i % 2 * 5}\n" for i in range(40)))
    (d / "mixed.jsonl").write_text("".join('{"text": "t%d", "label": %s}\n' % (i, '"a"' if i % 2 else i)
                                           for i in range(40)))
    (d / "empty_texts.csv").write_text("text,label\n" + "".join(f"  ,{i % 2}\n" for i in range(40)))
    (d / "unseen.csv").write_text("text,label\nx,0\ny,7\n")
    (d / "latin1.txt").write_bytes("fine\nd\xe9j\xe0 vu\n".encode("latin1"))
    return d


@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_data_errors(files, tmp_path):
    f = lambda name: f"data.train_file={files / name}"
    check(run_tformer("train", "data=files", f"data.train_file={files / 'nope.csv'}", cwd=tmp_path),
          "data file not found")
    check(run_tformer("train", "data=files", f("ok.csv"), "data.text_column=review", cwd=tmp_path),
          "column 'review' not found in the train split; it has columns text, label")
    check(run_tformer("train", "data=files", f("outside.csv"), cwd=tmp_path), "labels must be 0..")
    check(run_tformer("train", "data=files", f("mixed.jsonl"), cwd=tmp_path), "the label column mixes types")
    check(run_tformer("train", "data=files", f("empty_texts.csv"), cwd=tmp_path),
          "the train split is empty after dropping empty texts")
    check(run_tformer("train", "data=files", f("ok.csv"), f"data.test_file={files / 'unseen.csv'}", cwd=tmp_path),
          "test split (unseen.csv) has labels not seen in training: 7")


def test_config_errors(tmp_path):
    check(run_tformer("train", "model.d_model=30", "model.n_heads=4", cwd=tmp_path),
          "model.d_model=30 is not divisible by model.n_heads=4")
    check(run_tformer("train", "trainer.device=cuda", *FAST, cwd=tmp_path), "CUDA is not available")
    check(run_tformer("train", "trainer.early_stopping.monitor=val_auc", *FAST, cwd=tmp_path),
          "monitor='val_auc' is not a logged metric")

def test_overrides_hydra_cannot_apply_get_one_line_with_the_nearest_real_names(tmp_path):
    """Hydra's own report is six lines that suggest `+key=value` (a new key nothing reads) for a typo."""
    cases = {("train", "optimizer.lrr=1e-3"): "optimizer.lrr is not a setting of `tformer train`; did you mean "
                                              "optimizer.lr?",
             ("train", "schedule=warmup_magic"): "schedule=warmup_magic: there is no such schedule config",
             ("train", "model=smal"): "did you mean model=small? (the choices: base, deberta_v3_small, distilbert, "
                                      "electra_small, minilm_l6, modernbert_base, pretrained, roberta_base, small, "
                                      "static, tiny, xlmr_base)",
             ("train", "optimizer.lr=[1"): "could not read an override",
             ("train", "trainer.early_stoping.patience=2"): "did you mean trainer.early_stopping.patience?",
             ("evaluate", "data.dri=x"): "data.dri is not a setting of `tformer evaluate`; did you mean data.dir?",
             ("calibrate", "text_column=body"): "text_column is not a setting of `tformer calibrate`; did you mean "
                                                "data.text_column?",  # (a group's key typed bare)
             ("train", "-m", "optimizer.lrr=1e-3,1e-4"): "did you mean optimizer.lr?",  # (Hydra made its dir)
             ("pretrain", "-m", "mlm.windos=true,false"): "did you mean mlm.windows?"}
    for (task, *overrides), message in cases.items():
        r = run_tformer(task, *overrides, cwd=tmp_path)
        check(r, message)
        assert len(r.stderr.strip().splitlines()) == 1 and "HYDRA_FULL_ERROR" not in r.stderr, r.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()  # (no sweep dir either)
    resumed = tmp_path / "sweep"  # a sweep dir that was there before (a sweep being resumed) is never removed
    resumed.mkdir()
    (resumed / "multirun.yaml").write_text("{}\n")
    check(run_tformer("train", "-m", "optimizer.lrr=1e-3,1e-4", f"resume={resumed}", cwd=tmp_path),
          "did you mean optimizer.lr?")
    assert (resumed / "multirun.yaml").is_file()
    check(run_tformer("train", "-m", "optimizer.lr=1e-3,1e-4", f"hydra.sweep.dir={resumed}", cwd=tmp_path),
          "is not empty")  # a new sweep never starts in another sweep's folder
    assert [p.name for p in resumed.iterdir()] == ["multirun.yaml"]


def test_nan_loss_stops_and_says_where(tmp_path):
    check(run_tformer("train", *FAST, "optimizer.lr=1e30", "trainer.grad_clip=0", "trainer.log_every_steps=1",
                      "trainer.precision=fp32", cwd=tmp_path), "try a lower learning rate")


@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_checkpoint_and_predict_input_errors(files, tiny_run, tmp_path):
    check(run_tformer("evaluate", f"checkpoint={tmp_path / 'missing'}", cwd=tmp_path), "does not exist")
    check(run_tformer("predict", f"--checkpoint={tmp_path / 'missing'}", "hi", cwd=tmp_path),
          f"--checkpoint={tmp_path / 'missing'} does not exist; pass --checkpoint=<run dir>")  # (as predict takes it)
    weights = tiny_run.run_dir / "checkpoints" / "best" / "model.safetensors"  # a file: its folder is named
    check(run_tformer("evaluate", f"checkpoint={weights}", cwd=tmp_path), f"is a file; pass the folder that holds it, "
          f"checkpoint={weights.parent}")
    onnx = tmp_path / "onnx"
    export_onnx(tiny_run.run_dir, onnx)  # an export is read by the ONNX runtime, not as a model
    check(run_tformer("evaluate", f"checkpoint={onnx}", cwd=tmp_path), f"is an ONNX export, which `tformer predict "
          f"--runtime onnx --checkpoint {onnx}` and `tformer serve runtime=onnx checkpoint={onnx}` read; for this "
          f"command pass the checkpoint it was made from ({(tiny_run.run_dir / 'checkpoints' / 'best').resolve()})")
    check(run_tformer("audit", f"checkpoint={onnx}", cwd=tmp_path), "is an ONNX export, which")
    check(run_tformer("audit", f"checkpoint={tmp_path / 'missing'}", cwd=tmp_path), "does not exist")
    assert not (tmp_path / "outputs").exists()  # refused audits leave no folder (nor read their data first)
    shipped = shutil.copytree(onnx, tmp_path / "ship" / "model")  # away from its run: its source is not there
    check(run_tformer("evaluate", f"checkpoint={shipped}", cwd=tmp_path),
          "pass the checkpoint it was made from (<the run dir it was exported from>)")
    incomplete = tmp_path / "ckpt"
    incomplete.mkdir()
    (incomplete / "model.safetensors").write_bytes(b"")
    check(run_tformer("predict", f"--checkpoint={incomplete}", "hi", cwd=tmp_path), "is incomplete (missing model.json")
    copy_run(tiny_run.run_dir, tmp_path / "outputs" / "train" / "2000-01-01" / "00-00-00")  # predict's newest run
    check(run_tformer("predict", f"--file={files / 'latin1.txt'}", cwd=tmp_path), "line 2 is not valid UTF-8")
    check(run_tformer("predict", "--top-k", "zero", "x", cwd=tmp_path), "must be integers")
    check(run_tformer("predict", "--file=" + str(files / "ok.csv"), "--max-lines=5", cwd=tmp_path),
          "more than --max-lines=5")
    r = run_tformer("predict", "--max-chars=10", "--json", "a very long text that goes on and on", cwd=tmp_path)
    assert r.returncode == 0 and "were cut" in r.stderr and '"text": "a very lon"' in r.stdout
    meta = next(tmp_path.glob("outputs/train/*/*/checkpoints/best/meta.json"))
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "format_version": 99}))
    check(run_tformer("predict", f"--checkpoint={meta.parent}", "x", cwd=tmp_path), "format version 99")
