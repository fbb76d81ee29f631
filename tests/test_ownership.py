"""Folders tformer did not create are never deleted or overwritten: push's stage, export's out, a run's folder.
A folder is tformer's by its marker (store/ownership.py); anything else is refused in one line and left as it was."""
import hashlib
import json
import os

import pytest

from helpers import TINY, run_tformer, tiny
from tformer_cli.errors import TformerError
from tformer_cli.store import ownership
from tformer_cli.store.layout import MARKER, RunDir


def snapshot(folder):
    """Every file under folder (hidden ones too) with its bytes' digest: what must not change."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line_refusal(r):
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    return r.stderr


def project_folder(path):
    """A user's folder that happens to hold the two names an earlier stage has."""
    path.mkdir()
    (path / "manifest.json").write_text('{"name": "my web app"}')
    (path / "README.md").write_text("# my project\n")
    (path / ".git").mkdir()
    (path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return path


def test_a_folder_is_ours_only_by_its_marker(tmp_path):
    folder = project_folder(tmp_path / "project")
    with pytest.raises(TformerError, match="no .tformer marker"):
        ownership.check_replaceable(folder, "stage", "stage")
    (folder / MARKER).write_text("not json")  # a file of that name that tformer did not write is no marker
    with pytest.raises(TformerError, match="no .tformer marker"):
        ownership.check_replaceable(folder, "stage", "stage")
    (folder / MARKER).unlink()
    ours = tmp_path / "ours"
    with ownership.replacing(ours, "export", "out") as tmp:
        (tmp / "model.onnx").write_text("x")
    assert ownership.is_ours(ours, "export") and not ownership.is_ours(ours, "stage")
    with pytest.raises(TformerError, match="not a stage"):  # another kind of tformer folder
        ownership.check_replaceable(ours, "stage", "stage")
    ids = {ownership.marker(ours)["id"]}
    with ownership.replacing(ours, "export", "out") as tmp:  # replaced whole: a new folder, a new id
        (tmp / "model.onnx").write_text("y")
    assert (ours / "model.onnx").read_text() == "y" and ownership.marker(ours)["id"] not in ids
    with pytest.raises(RuntimeError), ownership.replacing(ours, "export", "out") as tmp:  # a failure half way
        (tmp / "model.onnx").write_text("half")
        raise RuntimeError("disk full")
    assert (ours / "model.onnx").read_text() == "y" and not list(tmp_path.glob(".ours.tmp-*"))


def test_an_empty_folder_of_the_user_keeps_its_identity(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    inode = empty.stat().st_ino
    with ownership.replacing(empty, "stage", "stage") as tmp:
        (tmp / "README.md").write_text("card")
    assert empty.stat().st_ino == inode and (empty / "README.md").read_text() == "card"
    assert ownership.is_ours(empty, "stage")


def test_a_refused_run_takes_away_only_the_folders_made_with_it(tmp_path):
    (tmp_path / "outputs" / "audit").mkdir(parents=True)  # there before: stays
    run = tmp_path / "outputs" / "audit" / "2026-01-01" / "00-00-00"
    ownership.new_run_dir(run, "audit", None)
    (run / "audit.log").write_text("error: ...\n")
    assert RunDir(run).discard_if_empty()
    outputs = tmp_path / "outputs"
    assert [p.name for p in outputs.iterdir()] == ["audit"] and not any((outputs / "audit").iterdir())
    again = tmp_path / "outputs" / "audit" / "2026-01-01" / "00-00-01"
    ownership.new_run_dir(again, "audit", None)
    (again.parent / "00-00-02").mkdir()  # another run of that day: the date folder stays
    assert RunDir(again).discard_if_empty()
    assert [p.name for p in again.parent.iterdir()] == ["00-00-02"]
    checked = tmp_path / "outputs" / "distill" / "2026-01-01" / "00-00-03"  # refused after the data checks
    ownership.new_run_dir(checked, "distill", None)
    (checked / "data_report.json").write_text("{}")
    assert RunDir(checked).discard_if_empty() and not checked.exists()
    stopped = tmp_path / "outputs" / "distill" / "2026-01-01" / "00-00-04"  # Ctrl-C while the teacher scored: no
    ownership.new_run_dir(stopped, "distill", None)  # checkpoint, only the time it took (its rerun was then refused)
    (stopped / "timings.json").write_text("[]")
    assert RunDir(stopped).discard_if_empty() and not stopped.exists()


@pytest.mark.slow
def test_push_and_export_never_delete_or_replace_foreign_files(tiny_run_copy, tmp_path):
    run = tiny_run_copy
    project = project_folder(tmp_path / "project")
    before = snapshot(project)
    one_line_refusal(run_tformer("push", f"checkpoint={run}", "stage=.", cwd=project))
    assert snapshot(project) == before and (project / ".git" / "HEAD").is_file()

    mixed = project_folder(tmp_path / "mixed")  # the two names plus others: the others were deleted before
    (mixed / "data.csv").write_text("text,label\n")
    before = snapshot(mixed)
    one_line_refusal(run_tformer("push", f"checkpoint={run}", f"stage={mixed}", cwd=tmp_path))
    assert snapshot(mixed) == before

    refused = tmp_path / "refused_stage"  # a refused push (a checkpoint with optimizer state) leaves no folder
    one_line_refusal(run_tformer("push", f"checkpoint={run / 'checkpoints' / 'last'}", f"stage={refused}",
                                 cwd=tmp_path))
    assert not refused.exists() and not list(tmp_path.glob(".refused_stage*"))

    foreign = tmp_path / "foreign_out"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    one_line_refusal(run_tformer("export", f"checkpoint={run}", f"out={foreign}", cwd=tmp_path))
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]

    r = run_tformer("export", f"checkpoint={run}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    export = run / "export" / "onnx"
    assert ownership.is_ours(export, "export")
    (export / "notes.txt").write_text("mine")  # a file the user put in our export folder
    assert "notes.txt" in one_line_refusal(run_tformer("export", f"checkpoint={run}", cwd=tmp_path))
    assert (export / "notes.txt").read_text() == "mine"
    (export / "notes.txt").unlink()

    other = tmp_path / "other"  # another model's export is not replaced silently
    os.makedirs(other)
    import shutil

    shutil.copytree(run / "checkpoints", other / "checkpoints")
    err = one_line_refusal(run_tformer("export", f"checkpoint={other}", f"out={export}", cwd=tmp_path))
    assert "another checkpoint" in err
    assert json.loads((export / "export.json").read_text())["source_checkpoint"] == "../../checkpoints/best"


@pytest.mark.slow
def test_a_new_run_never_starts_in_a_folder_that_holds_a_run_or_files(tiny_run_copy, tmp_path):
    run = RunDir(tiny_run_copy)
    before = snapshot(run.root)
    err = one_line_refusal(run_tformer("train", *tiny("seed=3"), f"hydra.run.dir={run.root}", cwd=tmp_path))
    assert "finished run" in err and f"resume={run.root}" in err
    assert snapshot(run.root) == before  # .hydra/config.yaml not rewritten, nothing added

    with run.lock():  # busy: another process is training into it
        one_line_refusal(run_tformer("train", *TINY, f"hydra.run.dir={run.root}", cwd=tmp_path))
    assert snapshot(run.root) == before

    project = project_folder(tmp_path / "project")
    project_files = snapshot(project)
    assert "not empty" in one_line_refusal(run_tformer("train", *TINY, f"hydra.run.dir={project}", cwd=tmp_path))
    assert "not empty" in one_line_refusal(run_tformer("evaluate", f"checkpoint={run.root}",
                                                       f"hydra.run.dir={project}", cwd=tmp_path))
    assert snapshot(project) == project_files

    other = tmp_path / "other"  # a resume goes on in its own run's folder: hydra.run.dir may name no other
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    for resume in (f"resume={run.root}", "resume=true"):
        err = one_line_refusal(run_tformer("train", *TINY, resume, f"hydra.run.dir={other}", cwd=tmp_path))
        assert "is not the run resume=" in err
    assert [p.name for p in other.iterdir()] == ["notes.txt"]

    from tformer_cli import train

    with pytest.raises(TformerError, match="finished run.*a new run_dir"):
        train(TINY, run_dir=run.root)
    assert snapshot(run.root) == before


def test_a_sweep_never_starts_in_a_folder_that_holds_files(tmp_path):
    project = project_folder(tmp_path / "project")
    before = snapshot(project)
    err = one_line_refusal(run_tformer("train", "-m", *TINY, "seed=1,2", f"hydra.sweep.dir={project}", cwd=tmp_path))
    assert "hydra.sweep.dir" in err and snapshot(project) == before


def test_an_unwritable_run_dir_is_one_line_and_an_empty_user_folder_stays(tmp_path):
    err = one_line_refusal(run_tformer("train", *TINY, "hydra.run.dir=/dev/null/run", cwd=tmp_path))
    assert "cannot write the run dir /dev/null/run" in err
    mine = tmp_path / "mine"
    mine.mkdir()  # an empty folder of the user's given as the run dir, and a run refused in it
    one_line_refusal(run_tformer("train", *TINY, "model.n_heads=3", f"hydra.run.dir={mine}", cwd=tmp_path))
    assert mine.is_dir() and not list(mine.iterdir())  # our bookkeeping went; the folder stayed
    made = tmp_path / "made"
    one_line_refusal(run_tformer("train", *TINY, "model.n_heads=3", f"hydra.run.dir={made}", cwd=tmp_path))
    assert not made.exists()  # a folder tformer made for a refused run goes


@pytest.mark.slow
def test_a_model_with_nan_weights_is_not_exported(tiny_run_copy, tmp_path):
    """max() over NaN logit differences said 0.00e+00 and kept the export."""
    from safetensors.torch import load_file, save_file

    from tformer_cli.store import manifest
    from tformer_cli.store.layout import CheckpointDir

    best = CheckpointDir(tiny_run_copy / "checkpoints" / "best")
    weights = load_file(best.weights)
    name = next(k for k in weights if weights[k].is_floating_point() and weights[k].dim() == 2)
    weights[name][0, 0] = float("nan")
    save_file(weights, best.weights, metadata={"format": "pt"})
    manifest.write(best)  # a consistent checkpoint whose model is broken
    err = one_line_refusal(run_tformer("export", f"checkpoint={tiny_run_copy}", cwd=tmp_path))
    assert "NaN" in err and not (tiny_run_copy / "export" / "onnx").exists()
