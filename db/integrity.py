"""Keyed MACs over the kernel cache's rows: the database is not trusted (DESIGN.md §8).

Anyone who can write the database (every worker and CLI host) could edit a stored winner, and a
plain sha256 beside a row is recomputed as easily as the row is edited. So every candidate and
winner row carries an HMAC-SHA256 over the canonical JSON of all its columns (but its creation
time) and of the rows whose fields a hit serves with it: the program and target it answers, and
for a winner its job's result summary and the MACs of its kernel, its baseline and its ranked
candidates. How a job ended (its state, error and result summary, which GET /jobs/{id} serves)
is signed too (`job_fields`).
Each MAC covers the row's id, so no signed row can stand in for another.

The key is not in the database: SUPEROPT_SECRET, else a random key in a file created 0600 beside
the SQLite database. A PostgreSQL database is shared by hosts that each need the same key, so
without SUPEROPT_SECRET the key file in the user's cache directory is used, and a log line says so.
A row without a MAC (written before rows were signed) or with a wrong one is never served.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import threading
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from superopt.db.engine import shown
from superopt.db.errors import StoreError
from superopt.db.models import Candidate, Job, Target, Winner, Workload
from superopt.digest import canonical_json
from superopt.paths import cache_dir

SECRET_ENV = "SUPEROPT_SECRET"
KEY_FILE = "superopt.key"
MIN_KEY_CHARS = 32  # a made key has 64 hex digits; SUPEROPT_SECRET no fewer than 32 characters

log = logging.getLogger(__name__)


class Signer:
    """MACs under one key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def mac(self, fields: dict[str, Any]) -> str:
        return hmac.new(self._key, canonical_json(fields).encode(), hashlib.sha256).hexdigest()

    def problem(self, fields: dict[str, Any], mac: str | None) -> str | None:
        """Why a row's `mac` does not vouch for `fields`; None when it does."""
        if mac is None:
            return "has no MAC (it was written before rows were signed)"
        if not hmac.compare_digest(self.mac(fields), mac):
            return "fails its MAC (edited, or signed with another key)"
        return None


_signers: dict[tuple[str | None, Path | None], Signer] = {}
_lock = threading.Lock()


def signer_for(s: Session) -> Signer:
    """The signer of the database `s` is bound to (its key read or created once per process)."""
    return signer_for_url(s.get_bind().engine.url)


def signer_for_url(url: URL) -> Signer:
    """The signer of the database at `url`; StoreError when its key cannot be trusted (a service
    asks at its start, so that it does not start only to answer every request 500)."""
    secret = os.environ.get(SECRET_ENV) or None
    path = None if secret else key_path(url)
    with _lock:
        if (secret, path) not in _signers:
            if secret is not None:
                if len(secret.strip()) < MIN_KEY_CHARS:
                    raise StoreError(f"{SECRET_ENV} is {len(secret.strip())} characters long (blanks aside); a key "
                                     f"that signs cache rows needs at least {MIN_KEY_CHARS} (e.g. the output of: "
                                     "openssl rand -hex 32)")
                try:
                    key = secret.encode()
                except UnicodeEncodeError:  # bytes that are no text in this locale
                    raise StoreError(f"{SECRET_ENV} holds bytes that are not text (e.g. the output of: openssl rand "
                                     "-hex 32)") from None
            else:
                assert path is not None
                key = _read_or_create(path)
                if url.get_backend_name() != "sqlite":
                    log.warning("%s is not set: the kernel cache rows of %s are signed with the key in %s; "
                                "hosts that share this database need the same key (set %s on each)",
                                SECRET_ENV, shown(url), path, SECRET_ENV)
            _signers[secret, path] = Signer(key)
        return _signers[secret, path]


def key_path(url: URL) -> Path:
    """Beside an SQLite database; for a server database, in the user's cache directory."""
    if url.get_backend_name() == "sqlite" and url.database:
        return Path(url.database).resolve().parent / KEY_FILE
    return cache_dir() / KEY_FILE


