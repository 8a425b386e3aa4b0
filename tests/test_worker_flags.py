"""`runrow worker` refuses numeric flags that cannot work, before it starts: an argparse usage
error (exit 2) naming the flag and its range, never a traceback, a worker whose every reaper
pass fails, or a hot loop. The ranges are the SQL functions' own (claim_runs' max_runs, the
lease of claim and heartbeat, reap_expired_runs' grace_seconds). Worker() checks the same."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys

import pytest

from pyworker.cli.main import build_parser, webhook_settings
from pyworker.worker.echo import handle as echo
from pyworker.worker.process import Worker
from pyworker.worker.webhooks import WebhookSettings

# Nothing listens there: a flag that slips through makes the worker try to connect (and the
# subprocess time out) instead of ending in a usage error.
UNREACHABLE = "postgresql://127.0.0.1:1/runrow?connect_timeout=1"

REFUSED = [
    ("--concurrency", "0", "1 to 1000"),
    ("--concurrency", "1001", "1 to 1000"),
    ("--lease", "0", "1 to 3600"),
    ("--lease", "3601", "1 to 3600"),
    ("--grace", "-5", "0 to 86400"),
    ("--grace", "86401", "0 to 86400"),
    ("--poll", "0", "0.1 to 86400"),
    ("--poll", "nan", "0.1 to 86400"),
    ("--reap-interval", "0", "0.1 to 86400"),
    ("--reap-interval", "inf", "0.1 to 86400"),
    ("--drain", "-1", "0 to 86400"),
    ("--trim-after", "-1", "0 to 876000"),
    ("--pool-size", "0", "1 to 1000"),
    ("--pool-size", "1001", "1 to 1000"),
    ("--max-model-calls", "0", "1 to 100000"),
    ("--max-model-calls", "1.5", "1 to 100000"),
]


def runrow_worker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pyworker", "worker", "--handler", "pyworker.worker.echo:handle", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "DATABASE_URL": UNREACHABLE, **(env or {})},
        timeout=20,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )


@pytest.mark.parametrize(("flag", "value", "range_"), REFUSED, ids=[f"{f}={v}" for f, v, _ in REFUSED])
def test_out_of_range_flag_is_a_usage_error_naming_flag_and_range(flag: str, value: str, range_: str) -> None:
    result = runrow_worker(flag, value)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "usage: runrow worker" in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert flag in error and range_ in error and value in error, error


def test_bad_concurrency_from_the_environment_is_a_usage_error() -> None:
    result = runrow_worker(env={"RUNROW_CONCURRENCY": "0"})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "--concurrency" in result.stderr and "1 to 1000" in result.stderr
    # The variable the user set is named, not only the flag they did not type.
    assert result.stderr.rstrip().endswith("got '0' (from $RUNROW_CONCURRENCY)"), result.stderr
    # A value typed as the flag is the flag's, even with the variable set (to a good value).
    typed = runrow_worker("--concurrency", "0", env={"RUNROW_CONCURRENCY": "4"})
    assert typed.returncode == 2 and typed.stderr.rstrip().endswith("got '0'"), typed.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--concurrency", "1", "--lease", "1", "--grace", "0", "--poll", "0.1", "--reap-interval", "0.1"],
        ["--concurrency", "1000", "--lease", "3600", "--grace", "86400", "--poll", "86400"],
        ["--drain", "0", "--trim-after", "0", "--pool-size", "1", "--max-model-calls", "1"],
        [
            *["--drain", "86400", "--trim-after", "876000", "--reap-interval", "86400"],
            *["--pool-size", "1000", "--max-model-calls", "100000"],
        ],
    ],
    ids=["lower-bounds", "upper-bounds", "zero-drain-and-never-trim", "upper-drain-and-trim"],
)
def test_flags_at_the_ends_of_their_ranges_are_accepted(args: list[str]) -> None:
    parsed = build_parser().parse_args(["worker", *args])
    assert parsed.func.__name__ == "cmd_worker"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("concurrency", 0),
        ("lease_seconds", 3601),
        ("grace_seconds", -5),
        ("poll_seconds", 0.0),
        ("reap_interval", 0.0),
        ("drain_seconds", -1.0),
        ("trim_after", -1.0),
        ("flush_interval", 0.0),
        ("pool_size", 0),
    ],
)
def test_worker_refuses_the_same_values(option: str, value: float) -> None:
    with pytest.raises(ValueError, match=option):
        Worker(UNREACHABLE, handler=echo, **{option: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, 100_001, 2.5, True, "100"])
def test_worker_refuses_a_max_model_calls_that_cannot_work(value: object) -> None:
    """The agent loop's cap comes in the handler config: checked when the worker is made, not
    at the first model call of every run."""
    with pytest.raises(ValueError, match="max_model_calls must be an integer from 1 to 100000"):
        Worker(UNREACHABLE, handler=echo, config={"max_model_calls": value})


@pytest.mark.parametrize("name", ["key_error_first_block", "key_error_max_block"])
@pytest.mark.parametrize("value", [0, 86401, float("nan"), "5", True])
def test_worker_refuses_a_key_error_block_report_key_error_would_refuse(name: str, value: object) -> None:
    """report_key_error refuses a block outside 0.001..86400 (22023): read at every key error,
    such a value made each one "handler raised", spending an attempt (the review of stop 56)."""
    with pytest.raises(ValueError, match=f"{name} must be a number from 0.001 to 86400"):
        Worker(UNREACHABLE, handler=echo, config={name: value})


@pytest.mark.parametrize("value", [599, 604801, float("nan"), "3600", True])
def test_worker_refuses_a_key_error_give_up_report_key_error_would_refuse(value: object) -> None:
    """report_key_error's give_up_after_seconds is 600..604800 (22023 otherwise, migration 0110)."""
    with pytest.raises(ValueError, match="key_error_give_up must be a number from 600 to 604800"):
        Worker(UNREACHABLE, handler=echo, config={"key_error_give_up": value})


