"""The small things a newcomer meets in the first hour: the loss in the first epoch's bar, a hint for labels
numbered from 1, Ctrl-C said as a stop (not an error, wherever it lands), --explain's weights in a file,
pretraining's curves, and the Python API's dict overrides, in-memory data and quiet mode."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra.errors import ConfigCompositionException

from helpers import (TINY, TINY_TRAINING, compose_config, ctrl_c_reaches_it, data_config, run_tformer, tiny,
                     tformer_reading)
from tformer_cli import TformerError, cli, errors, hydra_setup, train
from tformer_cli.console import output
from tformer_cli.data import sources
from tformer_cli.errors import hydra_error_line, interrupted_by
from tformer_cli.evaluation.answers import plain_explanation
from tformer_cli.runs.pretraining import pretrain
from tformer_cli.store.layout import RunDir
from tformer_cli.training.loop import Interrupted
from tformer_cli.typed_config import plain


def write_csv(path, labels):
    rows = [f"text {i} {'good' if y % 2 else 'bad'} words,{y}" for i, y in enumerate(labels)]
    path.write_text("text,label\n" + "\n".join(rows) + "\n")
    return path


def test_labels_numbered_from_one_suggest_label_offset(tmp_path):
    p = write_csv(tmp_path / "train.csv", [1, 2, 3] * 20)
    with pytest.raises(TformerError, match=r"numbered from 1; add data\.label_offset=1") as refused:
        sources.load(data_config("files", train_file=str(p)))
    assert "\n" not in str(refused.value)
    data = sources.load(data_config("files", train_file=str(p), label_offset=1))  # the hint, taken, works
    assert data.label_names == ["0", "1", "2"] and set(data.splits["train"]["label"][:]) == {0, 1, 2}


def test_labels_with_a_gap_are_not_told_to_shift(tmp_path):
    p = write_csv(tmp_path / "train.csv", [1, 3] * 20)  # 1..K with a hole: an offset would not fix it
    with pytest.raises(TformerError, match="renumber the label column") as refused:
        sources.load(data_config("files", train_file=str(p)))
    assert "label_offset" not in str(refused.value)


def test_a_resume_hint_pastes_back_into_a_shell(tmp_path):
    """A run dir or an override with a space or a quote, joined with spaces, split into other words when pasted."""
    import shlex
    from types import SimpleNamespace

    from tformer_cli.runs.session import resume_hint
    from tformer_cli.store.layout import RunDir

    from hydra.core.override_parser.overrides_parser import OverridesParser

    run = RunDir(tmp_path / "my runs, café" / "it's")  # (a space for the shell; a comma and an accent for Hydra)
    typed = ["data.train_file=my data.csv", "trainer.epochs=3", "resume=true"]
    session = SimpleNamespace(run_dir=run, overrides=typed, job=SimpleNamespace(resumes_sweeps=False, task="train"),
                              dist=SimpleNamespace(enabled=False, world=1))
    *words, resume = shlex.split(resume_hint(session).removeprefix("resume with: "))
    assert words == ["tformer", "train", *typed[:2]]
    assert OverridesParser.create().parse_override(resume).value() == str(run)


@pytest.mark.parametrize("stop", [cli.Stopped(), Interrupted("interrupted at epoch 1, step 3; the last checkpoint "
                                                              "is saved; resume with: tformer train resume=x")])
def test_ctrl_c_is_a_plain_line_with_exit_code_130(stop, capsys):
    with pytest.raises(SystemExit) as ended:
        cli._fail(stop)
    err = capsys.readouterr().err.splitlines()
    assert ended.value.code == 130
    assert len(err) == 1 and err[0].startswith("interrupted") and "error" not in err[0], err


def _hydra_reading_a_file_on_ctrl_c():
    """What Hydra's config source does when a KeyboardInterrupt lands in its `open`: its `finally` closes a file
    that was never opened (hydra/_internal/core_plugins/importlib_resources_config_source.py)."""
    try:
        raise KeyboardInterrupt
    finally:
        raise UnboundLocalError("cannot access local variable 'f' where it is not associated with a value")


def test_a_ctrl_c_that_a_library_turns_into_its_own_error_is_still_a_stop(capsys):
    with pytest.raises(SystemExit) as ended:
        cli._guarded(_hydra_reading_a_file_on_ctrl_c)()
    err = capsys.readouterr().err.splitlines()
    assert ended.value.code == 130 and len(err) == 1 and err[0].startswith("interrupted"), err
    with pytest.raises(UnboundLocalError):  # the same error without a Ctrl-C behind it is not hidden as a stop
        cli._guarded(_a_bug)()


def _a_bug():
    raise UnboundLocalError("cannot access local variable 'f' where it is not associated with a value")


def test_a_composition_error_without_words_still_gets_one_line():
    try:
        try:
            _hydra_reading_a_file_on_ctrl_c()
        except UnboundLocalError as inner:
            raise ConfigCompositionException() from inner  # (how Hydra wraps an OmegaConf error: no message)
    except ConfigCompositionException as exc:
        line = hydra_error_line("audit", exc)
        assert interrupted_by(exc)
    assert "\n" not in line and line.startswith("cannot access local variable") and "--help" in line
    assert hydra_error_line("train", ConfigCompositionException()).startswith("the config could not be composed")


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (a Ctrl-C lost in a finalizer)
def test_a_ctrl_c_while_a_config_composes_is_a_keyboard_interrupt():
    """Real SIGINTs at random moments of real Hydra composition (one in five lands where Hydra turns it into an
    UnboundLocalError of its own): the library caller and the CLI see a KeyboardInterrupt every time. (One that
    lands in an object's finalizer, which Python runs between any two lines, is lost, as anywhere: not counted.)"""
    rng, caught = random.Random(0), []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background `make test` ignores SIGINT)
    try:
        for _ in range(20):
            timer = threading.Timer(rng.uniform(0.0, 0.05), os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
            until = time.monotonic() + 5.0
            try:
                while time.monotonic() < until:  # until the Ctrl-C lands
                    hydra_setup.compose_config("train", ["data=files"])
                timer.join()  # (a timer that fired late on a busy machine: here)
            except BaseException as exc:
                caught.append(type(exc).__name__)
            timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert set(caught) == {"KeyboardInterrupt"} and len(caught) >= 10, caught


def test_a_ctrl_c_while_a_command_module_imports_is_one_line(monkeypatch, capsys):
    def importing(task):
        raise KeyboardInterrupt  # (where a Ctrl-C in the first second of `tformer report` lands: numpy importing)

    monkeypatch.setattr(cli, "_entry", importing)
    monkeypatch.setattr(cli, "_command", ["report"])
    with pytest.raises(SystemExit) as ended:
        cli._run_argv("report", ["some/run"])
    assert ended.value.code == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C); nothing was left half-written\n"  # (no resume: no run)


