"""A throwaway cluster (or pgbouncer) does not outlive the process that owns it.

A real owner process enters `devdb.throwaway()` and is killed with a real signal: SIGKILL (no
`finally` runs) and SIGTERM (Python's default action: none runs either). Before the orphan
reaper, both left the postmaster running and its temp folder on disk; and an owner killed inside
`pgbouncer.running()` left its pgbouncer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

OWNER = textwrap.dedent(
    """
    import sys, time
    from pyworker.db import devdb

    with devdb.throwaway() as cluster:
        print(cluster.root, flush=True)
        time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    """Whether `pid` runs. A zombie has exited: its new parent (init, once its owner is dead)
    may be slow to reap it, or in a container never do so."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_cluster_of_a_killed_owner_is_stopped_and_removed(sig: signal.Signals) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert owner.stdout is not None
        root = Path(owner.stdout.readline().strip())
        postmaster = int((root / "data" / "postmaster.pid").read_text().split()[0])
        assert _alive(postmaster)

        owner.send_signal(sig)
        assert owner.wait(timeout=10) == -sig

        deadline = time.monotonic() + 30
        while (_alive(postmaster) or root.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(postmaster), "the killed owner's postmaster is still running"
        assert not root.exists(), "the killed owner's cluster folder is still on disk"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_the_reaper_is_this_package_whatever_the_working_directory(tmp_path: Path) -> None:
    """An owner whose working directory holds another pyworker (an older checkout, say): the
    reaper it starts must still be its own package's. Before, `python -m` in the owner's
    directory ran the other one, which here does nothing, and the cluster stayed."""
    fake = tmp_path / "pyworker" / "db"
    fake.mkdir(parents=True)
    (tmp_path / "pyworker" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "orphan_reaper.py").write_text("import sys\nsys.stdin.read()\n")  # reaps nothing
    root = Path(__file__).resolve().parent.parent
    owner = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(root)!r})\n" + OWNER],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        assert owner.stdout is not None
        cluster = Path(owner.stdout.readline().strip())
        postmaster = int((cluster / "data" / "postmaster.pid").read_text().split()[0])
        owner.kill()
        owner.wait(timeout=10)
        deadline = time.monotonic() + 30
        while (_alive(postmaster) or cluster.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(postmaster) and not cluster.exists(), "the other checkout's reaper ran"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


BOUNCER_OWNER = textwrap.dedent(
    """
    import sys, time
    from pyworker.db import pgbouncer

    with pgbouncer.running(sys.argv[1], port=6499) as bouncer:
        print(bouncer.root, bouncer.proc.pid, flush=True)
        time.sleep(600)
    """
)


def test_pgbouncer_of_a_killed_owner_is_stopped_and_removed(database_url: str) -> None:
    from pyworker.db import pgbouncer

    if not pgbouncer.PGBOUNCER.exists():
        pytest.skip("pgbouncer is not installed (make bootstrap installs it)")
    owner = subprocess.Popen(
        [sys.executable, "-c", BOUNCER_OWNER, database_url],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert owner.stdout is not None
        root, pid = owner.stdout.readline().split()
        bouncer = Path(root)
        assert _alive(int(pid)) and bouncer.exists()

        owner.kill()
        assert owner.wait(timeout=10) == -signal.SIGKILL

        deadline = time.monotonic() + 30
        while (_alive(int(pid)) or bouncer.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(int(pid)), "the killed owner's pgbouncer is still running"
        assert not bouncer.exists(), "the killed owner's pgbouncer folder is still on disk"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_normal_exit_dismisses_the_reaper() -> None:
    """The reaper ends with its owner's `with` block; nothing of it is left behind."""
    from pyworker.db import devdb

    with devdb.throwaway() as cluster:
        root = Path(cluster.root)
        # Popen returns once exec has begun; /proc shows the new command line a moment later.
        deadline = time.monotonic() + 10
        while not (reapers := _reapers_of(cluster.root)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(reapers) == 1, reapers
    assert not root.exists()
    assert not any(_alive(pid) for pid in reapers)


def _reapers_of(root: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pyworker.db.orphan_reaper" in argv and any(root.encode() in a for a in argv):
            found.append(int(entry.name))
    return found


def test_a_released_folder_reaper_touches_nothing_a_link_there_points_to(tmp_path: Path) -> None:
    """The review of stop 59: after a normal exit the owner removed its folder, then released
    the reaper, which woke on EOF and removed whatever the path named by then: a link made there
    to another directory had that directory deleted. Released, it now does nothing."""
    from pyworker.db import devdb

    work = tmp_path / "work"
    work.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine")
    release = devdb.reap_folder_if_owner_dies(str(work))
    deadline = time.monotonic() + 10
    while not _reapers_of(str(work)) and time.monotonic() < deadline:
        time.sleep(0.01)
    work.rmdir()
    work.symlink_to(victim)
    release()
    assert (victim / "keep").read_text() == "mine"


def test_a_folder_reaper_of_a_killed_owner_removes_the_folder_not_a_link_put_in_its_place(
    tmp_path: Path,
) -> None:
    """Its owner killed, the reaper removes the folder it saw at its start, and only that: a
    link found in its place instead is left, and so is what it points to."""
    owner = textwrap.dedent(
        """
        import sys, time
        from pyworker.db import devdb

        devdb.reap_folder_if_owner_dies(sys.argv[1])
        print("ready", flush=True)
        time.sleep(600)
        """
    )
    gone, swapped, victim = tmp_path / "gone", tmp_path / "swapped", tmp_path / "victim"
    for folder in (gone, swapped, victim):
        folder.mkdir()
    (victim / "keep").write_text("mine")
    owners = [
        subprocess.Popen([sys.executable, "-c", owner, str(folder)], stdout=subprocess.PIPE, text=True)
        for folder in (gone, swapped)
    ]
    for process in owners:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    swapped.rmdir()
    swapped.symlink_to(victim)
    for process in owners:
        process.kill()
        process.wait(10)
    deadline = time.monotonic() + 30
    while gone.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not gone.exists()
    deadline = time.monotonic() + 10
    while _reapers_of(str(swapped)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert swapped.is_symlink() and (victim / "keep").read_text() == "mine"
