"""Every command with bad arguments, unwritable paths and closed pipes: no traceback,
ever, and a documented exit code (:mod:`unimatmul.cli.output`, the README).

Each case is a real ``python -m unimatmul`` process (a closed pipe can only be met by
one); they run a few at a time, once per session, and each case is its own test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from unimatmul.cli.output import (
    EXIT_CLOSED_OUTPUT,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from unimatmul.settings import REGISTRY

DOCUMENTED = {EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INTERRUPTED, EXIT_CLOSED_OUTPUT}
ANY = frozenset(DOCUMENTED)  # commands of other owners: documented, but not pinned here


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    code: int | frozenset[int]
    err: str = ""  # expected in stderr
    env: dict[str, str] = field(default_factory=dict)
    closed: str = ""  # "out": stdout is a pipe whose reader is gone; "both": stderr too
    cache: str = "good"  # UNIMATMUL_CACHE: "good" (one entry, shared, read only) or "own" (fresh)
    out: str = ""  # expected in stdout
    not_err: str = ""  # never in stderr
    absent: str = ""  # a path the command must not have created
    widest: int = 0  # the longest line of stdout and stderr together, when not 0


def _cases() -> list[Case]:
    c = Case
    tune = ("tune", "--quiet", "--budget-ms", "1")
    return [
        # info
        c("info closed", ("info",), EXIT_CLOSED_OUTPUT, closed="out"),
        c("info --json closed", ("info", "--json"), EXIT_CLOSED_OUTPUT, closed="out"),
        c("info --json all closed", ("info", "--json"), EXIT_CLOSED_OUTPUT, closed="both"),
        c("info device tpu", ("info", "--device", "tpu"), EXIT_USAGE, "unknown device 'tpu'"),
        c("info numpy on cuda", ("info", "--device", "cuda"), EXIT_USAGE, "NumPy arrays live on the CPU"),
        c("info bad index", ("info", "--array", "torch", "--device", "cuda:x"), EXIT_USAGE, "unknown device"),
        c(
            "info torch on cuda",
            ("info", "--array", "torch", "--device", "cuda:7"),
            frozenset({EXIT_OK, EXIT_UNAVAILABLE}),
        ),
        c("info cupy", ("info", "--array", "cupy"), frozenset({EXIT_OK, EXIT_UNAVAILABLE})),
        c("info bad mode", ("info",), EXIT_USAGE, "UNIMATMUL_MODE", env={"UNIMATMUL_MODE": "fast"}),
        c("info bad option", ("info", "--bogus"), EXIT_USAGE, "unrecognized arguments"),
        c(
            "info bad buckets",
            ("info",),
            EXIT_USAGE,
            "UNIMATMUL_BUCKETS='weird'",
            env={"UNIMATMUL_BUCKETS": "weird"},
        ),
        c(
            "info bad lru size",
            ("info",),
            EXIT_USAGE,
            "UNIMATMUL_LRU_SIZE='-1'",
            env={"UNIMATMUL_LRU_SIZE": "-1"},
        ),
        c(
            "info lru not a number",
            ("info",),
            EXIT_USAGE,
            "is not an integer",
            env={"UNIMATMUL_LRU_SIZE": "abc"},
        ),
        c(
            "cache bad lru size",
            ("cache", "show"),
            EXIT_USAGE,
            "UNIMATMUL_LRU_SIZE",
            env={"UNIMATMUL_LRU_SIZE": "0"},
        ),
        # Short lines: why a backend is unavailable in a few words (-v: in full), the presets.
        c("info short", ("info",), EXIT_OK, out="presets:   bert-base (6 shapes)", widest=200),
        c("info -v", ("info", "-v"), EXIT_OK, out="presets:"),
        c("no command", (), EXIT_OK, out="usage: unimatmul [-h] [--version] COMMAND"),
        c("version", ("--version",), EXIT_OK, out="unimatmul 0."),
        c("help closed", ("--help",), frozenset({EXIT_OK, EXIT_CLOSED_OUTPUT}), closed="out"),
        c("tune help lists presets", ("tune", "--help"), EXIT_OK, out="llama3-8b    4 shapes: Llama-3-8B"),
        # tune: refused before any tuning
        c("tune bf16 numpy", (*tune, "--shape", "4x5x5:bf16"), EXIT_USAGE, "NumPy has no bf16"),
        c("tune f8 numpy", (*tune, "--shape", "4x5x5:f8e4m3"), EXIT_USAGE, "NumPy has no f8e4m3"),
        c("tune int8", (*tune, "--shape", "4x5x5:int8"), EXIT_USAGE, "unsupported dtype int8"),
        c("tune huge", (*tune, "--shape", "99999999x99999999x99999999"), EXIT_UNAVAILABLE, "PiB"),
        c("tune bad shape", (*tune, "--shape", "64x48"), EXIT_USAGE, "bad shape"),
        c("tune bad preset", (*tune, "--preset", "nope"), EXIT_USAGE, "unknown preset"),
        c("tune bad budget", (*tune, "--shape", "8x8x8", "--budget-ms", "nan"), EXIT_USAGE, "--budget-ms"),
        c("tune bad buckets", (*tune, "--shape", "8x8x8", "--buckets", "zz"), EXIT_USAGE, "bucket"),
        c(
            "tune json no dir",
            (*tune, "--shape", "8x8x8", "--json", "{missing}/x.json"),
            EXIT_USAGE,
            "cannot write --json {missing}/x.json: no directory {missing}",
            absent="{missing}",
        ),
        c("tune json a dir", (*tune, "--shape", "8x8x8", "--json", "{dir}"), EXIT_ERROR, "a directory"),
        c("tune from missing", (*tune, "--from", "{missing}/rec.jsonl"), EXIT_UNAVAILABLE, "cannot read"),
        c("tune from a dir", (*tune, "--from", "{dir}"), EXIT_USAGE, "a folder, not a regular file"),
        c("tune from binary", (*tune, "--from", "{binary}"), EXIT_USAGE, "not a text file"),
        c("tune from garbage", (*tune, "--from", "{garbage}"), EXIT_USAGE, "neither a unimatmul record"),
        c(
            "tune cache under a file",
            (*tune, "--shape", "8x8x8"),
            EXIT_ERROR,
            "is a file, not a directory",
            env={"UNIMATMUL_CACHE": "{file}/cache.msgpack"},
        ),
        c(
            "tune cache read-only",
            (*tune, "--shape", "8x8x16"),
            EXIT_ERROR,
            "UNIMATMUL_CACHE_READONLY",
            env={"UNIMATMUL_CACHE_READONLY": "1"},
        ),
        c(
            "tune bad env",
            (*tune, "--shape", "8x8x8"),
            EXIT_USAGE,
            "UNIMATMUL_CACHE_READONLY",
            env={"UNIMATMUL_CACHE_READONLY": "maybe"},
        ),
        # tune: warnings after the table, one line per kind (a cache file that cannot be
        # read is one), never Python's "<path>:<line>: RuntimeWarning" and its source line
        c(
            "tune warns in a line",
            ("tune", "--budget-ms", "1", "--shape", "8x8x8"),
            EXIT_OK,
            "unimatmul: warning: cache {corrupt}: unreadable",
            env={"UNIMATMUL_CACHE": "{corrupt}"},
            out="(1 entry)",
            not_err="RuntimeWarning",
            widest=200,
        ),
        c(
            "tune warns in full",
            ("tune", "--budget-ms", "1", "--shape", "8x8x8", "-v"),
            EXIT_OK,
            "unimatmul: warning: cache {corrupt}: unreadable",
            env={"UNIMATMUL_CACHE": "{corrupt}"},
            not_err="RuntimeWarning",
        ),
        c(
            "tune warns not when quiet",
            (*tune, "--shape", "8x8x8"),
            EXIT_OK,
            env={"UNIMATMUL_CACHE": "{corrupt}"},
            not_err="warning",
            out="on 1 shape\n",
        ),
        # tune: measures, writes its own cache, then meets a closed pipe
        c("tune closed", (*tune, "--shape", "8x8x8"), EXIT_CLOSED_OUTPUT, closed="out", cache="own"),
        c(
            "tune all closed",
            ("tune", "--budget-ms", "1", "--shape", "8x8x8"),
            EXIT_CLOSED_OUTPUT,
            closed="both",
            cache="own",
        ),
        # cache
        c("cache show closed", ("cache", "show"), EXIT_CLOSED_OUTPUT, closed="out"),
        c("cache show", ("cache", "show"), EXIT_OK, out="confidence", not_err="warning"),
        c("cache show one entry", ("cache", "show"), EXIT_OK, out="(1 entry)\n"),
        c("cache show --json closed", ("cache", "show", "--json"), EXIT_CLOSED_OUTPUT, closed="out"),
        c("cache stats closed", ("cache", "stats"), EXIT_CLOSED_OUTPUT, closed="out"),
        c("cache stats --json closed", ("cache", "stats", "--json"), EXIT_CLOSED_OUTPUT, closed="out"),
        c("cache verify closed", ("cache", "verify"), EXIT_CLOSED_OUTPUT, closed="out"),
        c("cache path closed", ("cache", "path"), EXIT_CLOSED_OUTPUT, closed="out"),
        c(
            "cache export - closed",
            ("cache", "export", "--format", "json", "-o", "-"),
            EXIT_CLOSED_OUTPUT,
            closed="out",
        ),
        c("cache show corrupt", ("cache", "show", "--cache", "{corrupt}"), ANY),
        c("cache show a dir", ("cache", "show", "--cache", "{dir}"), ANY),
        c("cache stats corrupt", ("cache", "stats", "--cache", "{corrupt}"), ANY),
        c(
            "cache stats bad device",
            ("cache", "stats", "--validate", "--device", "tpu"),
            EXIT_USAGE,
            "unknown device",
        ),
        c("cache verify corrupt", ("cache", "verify", "--cache", "{corrupt}"), EXIT_ERROR),
        c("cache verify mismatch", ("cache", "verify", "--expect", "00"), EXIT_ERROR),
        c(
            "cache merge missing",
            ("cache", "merge", "{missing}/a.msgpack", "-o", "{tmp}/m.msgpack"),
            EXIT_UNAVAILABLE,
        ),
        c(
            "cache merge to a file's child",
            ("cache", "merge", "{good}", "-o", "{file}/m.msgpack"),
            EXIT_ERROR,
            "is a file, not a directory",
        ),
        c(
            "cache merge no dir",
            ("cache", "merge", "{good}", "-o", "{missing}/m.msgpack"),
            EXIT_USAGE,
            "cannot write -o {missing}/m.msgpack: no directory {missing}",
            absent="{missing}",
        ),
        c(
            "cache merge one",
            ("cache", "merge", "{good}", "-o", "{tmp}/one.msgpack"),
            EXIT_OK,
            out="from 1 file into",
        ),
        c("cache merge corrupt", ("cache", "merge", "{corrupt}", "-o", "{tmp}/m2.msgpack"), ANY),
        c("cache prune nothing", ("cache", "prune"), EXIT_USAGE, "nothing to prune"),
        c("cache recover missing", ("cache", "recover", "{missing}/x.msgpack"), ANY),
        c(
            "cache recover garbage",
            ("cache", "recover", "{garbage}"),
            EXIT_UNAVAILABLE,
            "nothing in it can be salvaged",
            not_err="cache recover {garbage}",
        ),
        c(
            "cache recover corrupt",
            ("cache", "recover", "{corrupt}"),
            EXIT_UNAVAILABLE,
            "nothing in it can be salvaged",
            not_err="`unimatmul cache recover",
        ),
        c("cache prune bad days", ("cache", "prune", "--older-than", "x"), EXIT_USAGE),
        c(
            "cache prune negative days",
            ("cache", "prune", "--older-than", "-3"),
            EXIT_USAGE,
            "--older-than must be a number of days, 0 or more, got -3",
        ),
        c("cache prune nan days", ("cache", "prune", "--older-than", "nan"), EXIT_USAGE, "--older-than"),
        c(
            "cache prune dry run",
            ("cache", "prune", "--older-than", "0", "--dry-run"),
            EXIT_OK,
            out="would remove 1 entry from",
        ),
        c(
            "cache prune unwritable",
            ("cache", "prune", "--older-than", "0", "--cache", "{file}/c.msgpack"),
            ANY,
        ),
        c("cache import missing", ("cache", "import", "tunableop", "{missing}/t.csv"), EXIT_UNAVAILABLE),
        c("cache import garbage", ("cache", "import", "tunableop", "{binary}"), ANY),
        c(
            "cache import untuned",
            ("cache", "import", "tunableop", "{untuned}"),
            EXIT_UNAVAILABLE,
            "`unimatmul tune --from FILE`",
            not_err="parse_untuned",
        ),
        c(
            "cache import bad format",
            ("cache", "import", "nope", "{garbage}"),
            EXIT_USAGE,
            "unknown import format",
        ),
        c(
            "cache export no dir",
            ("cache", "export", "--format", "json", "-o", "{missing}/x.json"),
            EXIT_USAGE,
            "no directory {missing}",
            absent="{missing}",
        ),
        c("cache export a dir", ("cache", "export", "--format", "json", "-o", "{dir}"), EXIT_ERROR),
        c(
            "cache export tunableop no dir",
            ("cache", "export", "--format", "tunableop", "-o", "{missing}/x.csv"),
            EXIT_USAGE,
            "no directory {missing}",
            absent="{missing}",
        ),
        c(
            "cache export tunableop of numpy",
            ("cache", "export", "--format", "tunableop", "-o", "{tmp}/numpy.csv"),
            EXIT_UNAVAILABLE,
            "tuned on numpy arrays",
            not_err="with torch installed",
            absent="{tmp}/numpy.csv",
        ),
        c("cache export bad format", ("cache", "export", "--format", "nope", "-o", "-"), EXIT_USAGE),
        c("cache on :memory:", ("cache", "stats", "--cache", ":memory:"), EXIT_USAGE, "not on ':memory:'"),
        c("cache no subcommand", ("cache",), EXIT_OK, out="usage: unimatmul cache [-h] COMMAND"),
        # conformance (a plugin's command)
        c("conformance unknown", ("conformance", "--backend", "nope"), EXIT_USAGE, "unknown backend"),
        c(
            "conformance xfail missing",
            ("conformance", "--backend", "onednn", "--xfail", "{missing}/x"),
            EXIT_USAGE,
            "expected-failure file",
        ),
        c("conformance bad device", ("conformance", "--backend", "onednn", "--device", "tpu"), EXIT_USAGE),
        c("conformance no backend", ("conformance",), EXIT_USAGE, "--backend"),
    ]


CASES = _cases()


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    seconds: float
    paths: dict[str, str] = field(default_factory=dict)  # what the case's {names} stood for


def _run(case: Case, paths: dict[str, str], base_env: dict[str, str], index: int) -> Result:
    started = time.perf_counter()
    env = dict(base_env)
    if case.cache == "own":
        env["UNIMATMUL_CACHE"] = str(Path(paths["tmp"]) / f"own-{index}.msgpack")
    if any("{corrupt}" in a for a in (*case.argv, *case.env.values())):
        # Reading a broken cache may move it aside: each case gets its own.
        own = Path(paths["tmp"]) / f"corrupt-{index}.msgpack"
        own.write_bytes(Path(paths["corrupt"]).read_bytes())
        paths = {**paths, "corrupt": str(own)}
    env.update({k: v.format(**paths) for k, v in case.env.items()})
    argv = [sys.executable, "-m", "unimatmul", *(a.format(**paths) for a in case.argv)]
    if not case.closed:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
        return Result(done.returncode, done.stdout, done.stderr, time.perf_counter() - started, paths)
    # A pipe whose reader is gone before the command writes: every write meets EPIPE,
    # as `unimatmul ... | head -1` does once head has its line (but every time).
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        stderr: int = write_end if case.closed == "both" else subprocess.PIPE
        done = subprocess.run(argv, env=env, stdout=write_end, stderr=stderr, timeout=120, check=False)
    finally:
        os.close(write_end)
    return Result(
        done.returncode,
        "",
        (done.stderr or b"").decode(errors="replace"),
        time.perf_counter() - started,
        paths,
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    tmp = tmp_path_factory.mktemp("sweep")
    env = {k: v for k, v in os.environ.items() if k not in REGISTRY}
    good = tmp / "good.msgpack"
    env["UNIMATMUL_CACHE"] = str(good)
    made = subprocess.run(
        [sys.executable, "-m", "unimatmul", "tune", "--quiet", "--budget-ms", "1", "--shape", "8x8x8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == EXIT_OK and good.exists(), made.stderr
    (tmp / "a-file").write_text("a file where a folder should be\n")
    (tmp / "a-dir").mkdir()
    (tmp / "binary").write_bytes(bytes(range(256)) * 4)
    (tmp / "garbage.txt").write_text("this is neither JSON lines\nnor a TunableOp file\n")
    (tmp / "corrupt.msgpack").write_bytes(b"\x93\xff\x00not msgpack at all" * 8)
    (tmp / "untuned.csv").write_text("GemmTunableOp_float_NN,nn_8_8_8_ld_8_8_8\n")
    paths = {
        "tmp": str(tmp),
        "good": str(good),
        "missing": str(tmp / "no-such-dir"),
        "file": str(tmp / "a-file"),
        "dir": str(tmp / "a-dir"),
        "binary": str(tmp / "binary"),
        "garbage": str(tmp / "garbage.txt"),
        "corrupt": str(tmp / "corrupt.msgpack"),
        "untuned": str(tmp / "untuned.csv"),
    }
    # The cases are processes that mostly wait on their imports: a few at a time keep two
    # cores busy without starving them.
    with ThreadPoolExecutor(max_workers=(os.cpu_count() or 2) + 1) as pool:
        futures = {case.name: pool.submit(_run, case, paths, env, i) for i, case in enumerate(CASES)}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_no_traceback_and_a_documented_exit_code(case: Case, results: dict[str, Result]) -> None:
    result = results[case.name]
    shown = f"exit {result.code}\nstderr:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, shown
    assert result.code in DOCUMENTED, shown
    expected = {case.code} if isinstance(case.code, int) else case.code
    assert result.code in expected, shown
    if case.err:
        assert case.err.format(**result.paths) in result.stderr, shown
    if case.not_err:
        assert case.not_err.format(**result.paths) not in result.stderr, shown
    if case.out:
        assert case.out in result.stdout, f"{shown}\nstdout:\n{result.stdout[-3000:]}"
    if case.absent:
        assert not Path(case.absent.format(**result.paths)).exists(), shown
    if case.widest:
        widest = max((len(line) for line in (result.stdout + result.stderr).splitlines()), default=0)
        assert widest <= case.widest, f"{shown}\nstdout:\n{result.stdout}"
    if result.code in (EXIT_USAGE, EXIT_UNAVAILABLE):
        assert "error: " in result.stderr, shown  # says what went wrong (argparse's usage too)
    if result.code == EXIT_CLOSED_OUTPUT and case.closed == "out":
        # Quietly, as a tool stopped by SIGPIPE: not even the warnings a tuning run met.
        assert result.stderr == "", shown
    assert "RuntimeWarning: unimatmul" not in result.stderr, shown  # collected, never Python's own


def test_the_sweep_covers_every_command() -> None:
    from unimatmul.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    cache_commands = commands["cache"]._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    swept = {case.argv[0] for case in CASES if case.argv}
    swept_cache = {case.argv[1] for case in CASES if case.argv[:1] == ("cache",) and len(case.argv) > 1}
    assert set(commands) <= swept, set(commands) - swept
    assert set(cache_commands) <= swept_cache, set(cache_commands) - swept_cache