def test_a_stop_by_sigterm_is_not_called_a_ctrl_c(monkeypatch):
    import signal

    from tformer_cli import errors

    monkeypatch.setattr(errors, "SIGNALLED", [signal.SIGTERM])
    monkeypatch.setattr(cli, "SIGNALLED", errors.SIGNALLED)
    assert str(cli.Stopped()).startswith("interrupted (SIGTERM); nothing was left half-written")


def test_a_stop_between_the_jobs_of_a_sweep_says_how_to_continue_the_sweep(monkeypatch):
    """A Ctrl-C between two jobs of `train -m` gave the single run's `resume=<run dir>` line."""
    monkeypatch.setattr(cli, "_command", ["train"])
    monkeypatch.setattr(sys, "argv", ["tformer train", "-m", "seed=1,2"])
    monkeypatch.setattr(cli, "_hydra_job", lambda: type("Job", (), {"sweep": type("Sweep", (), {"dir": "s/1 2"})})())
    assert str(cli.Stopped()).endswith("; nothing was left half-written. The sweep continues with the same `tformer "
                                       "train -m ...` command plus 'resume=s/1 2'")
    monkeypatch.setattr(cli, "_hydra_job", lambda: None)  # (stopped before its first job began)
    assert str(cli.Stopped()).endswith("No job of the sweep had begun: run the same `tformer train -m ...` command "
                                       "again")
    monkeypatch.setattr(sys, "argv", ["tformer train", "seed=1"])
    assert str(cli.Stopped()).endswith("`tformer train <same overrides> resume=<run dir>`")