def _read_or_create(path: Path) -> bytes:
    """The key in `path`, made first when there is none. Processes opening one database together
    (a service and its workers) race to make it: each writes a whole file of its own, readable by
    its owner only, and links it into place; the first link wins and every process reads that one."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return _trusted_key(path)


def _trusted_key(path: Path) -> bytes:
    """The key in `path`, if only its owner, this user, can read or change it and it is long
    enough: a key file another user planted or can write (an empty one signs with the empty key)
    would let them sign rows."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise StoreError(f"key file {path}: cannot be read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        problem = "is not a regular file" if not stat.S_ISREG(st.st_mode) else \
            f"belongs to another user (uid {st.st_uid})" if hasattr(os, "getuid") and st.st_uid != os.getuid() else \
            f"can be read or written by others (mode {stat.S_IMODE(st.st_mode):o}; chmod 600 it)" \
            if st.st_mode & 0o077 else None
        key = os.read(fd, 1 << 12).strip() if problem is None else b""
    finally:
        os.close(fd)
    if problem is None and len(key) < MIN_KEY_CHARS:
        problem = f"holds {len(key)} characters; a key needs at least {MIN_KEY_CHARS} (delete it: a new one is made)"
    if problem is not None:
        raise StoreError(f"key file {path} {problem}: it signs the kernel cache's rows, so it is not used")
    return key


# -- what each MAC covers ---------------------------------------------------------------------


def candidate_fields(c: Candidate, workload: Workload, target: Target) -> dict[str, Any]:
    return {
        "table": "candidate", "id": c.id, "job_id": c.job_id, "rank": c.rank, "data": c.data, "digest": c.digest,
        "time_us": float(c.time_us), "time_source": c.time_source,
        "estimated_us": None if c.estimated_us is None else float(c.estimated_us), "proved": bool(c.proved),
        "kernels": int(c.kernels), "workload": _workload(workload), "target": _target(target),
    }


def winner_fields(w: Winner, summary: dict[str, Any] | None) -> dict[str, Any]:
    """`w` with its workload and target rows loaded; `summary` its job's result. The rows it
    names (its kernel, its baseline, its job's ranked candidates) are each signed with their ids,
    so naming them binds their content: none can be edited or stand in for another."""
    return {
        "table": "winner", "id": w.id, "config_hash": w.config_hash, "version": w.version, "job_id": w.job_id,
        "candidate_id": w.candidate_id, "baseline_id": w.baseline_id, "ranked_ids": w.ranked_ids,
        "time_us": float(w.time_us), "workload": _workload(w.workload), "target": _target(w.target),
        "summary": summary,
    }


def job_fields(j: Job) -> dict[str, Any]:
    """What a job's MAC covers: how it ended (its state and error) and the result summary served
    with it, and what says which job and program it answers. Signed when it ends (`jobs._end`):
    an edit that fails a job with a message of the editor's choosing fails the MAC."""
    return {"table": "job", "id": j.id, "workload_id": j.workload_id, "config_hash": j.config_hash,
            "cache_hit": bool(j.cache_hit), "result": j.result, "state": j.state, "error": j.error}


def sign_job(s: Session, job: Job) -> None:
    """Sign a job as it ends (`job_fields`; the job has its id)."""
    assert job.id is not None, "a job is signed with its id: flush the job first"
    job.result_mac = signer_for(s).mac(job_fields(job))


def _workload(w: Workload) -> dict[str, Any]:
    return {"id": w.id, "program_hash": w.program_hash, "shapes": w.shapes, "dtypes": w.dtypes, "name": w.name,
            "program_json": w.program_json}


def _target(t: Target) -> dict[str, Any]:
    return {"id": t.id, "fingerprint": t.fingerprint, "name": t.name, "measured": bool(t.measured)}
