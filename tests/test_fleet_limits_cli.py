"""`runrow limits`, `runrow budget` and the fleet lines of `runrow status`, as real processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import psycopg
import pytest
from tail_support import private_database_url
from test_cli import runrow

from pyworker.worker.backoff import retry_in

__all__ = ["private_database_url"]


def test_limits_set_show_remove(private_database_url: str) -> None:
    url = private_database_url
    done = runrow(url, "limits", "set", "cli-key", "--rpm", "50", "--output-tpm", "8000")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "rate limit of cli-key set"
    shown = runrow(url, "limits", "show")
    assert shown.returncode == 0, shown.stderr
    line = next(ln for ln in shown.stdout.splitlines() if ln.startswith("cli-key"))
    assert line.split()[:3] == ["cli-key", "50", "8000"]  # rpm, output tpm (input unlimited: empty)
    assert "blocks:" in shown.stdout and "runs in backoff:" in shown.stdout
    assert runrow(url, "limits", "remove", "cli-key").returncode == 0
    again = runrow(url, "limits", "remove", "cli-key")
    assert again.returncode == 2
    assert 'rate_limit_key "cli-key" has no rate limit to remove' in again.stderr
    assert "Traceback" not in again.stderr


def _row(stdout: str, key: str) -> dict[str, str]:
    """The row of `key` in the table a command printed, by its header's names."""
    lines = stdout.splitlines()
    names = next(ln for ln in lines if ln.split()[:1] in (["rate_limit_key"], ["fairness_key"]))
    dashes = lines[lines.index(names) + 1]
    spans = [m.span() for m in re.finditer("-+", dashes)]
    row = next(ln for ln in lines if ln.startswith(f"{key} "))
    return {n: row[a:b].strip() for n, (a, b) in zip(names.split(), spans, strict=True)}


def test_an_option_left_out_keeps_the_current_value(private_database_url: str) -> None:
    """The SQL setters take every value, NULL being "not limited", and the CLI passed NULL for an
    option not given: `budget tenant acme --cost-per-day 30` after `--tokens-per-day 2000000
    --cost-per-day 25` lifted acme's token budget without a word; `limits set` the same."""
    url = private_database_url
    assert (
        runrow(
            url, "budget", "tenant", "kept", "--tokens-per-day", "2000000", "--cost-per-day", "25"
        ).returncode
        == 0
    )
    done = runrow(url, "budget", "tenant", "kept", "--cost-per-day", "30")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "budget of tenant kept set"
    assert _row(runrow(url, "budget", "show").stdout, "kept")["tokens_per_day"] == "2000000"
    assert _row(done.stdout, "kept") == {
        "fairness_key": "kept",
        "tokens_per_day": "2000000",
        "cost_per_day": "30",
    }
    assert runrow(url, "limits", "set", "kept-key", "--rpm", "50", "--input-tpm", "30000").returncode == 0
    done = runrow(url, "limits", "set", "kept-key", "--output-tpm", "8000")
    assert done.returncode == 0, done.stderr
    assert _row(done.stdout, "kept-key") == {
        "rate_limit_key": "kept-key",
        "requests_per_minute": "50",
        "input_tokens_per_minute": "30000",
        "output_tokens_per_minute": "8000",
    }
    for command in (["budget", "tenant"], ["limits", "set"]):
        helped = runrow(None, *command, "--help")
        assert "left out keeps" in " ".join(helped.stdout.split()), helped.stdout


