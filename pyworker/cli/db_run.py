"""CMD of `runrow db run -- CMD`: a child that a signal to runrow reaches too.

runrow used to wait for CMD in subprocess.call: a SIGTERM killed runrow alone (Python's default
action), the orphan reaper removed the cluster, and CMD ran on, orphaned, against a database that
was gone (`sleep 100` still alive a minute later). Now SIGTERM, SIGINT and SIGHUP are blocked in
runrow while CMD runs and taken with sigtimedwait: each is sent on to CMD (to its process group
if it made one of its own), runrow waits for CMD to end, its caller stops the cluster, and the
exit code is 128 + the signal's number, as a shell reports a command a signal ended.

A signal the kernel sent (a terminal's Ctrl-C or hangup) went to the whole foreground process
group, CMD included, when CMD shares runrow's: it is not sent again, or CMD would see each Ctrl-C
twice (a worker's second signal skips its drain). CMD stays in runrow's process group, so an
interactive CMD (psql) keeps the terminal. A signal runrow was started ignoring (nohup's SIGHUP,
a background job's SIGINT) is left alone: CMD inherits its being ignored, as before.
"""

from __future__ import annotations

import os
import signal
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SI_KERNEL = 0x80  # si_code of a signal the kernel sent (a terminal's), not kill(2)'s SI_USER
POLL_SECONDS = 0.5  # the fallback if a SIGCHLD is missed; the wait ends at the SIGCHLD


def run(command: list[str], env: dict[str, str] | None = None) -> int:
    """Run `command` to its end, passing on the signals sent to this process; its exit code, or
    128 + the first signal passed on (or that ended it)."""
    watched = {s for s in FORWARDED if signal.getsignal(s) is not signal.SIG_IGN} | {signal.SIGCHLD}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        try:
            # posix_spawn, not Popen: the child must start with runrow's mask as it was (a mask
            # survives exec), set before it runs any code, which preexec_fn does not do safely.
            pid = os.posix_spawnp(
                command[0],
                command,
                os.environ if env is None else env,
                setsigmask=previous,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # as subprocess restores them
            )
        except OSError as exc:
            print(f"runrow db run: {command[0]}: {exc.strerror}", file=sys.stderr)
            return 126  # found but could not be run, the shell's code
        passed_on = _wait(pid, watched)
    finally:
        _take_pending(watched)  # one sent after the child ended: nothing left to pass it to
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    status = passed_on[1]
    if passed_on[0] is not None:
        return 128 + passed_on[0]
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _wait(pid: int, watched: set[signal.Signals]) -> tuple[int | None, int]:
    """Wait for `pid`, passing signals on; (the first signal passed on or None, wait status)."""
    first: int | None = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return first, status
        info = signal.sigtimedwait(watched, POLL_SECONDS)
        if info is None or info.si_signo == signal.SIGCHLD:
            continue
        if _send(pid, info):
            first = first or info.si_signo


def _send(pid: int, info: signal.struct_siginfo) -> bool:
    """Send the signal on to the child (its process group if it leads one); False when the
    terminal sent it to the child's group already."""
    try:
        own_group = os.getpgid(pid) == pid
    except ProcessLookupError:
        return False  # ended (a zombie still has a group): the next waitpid sees it
    if info.si_code == SI_KERNEL and not own_group:
        return False
    try:
        if own_group:
            os.killpg(pid, info.si_signo)
        else:
            os.kill(pid, info.si_signo)
    except ProcessLookupError:
        pass
    return True


def _take_pending(watched: set[signal.Signals]) -> None:
    while signal.sigtimedwait(watched, 0) is not None:
        pass