def test_max_model_calls_from_the_flag_its_variable_or_the_default() -> None:
    """The agent loop's cap: 100 unless the flag or RUNROW_MAX_MODEL_CALLS says otherwise."""
    parser = build_parser()
    assert parser.parse_args(["worker"]).max_model_calls == 100
    assert parser.parse_args(["worker", "--max-model-calls", "7"]).max_model_calls == 7
    result = runrow_worker(env={"RUNROW_MAX_MODEL_CALLS": "0"})
    assert result.returncode == 2 and "got '0' (from $RUNROW_MAX_MODEL_CALLS)" in result.stderr, result.stderr


def test_webhook_per_receiver_from_the_flag_its_variable_or_the_default() -> None:
    """The cap on deliveries in flight to one receiver: 4 unless the flag or
    RUNROW_WEBHOOK_PER_RECEIVER says otherwise, and what the worker's settings get."""
    parser = build_parser()
    assert webhook_settings(parser.parse_args(["worker", "--webhook-secret", "s"])).per_receiver == 4  # type: ignore[union-attr]
    args = parser.parse_args(["worker", "--webhook-secret", "s", "--webhook-per-receiver", "7"])
    assert webhook_settings(args).per_receiver == 7  # type: ignore[union-attr]
    result = runrow_worker(env={"RUNROW_WEBHOOK_PER_RECEIVER": "0"})
    assert result.returncode == 2, result.stderr
    assert "got '0' (from $RUNROW_WEBHOOK_PER_RECEIVER)" in result.stderr, result.stderr


