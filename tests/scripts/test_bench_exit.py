"""`make bench` fails when a benchmark misses its target: each script's exit status says so."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.stderr import problems

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"gpufleet_{name}", ROOT / "scripts" / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def summary(calls_ok: bool, ratio_ok: bool, latency_ms: float, same: bool = True) -> dict:
    return {
        "same_decisions": same,
        "latency_ms": latency_ms,
        "targets": {"calls_per_1000_ok": calls_ok, "ratio_ok": ratio_ok},
    }


def test_teardown_bench_fails_when_the_calls_target_is_missed() -> None:
    bench = load("bench_teardown")
    assert bench.exit_status(summary(True, True, 0)) == 0
    assert bench.exit_status(summary(False, True, 0)) == 1
    assert bench.exit_status(summary(True, True, 0, same=False)) == 1


def test_teardown_bench_judges_the_wall_time_ratio_only_with_injected_latency() -> None:
    bench = load("bench_teardown")
    assert bench.exit_status(summary(True, False, 0)) == 0
    assert bench.exit_status(summary(True, False, 20)) == 1


def test_make_bench_runs_each_benchmark_as_a_command_whose_status_counts() -> None:
    recipe = (ROOT / "Makefile").read_text().split("\nbench:", 1)[1].split("\n\n", 1)[0]
    lines = [ln.strip() for ln in recipe.splitlines()[1:] if ln.strip()]
    # every benchmark script, each once, as a plain command
    benches = sorted(f"$(PY) scripts/{p.name}" for p in (ROOT / "scripts").glob("bench_*.py"))
    assert sorted(lines) == benches
    assert not any("|| true" in ln or ln.startswith("-") for ln in lines)


def test_plan_bench_times_each_stack_against_a_same_run_baseline_and_fails_a_slow_one(
    monkeypatch, capsys
) -> None:
    import subprocess
    from types import SimpleNamespace

    bench = load("bench_plan")
    # a fresh process takes one tick (1 s) and 0.5 CPU s; a plan two ticks and 2 CPU s:
    # over the 1.5 s target
    clock = iter(range(0, 10_000))
    cpu = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: float(next(clock)))
    monkeypatch.setattr(
        bench.resource, "getrusage", lambda who: SimpleNamespace(ru_utime=cpu[0], ru_stime=0.0)
    )

    envs = []

    def fake_run(cmd, **kw):
        envs.append(kw["env"])
        cpu[0] += 0.5
        if "scripts/plan.py" in cmd:
            next(clock)  # a plan takes one tick more than the baseline
            cpu[0] += 1.5
        return subprocess.CompletedProcess(cmd, 0, b"{}", b"")

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    assert bench.main(["--stacks", "a100x4", "--repeat", "1"]) == 1
    out = capsys.readouterr().out
    # every run, the baseline's too, caches bytecode as a person's machine does, into one
    # folder of the run's own that is gone once the run ends
    caches = {e["PYTHONPYCACHEPREFIX"] for e in envs}
    assert len(envs) == 4 and len(caches) == 1 and not Path(caches.pop()).exists()
    assert not any("PYTHONDONTWRITEBYTECODE" in e for e in envs)
    assert "before each stack, median 1.00 s" in out
    row = next(line for line in out.splitlines() if line.startswith("a100x4"))
    assert row.split()[1:8] == ["2.00", "2.00", "1.00", "2.00", "2.00", "0.50", "0"]
    assert row.endswith("SLOW") and "over 1.5 CPU s: a100x4" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_plan_bench_refuses_an_unknown_stack_with_exit_2(capsys) -> None:
    bench = load("bench_plan")
    assert bench.main(["--stacks", "a100x44"]) == 2
    assert "unknown stack(s) a100x44" in capsys.readouterr().err


def test_train_bench_fails_when_fab_trails_torchrun_by_more_than_the_targets() -> None:
    bench = load("bench_train")
    # (first line, resume) seconds per run: fab within 2 s and 3 s of plain torchrun.
    plain = [(1.2, 1.5), (1.0, 1.4), (1.4, 1.6)]
    close = bench.summarise(plain, [(2.9, 4.0), (3.1, 4.3), (3.0, 4.1)])
    assert close["first_line"] == {
        "torchrun_s": 1.2, "fab_s": 3.0, "extra_s": 1.8, "ratio": 2.5,
    }  # fmt: skip
    assert bench.exit_status(close) == 0
    slow_start = bench.summarise(plain, [(3.5, 4.0), (3.6, 4.3), (3.4, 4.1)])
    assert slow_start["targets"] == {"first_line": False, "resume": True}
    assert bench.exit_status(slow_start) == 1
    slow_resume = bench.summarise(plain, [(2.0, 5.0), (2.0, 4.9), (2.0, 5.1)])
    assert bench.exit_status(slow_resume) == 1
    assert "MISSED" in bench.report(slow_resume) and "+3.5" in bench.report(slow_resume)


@pytest.mark.parametrize(
    ("script", "argv", "said"),
    [
        # '' named no stacks and ran every one (minutes of plans)
        ("bench_plan", ["--stacks", ""], "--stacks name at least one"),
        ("bench_plan", ["--stacks", " , "], "--stacks name at least one"),
        # --runs 0 ended in statistics.median([]) after the whole first run
        ("bench_setup", ["--runs", "0"], "argument --runs: 0: give a whole number from 1 to 50"),
        ("bench_setup", ["--runs", "10**9"], "argument --runs: '10**9': give a whole number"),
        ("bench_train", ["--runs", "1000000"], "argument --runs: 1000000: give a whole number"),
        ("bench_teardown", ["--scale", "100000"], "--scale: 100000: give a whole number from 1"),
        ("bench_teardown", ["--scale", "0"], "--scale: 0: give a whole number from 1 to 50"),
        ("bench_teardown", ["--latency-ms", "-5"], "--latency-ms: '-5': give a number from 0"),
        ("bench_teardown", ["--latency-ms", "nan"], "--latency-ms: 'nan': give a number from 0"),
        ("bench_teardown", ["--latency-ms", "1e9"], "--latency-ms: '1e9': give a number from 0"),
    ],
)
def test_a_bad_value_is_refused_before_the_benchmark_starts(
    script: str, argv: list[str], said: str
) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / f"{script}.py"), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    (line,) = problems(proc.stderr)
    assert line.startswith(f"{script}.py: ") and said in line, line
