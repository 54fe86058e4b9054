"""Every benchmark suite runs at its ``--smoke`` size and writes well-formed records.

Never a speed assertion: only the shape of the output and the correctness counters.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import pytest

import aiopurgatory
from aiopurgatory import Outcome
from bench import allocs, loop_server, steps
from bench import loop as loop_bench
from bench.__main__ import main
from bench.impls import DEFAULT_IMPLS, FLOOR, HOOKS, IMPLS, make_purgatories
from bench.report import TABLES


def _reject_non_json(constant: str) -> None:
    raise AssertionError(f"{constant} is not valid JSON")


@pytest.mark.parametrize(
    ("suite", "loop"),
    [
        ("timer", "asyncio"),
        ("churn", "uvloop"),
        ("expiry", "both"),
        ("purgatory", "asyncio"),
        ("idle", "uvloop"),
        ("memory", "asyncio"),
    ],
)
def test_suite_smoke(
    suite: str, loop: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "records.json"
    status = main([suite, "--smoke", "--loop", loop, "--no-progress", "--json", str(out)])

    assert status == 0
    assert f"## {suite}" in capsys.readouterr().out
    records = json.loads(out.read_text(), parse_constant=_reject_non_json)
    assert isinstance(records, list)
    assert records
    loops = {"asyncio", "uvloop"} if loop == "both" else {loop}
    assert {(r["impl"], r["loop"]) for r in records} == {
        (i, lp) for i in DEFAULT_IMPLS for lp in loops
    }
    table = TABLES[suite]
    for record in records:
        assert record["suite"] == suite
        assert "error" not in record
        assert all(key in record for key in table.keys)
        for metric in table.metrics:
            value = record.get(metric)
            assert value is None or isinstance(value, int | float), (metric, value)
        if "early" in record and record["impl"] == "wheel":
            assert record["early"] == 0
        if "doubles" in record:
            assert record["doubles"] == 0
            assert record["unfinished"] == 0


def test_churn_turns_the_pending_set_over(tmp_path: Path) -> None:
    """The window runs on until the pending set turned over --min-turnovers times (a
    small duration given explicitly); the record says how often, and the collections."""
    out = tmp_path / "records.json"
    argv = ["churn", "--smoke", "--impl", "wheel,heap", "--pending", "2000", "--seconds", "0.02"]
    argv += ["--min-turnovers", "3", "--max-seconds", "5", "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    records = json.loads(out.read_text())
    assert {r["impl"] for r in records} == {"wheel", "heap"}
    for record in records:
        assert record["turnovers"] >= 3
        assert record["turnovers"] == round(record["pairs"] / 2000, 2)
        assert record["window_s"] > 0
        assert all(isinstance(record[f"gc{g}"], int) for g in range(3))
        assert record["pending_end"] == 2000


def test_purgatory_counts_after_its_warm_up(tmp_path: Path) -> None:
    """Warm-up requests go out first and are not counted; the window's collections and
    longest loop stall are in the record."""
    out = tmp_path / "records.json"
    argv = ["purgatory", "--smoke", "--impl", "wheel", "--keys", "shared", "--rate", "4000"]
    argv += ["--warmup", "0.05", "--max-seconds", "0.1", "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    (record,) = json.loads(out.read_text())
    assert record["warmup_requests"] == 200
    assert record["requests"] == 400
    assert 0 < record["window_s"] < 1
    assert all(isinstance(record[f"gc{g}"], int) for g in range(3))
    assert isinstance(record["gc_pause_max_ms"], float)
    assert isinstance(record["stall_max_ms"], float)
    assert isinstance(record["stalls_over_5ms"], int)
    assert (record["doubles"], record["unfinished"], record["early"]) == (0, 0, 0)


def test_allocs_counts_what_the_library_allocates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The instrument works: every path measured per build, the user's operation object
    counted, the pure build's registration seen allocating. Never a figure's size beyond
    that: those are the records' and the docs'."""
    out = tmp_path / "records.json"
    builds = "compiled,pure" if aiopurgatory.COMPILED else "pure"
    argv = ["allocs", "-n", "300", "--pending", "50", "--build", builds, "--json", str(out)]
    assert main(argv) == 0
    assert "## allocs" in capsys.readouterr().out
    records = json.loads(out.read_text(), parse_constant=_reject_non_json)
    assert {(r["build"], r["path"], r["keys"]) for r in records} == {
        (build, path, keys) for build in builds.split(",") for path, keys in allocs.PATHS
    }
    counted = allocs.library_path().exists()  # a C compiler was there to build the counter
    for record in records:
        assert record["suite"] == "allocs"
        for field in allocs.FIELDS:
            value = record[field]
            assert (
                value is None
                if field in ("allocs_per_op", "bytes_per_op") and not counted
                else isinstance(value, int | float)
            ), (field, record)
        if record["path"] == "operation":  # the user's object: one block that stays
            assert record["net_blocks_per_op"] > 0.5  # one block, give or take noise
            assert record["young_per_op"] > 0.5
            if counted:
                assert record["allocs_per_op"] >= 1
        if counted and record["build"] == "pure" and record["path"] == "register":
            assert record["allocs_per_op"] > 0
    assert main(["summarize", str(out)]) == 0
    assert "## allocs" in capsys.readouterr().out


