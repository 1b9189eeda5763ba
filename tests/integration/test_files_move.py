"""files.move in one process: what a unit does in each situation it can find.

Real worker processes killed between copy and delete, and the rest of the
list of guarantees, are in ``test_builtin_workers.py``.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from durable import faults, jobs
from durable.builtin import files as files_module
from durable.builtin.files import MoveFilesForm
from durable.errors import InputRejected
from durable.lease import claim
from durable.models import Job, UnitResult
from durable.worker import Worker

from .helpers import drain

pytestmark = pytest.mark.django_db

FILES = {
    "a.txt": b"alpha\n",
    "dir/b.bin": bytes(range(256)) * 4096,  # 1 MiB: more than one read
    "dir/sub/c with space.txt": b"gamma",
    "ünï/d.txt": "δ".encode(),
    "empty": b"",
}


def local(path: Path) -> dict:
    return {"BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(path)}}  # fmt: skip


@pytest.fixture
def roots(settings, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    for root in (src, dst, tmp_path / "corrupt"):
        root.mkdir()
    settings.STORAGES = {
        **settings.STORAGES,
        "src": local(src),
        "dst": local(dst),
        "nested": local(src / "archive"),
        "missing": local(tmp_path / "not-mounted"),
        "corrupt": {
            "BACKEND": "tests.testapp.storage.CorruptingStorage",
            "OPTIONS": {"location": str(tmp_path / "corrupt")},
        },
    }
    return src, dst


def fill(root: Path, files: dict[str, bytes] = FILES) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes() for path in root.rglob("*") if path.is_file()
    }


def move(**data) -> Job:
    data = {"source": "src", "destination": "dst", **data}
    return drain(jobs.enqueue("files.move", data).pk)


def outcomes(job: Job) -> dict[str, str]:
    rows = UnitResult.objects.filter(job_id=job.pk).exclude(key="summary")
    return {row.result["name"]: row.result["outcome"] for row in rows}


# --- moving -----------------------------------------------------------------------------------


def test_move__every_file_verified_then_removed_from_the_source(roots):
    src, dst = roots
    fill(src)
    os.utime(src / "a.txt", (1_600_000_000, 1_600_000_000))
    job = move()
    assert job.state == "completed"
    assert tree(dst) == FILES
    assert tree(src) == {}
    assert (dst / "a.txt").stat().st_mtime == 1_600_000_000  # kept metadata
    assert (job.units_done, job.units_total) == (len(FILES) + 1, len(FILES) + 1)
    results = {r.result["name"]: r.result for r in UnitResult.objects.filter(job_id=job.pk)
               if "name" in (r.result or {})}  # fmt: skip
    big = results["dir/b.bin"]
    assert big["sha256"] == hashlib.sha256(FILES["dir/b.bin"]).hexdigest()
    assert (big["size"], big["outcome"], big["copied"]) == (1024 * 1024, "moved", True)
    assert job.checkpoint == {"after": "ünï/d.txt", "done": True}
    summary = job.events.get(kind="moved")
    assert summary.message == f"moved 5 file(s), {sum(map(len, FILES.values())):,} bytes"


def test_move__a_prefix_or_a_list_of_names(roots):
    src, dst = roots
    fill(src)
    assert move(prefix="dir/").state == "completed"
    assert set(tree(dst)) == {"dir/b.bin", "dir/sub/c with space.txt"}
    assert move(names=["empty", "a.txt", "no-such-file"]).state == "completed"
    assert set(tree(src)) == {"ünï/d.txt"}
    assert outcomes(Job.objects.latest("id"))["no-such-file"] == "vanished"


def test_move__a_copy_made_before_a_crash_is_not_copied_again(roots):
    """The crash came between copy and delete: the replay only deletes the source."""
    src, dst = roots
    fill(src, {"a.txt": b"alpha\n"})
    fill(dst, {"a.txt": b"alpha\n"})  # what the crashed attempt left behind
    inode = (dst / "a.txt").stat().st_ino
    job = move()
    assert job.state == "completed"
    result = UnitResult.objects.get(job_id=job.pk, key="file:a.txt").result
    assert (result["outcome"], result["copied"]) == ("moved", False)
    assert (dst / "a.txt").stat().st_ino == inode  # the same file: never rewritten
    assert tree(src) == {}


def test_move__a_copy_cut_short_by_a_crash_is_replaced(roots):
    """Cut short, the copy is under this job's own temporary name: replaced, then gone."""
    src, dst = roots
    fill(src, {"dir/big": b"x" * 5000})
    job = jobs.enqueue("files.move", {"source": "src", "destination": "dst"})
    partial = files_module.temporary_name("dir/big", job.pk)
    assert partial.startswith("dir/.durable-move-")
    fill(dst, {partial: b"x" * 1200})  # what the crashed attempt left behind
    assert drain(job.pk).state == "completed"
    assert tree(dst) == {"dir/big": b"x" * 5000}


