"""How a `-m` sweep job ended, as a record in its folder (job_status.json), written by the CLI's job wrapper and
error guard (cli.py) and read by the sweep summary (summary.py), so a job's status never depends on the wording
of its error message:

    {"status": "done" | "failed" | "interrupted", "exit_code": 0 | 2 | 130, "message": "<the error line>" | null}

A job that is running, or was killed before it could write (SIGKILL, out of memory), has no record: the record of
an earlier attempt is removed when a resumed sweep starts the job again.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..store.atomic import write_json

FILE = "job_status.json"
INTERRUPTED_EXIT_CODE = 130  # Ctrl-C / SIGTERM: the job saved what it had and can be resumed
STATUSES = ("done", "failed", "interrupted")


@dataclass(frozen=True)
class JobStatus:
    status: str  # done | failed | interrupted
    exit_code: int
    message: str | None = None

    @classmethod
    def ended(cls, exit_code: int, message: str | None = None) -> "JobStatus":
        """The status of a job that ended with `exit_code` (0 done, 130 interrupted, else failed)."""
        status = "done" if exit_code == 0 else "interrupted" if exit_code == INTERRUPTED_EXIT_CODE else "failed"
        return cls(status, exit_code, message)


def path(job_dir: str | Path) -> Path:
    return Path(job_dir) / FILE


def write(job_dir: str | Path, status: JobStatus) -> Path:
    return write_json(path(job_dir), asdict(status))


def clear(job_dir: str | Path) -> None:
    """A job starting (again): the record of an earlier attempt no longer says how it stands."""
    path(job_dir).unlink(missing_ok=True)


def read(job_dir: str | Path) -> JobStatus | None:
    """The job's record, or None when it has none (running, killed, or written before records existed) or it
    cannot be read."""
    try:
        data = json.loads(path(job_dir).read_text())
        status = JobStatus(str(data["status"]), int(data["exit_code"]), data.get("message"))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return status if status.status in STATUSES else None