def test_webhook_signing_and_previous_secret_from_the_flags_or_their_variables() -> None:
    """--webhook-signing (fleet unless told: what receivers verified before) and
    --webhook-previous-secret reach the sender's settings. A bad mode from the variable names it;
    a previous secret with no current one (the worker would deliver nothing) or the current one
    again (nothing rotated) stops the worker naming both flags and quoting neither secret."""
    parser = build_parser()
    base = ["worker", "--webhook-secret", "s"]
    settings = webhook_settings(parser.parse_args(base))
    assert settings is not None and (settings.signing, settings.previous_secret) == ("fleet", None)
    args = parser.parse_args([*base, "--webhook-signing", "both", "--webhook-previous-secret", "old"])
    settings = webhook_settings(args)
    assert settings is not None and (settings.signing, settings.previous_secret) == ("both", "old")
    result = runrow_worker("--webhook-signing", "users")
    assert result.returncode == 2, result.stderr
    assert "argument --webhook-signing: must be one of fleet, user, both, got 'users'" in result.stderr
    result = runrow_worker(env={"RUNROW_WEBHOOK_SIGNING": "users"})
    assert result.returncode == 2, result.stderr
    assert "--webhook-signing" in result.stderr, result.stderr
    assert "got 'users' (from $RUNROW_WEBHOOK_SIGNING)" in result.stderr, result.stderr
    for env in (
        {"RUNROW_WEBHOOK_PREVIOUS_SECRET": "old-secret-1"},
        {"RUNROW_WEBHOOK_SECRET": "old-secret-1", "RUNROW_WEBHOOK_PREVIOUS_SECRET": "old-secret-1"},
    ):
        result = runrow_worker(env=env)
        assert result.returncode == 2, result.stderr
        assert "--webhook-previous-secret" in result.stderr and "--webhook-secret" in result.stderr
        assert "old-secret-1" not in result.stderr and "Traceback" not in result.stderr, result.stderr


def _model_env(**given: str) -> dict[str, str]:
    """The environment with the Anthropic variables `given` and no others."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}, **given}


def _start_log(*flags: str, env: dict[str, str] | None = None) -> str:
    """What `runrow worker` logs before it connects (to a database that never answers)."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "pyworker", "worker", *flags],
        stderr=subprocess.PIPE,
        text=True,
        env={**(env or _model_env(ANTHROPIC_API_KEY="test-key")), "DATABASE_URL": UNREACHABLE},
    )
    assert worker.stderr is not None
    seen: list[str] = []
    try:
        for line in worker.stderr:  # the warning comes before this line
            seen.append(line)
            if "connecting to 127.0.0.1:1" in line:
                break
    finally:
        worker.terminate()  # stops at once before the database answers
        worker.communicate(timeout=30)
    return "".join(seen)


def test_pool_size_reaches_the_worker_and_concurrency_beyond_it_is_warned_of() -> None:
    """The work pool had no flag: `min(concurrency + 4, 32)` whatever the handlers needed, and a
    worker with more runs in flight than connections said nothing of the runs left waiting."""
    assert build_parser().parse_args(["worker", "--pool-size", "7"]).pool_size == 7
    assert build_parser().parse_args(["worker"]).pool_size is None  # Worker's default
    log = _start_log("--concurrency", "20", "--pool-size", "10")
    assert "WARNING" in log and "concurrency 20 exceeds the pool's 10 connections" in log, log


def test_the_default_pool_is_not_warned_of_at_any_concurrency() -> None:
    """Every `--concurrency 40` start warned "exceeds the pool's 32 connections … raise
    --pool-size": a false alarm for the default agent loop, which holds a connection only briefly
    (heartbeats have their own pool). Only a --pool-size the operator chose is warned of."""
    log = _start_log("--concurrency", "40")
    assert "connecting to 127.0.0.1:1" in log, log
    assert "exceeds the pool" not in log, log


def test_log_level_after_the_command_is_the_workers() -> None:
    """`runrow worker --log-level DEBUG` was "unrecognized arguments": the global options worked
    only before the command."""
    log = _start_log("--handler", "pyworker.worker.echo:handle", "--log-level", "DEBUG")
    assert any(" DEBUG " in line for line in log.splitlines()), log
    quiet = _start_log(
        "--log-level", "DEBUG", "--handler", "pyworker.worker.echo:handle", "--log-level", "INFO"
    )
    assert "connecting to 127.0.0.1:1" in quiet and " DEBUG " not in quiet, quiet


NO_MODEL = "neither ANTHROPIC_API_KEY nor ANTHROPIC_BASE_URL is set"