@pytest.mark.parametrize(
    "theirs",
    [b"line1\n", b"", b"line1\nline2"],
    ids=["a-shorter-file-starting-like-ours", "an-empty-file", "the-same-bytes-other-time"],
)
def test_move__somebody_elses_file_at_the_destination_is_never_replaced(roots, theirs):
    """The audit's cases: a log whose first line equals the source's, and an empty file."""
    src, dst = roots
    fill(src, {"log.txt": b"line1\nline2"})
    fill(dst, {"log.txt": theirs})
    os.utime(dst / "log.txt", (1_500_000_000, 1_500_000_000))  # written long ago, by them
    inode = (dst / "log.txt").stat().st_ino
    job = move()
    assert job.state == "failed"
    assert "dst:log.txt already exists with" in job.reason
    assert (dst / "log.txt").read_bytes() == theirs
    assert (dst / "log.txt").stat().st_ino == inode  # the very same file, untouched
    assert (dst / "log.txt").stat().st_mtime == 1_500_000_000
    assert tree(src) == {"log.txt": b"line1\nline2"}
    assert tree(dst) == {"log.txt": theirs}  # and no copy of ours left beside it


def test_move__another_jobs_copy_in_progress_is_left_alone(roots):
    src, dst = roots
    fill(src, {"a.txt": b"alpha\n"})
    theirs = files_module.temporary_name("a.txt", 999_999)  # job 999999 is copying it
    fill(dst, {theirs: b"alp"})
    job = move()
    assert job.state == "completed"
    assert tree(dst) == {"a.txt": b"alpha\n", theirs: b"alp"}  # not ours: not touched
    assert tree(src) == {}


def test_move__a_stale_publish_of_ours_is_replaced_when_the_source_changed(roots):
    """Killed after publishing, then the source was rewritten: our old copy goes, not theirs."""
    src, dst = roots
    fill(src, {"a.txt": b"version 2\n"})
    job = jobs.enqueue("files.move", {"source": "src", "destination": "dst"})
    tmp = files_module.temporary_name("a.txt", job.pk)
    fill(dst, {tmp: b"version 1\n"})
    os.link(dst / tmp, dst / "a.txt")  # published, then the crash
    assert drain(job.pk).state == "completed"
    assert tree(dst) == {"a.txt": b"version 2\n"}
    assert tree(src) == {}