def test_all_runs_every_build_and_baseline_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "records.json"
    status = main(
        ["all", "--smoke", "--suites", "timer,churn", "--no-progress", "--json", str(out)]
    )

    assert status == 0
    text = capsys.readouterr().out
    assert "## timer" in text
    assert "## churn" in text
    assert "pure x" in text
    records = json.loads(out.read_text())
    combos = {(r["suite"], r["impl"], r["loop"], r["gc"]) for r in records}
    floors = {"timer": (FLOOR,), "churn": (FLOOR, HOOKS)}
    assert combos == {
        (suite, impl, loop, gc)
        for suite in ("timer", "churn")
        for impl in (*IMPLS, *floors[suite])
        for loop in ("asyncio", "uvloop")
        for gc in ("on", "off")
    }
    # The pure implementation really ran the pure-Python modules.
    assert {r["build"] for r in records if r["impl"] == "pure"} == {"pure"}
    # The floors hold nothing: they made and dropped objects, and timed none.
    held = [r for r in records if r["impl"] in (FLOOR, HOOKS)]
    assert {r["impl"] for r in held} == {FLOOR, HOOKS}
    assert all(r["pending_end"] == 0 and r["pairs"] > 0 for r in held)
    assert all(r["fired"] == 0 for r in held if r["suite"] == "timer")


@pytest.mark.anyio
async def test_the_hooks_floor_makes_the_operations_own_calls() -> None:
    done: list[tuple[int, bool]] = []
    ops = make_purgatories(HOOKS, asyncio.get_running_loop(), lambda t, e: done.append((t, e)))
    first = ops.register(1, (1,), 10.0)
    second = ops.register(2, (2,), 10.0)
    assert not first.done()  # checked at registration: not ready yet

    ops.set_ready(first)
    assert ops.check_and_complete(1) == 1  # try_complete -> force_complete -> on_complete
    assert ops.cancel(second)

    assert done == [(1, False)]  # on_complete ran once, for the completed one only
    assert first.outcome is Outcome.COMPLETED
    assert second.outcome is Outcome.CANCELLED
    assert ops.pending() == 0

    third = ops.register(3, (3,), 10.0)
    assert ops.force_complete(third)
    assert not ops.force_complete(third)  # the operation's exactly-once, not a constant
    assert done == [(1, False), (3, False)]


@pytest.mark.parametrize("suite", ["expiry", "purgatory", "idle", "memory"])
def test_the_floor_is_only_for_the_steady_pair_suites(suite: str) -> None:
    with pytest.raises(SystemExit, match="unknown implementation"):
        main([suite, "--smoke", "--impl", f"wheel,{FLOOR}", "--no-progress"])