@pytest.mark.parametrize(
    ("handler", "env", "starts"),
    [
        ([], {}, False),
        (["--handler", "pyworker.agent:handle"], {"ANTHROPIC_AUTH_TOKEN": "t"}, False),
        ([], {"ANTHROPIC_API_KEY": ""}, False),
        ([], {"ANTHROPIC_API_KEY": "k"}, True),
        ([], {"ANTHROPIC_BASE_URL": "http://127.0.0.1:1"}, True),  # a gateway, or `runrow fake-model`
        (["--handler", "pyworker.worker.echo:handle"], {}, True),
    ],
    ids=["default", "auth-token", "empty-key", "key", "base-url", "echo"],
)
def test_the_agent_worker_does_not_start_without_a_model_to_call(
    handler: list[str], env: dict[str, str], starts: bool
) -> None:
    """With neither ANTHROPIC_API_KEY nor ANTHROPIC_BASE_URL the agent loop's client called
    api.anthropic.com without a key: the worker started, claimed, and failed every run ("model
    API unreachable: Connection to api.anthropic.com failed"). A handler of one's own is not
    asked. ANTHROPIC_AUTH_TOKEN is not read by the worker's client (it sends the API key only)."""
    if starts:
        log = _start_log(*handler, env=_model_env(**env))
        assert "connecting to 127.0.0.1:1" in log and NO_MODEL not in log, log
        return
    done = subprocess.run(
        [sys.executable, "-m", "pyworker", "worker", *handler],
        capture_output=True,
        text=True,
        env={**_model_env(**env), "DATABASE_URL": UNREACHABLE},
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("runrow worker: the agent handler calls the Anthropic Messages API")
        and NO_MODEL in last
    )
    assert ("ANTHROPIC_AUTH_TOKEN is set" in last) == ("ANTHROPIC_AUTH_TOKEN" in env), last


def test_worker_help_lists_the_environment_it_reads() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pyworker", "worker", "--help"], capture_output=True, text=True, check=True
    ).stdout
    block = out[out.index("\nenvironment:\n") :]
    for var in (
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "RUNROW_MAX_RETRIES",
        "DATABASE_URL",
        "OTEL_TRACES_EXPORTER",
    ):
        assert var in block, var


def test_help_shows_defaults_of_values_but_not_of_switches() -> None:
    """`--no-session-limits ... (default: True)` read as if the limits were off by default."""
    worker = build_parser()._subparsers._group_actions[0].choices["worker"]  # type: ignore[union-attr]
    text = " ".join(worker.format_help().split())
    assert "(default: True)" not in text and "(default: False)" not in text
    assert "heartbeats every lease/3 (default: 30)" in text


def test_help_never_shows_a_secret_taken_from_the_environment() -> None:
    """`runrow worker --help` printed "(default: <the secret>)" for RUNROW_WEBHOOK_SECRET and
    RUNROW_WEBHOOK_PREVIOUS_SECRET, and the proxy URL with its password (the review of stop 57)."""
    env = {
        **os.environ,
        "RUNROW_WEBHOOK_SECRET": "SECRET-LEAK",
        "RUNROW_WEBHOOK_PREVIOUS_SECRET": "PREVIOUS-LEAK",
        "RUNROW_WEBHOOK_PROXY": "http://user:PROXY-LEAK@proxy.example:3128",
    }
    out = subprocess.run(
        [sys.executable, "-m", "pyworker", "worker", "--help"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "LEAK" not in out and "--webhook-secret" in out and "--webhook-proxy" in out


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("timeout", 0.0, "webhook_timeout must be a number from 0.1 to 600, got 0.0"),
        ("max_attempts", 0, "webhook_attempts must be an integer from 1 to 100, got 0"),
        ("max_attempts", 2.5, "webhook_attempts must be an integer from 1 to 100, got 2.5"),
        ("backoff_seconds", True, "webhook_backoff must be a number from 0.1 to 3600, got True"),
        ("poll_seconds", float("nan"), "webhook_poll must be a number from 0.1 to 86400, got nan"),
        ("per_receiver", 0, "webhook_per_receiver must be an integer from 1 to 1000, got 0"),
        ("per_receiver", 1001, "webhook_per_receiver must be an integer from 1 to 1000, got 1001"),
        ("signing", "users", "webhook_signing must be one of fleet, user, both, got 'users'"),
        ("previous_secret", "", "webhook previous secret must not be empty (None: no rotation under way)"),
        (
            "allow_networks",
            ["10.0.0.0/8"],
            "webhook allow_networks must be a tuple of ipaddress networks, got ['10.0.0.0/8']",
        ),
        (
            "previous_secret",
            "s",
            "the webhook previous secret is the current secret: in a rotation, the current "
            "secret is the new one",
        ),
    ],
)
def test_webhook_settings_refuse_what_their_flags_refuse(option: str, value: object, message: str) -> None:
    """The webhook sender's settings, given in code rather than by flag, are checked against
    the same ranges (pyworker.worker.settings) with the same message as Worker's."""
    with pytest.raises(ValueError) as refused:
        WebhookSettings(secret="s", **{option: value})  # type: ignore[arg-type]
    assert str(refused.value) == message


