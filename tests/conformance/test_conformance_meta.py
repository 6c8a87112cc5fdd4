"""Tests of the conformance suite itself: it must find each fault of a broken backend.

Each broken fake (conformance_fakes.py) differs from a correct one by one fault; the
suite runs on it and exactly the checks that look for that fault must fail. The
slow checks (a subprocess, threads) only run where they are the point.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import conformance_fakes as fakes
import pytest

from unimatmul.backend import Backend
from unimatmul.cli import main
from unimatmul.core.errors import BackendUnavailable
from unimatmul.core.problem import Problem
from unimatmul_conformance import CHECKS, Expectations, Suite, run_suite
from unimatmul_conformance.report import FAILED, STATUSES, XFAILED, XPASSED

# Everything but the fresh-process and thread checks, which cost a second each.
FAST = frozenset(CHECKS) - {"identity-stable", "threads"}

FAULTS = [
    (fakes.WritesOutOfBounds, FAST, {"guard"}),
    (fakes.WritesItsInput, FAST, {"guard"}),
    (fakes.WrongResults, FAST, {"result"}),
    (fakes.OneWrongElement, FAST, {"result"}),
    (fakes.LeavesElementsUnwritten, FAST, {"written"}),
    (fakes.CrashesOnUnsupported, FAST, {"candidates", "unsupported"}),
    (fakes.BadIdentity, FAST, {"candidates", "cache-roundtrip"}),
    (fakes.IncompletePlatform, FAST, {"platform"}),
    (fakes.RefusesWhatItOffers, FAST, {"prepare", "cache-roundtrip"}),
    (fakes.UnstableIdentities, {"identity-stable", "candidates", "cache-roundtrip"}, {"identity-stable"}),
    (fakes.NotThreadSafe, {"threads", "result", "written"}, {"threads"}),
]


@pytest.mark.parametrize(("backend_class", "checks", "expected"), FAULTS, ids=[f[0].__name__ for f in FAULTS])
def test_the_suite_finds_exactly_the_fault(
    backend_class: type[Backend], checks: frozenset[str], expected: set[str]
) -> None:
    report = run_suite(backend_class(), quick=True, checks=checks)
    failed = {r.check for r in report.failed()}
    assert failed == expected, [f"{r.id}: {r.why}" for r in report.failed()][:5]
    # The checks that were meant to pass did run, on real problems.
    assert report.counts()["passed"] > len(checks)
    assert report.ok == (not expected)


def test_a_correct_backend_passes_every_check() -> None:
    report = run_suite(fakes.GoodBackend(), quick=True)
    assert report.ok, [f"{r.id}: {r.why}" for r in report.failed()][:5]
    by_check = report.by_check()
    assert set(by_check) == set(CHECKS)
    for name in (
        "result",
        "written",
        "guard",
        "threads",
        "identity-stable",
        "cache-roundtrip",
        "unsupported",
    ):
        assert by_check[name]["passed"] >= 1, name
    # f32 and f64 in the quick matrix, two kernels each: dozens of runs.
    assert by_check["result"]["passed"] >= 50
    assert by_check["graph"]["skipped"] == by_check["stream"]["skipped"] == 1  # CPU: no graphs, no streams
    # What the fake refuses is answered "unsupported" by the candidates check, not run.
    refused = [r for r in report.results if r.check == "candidates" and r.why.startswith("unsupported")]
    assert any(":f16." in (r.case or "") for r in refused)
    assert any(":none:" not in (r.case or "") and "gelu" in (r.case or "") for r in refused)


def _rel_error(why: str) -> float:
    match = re.search(r"relative error ([0-9.e+-]+)", why)
    assert match, why
    return float(match.group(1))


def test_one_wrong_element_is_caught_where_the_norm_hides_it() -> None:
    report = run_suite(fakes.OneWrongElement(), quick=True, checks={"result"})
    big = [r for r in report.failed("result") if ":m256n192k320b1:" in (r.id or "")]
    assert big, "the large problem's single wrong element went unnoticed"
    for r in big:
        assert _rel_error(r.why) < 1e-4  # within the norm tolerance ...
        assert "1 elements outside their bound" in r.why  # ... but not element by element


def test_guard_failures_say_where_the_write_landed() -> None:
    report = run_suite(fakes.WritesOutOfBounds(), quick=True, checks={"guard"})
    problems = {r.id: (Problem.from_key((r.case or "").split("@")[0]), r.why) for r in report.failed("guard")}
    padded = [why for p, why in problems.values() if p.ldc > p.n and p.batch == 1]
    contiguous = [why for p, why in problems.values() if p.ldc == p.n and p.batch == 1]
    assert padded and all("in the padding of row" in why for why in padded), padded
    assert contiguous and all("after the output's last element" in why for why in contiguous)
    # Every problem that ran fails: the write is out of bounds at every size.
    assert len(report.failed("guard")) == report.by_check()["guard"]["failed"] > 20


def test_unwritten_elements_are_found_when_beta_is_not_zero() -> None:
    report = run_suite(fakes.LeavesElementsUnwritten(), quick=True, checks={"written"})
    with_beta = [r for r in report.failed("written") if ":beta1:" in (r.id or "")]
    assert with_beta and all("C's initial value" in r.why for r in with_beta)
    without = [r for r in report.failed("written") if ":beta0:" in (r.id or "")]
    assert without and all("still hold the poison" in r.why for r in without)


def test_expected_failures_are_reported_as_such() -> None:
    expectations = Expectations.parse(
        "# the fake forgets the last k term\nresult::*::fake-wrong/*   off-by-one in the k loop\n"
        "platform   listed to show an expected failure that passes\n",
        "test.txt",
    )
    report = run_suite(
        fakes.WrongResults(), quick=True, checks={"result", "platform"}, expectations=expectations
    )
    counts = report.counts()
    assert report.ok and counts[FAILED] == 0
    assert counts[XFAILED] >= 30 and counts[XPASSED] == 1
    xfailed = next(r for r in report.results if r.status == XFAILED)
    assert xfailed.expected == "off-by-one in the k loop"
    assert "expected failures passed" in report.summary()


def test_an_expected_failure_needs_a_reason() -> None:
    with pytest.raises(ValueError, match=r"x\.txt:2: .* has no reason"):
        Expectations.parse("# comment\nresult::*\n", "x.txt")


def test_the_shipped_expectation_files_parse() -> None:
    for path in sorted((Path(__file__).parents[2] / "conformance/unimatmul_conformance/xfail").glob("*.txt")):
        Expectations.builtin(path.stem)  # raises on a malformed line
    assert Expectations.builtin("no-such-backend").entries == []


def test_an_unavailable_backend_is_refused_with_its_reason() -> None:
    with pytest.raises(BackendUnavailable, match=r"libfake\.so not found"):
        Suite(fakes.Missing())


def test_the_json_report_holds_every_check(tmp_path: Path) -> None:
    report = run_suite(fakes.IncompletePlatform(), quick=True, checks={"platform", "candidates"})
    path = tmp_path / "report.json"
    report.write_json(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["format"] == "unimatmul-conformance-report" and data["backend"] == "fake-no-versions"
    assert data["ok"] is False and data["counts"]["failed"] == 1
    assert len(data["checks"]) == sum(data["counts"].values()) == len(report.results)
    assert {c["status"] for c in data["checks"]} <= set(STATUSES)
    failed = [c for c in data["checks"] if c["status"] == "failed"]
    assert failed[0]["id"] == "platform" and "empty" in failed[0]["why"]
    summary = report.summary()
    assert len(summary.splitlines()) < 25 and "FAILED platform" in summary
    # Named .gz, the same report is gzipped (GPU reports run to megabytes of JSON).
    report.write_json(tmp_path / "report.json.gz")
    assert json.loads(gzip.decompress((tmp_path / "report.json.gz").read_bytes())) == data


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--backend", "no-such-backend"]) == 2
    assert "unknown backend 'no-such-backend'" in capsys.readouterr().err
    assert main(["conformance", "--backend", "conformance_fakes:Missing"]) == 3
    assert "libfake.so not found" in capsys.readouterr().out
    report = tmp_path / "report.json"
    assert main(["conformance", "--backend", "conformance_fakes:SupportsNothing", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "PASSED:" in out and f"report: {report}" in out
    assert json.loads(report.read_text(encoding="utf-8"))["ok"] is True
    assert main(["conformance", "--backend", "conformance_fakes:SupportsNothingNoVersions", "--quick"]) == 1
    assert "FAILED platform: versions() reported no library version" in capsys.readouterr().out