def test_any_error_after_a_stop_signal_is_the_stop(monkeypatch, capsys):
    """numpy stopped while it imports refuses to import again (an ImportError with no KeyboardInterrupt behind
    it): once a stop signal came, what fails is the stop, said as one line."""
    def numpy_again():
        raise ImportError("cannot load module more than once per process")

    monkeypatch.setattr(cli, "_command", ["train"])
    with pytest.raises(ImportError):  # no signal: a real error stays one
        cli._guarded(numpy_again)()
    monkeypatch.setattr(errors, "SIGNALLED", [signal.SIGINT])
    with pytest.raises(SystemExit) as ended:
        cli._guarded(numpy_again)()
    assert ended.value.code == 130
    assert capsys.readouterr().err.startswith("interrupted (Ctrl-C); nothing was left half-written. A run that had "
                                              "saved a checkpoint continues with `tformer train <same overrides>")


def _a_file_read_cut_short():
    """What a Ctrl-C while `datasets` reads a CSV becomes: its DatasetGenerationError (from the KeyboardInterrupt),
    worded by tformer as a file it could not read."""
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as stop:
            raise RuntimeError("An error occurred while generating the dataset") from stop
    except RuntimeError as exc:
        raise TformerError("could not read train.csv as csv: KeyboardInterrupt") from exc


def test_one_of_our_errors_wrapping_what_a_ctrl_c_broke_is_the_stop(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_command", ["evaluate"])
    with pytest.raises(SystemExit) as ended:
        cli._guarded(_a_file_read_cut_short)()
    assert ended.value.code == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C); nothing was left half-written\n"


@pytest.mark.slow  # (a subprocess)
def test_a_signal_after_the_last_line_changes_nothing():
    """A Ctrl-C (or a launcher's SIGTERM) while a finished command's interpreter tears down: its exit code stays."""
    code = ("import os, signal, time\nfrom tformer_cli import cli\nprint('last line', flush=True)\ncli._exiting()\n"
            "os.kill(os.getpid(), signal.SIGINT)\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(0.2)\n"
            "raise SystemExit(3)")
    ended = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=ctrl_c_reaches_it)
    assert (ended.returncode, ended.stdout, ended.stderr) == (3, "last line\n", "")


@pytest.mark.slow  # (a subprocess)
def test_a_ctrl_c_that_lands_in_a_finalizer_is_not_lost():
    """Python prints a KeyboardInterrupt raised in a `__del__` (a weakref callback, a file's close) and goes on; the
    CLI raises it again in the code that runs next."""
    code = ("import time\nfrom tformer_cli import cli\ncli._stop_signals()\n"
            "class Finalized:\n    def __del__(self):\n        raise KeyboardInterrupt\n"
            "try:\n    Finalized()\n    started = time.monotonic()\n    while time.monotonic() - started < 60:\n"
            "        pass\n    print('lost')\nexcept KeyboardInterrupt:\n    print('stopped')\n")
    ended = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=ctrl_c_reaches_it)
    assert (ended.stdout, ended.stderr) == ("stopped\n", "")


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_a_ctrl_c_at_any_moment_of_a_command_is_one_line_or_nothing(tiny_run, tmp_path):
    """Real SIGINTs at seeded moments across a whole `tformer train` (from the moment its main takes the signals:
    imports, Hydra composing, data, training, reports, teardown) and `tformer report`: each ends with exit code 0
    (it had finished) or 130 and its stop line, never a traceback or a line after it."""
    rng = random.Random(0)
    for args in (["train", *TINY], ["report", str(tiny_run.run_dir)]):
        started = time.monotonic()
        assert run_tformer(*args, cwd=tmp_path).returncode == 0
        whole = time.monotonic() - started
        # early moments (importing, composing) and seeded ones over the whole run and just past its end
        for at in [0.05, 0.15, 0.3, *sorted(rng.uniform(0.3, whole * 1.05) for _ in range(5))]:
            proc, lines, reader = tformer_reading(*args, cwd=tmp_path)
            deadline = time.monotonic() + 60
            while not _tformer_took_the_signals(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(at)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=300)
            reader.join(timeout=30)
            shown = "".join(lines)
            assert proc.returncode in (0, 130), (args[0], at, shown[-3000:])
            assert "Traceback" not in shown, (args[0], at, shown[-3000:])
            if proc.returncode == 130:
                assert shown.rstrip().splitlines()[-1].startswith("interrupted"), (args[0], at, shown[-3000:])