def test_the_runrow_script_imports_tools_and_handlers_from_the_folder_it_runs_in(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`runrow worker --tools myapp.tools` beside `myapp/` (the README's own example) could not
    import it: the `runrow` script puts the venv's bin on sys.path, not the working directory,
    as `python -m` does (the README audit). `runrow serve --tools-module` could."""
    app = tmp_path / "myapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "tools.py").write_text(
        "from pyworker.agent.tools import tool\n\n\n"
        "@tool(input_schema={'type': 'object', 'properties': {}}, description='Ping.', effect='pure')\n"
        "def ping(idempotency_key: str) -> str:\n    return 'pong'\n"
    )
    (app / "handler.py").write_text("async def handle(ctx):\n    raise NotImplementedError\n")
    script = os.path.join(os.path.dirname(sys.executable), "runrow")
    worker = subprocess.Popen(
        [script, "worker", "--tools", "myapp.tools", "--handler", "myapp.handler:handle"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DATABASE_URL": UNREACHABLE},
        cwd=tmp_path,
    )
    assert worker.stderr is not None
    seen: list[str] = []
    try:
        # Past the imports it goes on to connect, to a database that is not there; a failed
        # import exits 2 first.
        for line in worker.stderr:
            seen.append(line)
            if "connecting to 127.0.0.1:1" in line:
                break
    finally:
        worker.terminate()  # stops at once before the database answers
        worker.communicate(timeout=30)
    assert any("connecting to 127.0.0.1:1" in line for line in seen), "".join(seen)


def test_allow_private_webhooks_from_the_flag_or_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """RUNROW_ALLOW_PRIVATE_WEBHOOKS, as RUNROW_WEBHOOK_PROXY and the other webhook settings come
    from the environment: a deployment whose receivers are on its own network sets it where it
    sets the rest. A value that is neither on nor off is refused naming the variable, not taken
    as off (every private receiver refused, unsaid)."""
    base = ["worker", "--webhook-secret", "s"]
    for value, allowed in (
        ("1", True),
        ("true", True),
        ("YES", True),
        ("0", False),
        ("off", False),
        ("", False),
    ):
        monkeypatch.setenv("RUNROW_ALLOW_PRIVATE_WEBHOOKS", value)
        settings = webhook_settings(build_parser().parse_args(base))
        flagged = webhook_settings(build_parser().parse_args([*base, "--allow-private-webhooks"]))
        assert settings is not None and settings.allow_private is allowed, value
        assert flagged is not None and flagged.allow_private is True  # the flag wins
    monkeypatch.delenv("RUNROW_ALLOW_PRIVATE_WEBHOOKS")
    settings = webhook_settings(build_parser().parse_args(base))
    assert settings is not None and settings.allow_private is False
    result = runrow_worker(env={"RUNROW_ALLOW_PRIVATE_WEBHOOKS": "enabled"})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "argument --allow-private-webhooks: must be one of" in result.stderr, result.stderr
    assert result.stderr.rstrip().endswith("got 'enabled' (from $RUNROW_ALLOW_PRIVATE_WEBHOOKS)"), (
        result.stderr
    )


SPELLED = (
    "which are allowed by the IPv4 network they reach, never by their IPv6 form: list the IPv4 "
    "network instead"
)
EVERY_ADDRESS = (
    "to let deliveries reach every address, use --allow-private-webhooks "
    "(a worker also reads RUNROW_ALLOW_PRIVATE_WEBHOOKS=1; serve, the flag only)"
)


def test_webhook_allow_network_from_the_flags_or_their_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """--webhook-allow-network, repeatable (and comma-separated), or RUNROW_WEBHOOK_ALLOW_NETWORKS:
    the networks reach the sender's settings, each once; flags replace the variable's list."""
    base = ["worker", "--webhook-secret", "s"]
    ten, fd, docker = (ipaddress.ip_network(n) for n in ("10.96.0.0/12", "fd00:1::/32", "172.17.0.0/16"))
    settings = webhook_settings(build_parser().parse_args(base))
    assert settings is not None and settings.allow_networks == ()
    args = [
        *base,
        "--webhook-allow-network",
        "10.96.0.0/12",
        "--webhook-allow-network",
        "fd00:1::/32,10.96.0.0/12",
    ]
    settings = webhook_settings(build_parser().parse_args(args))
    assert settings is not None and settings.allow_networks == (ten, fd)
    monkeypatch.setenv("RUNROW_WEBHOOK_ALLOW_NETWORKS", "10.96.0.0/12, 172.17.0.0/16")
    from_env = webhook_settings(build_parser().parse_args(base))
    flagged = webhook_settings(build_parser().parse_args([*base, "--webhook-allow-network", "fd00:1::/32"]))
    assert from_env is not None and from_env.allow_networks == (ten, docker)
    assert flagged is not None and flagged.allow_networks == (fd,)
    # The widest networks taken, a /8 and a /16; and the help says the flags replace the list.
    widest_networks = ("10.0.0.0/8", "fd00::/16")
    widest = webhook_settings(
        build_parser().parse_args([*base, "--webhook-allow-network", ",".join(widest_networks)])
    )
    assert widest is not None and widest.allow_networks == tuple(map(ipaddress.ip_network, widest_networks))
    help_text = " ".join(runrow_worker("--help").stdout.split())
    assert "the flags replace its list rather than add to it" in help_text, help_text


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("10.0.0/8", "must be a network in CIDR notation (10.0.0.0/8, fd00:1::/32), got '10.0.0/8'"),
        ("10.1.2.3/8", "10.1.2.3/8 has host bits set: the network is 10.0.0.0/8"),
        ("private", "must be a network in CIDR notation (10.0.0.0/8, fd00:1::/32), got 'private'"),
        ("10.0.0.0/8,", "must be a network in CIDR notation (10.0.0.0/8, fd00:1::/32), got ''"),
        # A catch-all is --allow-private-webhooks said otherwise: pointed to it, not taken silently.
        ("0.0.0.0/0", f"0.0.0.0/0 is wider than a /8: {EVERY_ADDRESS}"),
        ("10.0.0.0/8,0.0.0.0/1", f"0.0.0.0/1 is wider than a /8: {EVERY_ADDRESS}"),
        ("::/0", f"::/0 is wider than a /16: {EVERY_ADDRESS}"),
        ("fc00::/7", f"fc00::/7 is wider than a /16: {EVERY_ADDRESS}"),
        # An IPv6 spelling of IPv4 addresses is judged by the IPv4 it reaches: listed, it would
        # match nothing, silently (a review of stop 62).
        ("::ffff:10.1.0.0/112", f"::ffff:a01:0/112 spells IPv4 addresses in IPv6 (IPv4-mapped), {SPELLED}"),
        ("10.1.0.0/16,2002:a01::/32", f"2002:a01::/32 spells IPv4 addresses in IPv6 (6to4), {SPELLED}"),
        ("64:ff9b::a01:0/112", f"64:ff9b::a01:0/112 spells IPv4 addresses in IPv6 (NAT64), {SPELLED}"),
        ("64:ff9b:1::/48", f"64:ff9b:1::/48 spells IPv4 addresses in IPv6 (local-use NAT64), {SPELLED}"),
    ],
)
def test_a_webhook_allow_network_that_is_no_network_is_a_usage_error(value: str, why: str) -> None:
    result = runrow_worker("--webhook-allow-network", value)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.rstrip().endswith(f"argument --webhook-allow-network: {why}"), result.stderr
    result = runrow_worker(env={"RUNROW_WEBHOOK_ALLOW_NETWORKS": value})
    assert result.returncode == 2, result.stderr
    assert result.stderr.rstrip().endswith(f"{why} (from $RUNROW_WEBHOOK_ALLOW_NETWORKS)"), result.stderr