def test_move__a_crash_before_the_mtime_was_kept_is_repaired_before_the_delete(roots):
    """Killed after publishing a copy whose modification time had not been applied yet."""
    src, dst = roots
    fill(src, {"a.txt": b"alpha\n"})
    os.utime(src / "a.txt", (1_600_000_000, 1_600_000_000))
    job = jobs.enqueue("files.move", {"source": "src", "destination": "dst"})
    tmp = files_module.temporary_name("a.txt", job.pk)
    fill(dst, {tmp: b"alpha\n"})  # the copy, with the time of its writing
    os.link(dst / tmp, dst / "a.txt")
    job = drain(job.pk)
    assert job.state == "completed"
    assert (dst / "a.txt").stat().st_mtime == 1_600_000_000  # applied again, then verified
    result = UnitResult.objects.get(job_id=job.pk, key="file:a.txt").result
    assert (result["outcome"], result["copied"]) == ("moved", False)
    assert tree(dst) == {"a.txt": b"alpha\n"}
    assert tree(src) == {}


def test_move__into_a_storage_that_is_not_a_local_directory(roots, settings):
    """No hard links there: published with save (another name rather than overwrite)."""
    src, _ = roots
    settings.STORAGES = {
        **settings.STORAGES,
        "memory": {"BACKEND": "django.core.files.storage.InMemoryStorage"},
    }
    from django.core.files.storage import storages

    memory = storages["memory"]
    memory.save("taken.txt", io.BytesIO(b"theirs"))
    fill(src, {"a.txt": b"alpha\n", "dir/b.bin": FILES["dir/b.bin"], "taken.txt": b"ours"})
    job = drain(jobs.enqueue("files.move", {"source": "src", "destination": "memory",
                                           "on_conflict": "skip"}).pk)  # fmt: skip
    assert job.state == "completed", job.reason
    assert outcomes(job) == {
        "a.txt": "moved",
        "dir/b.bin": "moved",
        "taken.txt": "conflict_skipped",
    }
    assert memory.open("a.txt").read() == b"alpha\n"
    assert memory.open("dir/b.bin").read() == FILES["dir/b.bin"]
    assert memory.open("taken.txt").read() == b"theirs"
    assert sorted(memory.listdir("")[1]) == ["a.txt", "taken.txt"]  # no temporary copy left
    assert memory.listdir("dir")[1] == ["b.bin"]
    assert tree(src) == {"taken.txt": b"ours"}


@pytest.mark.parametrize("meanwhile", ["moved by another job", "deleted by its owner"])
def test_move__a_source_that_goes_while_it_is_read_is_not_a_failure(roots, monkeypatch, meanwhile):
    src, dst = roots
    fill(src, {"a.txt": b"alpha\n"})
    real = files_module._HashingReader.read

    def taken_away(self, n=-1):
        if (src / "a.txt").exists():
            if meanwhile == "moved by another job":
                fill(dst, {"a.txt": b"alpha\n"})
            (src / "a.txt").unlink()
            raise FileNotFoundError(2, "No such file or directory", str(src / "a.txt"))
        return real(self, n)

    monkeypatch.setattr(files_module._HashingReader, "read", taken_away)
    job = drain(jobs.enqueue("files.move", {"source": "src", "destination": "dst"}).pk)
    assert (job.state, job.attempts) == ("completed", 0)
    expected = "already_moved" if meanwhile == "moved by another job" else "vanished"
    assert outcomes(job) == {"a.txt": expected}
    assert tree(dst) == ({"a.txt": b"alpha\n"} if expected == "already_moved" else {})


def test_move__temporary_names_are_never_moved_as_files(roots):
    src, dst = roots
    fill(src, {"a.txt": b"a", files_module.temporary_name("a.txt", 7): b"left by a crash"})
    assert move().state == "completed"
    assert tree(dst) == {"a.txt": b"a"}


def test_move__after_the_source_was_deleted_the_replay_is_done(roots):
    _, dst = roots
    fill(dst, {"a.txt": b"alpha\n"})  # deleted at the source, then the crash
    job = move(names=["a.txt"])
    assert job.state == "completed"
    assert outcomes(job) == {"a.txt": "already_moved"}
    assert tree(dst) == {"a.txt": b"alpha\n"}