def _run_while_a_session_holds(url: str, change: str, command: list[str], waits_on: str) -> str:
    """Run `runrow *command` while a real second session holds `change` uncommitted (its row
    locked); once the command waits for a lock (its query naming `waits_on`), commit the change
    and return the command's stdout."""
    with psycopg.connect(url) as holder:
        holder.execute(change)
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"DATABASE_URL": url}
        process = subprocess.Popen(
            [sys.executable, "-m", "pyworker", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            with psycopg.connect(url, autocommit=True) as watcher:
                deadline = time.monotonic() + 30
                while not watcher.execute(
                    "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND query LIKE %s)",
                    (f"%{waits_on}%",),
                ).fetchone()[0]:  # type: ignore[index]
                    assert process.poll() is None, process.communicate()
                    assert time.monotonic() < deadline, "the command never waited for the row"
                    time.sleep(0.05)
            holder.commit()
            out, err = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0, err
    return out


def test_budget_tenant_keeps_a_budget_changed_while_it_waits(private_database_url: str) -> None:
    """`budget tenant race --cost-per-day 30` read the tenant's tokens_per_day, then set both: a
    change of tokens_per_day committed between the read and the write was overwritten with the
    value read. update_tenant_budget keeps what is not given in SQL, under the row's lock. A
    real second session holds its change uncommitted while the command runs."""
    url = private_database_url
    assert (
        runrow(url, "budget", "tenant", "race", "--tokens-per-day", "1000", "--cost-per-day", "25").returncode
        == 0
    )
    out = _run_while_a_session_holds(
        url,
        "SELECT runrow.set_tenant_budget('race', 5000, 25)",
        ["budget", "tenant", "race", "--cost-per-day", "30"],
        "tenant_budget",
    )
    assert _row(out, "race") == {"fairness_key": "race", "tokens_per_day": "5000", "cost_per_day": "30"}


def test_limits_set_keeps_a_limit_changed_while_it_waits(private_database_url: str) -> None:
    """`limits set race-key --rpm 80` read the key's token limits from the view, then set all
    three: a change of input_tokens_per_minute committed between the read and the write was
    overwritten with the value read (before update_rate_limit: input 30000 again, not 50000).
    update_rate_limit keeps what is not given in SQL, under the key's row lock."""
    url = private_database_url
    assert runrow(url, "limits", "set", "race-key", "--rpm", "50", "--input-tpm", "30000").returncode == 0
    out = _run_while_a_session_holds(
        url,
        "SELECT runrow.set_rate_limit('race-key', 50, 50000, NULL)",
        ["limits", "set", "race-key", "--rpm", "80"],
        "rate_limit",
    )
    assert _row(out, "race-key") == {
        "rate_limit_key": "race-key",
        "requests_per_minute": "80",
        "input_tokens_per_minute": "50000",
        "output_tokens_per_minute": "",
    }


def test_bad_values_are_one_line_errors_and_change_nothing(private_database_url: str) -> None:
    url = private_database_url
    bad = runrow(url, "limits", "set", "cli-bad", "--rpm", "-5")
    assert bad.returncode == 2
    assert "--rpm must be a finite number more than 0, got -5" in bad.stderr
    assert "Traceback" not in bad.stderr
    with psycopg.connect(url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM runrow.rate_limits WHERE rate_limit_key = 'cli-bad'"
        ).fetchone() == (0,)
    price = runrow(
        url,
        "budget",
        "price",
        "m",
        "--input",
        "-1",
        "--output",
        "1",
        "--cache-write",
        "1",
        "--cache-read",
        "1",
    )
    assert price.returncode == 2 and "--input must be a finite number, 0 or more" in price.stderr
    nothing = runrow(url, "budget", "tenant", "acme")
    assert nothing.returncode == 2 and "--tokens-per-day or --cost-per-day" in nothing.stderr


PRICE_BUT_CACHE_READ = ["budget", "price", "opt-m", "--input", "1", "--output", "1", "--cache-write", "1"]


@pytest.mark.parametrize(
    ("args", "option", "argument"),
    [
        (["limits", "set", "opt-key", "--rpm", "0"], "--rpm", "requests_per_minute"),
        (
            ["limits", "set", "opt-key", "--rpm", "5", "--input-tpm", "-1"],
            "--input-tpm",
            "input_tokens_per_minute",
        ),
        (["limits", "set", "opt-key", "--output-tpm", "0"], "--output-tpm", "output_tokens_per_minute"),
        (["budget", "tenant", "opt-t", "--tokens-per-day", "0"], "--tokens-per-day", "tokens_per_day"),
        (["budget", "tenant", "opt-t", "--cost-per-day", "-1"], "--cost-per-day", "cost_per_day"),
        (
            [*PRICE_BUT_CACHE_READ, "--cache-read", "-1"],
            "--cache-read",
            "cache_read_per_mtok",
        ),
        (["enqueue", "hi", "--token-budget", "0"], "--token-budget", "token_budget"),
        (["enqueue", "hi", "--cost-budget", "-1"], "--cost-budget", "cost_budget"),
        (["enqueue", "hi", "--fairness-key", ""], "--fairness-key", "fairness_key"),
        # Positionals by their metavar (the review of stop 59: `budget tenant ""` said fairness_key).
        (["budget", "tenant", "", "--cost-per-day", "5"], "TENANT", "fairness_key"),
        (["budget", "remove-tenant", ""], "TENANT", "fairness_key"),
        (["fairness", "weight", "", "2"], "TENANT", "fairness_key"),
        (["limits", "set", "", "--rpm", "5"], "KEY", "rate_limit_key"),
    ],
)
def test_errors_name_the_option_not_the_sql_argument(
    private_database_url: str, args: list[str], option: str, argument: str
) -> None:
    """The SQL function's 22023 names its argument (`requests_per_minute must be ...`), which the
    user never typed: the CLI says the option instead, keeping the SQLSTATE's meaning."""
    done = runrow(private_database_url, *args)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert line.startswith(f"runrow: invalid argument: {option} must "), line
    # NULL is SQL's word for an option left out: no command line can type it.
    assert argument not in line and "\n" not in line and "NULL" not in line


@pytest.mark.parametrize("amount", ["1e400", "-1e400", "1e15", "1e-400", "0.0000000000000001", "inf", "nan"])
@pytest.mark.parametrize(
    "args",
    [
        ["budget", "tenant", "usd-t", "--cost-per-day"],
        [*PRICE_BUT_CACHE_READ, "--cache-read", "1", "--input"],
        [*PRICE_BUT_CACHE_READ, "--cache-read", "1", "--web-search"],
        ["enqueue", "hi", "--cost-budget"],
    ],
    ids=["cost-per-day", "input", "web-search", "cost-budget"],
)
def test_amounts_past_what_money_needs_are_refused_naming_the_option(
    private_database_url: str, args: list[str], amount: str
) -> None:
    """Decimal reads 1e400 and 1e-400 exactly and the numeric SQL arguments stored them: a budget
    of 1e400 USD was set (a 400-digit column in `budget show`), 1e200000 was a database error
    naming nothing. The CLI refuses an amount past 10^15 USD or finer than 15 decimal places (and
    inf, nan) as a usage error naming the option, before connecting."""
    done = runrow(private_database_url, *args[:-1], f"{args[-1]}={amount}")
    assert done.returncode == 2, done.stdout
    error = done.stderr.strip().splitlines()[-1]
    assert f"argument {args[-1]}: " in error and repr(amount) in error, error
    with psycopg.connect(private_database_url) as conn:
        written = conn.execute(
            "SELECT (SELECT count(*) FROM runrow.tenant_budgets WHERE fairness_key = 'usd-t')"
            " + (SELECT count(*) FROM runrow.model_prices WHERE model = 'opt-m')"
            " + (SELECT count(*) FROM runrow.agent_run WHERE cost_budget IS NOT NULL)"
        ).fetchone()
    assert written == (0,)


def test_budget_and_status(private_database_url: str) -> None:
    url = private_database_url
    assert runrow(url, "budget", "tenant", "acme", "--tokens-per-day", "1000").returncode == 0
    args = [
        "budget",
        "price",
        "claude-x",
        "--input",
        "3",
        "--output",
        "15",
        "--cache-write",
        "3.75",
        "--cache-read",
        "0.3",
    ]
    assert runrow(url, *args).returncode == 0
    assert runrow(url, *args[:2], "claude-1h", *args[3:], "--cache-write-1h", "7.5").returncode == 0
    web = ["--web-search", "0.02", "--web-fetch", "0.001"]
    searching = runrow(url, *args[:2], "claude-web", *args[3:], *web)
    assert searching.returncode == 0, searching.stderr
    refused = runrow(url, *args[:2], "claude-web", *args[3:], "--web-search", "-1")
    assert refused.returncode == 2 and "--web-search must be" in refused.stderr, refused.stderr
    shown = runrow(url, "budget", "show")
    assert shown.returncode == 0, shown.stderr
    assert any(ln.startswith("acme") and "1000" in ln for ln in shown.stdout.splitlines())
    # The 1-hour cache write price: 2 x input by default, or as given; then the server tools' prices
    # per request, by default the documented ones (web search 0.01, web fetch 0), or as given.
    prices = {ln.split()[0]: ln.split()[-3:] for ln in shown.stdout.splitlines() if ln.startswith("claude-")}
    assert prices["claude-x"] == ["6", "0.01", "0"], prices
    assert prices["claude-1h"] == ["7.5", "0.01", "0"], prices
    assert prices["claude-web"] == ["6", "0.02", "0.001"], prices
    status = runrow(url, "status")
    assert status.returncode == 0, status.stderr
    for name in ("rate_limit_keys_blocked", "runs_in_backoff", "tenants_over_budget"):
        assert name in status.stdout
    for command in ("limits", "budget"):
        helped = runrow(None, command, "--help")
        assert helped.returncode == 0 and "examples:" in helped.stdout


def test_backoff_is_exponential_with_jitter_and_honours_retry_after() -> None:
    assert [retry_in(n, rng=lambda: 0.0) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert [retry_in(n, rng=lambda: 1.0) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert retry_in(30, rng=lambda: 1.0) == 300.0  # capped
    assert retry_in(1, 12.0, rng=lambda: 0.0) == 12.0  # the API's retry-after wins
    assert retry_in(1, 12.0, rng=lambda: 1.0) == 12.0 * 1.1
    assert retry_in(1, 10**9) == 86400.0  # release_run's limit


def test_status_counts_what_it_does_not_list(private_database_url: str) -> None:
    """runrow status read up to 100,000 rows of runs_in_backoff to count them, and listed at most
    100 blocked keys or tenants over budget without saying there were more. It now counts in
    queue_metrics, names at most 10 and says how many more."""
    url = private_database_url
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(12):
            conn.execute("SELECT runrow.set_tenant_budget(%s, 1, NULL)", (f"over-{i:02}",))
            conn.execute(
                "INSERT INTO runrow.spend_hour (fairness_key, hour, model, tokens)"
                " VALUES (%s, date_trunc('hour', now()), 'm', 5)",
                (f"over-{i:02}",),
            )
        for _ in range(3):
            conn.execute("SELECT runrow.enqueue_run(gen_random_uuid(), '\"x\"', 'm', start_in => '1 hour')")
        over, not_due = conn.execute(
            "SELECT count(*), (SELECT count(*) FROM runrow.runs_in_backoff) FROM runrow.tenants_over_budget"
        ).fetchone()
    status = runrow(url, "status")
    assert status.returncode == 0, status.stderr
    lines = {ln.split()[0]: ln for ln in status.stdout.splitlines() if ln.strip()}
    tenants = lines["tenants_over_budget"]
    assert tenants.count("over-") == 10 and tenants.endswith(f"(+{over - 10} more)"), tenants
    assert lines["runs_in_backoff"].split()[-1] == str(not_due) and not_due >= 3
