"""`runrow demo`, run as a person runs it (a subprocess), checked on what it prints and what it leaves.

The first test gives it a database of its own in the test cluster (scratch_database: empty, the demo
migrates it), so its workers see no other test's runs. The second lets it start its own throwaway
cluster and interrupts it mid-run as Ctrl-C would: everything it started must be gone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEMO = [sys.executable, "-m", "pyworker", "demo", "--fake"]


def demo_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")}
    env.pop("DATABASE_URL", None)
    env.update(NO_COLOR="1", **extra)
    return env


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, not yet reaped by its parent) is not running anything.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_demo_kills_the_worker_mid_run_the_other_resumes_and_the_email_goes_out_once(
    scratch_database: str,
) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        DEMO,
        cwd=REPO,
        env=demo_env(DATABASE_URL=scratch_database),
        capture_output=True,
        text=True,
        timeout=180,
    )
    elapsed = time.monotonic() - started
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert elapsed < 90, f"the demo took {elapsed:.1f} s\n{out}"

    # The first claim, the kill of exactly that worker after step 3, the other worker's resume.
    first = re.search(r"CLAIMED by (worker-[ab]) \(pid (\d+)\), attempt 1", out)
    assert first, out
    victim, victim_pid = first.group(1), int(first.group(2))
    survivor = "worker-b" if victim == "worker-a" else "worker-a"
    kill = re.search(
        rf"KILL: step (\d+) is committed: SIGKILL {victim} \(pid {victim_pid}\), which holds the run", out
    )
    assert kill and int(kill.group(1)) == 3, out
    assert re.search(r"REQUEUED after attempt 1 of 3: lease expired", out), out
    assert re.search(rf"CLAIMED by {survivor} \(pid \d+\), attempt 2", out), out
    resume = re.search(
        rf"RESUME: {survivor} rebuilt the request from conversation_history: steps 1\.\.(\d+)", out
    )
    assert resume, out
    k = int(resume.group(1))
    assert k >= 3, out
    assert (
        out.index("KILL:") < out.index("REQUEUED") < out.index("RESUME:") < out.index("COMPLETE: completed")
    )

    # Exactly once: the tools' own execution log, and no model turn asked twice.
    assert "effect count of send_email (non-idempotent): 1" in out, out
    assert re.search(r"send_email\s+non_idempotent\s+1\b", out), out
    assert re.search(r"model calls: 6 for 6 committed model turns \(none repeated\)", out), out

    # The step log read back: 12 steps, 1..k by attempt 1 and the rest by attempt 2, each model turn
    # with its request id.
    steps = re.findall(r"^\s+(\d+)\s+(model_turn|tool_result)\s+(\d)\s+(req_\S+)?", out, re.M)
    assert [int(s[0]) for s in steps] == list(range(1, 13)), out
    assert [int(s[2]) for s in steps] == [1] * k + [2] * (12 - k), out
    assert all(s[3] for s in steps if s[1] == "model_turn"), out
    assert re.search(r"run_claimed\s+2\b", out) and re.search(r"complete\s+1\b", out), out

    # Each line of an attempt's events says whose it is: those of the killed attempt printed after
    # the KILL line (the tail catching up) read as attempt 1's, not as work after the kill.
    attempt_lines = [ln for ln in out.splitlines() if re.search(r"tool call \w+ \[|step \d+ committed: ", ln)]
    assert attempt_lines and all(re.search(r"worker-[ab] #[12]: ", ln) for ln in attempt_lines), out
    after_kill = out[out.index("KILL:") : out.index("REQUEUED")]
    assert f"{victim} #2" not in after_kill and f"{survivor} #" not in after_kill, out
    assert f"lines labelled {victim} #1 below were journaled before the kill" in out, out

    # Everything it started is gone: the killed worker, and the one it stopped.
    assert f"{victim}: killed by the demo (SIGKILL)" in out, out
    assert f"{survivor}: stopped (SIGTERM, exit 0)" in out, out
    assert "fake model stopped" in out, out
    for pid in map(int, re.findall(r"worker-[ab] up \(pid (\d+)\)", out)):
        assert not alive(pid), pid


def _sigint_as_a_terminal_sends_it() -> None:
    # A background job of a non-interactive shell (`make test &` in a script) inherits SIGINT
    # ignored, and Python keeps it ignored: the demo would never see the Ctrl-C this test sends.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def started_until_claimed(marker: str = "CLAIMED by") -> tuple[subprocess.Popen[str], str]:
    """The demo on its own cluster, slowed down, and what it printed up to its run's first claim
    (or to the first line with `marker`)."""
    proc = subprocess.Popen(
        [*DEMO, "--delta-delay", "0.2"],
        cwd=REPO,
        env=demo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_sigint_as_a_terminal_sends_it,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        lines.append(line)
        if marker in line or time.monotonic() > deadline:
            break
    out = "".join(lines)
    assert marker in out, out
    return proc, out


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_mid_run_shuts_down_the_workers_the_fake_model_and_the_cluster(
    sig: signal.Signals, code: int
) -> None:
    """A SIGTERM exited 130, the Ctrl-C code (the audit): it is 128 + the signal, as a shell says."""
    proc, out = started_until_claimed()
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=60)
    out += rest
    assert proc.returncode == code, out
    assert f"interrupted ({sig.name})" in out, out
    assert "INTERRUPTED: demo took" in out, out
    assert not demo_folder(out).exists(), out

    root = re.search(r"cluster up in (\S+)", out)
    assert root, out
    assert not Path(root.group(1)).exists(), out
    assert "PostgreSQL cluster stopped and its folder removed" in out
    assert "fake model stopped" in out
    pids = [int(p) for p in re.findall(r"worker-[ab] up \(pid (\d+)\)", out)]
    assert len(pids) == 2, out
    for pid in pids:
        assert not alive(pid), pid
    # Drained, the run in flight released: each worker ended on its own, not by the signal.
    assert re.findall(r"(worker-[ab]): stopped \(SIGTERM, exit 0\)", out) == ["worker-a", "worker-b"], out
    postmasters = subprocess.run(["pgrep", "-f", root.group(1)], capture_output=True, text=True).stdout
    assert not postmasters.strip(), postmasters


def test_stopped_while_its_workers_start_the_workers_still_drain_and_exit_0() -> None:
    """A SIGTERM to the demo just after it started its workers: they were still importing, had no
    handler yet, and died by the demo's SIGTERM: `worker-a: stopped (SIGTERM, exit -15)` (the
    audit). Each must end on its own, exit 0, having claimed nothing."""
    proc, out = started_until_claimed("worker-b starting (pid")
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    out += rest
    assert proc.returncode == 143, out
    assert "interrupted (SIGTERM)" in out and "CLAIMED by" not in out, out
    assert re.findall(r"(worker-[ab]): stopped \(SIGTERM, exit 0\)", out) == ["worker-a", "worker-b"], out
    pids = [int(p) for p in re.findall(r"worker-[ab] starting \(pid (\d+)\)", out)]
    assert len(pids) == 2 and not any(map(alive, pids)), out
    root = re.search(r"cluster up in (\S+)", out)
    assert root and not Path(root.group(1)).exists(), out


def demo_folder(out: str) -> Path:
    found = re.search(r"worker logs: (\S+)/worker-\*\.log", out)
    assert found, out
    return Path(found.group(1))


def test_a_sigkilled_demo_leaves_no_folder_cluster_or_worker() -> None:
    """SIGKILL reaches no `finally`: the cluster's own reaper removed the cluster, but the demo's
    temp folder (/tmp/runrow-demo-*: worker logs, workspace) stayed behind (the audit)."""
    proc, out = started_until_claimed()
    folder, cluster = demo_folder(out), Path(re.findall(r"cluster up in (\S+)", out)[0])
    assert folder.is_dir() and cluster.is_dir(), out
    proc.kill()
    proc.communicate(timeout=30)
    pids = [int(p) for p in re.findall(r"worker-[ab] up \(pid (\d+)\)", out)]
    gone = time.monotonic() + 60  # the workers drain (up to 5 s) before the folder goes
    while (folder.exists() or cluster.exists() or any(map(alive, pids))) and time.monotonic() < gone:
        time.sleep(0.1)
    assert not folder.exists(), sorted(p.name for p in folder.rglob("*"))
    assert not cluster.exists()
    assert not any(map(alive, pids)), pids


def test_help_says_what_the_demo_shows() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pyworker", "demo", "--help"],
        cwd=REPO,
        env=demo_env(),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    for needle in ("sigkill", "resume", "send_email", "exactly once", "--delta-delay", "ctrl-c"):
        assert needle in out.lower(), (needle, out)


def test_with_an_api_key_the_workers_call_the_configured_messages_api_with_the_real_model_name(
    scratch_database: str,
) -> None:
    """The ANTHROPIC_API_KEY path (no in-process fake): the workers get the key and base URL from the
    environment, the run pins claude-sonnet-4-5 and asks for thinking. A fake server stands in for the
    real API; no kill, to keep it short."""
    from pyworker.fake.server import FakeModel

    with FakeModel("demo", api_key="sk-demo-test") as fake:
        proc = subprocess.run(
            [sys.executable, "-m", "pyworker", "demo", "--kill-after-step", "0"],
            cwd=REPO,
            env=demo_env(
                DATABASE_URL=scratch_database,
                ANTHROPIC_API_KEY="sk-demo-test",
                ANTHROPIC_BASE_URL=fake.base_url,
            ),
            capture_output=True,
            text=True,
            timeout=180,
        )
        requests = [r for r in fake.requests if r.path.startswith("/v1/messages")]
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert f"ANTHROPIC_API_KEY is set: {fake.base_url}, model claude-sonnet-4-5" in out, out
    assert "KILL:" not in out and "effect count of send_email (non-idempotent): 1" in out, out
    assert len(requests) == 6 and all(r.status == 200 for r in requests), [r.status for r in requests]
    for r in requests:
        assert r.body["model"] == "claude-sonnet-4-5"
        assert r.body["thinking"]["type"] == "enabled"
        assert [t["name"] for t in r.body["tools"]] == ["list_files", "read_file", "send_email", "write_file"]


def test_the_demo_tools_are_the_tools_the_fake_demo_scenario_calls() -> None:
    """The definitions pinned on the demo's run equal the fake scenario's DEMO_TOOLS. In a fresh
    process, as `runrow demo` imports the module."""
    check = (
        "from pyworker.demo import tools as demo_tools; "
        "from pyworker.fake import scenarios as fake_scenarios; "
        "assert demo_tools.definitions() == list(fake_scenarios.DEMO_TOOLS), demo_tools.definitions(); "
        "assert demo_tools.effects()['send_email'] == 'non_idempotent'"
    )
    proc = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