def test_move__a_checksum_mismatch_leaves_the_source_and_fails_visibly(roots, tmp_path):
    src, _ = roots
    fill(src, {"a.txt": b"alpha\n", "b.txt": b"beta\n"})
    job = drain(jobs.enqueue("files.move", {"source": "src", "destination": "corrupt"},
                            max_attempts=1).pk)  # fmt: skip
    assert job.state == "failed"
    assert "corrupt:a.txt does not match its source" in job.reason
    assert hashlib.sha256(b"alpha\n").hexdigest() in job.reason
    assert "The copy was removed; the source is untouched." in job.reason
    assert job.last_error["error_class"] == "durable.errors.VerificationFailed"
    assert tree(src) == {"a.txt": b"alpha\n", "b.txt": b"beta\n"}  # untouched, nothing more moved
    assert tree(tmp_path / "corrupt") == {}  # the bad copy is gone
    assert job.checkpoint is None


def test_move__a_mismatch_is_retried_with_backoff_before_it_fails(roots):
    src, _ = roots
    fill(src, {"a.txt": b"alpha\n"})
    job = jobs.enqueue("files.move", {"source": "src", "destination": "corrupt"})
    claimed = claim("w", queues=["default"], operations=["files.move"], lease_seconds=30)
    Worker(worker_id="w").execute(*claimed)  # one attempt
    job.refresh_from_db()
    assert (job.state, job.attempts) == ("queued", 1)  # retried later, not failed at once
    assert job.next_attempt_at > job.updated_at
    assert job.events.filter(kind="retry_scheduled").count() == 1


def test_move__a_different_file_at_the_destination_is_never_overwritten(roots):
    src, dst = roots
    fill(src, {"a.txt": b"ours", "b.txt": b"b"})
    fill(dst, {"a.txt": b"somebody else's"})
    job = move()
    assert job.state == "failed"  # non-retryable: a verdict, not a glitch
    assert job.attempts == 1
    assert "dst:a.txt already exists with other content" in job.reason
    assert "the source is left in place" in job.reason
    assert tree(src) == {"a.txt": b"ours", "b.txt": b"b"}
    assert tree(dst) == {"a.txt": b"somebody else's"}

    skipped = move(on_conflict="skip")
    assert skipped.state == "completed"
    assert outcomes(skipped) == {"a.txt": "conflict_skipped", "b.txt": "moved"}
    assert tree(src) == {"a.txt": b"ours"}
    assert tree(dst) == {"a.txt": b"somebody else's", "b.txt": b"b"}
    assert "skipped 1 that exist at the destination" in skipped.events.get(kind="moved").message


def test_move__a_listing_that_grows_during_the_move(roots, monkeypatch):
    src, dst = roots
    fill(src, {"b": b"1", "d": b"2"})
    original = faults.reach

    def arrivals(point: str) -> None:
        if point == "files.after_copy" and not (src / "z").exists():
            fill(src, {"a": b"early", "z": b"late"})  # before and after the checkpoint
        original(point)

    monkeypatch.setattr("durable.builtin.files.faults.reach", arrivals)
    assert move().state == "completed"
    assert tree(dst) == {"b": b"1", "d": b"2", "z": b"late"}
    assert tree(src) == {"a": b"early"}  # behind the checkpoint: left for the next move


# --- storages that are not there ------------------------------------------------------------------


def test_move__an_unmounted_storage_pauses_the_job_until_resumed(roots, tmp_path):
    src, _ = roots
    fill(src, {"a.txt": b"alpha\n"})
    job = drain(jobs.enqueue("files.move", {"source": "src", "destination": "missing"}).pk)
    assert job.state == "paused"
    assert f"{tmp_path / 'not-mounted'} does not exist or is not a directory" in job.reason
    assert "mount or create it, then resume" in job.reason
    assert job.attempts == 0
    (tmp_path / "not-mounted").mkdir()
    jobs.resume(job.pk, actor="ops")
    assert drain(job.pk).state == "completed"
    assert tree(tmp_path / "not-mounted") == {"a.txt": b"alpha\n"}