def test_summarize_renders_saved_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "records.json"
    assert main(["idle", "--smoke", "--no-progress", "--json", str(out)]) == 0
    capsys.readouterr()

    assert main(["summarize", str(out), "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "## idle" in lines
    assert any(line.startswith("| scenario |") for line in lines)


def test_timeouts_suite_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "records.json"
    status = main(["timeouts", "--smoke", "--loop", "both", "--no-progress", "--json", str(out)])

    assert status == 0
    assert "## timeouts" in capsys.readouterr().out
    records = json.loads(out.read_text(), parse_constant=_reject_non_json)
    combos = {(r["impl"], r["loop"], r["api"]) for r in records}
    assert combos == {
        (impl, loop, api)
        for impl in ("wheel", "heap")
        for loop in ("asyncio", "uvloop")
        for api in ("timeout", "call_later", "wait_for")
    }
    for record in records:
        assert "error" not in record
        assert record["fired"] == 0  # deadlines 10-40 s away: none is due in a case
        assert isinstance(record["ops"], int)
        assert record["ops"] > 0
        for metric in TABLES["timeouts"].metrics:
            assert isinstance(record[metric], int | float), (metric, record)


def test_kafka_suite_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The Kafka-protocol broker's suite: one run at the smoke size, its figures flat."""
    pytest.importorskip("aiokafka")
    pytest.importorskip("kio")
    out = tmp_path / "records.json"
    status = main(["kafka", "--smoke", "--json", str(out)])

    assert status == 0
    text = capsys.readouterr().out
    assert "## kafka" in text
    assert "consumed end to end" in text  # the bench's own lines too
    records = json.loads(out.read_text(), parse_constant=_reject_non_json)
    assert len(records) == 1
    record = records[0]
    assert "error" not in record
    assert (record["suite"], record["records"], record["idle"]) == ("kafka", 500, 100)
    assert (record["transactions"], record["starts"]) == (30, 3)
    confluent = importlib.util.find_spec("confluent_kafka") is not None
    for metric in TABLES["kafka"].metrics:
        if metric.startswith("txn_confluent_") and not confluent:
            assert record[metric] is None, (metric, record[metric])  # NaN: not measured
            continue
        assert isinstance(record[metric], int | float), (metric, record.get(metric))
    # Transactions: 30 commits of 10 records each, measured per client.
    for client in ("aiokafka", "confluent") if confluent else ("aiokafka",):
        assert record[f"txn_{client}_transactions"] == 30
        assert record[f"txn_{client}_records_per_transaction"] == 10
        for figure in ("commits_per_s", "broker_cpu_us_per_commit", "broker_cpu_percent"):
            value = record[f"txn_{client}_{figure}"]
            assert 0 < value < math.inf, (client, figure, value)
    assert "commits/s" in text
    # Start times: positive, finite, the answer after the "listening on" line.
    for figure in (
        "in_process_ms",
        "fixture_thread_ms",
        "subprocess_listening_ms",
        "subprocess_answered_ms",
    ):
        assert 0 < record[f"start_{figure}"] < 30_000, (figure, record[f"start_{figure}"])
    assert record["start_subprocess_answered_ms"] >= record["start_subprocess_listening_ms"]
    assert record["start_starts"] == 3
    # The container's start is cited, never run: the figures and their source as quoted.
    assert record["start_cited_jvm_broker_start_ms_low"] == 1150
    assert record["start_cited_native_broker_start_ms_high"] == 140
    assert record["start_cited_source"].startswith("https://cwiki.apache.org/")
    assert "cited, not run" in text
    assert record["idle_polling_answers_per_s"] > 0  # the idle consumers were answered
    # ... by the purgatory's timer, not sooner: nothing arrives on the idle topic.
    assert record["idle_polling_round_trip_p50_ms"] >= 500
    assert record["idle_polling_connections_lost"] == 0
    assert record["idle_parked_connections_lost"] == 0
    assert record["idle_parked_answers_per_s"] == 0  # max wait 30 s: none expired

    assert main(["summarize", str(out)]) == 0
    assert "## kafka" in capsys.readouterr().out


def test_loop_pairs_and_lateness(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``bench loop`` runs the loops side by side (asyncio's and uvloop's, stock and
    wheel) and records what its table shows."""
    out = tmp_path / "records.json"
    argv = ["loop", "--pending", "1000", "--gc", "on,off", "--seconds", "0.02"]
    assert main([*argv, "--repeats", "1", "--lateness", "300", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "wheel/asyncio ÷ stock asyncio" in table
    assert "wheel/uvloop ÷ stock uvloop" in table
    records = json.loads(out.read_text(), parse_constant=_reject_non_json)
    pairs = [r for r in records if "median" in r]
    impls = ("stock asyncio", "wheel/asyncio", "stock uvloop", "wheel/uvloop")
    assert {(r["impl"], r["gc"]) for r in pairs} == {
        (impl, gc) for impl in impls for gc in ("on", "off")
    }
    assert all(r["median"] > 0 and r["pending"] == 1000 for r in pairs)
    late = {r["impl"]: r for r in records if "lateness" in r}
    assert sorted(late) == sorted(impls)
    # asyncio's promise, on every loop but stock uvloop (which rounds to milliseconds).
    assert [late[i]["early"] for i in impls if i != "stock uvloop"] == [0, 0, 0]
    assert all(r["p50_ms"] <= r["p99_ms"] <= r["max_ms"] for r in late.values())


@pytest.mark.parametrize("impl", ["wheel", "heap"])
def test_steps_runs_churn_steps_without_expiring(
    impl: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench.steps", "churn", "--impl", impl, "--pending", "500", "--steps", "700"]
    monkeypatch.setattr(sys, "argv", argv)
    steps.main()
    # The frozen clock: every operation finished was finished by a step, none expired.
    assert capsys.readouterr().out == f"churn {impl}: 700 steps, 500 pending\n"


def test_steps_times_a_close(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench.steps", "close", "--pending", "1000"])
    steps.main()
    assert capsys.readouterr().out.startswith("close: aclose() of 1000 pending, CPU s median ")


def test_loop_probes_of_the_full_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``bench loop``'s probes beyond the pairs, tiny: each loop's rate ratio between
    the pending sizes, RSS through arming and cancelling (a process per loop), lateness
    armed at a steady rate; and the arming timed beside a case."""
    out = tmp_path / "records.json"
    argv = ["loop", "--pending", "1000,2000", "--gc", "on", "--seconds", "0.02"]
    argv += ["--repeats", "1", "--rss", "20000", "--lateness", "3000"]
    assert main([*argv, "--lateness-rate", "50000", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rate at 2,000 pending / rate at 1,000" in text
    assert "armed 100 every 2 ms (asked: 50,000/s)" in text
    records = json.loads(out.read_text(), parse_constant=_reject_non_json)
    impls = tuple(loop_bench.LOOPS)  # asyncio's, and uvloop's when it is installed
    scaling = [r for r in records if "scaling" in r]
    assert {(r["impl"], r["scaling"]) for r in scaling} == {(i, "2000/1000") for i in impls}
    assert all(r["ratio"] > 0 for r in scaling)
    rss = {r["impl"]: r["phases"] for r in records if "rss_timers" in r}
    assert set(rss) == set(impls)
    stock = {p["phase"]: p for p in rss["stock asyncio"]}
    # The heap keeps its cancelled handles until more than half are cancelled ...
    assert stock["armed"]["heap_items"] == 20_000
    assert stock["half cancelled, iterated"]["heap_items"] > 10_000
    assert stock["all cancelled"]["heap_items"] > 10_000
    assert stock["iterated"]["heap_items"] == 0  # ... then purges them all
    for phases in rss.values():
        assert phases[1]["rss_mb"] > phases[0]["rss_mb"] > 0
        assert abs(phases[-1]["blocks"] - phases[0]["blocks"]) < 2_000  # nothing kept
    # The wheel loop's heap holds its alarm only, whatever is pending.
    assert all(p["heap_items"] <= 1 for p in rss["wheel/asyncio"])
    late = [r for r in records if "lateness" in r]
    # asyncio's promise on every loop but stock uvloop (which rounds to milliseconds).
    early = [(r["impl"], r["early"]) for r in late if r["impl"] != "stock uvloop"]
    assert early == [(i, 0) for i in impls if i != "stock uvloop"]
    assert all(r["p50_ms"] <= r["p99_ms"] <= r["max_ms"] and r["armed_per_s"] > 0 for r in late)
    arming = loop_bench.arming_seconds("wheel/asyncio", 1000)
    assert all(arming[k] >= 0 for k in ("arm_wall_s", "arm_cpu_s", "cancel_wall_s"))


WRK_OUTPUT = """\
Running 1s test @ http://127.0.0.1:4000/
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   310.21us  120.50us   2.10ms   90.00%
    Req/Sec    12.00k     1.00k   13.00k    70.00%
  Latency Distribution
     50%  290.00us
     75%  330.00us
     90%  400.00us
     99%    1.20ms
  12345 requests in 1.00s, 1.80MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
Requests/sec:  12340.50
Transfer/sec:      1.80MB
"""


def test_loop_server_reads_wrks_report() -> None:
    found = loop_server.parse_wrk(WRK_OUTPUT)
    assert found == {
        "requests_per_s": 12340.5,
        "p50_ms": pytest.approx(0.29),
        "p99_ms": 1.2,
        "requests": 12345,
        "errors": 3,
        "non_2xx": 0,
    }


def test_loop_server_without_wrk_says_how_to_install_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["loop-server", "--wrk", "/nonexistent/wrk"]) == 2
    assert "apt-get install -y wrk" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (apt-get)")
def test_loop_server_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The server bench, tiny: each loop's server holds the idle connections, each with
    its keep-alive timer pending on the loop, and answers wrk."""
    pytest.importorskip("aiohttp")
    out = tmp_path / "records.json"
    argv = ["loop-server", "--idle", "50", "--duration", "1", "--connections", "4"]
    assert main([*argv, "--json", str(out)]) == 0
    assert "requests/s" in capsys.readouterr().out
    records = json.loads(out.read_text(), parse_constant=_reject_non_json)
    assert [r["impl"] for r in records][:2] == ["stock asyncio", "wheel/asyncio"]
    for record in records:
        assert (record["idle_held"], record["idle_failed"], record["idle_lost"]) == (50, 0, 0)
        if record["impl"] != "stock uvloop":  # uvloop's own timers cannot be counted
            assert record["timers_pending"] >= 50  # a keep-alive timer per idle connection
        assert record["requests_per_s"] > 0
        assert record["errors"] == record["non_2xx"] == 0
        assert record["cpu_s"] > 0
        assert record["rss_peak_mb"] >= record["rss_idle_mb"] > 0


def test_cases_run_in_each_python_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--python``: every case in each interpreter named (here this one, by its version
    and by its path); the tables get a python column when the records come from more
    than one version; an unknown version is refused at once."""
    this = f"{sys.version_info[0]}.{sys.version_info[1]}"
    out = tmp_path / "records.json"
    argv = ["churn", "--smoke", "--impl", "wheel,heap", "--no-progress", "--json", str(out)]
    assert main([*argv, "--python", f"{this},{sys.executable}"]) == 0
    records = json.loads(out.read_text())
    assert len(records) == 4
    assert {r["python"] for r in records} == {sys.version.split()[0]}
    capsys.readouterr()

    records[0]["python"] = records[1]["python"] = "3.99.0"
    out.write_text(json.dumps(records))
    assert main(["summarize", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "impl" in line)
    assert header.split()[0] == "python"
    assert sum(line.startswith("3.99.0") for line in lines) == 2
    with pytest.raises(SystemExit, match=r"--python 3\.99: no .*\.venv-3\.99"):
        main([*argv, "--python", "3.99"])
