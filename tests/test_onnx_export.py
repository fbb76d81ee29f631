"""`tformer export` to ONNX and the torch-free runtime: parity with PyTorch, the same answers as `Classifier`,
no torch imported by `predict runtime=onnx`, and damaged exports refused."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from helpers import TINY_RUN, copy_run, run_tformer, tiny

pytest.importorskip("onnxruntime")

from tformer_cli import Classifier, TformerError, train  # noqa: E402
from tformer_cli.deploy.export import PARITY_TOLERANCE, export_onnx  # noqa: E402
from tformer_cli.deploy.onnx_classifier import OnnxClassifier  # noqa: E402

pytestmark = pytest.mark.slow  # the tests export (and some train) a run

# the shared tiny run (TINY_RUN): max_len 24 with long_text=chunks, so longer texts are read as several windows
# whose logits are averaged
LONG = "the acting was good but the plot was painfully dull and far too long " * 6
TEXTS = ["a gripping, beautifully shot film", "  ", "never boring", LONG, "x"]


@pytest.fixture(scope="module")
def run(tiny_run, tmp_path_factory):
    """A copy of the session's tiny run: the exports below are written into it."""
    return copy_run(tiny_run.run_dir, tmp_path_factory.mktemp("onnx") / "run")


@pytest.fixture(scope="module")
def exported(run):
    return export_onnx(run)


def test_fp32_export_matches_pytorch_within_tolerance(exported, run):
    print(f"max |logit difference| ONNX vs PyTorch: {exported.max_abs_logit_diff:.3e}")
    assert exported.max_abs_logit_diff <= PARITY_TOLERANCE == 1e-4
    assert exported.label_agreement == 1.0
    info = json.loads((exported.path / "export.json").read_text())
    assert exported.path == run / "export" / "onnx"
    assert info["quantization"] is None and info["long_text"] == "chunks" and info["max_len"] == 24


def test_onnx_runtime_gives_the_torch_answers(exported, run):
    torch_clf, onnx_clf = Classifier.load(run), OnnxClassifier.load(run)
    assert onnx_clf.labels == torch_clf.labels
    assert len(torch_clf._encode([LONG])[2][0]) > 1  # the long text really is several windows
    p_torch, p_onnx = torch_clf.predict_proba(TEXTS), onnx_clf.predict_proba(TEXTS)
    assert np.isnan(p_onnx[1]).all() and np.isnan(p_torch[1]).all()
    filled = [0, 2, 3, 4]
    assert np.abs(p_torch[filled] - p_onnx[filled]).max() <= 1e-4
    a, b = torch_clf.predict(TEXTS, top_k=2), onnx_clf.predict(TEXTS, top_k=2)
    assert [r["label"] for r in a] == [r["label"] for r in b] and b[1]["empty"]
    with pytest.raises(TformerError, match="torch runtime"):
        onnx_clf.explain(["never boring"], method="rollout")
    occluded = onnx_clf.explain(["never boring"])[0]["explanation"]  # occlusion needs only forward passes
    assert occluded["words"] == ["never", "boring"] and occluded == torch_clf.explain(["never boring"])[0][
        "explanation"] | {"weights": pytest.approx(occluded["weights"], abs=1e-3)}