def test_move__a_storage_no_longer_configured_pauses_with_what_to_add(roots, settings):
    job = jobs.enqueue("files.move", {"source": "src", "destination": "dst"})
    settings.STORAGES = {k: v for k, v in settings.STORAGES.items() if k != "dst"}
    job = drain(job.pk)
    assert job.state == "paused"
    assert "no storage named 'dst' is configured on this worker" in job.reason
    assert "FILE_STORAGES" in job.reason


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"source": "nope"}, "source"),
        ({"destination": "src"}, "destination"),
        ({"destination": "nested"}, "destination"),  # inside the source: would loop
        ({"prefix": "a/", "names": ["b"]}, "prefix"),
        ({"names": ["../../etc/passwd"]}, "names"),
        ({"names": "a.txt"}, "names"),
        ({"prefix": "/etc"}, "prefix"),
        ({"on_conflict": "overwrite"}, "on_conflict"),
        ({"source": "staticfiles"}, "source"),
    ],
)
def test_move__refuses_bad_input_on_enqueue(roots, data, field):
    with pytest.raises(InputRejected) as refused:
        jobs.enqueue("files.move", {"source": "src", "destination": "dst", **data})
    assert refused.value.field == field


def test_form__its_cleaned_data_is_the_job_input(roots):
    form = MoveFilesForm(
        data={
            "source": "src",
            "destination": "dst",
            "names": "a.txt\n\n dir/b.bin \n",
            "on_conflict": "fail",
        }
    )
    assert form.is_valid(), form.errors
    assert ("src", "src") in form.fields["source"].choices
    assert ("staticfiles", "staticfiles") not in form.fields["source"].choices
    job = jobs.enqueue("files.move", form.cleaned_data)
    assert job.input == {"source": "src", "destination": "dst", "prefix": "",
                         "names": ["a.txt", "dir/b.bin"], "on_conflict": "fail"}  # fmt: skip


# --- the command ---------------------------------------------------------------------------------


def test_command__refuses_clearly(roots):
    with pytest.raises(CommandError, match="source: no storage named 'elsewhere'"):
        call_command("move_files", "elsewhere", "dst", stdout=io.StringIO())


# transaction=True: the command runs the job in a thread with its own connection,
# which must see the committed job.
@pytest.mark.django_db(transaction=True)
def test_command__wait_runs_it_here_and_reports(roots):
    src, dst = roots
    fill(src)
    out = io.StringIO()
    call_command("move_files", "src", "dst", "--prefix", "dir/", "--wait", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("enqueued job ")
    assert lines[0].endswith(": move src → dst")
    assert lines[-2].startswith("[##############################] 3/3 completed")
    assert lines[-1] == f"moved 2 file(s), {1024 * 1024 + 5:,} bytes"
    assert set(tree(dst)) == {"dir/b.bin", "dir/sub/c with space.txt"}


def test_move__a_source_written_during_the_copy_is_not_deleted(roots, monkeypatch):
    src, dst = roots
    fill(src, {"log.txt": b"first line\n"})
    real_read = files_module._HashingReader.read

    def read_while_written(self, n=-1):
        chunk = real_read(self, n)
        if chunk == b"first line\n":
            with open(src / "log.txt", "ab") as handle:  # a writer appends meanwhile
                handle.write(b"second line\n")
        return chunk

    monkeypatch.setattr(files_module._HashingReader, "read", read_while_written)
    job = drain(jobs.enqueue("files.move", {"source": "src", "destination": "dst"},
                            max_attempts=1).pk)  # fmt: skip
    assert job.state == "failed"
    assert "log.txt: the source changed while it was copied" in job.reason
    assert tree(dst) == {}  # the copy was removed
    assert tree(src) == {"log.txt": b"first line\nsecond line\n"}  # nothing lost