def _tformer_took_the_signals(pid: int) -> bool:
    """Whether `tformer`'s main has set its stop handlers (Linux: SIGTERM caught in /proc/<pid>/status; elsewhere,
    assumed). Before that, in the interpreter's start and the CLI module's import (tens of ms), a SIGINT is
    Python's own: a KeyboardInterrupt traceback that no program's code can word."""
    try:
        caught = re.search(r"SigCgt:\s*([0-9a-f]+)", Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return True
    return caught is None or bool(int(caught.group(1), 16) >> (signal.SIGTERM - 1) & 1)


def test_a_user_error_keeps_its_error_prefix(capsys):
    with pytest.raises(SystemExit) as ended:
        cli._fail(TformerError("trainer.epochs=0 must be at least 1"))
    assert ended.value.code == 2 and capsys.readouterr().err == "error: trainer.epochs=0 must be at least 1\n"


def test_a_redirected_explanation_carries_each_words_weight():
    result = {"label": "positive", "probability": 0.91,
              "explanation": {"tokens": ["[CLS]", "super", "##b", "film", "[SEP]"], "rollout": [0.1, 0.3, 0.2, 0.3, 0.1]}}
    assert plain_explanation(result).plain == "positive 0.910 [rollout]: superb(0.50) film(0.30)"
    result["explanation"] = {"method": "occlusion", "words": ["superb", "film", "!"], "weights": [0.4, -0.05, 0.0]}
    assert plain_explanation(result).plain == "positive 0.910 [occlusion]: superb(+0.40) film(-0.05) !(+0.00)"


@pytest.mark.slow  # a `tformer predict` process
def test_predict_explain_into_a_file_prints_the_weights(tiny_run, tmp_path):
    r = run_tformer("predict", "--explain", f"--checkpoint={tiny_run.run_dir}", "the film was great", "", "dull",
                    cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    w = r"\([+-]\d\.\d\d\)"
    assert re.search(rf"^1\. \w+ \d\.\d{{3}} \[occlusion\]: the{w} film{w} was{w} great{w}$", r.stdout, re.M), r.stdout
    assert re.search(rf"^2\. \(an empty text: nothing to explain\)\n3\. \w+ \d\.\d{{3}} \[occlusion\]: dull{w}$",
                     r.stdout, re.M), r.stdout  # (numbered as the table's rows: the empty one too)


@pytest.mark.slow  # trains in a `tformer` process
def test_the_first_epochs_bar_shows_the_loss_on_small_data(tmp_path):
    """10 batches, a loss logged every 20 steps: the bar still shows a loss from its first step."""
    r = run_tformer("train", *TINY_TRAINING, "data.n_train=300", "data.n_validation=50", "data.n_test=50",
                    "trainer.test_after_fit=false", cwd=tmp_path, env={"TFORMER_PROGRESS_SECONDS": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    bar = [line for line in r.stderr.splitlines() if line.startswith("epoch 1/1: ")]
    assert bar[0].startswith("epoch 1/1: 1/10 batches") and re.search(r"loss \d+\.\d{4}", bar[0]), bar


@pytest.mark.slow  # pretrains
def test_pretraining_writes_training_curves(tmp_path):
    run = RunDir(tmp_path / "run")
    pretrain(plain(compose_config("pretrain", *tiny("model=tiny", "data.n_train=200", "data.n_validation=50"))), run)
    assert run.training_curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # trains in a `tformer` process, twice
@pytest.mark.heavy  # make test-heavy (CI runs it)
def test_a_ctrl_c_after_training_before_the_reports_leaves_a_run_that_resumes_to_them(tmp_path):
    """Stopped once history.json was written but before calibration and the test pass, the run read as finished:
    its resume was refused, and it had no temperature, no label-set cuts and no test metrics, unsaid."""
    from helpers import interrupted_when

    args = ["train", *tiny("data.n_test=60000", "model.max_len=16"), "hydra.run.dir=run"]  # (a long test pass)
    code, out = interrupted_when("run/training_curves.png", *args, cwd=tmp_path)
    run = RunDir(tmp_path / "run")
    assert code == 130 and "interrupted after training, before its reports (calibration, test) were all " \
                           "written; resume with: tformer train " in out, out[-2000:]
    assert not run.finished and not run.test_metrics.exists()
    r = run_tformer(*args, "resume=run", cwd=tmp_path)
    assert r.returncode == 0 and "training had already ended; its reports follow" in r.stdout, r.stderr[-2000:]
    assert run.finished and json.loads(run.test_metrics.read_text())["n"] == 60000
    assert json.loads(run.best.meta.read_text())["temperature"] is not None


def reviews(n=160, seed=0):
    rng = random.Random(seed)
    words = {"pos": ["great", "superb", "lovely", "fine"], "neg": ["awful", "dull", "boring", "bad"]}
    labels = ["pos" if i % 2 else "neg" for i in range(n)]
    return [" ".join(rng.choice(words[y]) for _ in range(6)) for y in labels], labels


@pytest.mark.slow  # trains twice in-process
def test_the_api_takes_a_dict_lists_or_a_dataframe_and_can_be_quiet(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    overrides = dict(o.split("=", 1) for o in TINY_TRAINING)
    texts, labels = reviews()
    result = train(overrides, data=(texts, labels), test_data=reviews(40, seed=1), quiet=True)
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # quiet: nothing on the screen; the run log still has it all
    assert "epoch   1/1" in (result.run_dir / "train.log").read_text()
    assert result.test_metrics["n"] == 40 and [h["epoch"] for h in result.history] == [1]
    config = (result.best_checkpoint / "config.yaml").read_text()
    assert "name: files" in config and "train.parquet" in config  # a data=files run like any other
    # the same data as a DataFrame: the same stored file
    again = train({**overrides, "trainer.epochs": 2}, data=pd.DataFrame({"text": texts, "label": labels}))
    assert [h["epoch"] for h in again.history] == [1, 2]
    assert not output().screen.quiet  # quiet=True lasted for its own call only
    assert len(list((tmp_path / "outputs" / "data").glob("*/train.parquet"))) == 1


@pytest.mark.parametrize("call, message", [
    (lambda: train({"trainer.epochs": object()}), "a value must be a string"),
    (lambda: train(data=(["a", "b"], [0])), "2 texts and 1 labels"),
    (lambda: train(data="reviews.csv"), "takes a pandas DataFrame"),
    (lambda: train(["data=imdb"], data=(["a", "b"], [0, 1])), "drop data=imdb"),
    (lambda: train(test_data=(["a"], [0])), "go with data="),
    (lambda: train(quiet="yes"), "must be True or False"),
])
def test_the_api_refuses_what_it_cannot_take_in_one_line(call, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TformerError, match=message) as refused:
        call()
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "outputs").exists()  # refused before anything was written