def test_predict_runtime_onnx_never_imports_torch(exported, run, tmp_path):
    code = ("import sys\nfrom tformer_cli.cli import main\nsys.argv = ['tformer', 'predict', '--runtime=onnx', "
            f"'--checkpoint={run}', '--json', 'never boring']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('torch imported' if 'torch' in sys.modules else 'no torch', file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().endswith("no torch")
    answer = json.loads(r.stdout)
    expected = Classifier.load(run).predict(["never boring"])[0]
    assert answer["label"] == expected["label"]
    assert answer["probability"] == pytest.approx(expected["probability"], abs=1e-4)


def test_cli_export_prints_parity_and_predict_uses_it(run, tmp_path):
    out = tmp_path / "exported"
    r = run_tformer("export", f"checkpoint={run}", f"out={out}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    diff = float(re.search(r"max \|logit difference\| vs PyTorch ([0-9.e+-]+)", r.stdout).group(1))
    assert diff <= 1e-4
    r = run_tformer("predict", "--runtime=onnx", f"--checkpoint={out}", "--json", "never boring", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["label"] in ("negative", "positive")
    r = run_tformer("export", f"checkpoint={run}", "format=tflite", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "format=" in r.stderr


def test_int8_export_is_smaller_and_reports_its_difference(exported, run):
    q = export_onnx(run, quantize="int8")
    assert q.path == run / "export" / "onnx-int8" and q.bytes < exported.bytes
    assert 0.0 <= q.label_agreement <= 1.0 and np.isfinite(q.max_abs_logit_diff)
    clf = OnnxClassifier.load(q.path)
    assert clf.info["quantization"] == "int8" and clf.info["int8_recipe"]["per_channel"] is True
    import onnx

    scales = [t for t in onnx.load(str(q.path / "model.onnx")).graph.initializer if t.name.endswith("_scale")]
    assert any(len(t.dims) == 1 and t.dims[0] > 1 for t in scales)  # one weight scale per output channel
    assert [r["label"] in clf.labels for r in clf.predict(["never boring", LONG])] == [True, True]


def test_damaged_or_missing_exports_are_refused_in_one_line(exported, run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(exported.path, copy)
    data = bytearray((copy / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(TformerError, match="changed after it was written"):
        OnnxClassifier.load(copy)
    (copy / "labels.json").unlink()
    with pytest.raises(TformerError, match="incomplete"):
        OnnxClassifier.load(copy)
    other = tmp_path / "other_run"
    shutil.copytree(run / "checkpoints", other / "checkpoints")
    with pytest.raises(TformerError, match="tformer export checkpoint="):
        OnnxClassifier.load(other)
    r = run_tformer("predict", "--runtime=onnx", f"--checkpoint={copy}", "hello", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_an_export_older_than_its_checkpoint_is_refused_until_re_exported(exported, run, tmp_path):
    import shutil

    from tformer_cli.deploy import hub_repo

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    other = train(tiny("seed=7", "trainer.epochs=1", base=TINY_RUN), run_dir=tmp_path / "other").run_dir
    shutil.rmtree(copy / "checkpoints" / "best")  # a newer best was saved after the export (resumed, extended)
    shutil.copytree(other / "checkpoints" / "best", copy / "checkpoints" / "best")
    with pytest.raises(TformerError, match="re-export: tformer export checkpoint="):
        OnnxClassifier.load(copy)
    with pytest.raises(TformerError, match="before pushing"):
        hub_repo.stage(copy, tmp_path / "stage")
    assert OnnxClassifier.load(copy / "export" / "onnx").labels  # named explicitly, an export is what it is

    last = export_onnx(copy / "checkpoints" / "last")  # another checkpoint of the run: its own folder
    assert last.path == copy / "export" / "onnx-last"
    assert OnnxClassifier.load(copy / "checkpoints" / "last").info["source_checkpoint"] == "../../checkpoints/last"
    export_onnx(copy)  # re-exported: best's export is current again
    assert OnnxClassifier.load(copy).predict(["never boring"])[0]["label"] == \
        Classifier.load(copy).predict(["never boring"])[0]["label"]

    staged = hub_repo.stage(copy, tmp_path / "stage")
    assert json.loads((staged / "onnx" / "export.json").read_text())["source_checkpoint"] == ".."
    assert OnnxClassifier.load(staged / "onnx").labels  # its manifest still holds
    hub_repo.stage(copy, staged)  # a previous stage (by its marker) is replaced whole
    (staged / "mine.txt").write_text("a file the user put in the stage")
    with pytest.raises(TformerError, match="did not write there"):  # replacing it would delete the user's file
        hub_repo.stage(copy, staged)
    assert (staged / "mine.txt").read_text() == "a file the user put in the stage"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(TformerError, match="not empty"):
        hub_repo.stage(copy, tmp_path / "mine")
    with pytest.raises(TformerError, match="inside the checkpoint"):  # never clear the source itself
        hub_repo.stage(copy, copy / "checkpoints" / "best")


def test_export_refuses_unwritable_targets_and_handles_tiny_max_len(run, tmp_path):
    with pytest.raises(TformerError, match="needs out="):
        export_onnx("hf://someone/model")
    (tmp_path / "file.onnx").write_text("x")
    with pytest.raises(TformerError, match="is a file"):
        export_onnx(run, tmp_path / "file.onnx")
    short = train(tiny("model.max_len=4"), run_dir=tmp_path / "short").run_dir
    done = export_onnx(short)  # parity batches never longer than max_len
    assert done.max_abs_logit_diff <= PARITY_TOLERANCE


def test_report_of_an_export_elsewhere_names_its_run_or_what_reads_it(exported, run, tmp_path):
    """`tformer report <out= export>` sent the user to `tformer evaluate checkpoint=<export>`, which refuses it."""
    import shutil

    from tformer_cli.evaluation.folders import refuse_other_paths

    elsewhere = export_onnx(run, tmp_path / "shipped").path  # (out=: export.json names the checkpoint)
    with pytest.raises(TformerError, match=f"is an ONNX export of the run {run}; report the run"):
        refuse_other_paths(elsewhere)
    copied = shutil.copytree(elsewhere, tmp_path / "far" / "away" / "model")  # (its checkpoint no longer found)
    with pytest.raises(TformerError, match=r"is an ONNX export, not a run: .*`tformer predict --runtime onnx"):
        refuse_other_paths(copied)


def test_parity_compares_label_sets_for_a_multi_label_model():
    """Two answers with the same top label but another label set: a multi-label export's parity counts them as
    different (the figure `tformer export` prints is the share of identical label sets)."""
    import numpy as np

    from tformer_cli.deploy.export import _answers

    ref, got = np.array([[3.0, 0.1, -2.0]]), np.array([[3.0, -0.1, -2.0]])
    assert (_answers(False, None, None)(ref) == _answers(False, None, None)(got)).all()
    multi = _answers(True, None, [0.5, 0.5, 0.5])
    assert not (multi(ref) == multi(got)).all(1).any()


def test_serving_a_run_exported_only_as_int8_finds_that_export(tiny_run_copy):
    from tformer_cli.deploy.export import export_onnx
    from tformer_cli.store.locate import locate_export

    done = export_onnx(tiny_run_copy / "checkpoints" / "best", None, quantize="int8")
    assert locate_export(tiny_run_copy).path.resolve() == done.path.resolve() and done.path.name == "onnx-int8"
