"""The checks. Each returns an Outcome: (status, why); none raises for a backend's fault.

Names (the first part of every check id):

- ``platform``: the Platform fingerprint is complete;
- ``candidates``: ``candidates()`` answers with Candidates whose identities round-trip,
  or raises UnsupportedProblem, and nothing else;
- ``unsupported``: ``prepare()`` of a candidate never offered raises UnsupportedProblem;
- ``prepare``, ``result``, ``written``, ``guard``: one run of one candidate on one
  problem: it prepares, matches the float64 reference, writes every element of the
  poisoned output, and writes nothing outside it (canaries, inputs unchanged);
- ``threads``: one runner called from several threads at once stays correct;
- ``identity-stable``: a fresh process lists the same candidate identities;
- ``cache-roundtrip``: records naming the candidates survive the cache store and
  lead back to the same kernels;
- ``graph``, ``stream`` (GPU): see :mod:`unimatmul_conformance.gpu`;
- ``grouped``: a grouped GEMM's candidate is right on every distribution of ``offs``
  (backends whose ``ops`` name ``grouped_gemm``): see :mod:`unimatmul_conformance.grouped`.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from unimatmul.backend import Candidate
from unimatmul.cache.protocol import open_store
from unimatmul.cache.record import OK, CandidateResult, TuningRecord
from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.platform import detect_platform
from unimatmul.core.problem import Problem
from unimatmul_conformance.guards import POISON, guarded_output, host64, host_bits
from unimatmul_conformance.loading import recreate_specs
from unimatmul_conformance.numerics import compare, make_case_data
from unimatmul_conformance.report import FAILED, PASSED, SKIPPED

if TYPE_CHECKING:
    from unimatmul_conformance.context import SuiteContext
    from unimatmul_conformance.matrix import Case

Outcome = tuple[str, str]

PLATFORM = "platform"
CANDIDATES = "candidates"
UNSUPPORTED = "unsupported"
PREPARE = "prepare"
RESULT = "result"
WRITTEN = "written"
GUARD = "guard"
THREADS = "threads"
IDENTITY = "identity-stable"
CACHE = "cache-roundtrip"
GRAPH = "graph"
STREAM = "stream"
GROUPED = "grouped"
ALL = (
    PLATFORM,
    CANDIDATES,
    UNSUPPORTED,
    PREPARE,
    RESULT,
    WRITTEN,
    GUARD,
    THREADS,
    IDENTITY,
    CACHE,
    GRAPH,
    STREAM,
    GROUPED,
)
RUN = (PREPARE, RESULT, WRITTEN, GUARD)  # the checks one run of a candidate answers


def _exc(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _listing(items: list[str], limit: int = 4) -> str:
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more


def close_runner(runner: Any) -> None:
    close = getattr(runner, "close", None)
    if callable(close):
        close()


# --- the backend as a whole --------------------------------------------------------


def check_platform(suite: SuiteContext) -> Outcome:
    backend = suite.backend
    problems = []
    try:
        versions = backend.versions()
        info = backend.platform_info(suite.target)
        platform = detect_platform(suite.target, [backend])
    except Exception as exc:
        return FAILED, f"versions()/platform_info()/detect_platform raised {_exc(exc)}"
    if not isinstance(info, dict):
        problems.append(f"platform_info() returned {type(info).__name__}, not a dict")
    if not isinstance(versions, dict) or not versions:
        problems.append("versions() reported no library version")
    else:
        for lib, version in versions.items():
            if not isinstance(lib, str) or not lib or not isinstance(version, str) or not version.strip():
                problems.append(f"versions() has an empty or non-text entry {lib!r}: {version!r}")
            elif platform.versions.get(lib) != version:
                problems.append(f"the Platform lacks {lib} {version} (has {platform.versions.get(lib)!r})")
    for name in ("vendor", "arch", "device"):
        value = getattr(platform, name)
        if not isinstance(value, str) or not value.strip():
            problems.append(f"Platform.{name} is empty")
    if not isinstance(platform.cores, int) or platform.cores < 1:
        problems.append(f"Platform.cores is {platform.cores!r}")
    if problems:
        return FAILED, _listing(problems)
    return PASSED, f"{platform.namespace}; libraries: {', '.join(f'{k} {v}' for k, v in platform.libraries)}"


def check_identity_stable(suite: SuiteContext) -> Outcome:
    """Compare candidate identities listed now, at planning, and by a fresh process."""
    specs = recreate_specs(suite.backend, suite.spec)
    if not specs:
        return (
            SKIPPED,
            "the backend's class cannot be imported by a fresh process (defined in __main__ or a function)",
        )
    pairs = sorted({(c.problem.key, c.kind) for c in suite.cases})
    here: dict[str, Any] = {}
    for key, kind in pairs:
        here[f"{key}@{kind}"] = suite.offered_now(Problem.from_key(key), kind)
    with tempfile.TemporaryDirectory(prefix="unimatmul-conformance-") as tmp:
        output = Path(tmp) / "identities.json"
        request = {
            "specs": specs,
            "device": {"kind": suite.target.device.kind, "index": suite.target.device.index},
            "pairs": [list(p) for p in pairs],
            "output": str(output),
        }
        env = dict(os.environ)
        # The fresh process must import what this one can (tests put paths on sys.path).
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "unimatmul_conformance.identities"],
                input=json.dumps(request),
                capture_output=True,
                text=True,
                env=env,
                timeout=600,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return FAILED, "the fresh process listing candidates did not finish in 600 s"
        if proc.returncode != 0 or not output.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return (
                FAILED,
                f"the fresh process listing candidates failed (exit {proc.returncode}): {' | '.join(tail)}",
            )
        answer = json.loads(output.read_text(encoding="utf-8"))
    if "error" in answer:
        return SKIPPED, f"a fresh process cannot re-create the backend: {answer['error']}"
    there: dict[str, Any] = answer["lists"]
    diffs = []
    compared = 0
    for label, mine in here.items():
        planned = suite.offered_planned(label)
        theirs = there.get(label, {})
        if isinstance(mine, Exception) and not isinstance(mine, UnsupportedProblem):
            continue  # a crash is the candidates check's finding, not this one's
        if isinstance(mine, UnsupportedProblem):
            if "unsupported" not in theirs:
                diffs.append(f"{label}: unsupported here, {theirs} in a fresh process")
            continue
        ids = [c.identity for c in mine]
        compared += 1
        if planned is not None and planned != ids:
            diffs.append(f"{label}: listed {planned} first and {ids} when asked again in the same process")
        if "ok" not in theirs:
            diffs.append(f"{label}: {ids} here, {theirs} in a fresh process")
        elif set(theirs["ok"]) != set(ids):
            only_here = sorted(set(ids) - set(theirs["ok"]))
            only_there = sorted(set(theirs["ok"]) - set(ids))
            diffs.append(f"{label}: only here {only_here}, only in a fresh process {only_there}")
    if diffs:
        return FAILED, f"{len(diffs)} problems list different identities: {_listing(diffs, 2)}"
    return PASSED, f"same identities in a fresh process for {compared} problems"


def _record_changes(sent: TuningRecord, got: TuningRecord) -> str:
    """What a store changed in a record, ignoring numbers a store may keep compactly."""
    if got.problem != sent.problem:
        return f"the problem became {got.problem!r}"
    if got.winner != sent.winner:
        return f"the winner {sent.winner!r} became {got.winner!r}"
    sent_ids = [(r.identity, r.status) for r in sent.results]
    got_ids = [(r.identity, r.status) for r in got.results]
    if got_ids != sent_ids:
        return f"the candidates {sent_ids} became {got_ids}"
    if got.versions != sent.versions:
        return f"the versions {sent.versions} became {got.versions}"
    if not math.isclose(got.winner_s, sent.winner_s, rel_tol=1e-3):
        return f"the winner's time {sent.winner_s} became {got.winner_s}"
    return ""


def check_cache_roundtrip(suite: SuiteContext) -> Outcome:
    """Records naming every offered candidate go through the store and back to a kernel."""
    backend = suite.backend
    try:
        namespace = detect_platform(suite.target, [backend]).namespace
        versions = backend.versions()
    except Exception as exc:
        return FAILED, f"cannot build the Platform: {_exc(exc)}"
    chosen: dict[str, tuple[Case, list[Candidate]]] = {}
    for case in suite.cases:
        offered = suite.offered(case)
        if isinstance(offered, list) and offered:
            chosen.setdefault(case.problem.key, (case, offered))
    if not chosen:
        return SKIPPED, "the backend offered no candidate for any problem"
    problems: list[str] = []
    records: dict[str, TuningRecord] = {}
    for i, (key, (_, offered)) in enumerate(chosen.items()):
        records[key] = TuningRecord(
            problem=key,
            winner=offered[-1].identity,
            winner_s=1e-6 * (i + 1),
            default_s=2e-6 * (i + 1),
            results=[
                CandidateResult(c.identity, OK, 1e-6 * (i + j + 1), 5, 1e-7) for j, c in enumerate(offered)
            ],
            versions=dict(versions),
            tuned_at=time.time(),
            tune_s=0.5,
            settings={"writer": "unimatmul-conformance"},
            writer="unimatmul-conformance",
        )
    with tempfile.TemporaryDirectory(prefix="unimatmul-conformance-") as tmp:
        path = Path(tmp) / "cache.msgpack"
        store = open_store(path)
        put_many = getattr(store, "put_many", None)  # one file write instead of one per record
        if callable(put_many):
            put_many({(namespace, key): record for key, record in records.items()})
        else:
            for key, record in records.items():
                store.put(namespace, key, record)
        fresh = open_store(path)  # a new reader: what another process would see
        for key, (case, offered) in chosen.items():
            got = fresh.get(namespace, key)
            if got is None:
                problems.append(f"{key}: not found after a round trip through {path.name}")
                continue
            changed = _record_changes(records[key], got)
            if changed:
                problems.append(f"{key}: through the store, {changed}")
            problem = Problem.from_key(got.problem)
            if problem != case.problem:
                problems.append(f"{key}: Problem.from_key gives {problem!r}")
            target = suite.targets[case.kind]
            for result in got.results:
                candidate = Candidate.from_identity(result.identity)
                if candidate not in offered:
                    problems.append(
                        f"{key}: {result.identity} parses to {candidate!r}, not an offered candidate"
                    )
                    continue
                try:
                    if backend.check(problem, candidate, target) is not True:
                        problems.append(f"{key}: check() rejects the stored {result.identity}")
                except Exception as exc:
                    problems.append(f"{key}: check({result.identity}) raised {_exc(exc)}")
            winner = Candidate.from_identity(got.winner)
            try:
                runner = backend.prepare(problem, winner, target)
                if getattr(runner, "candidate", None) != winner:
                    problems.append(
                        f"{key}: the runner of {got.winner} says it is {getattr(runner, 'candidate', None)}"
                    )
                close_runner(runner)
            except Exception as exc:
                problems.append(f"{key}: prepare() of the stored winner {got.winner} raised {_exc(exc)}")
    if problems:
        return FAILED, f"{len(problems)} problems: {_listing(problems, 3)}"
    return PASSED, f"{len(records)} records through the msgpack store and back to their kernels"


# --- one problem -------------------------------------------------------------------


def check_candidates(suite: SuiteContext, case: Case) -> Outcome:
    offered = suite.offered(case)
    if isinstance(offered, UnsupportedProblem):
        return PASSED, f"unsupported: {offered}"
    if isinstance(offered, Exception):
        return FAILED, (
            f"candidates() raised {_exc(offered)}; a problem the backend cannot run must raise "
            f"UnsupportedProblem"
        )
    backend = suite.backend
    target = suite.targets[case.kind]
    problems = []
    if Problem.from_key(case.problem.key) != case.problem:
        problems.append("the problem's key does not parse back to the same Problem")
    seen: set[str] = set()
    for candidate in offered:
        if not isinstance(candidate, Candidate):
            problems.append(f"{candidate!r} is not a Candidate")
            continue
        identity = candidate.identity
        if candidate.backend != backend.name:
            problems.append(f"{identity}: its backend is {candidate.backend!r}, not {backend.name!r}")
        if identity in seen:
            problems.append(f"{identity} is offered twice")
        seen.add(identity)
        try:
            parsed = Candidate.from_identity(identity)
        except ValueError as exc:
            problems.append(f"{identity} does not parse: {exc}")
            continue
        if parsed != candidate or parsed.identity != identity:
            problems.append(f"{identity} parses back to {parsed!r}, not {candidate!r}")
            continue
        try:
            if backend.check(case.problem, parsed, target) is not True:
                problems.append(f"check() rejects {identity}, which candidates() offers")
        except Exception as exc:
            problems.append(f"check({identity}) raised {_exc(exc)}")
    if problems:
        return FAILED, _listing(problems)
    if not offered:
        return PASSED, "no candidates offered"
    return PASSED, f"{len(offered)} candidates: {_listing([c.identity for c in offered])}"


def check_unsupported(suite: SuiteContext, case: Case) -> Outcome:
    """prepare() of candidates never offered for this problem says "unsupported"."""
    backend = suite.backend
    target = suite.targets[case.kind]
    problems = []
    strangers = [
        Candidate(backend.name, "conformance-no-such-kernel", (("variant", 7),)),
        Candidate("conformance-foreign", "kernel"),
    ]
    for candidate in strangers:
        try:
            runner = backend.prepare(case.problem, candidate, target)
        except UnsupportedProblem:
            continue
        except Exception as exc:
            problems.append(f"prepare({candidate.identity}) raised {_exc(exc)} instead of UnsupportedProblem")
            continue
        close_runner(runner)
        problems.append(f"prepare({candidate.identity}) returned a runner for a kernel it never offered")
    try:
        if backend.check(case.problem, strangers[0], target) is not False:
            problems.append(f"check({strangers[0].identity}) did not return False")
    except Exception as exc:
        problems.append(f"check({strangers[0].identity}) raised {_exc(exc)}")
    # Candidates of another problem (as a stale cache entry would name them) may run
    # here or be refused, but not crash.
    for candidate in suite.other_candidates(case):
        try:
            close_runner(backend.prepare(case.problem, candidate, target))
        except UnsupportedProblem:
            pass
        except Exception as exc:
            problems.append(
                f"prepare({candidate.identity}) of another problem's candidate raised {_exc(exc)}"
            )
    if problems:
        return FAILED, _listing(problems)
    return PASSED, "candidates never offered were refused with UnsupportedProblem"


# --- one candidate on one problem --------------------------------------------------


def execute(suite: SuiteContext, case: Case, candidate: Candidate) -> dict[str, Outcome]:
    """Run one candidate once on a guarded, poisoned output; answers the RUN checks."""
    problem = case.problem
    target = suite.targets[case.kind]
    adapter, device = target.adapter, target.device
    try:
        runner = suite.backend.prepare(problem, candidate, target)
    except Exception as exc:
        why = (
            f"{candidate.identity} is offered for this problem, but prepare() says unsupported: {exc}"
            if isinstance(exc, UnsupportedProblem)
            else f"prepare() raised {_exc(exc)}"
        )
        return {PREPARE: (FAILED, why)} | {name: (SKIPPED, "not run: prepare() failed") for name in RUN[1:]}
    outcomes: dict[str, Outcome] = {}
    own = getattr(runner, "candidate", None)
    outcomes[PREPARE] = (
        (PASSED, f"prepared {candidate.identity}")
        if own == candidate
        else (FAILED, f"the runner's candidate is {own!r}, not {candidate.identity}")
    )
    try:
        data = suite.case_data(case)
        out = guarded_output(problem, adapter, device)
        beta_given = case.beta != 0.0
        out.arm(data.c if beta_given else None)
        before = host_bits(adapter, out.view, problem.dtype_c) if beta_given else None
        raised: BaseException | None = None
        try:
            data.run(runner, out.view, case.alpha, case.beta)
            adapter.synchronize(device)
        except Exception as exc:
            raised = exc
        after = host_bits(adapter, out.view, problem.dtype_c)
        out64 = host64(adapter, out.view)
    finally:
        close_runner(runner)
    if before is None:
        unwritten = after == POISON[problem.dtype_c]
        how = "still hold the poison"
    else:
        # With beta != 0 the output starts as C; an element still bit-equal to C where
        # the result must differ from C was never written.
        must_change = ~(np.abs(data.reference - data.c64) <= data.bound)
        unwritten = (after == before) & must_change
        how = "still hold C's initial value where the result differs"
    if raised is not None:
        outcomes[RESULT] = (FAILED, f"the runner raised {_exc(raised)}")
        outcomes[WRITTEN] = (SKIPPED, "the runner raised")
    else:
        count = int(unwritten.sum())
        if count:
            first = tuple(int(x) for x in np.argwhere(unwritten)[0])
            outcomes[WRITTEN] = (FAILED, f"{count} of {unwritten.size} elements {how} (first at {first})")
        else:
            outcomes[WRITTEN] = (PASSED, f"all {unwritten.size} elements written")
        if count == unwritten.size:
            outcomes[RESULT] = (SKIPPED, "no element was written (see the written check)")
        else:
            cmp = compare(out64, data, ~unwritten)
            tol = data.tolerance
            if cmp.ok(tol):
                outcomes[RESULT] = (PASSED, f"relative error {cmp.rel_error:.2e} <= {tol:.0e}")
            else:
                bad = (
                    f"; {cmp.bad_elements} elements outside their bound, {cmp.worst}"
                    if cmp.bad_elements
                    else ""
                )
                outcomes[RESULT] = (FAILED, f"relative error {cmp.rel_error:.3g} (tolerance {tol:.0e}){bad}")
    damage = out.damaged()
    changed = data.inputs_changed(adapter)
    if changed:
        suite.forget_case_data(case)  # later candidates must not see the damage
    if damage or changed:
        parts = []
        if damage:
            parts.append("canaries around the output changed: " + "; ".join(damage))
        if changed:
            parts.append(f"inputs changed: {', '.join(changed)}")
        outcomes[GUARD] = (FAILED, " / ".join(parts))
    else:
        outcomes[GUARD] = (PASSED, "nothing outside the output was written; inputs unchanged")
    return outcomes


def check_threads(
    suite: SuiteContext, case: Case, candidate: Candidate, threads: int = 4, calls: int = 6
) -> Outcome:
    """One runner, several threads, separate outputs: every call's result is right."""
    problem = case.problem
    target = suite.targets[case.kind]
    adapter, device = target.adapter, target.device
    try:
        runner = suite.backend.prepare(problem, candidate, target)
    except Exception as exc:
        return FAILED, f"prepare() raised {_exc(exc)}"
    try:
        datas = [
            make_case_data(problem, case.alpha, case.beta, adapter, device, suite.seed + 101 + i)
            for i in range(threads)
        ]
        outs = [guarded_output(problem, adapter, device) for _ in range(threads)]
        barrier = threading.Barrier(threads)
        errors: list[str] = []

        def work(i: int) -> None:
            data, out = datas[i], outs[i]
            try:
                barrier.wait(timeout=60)
                for call in range(calls):
                    out.arm(data.c if case.beta != 0.0 else None)
                    data.run(runner, out.view, case.alpha, case.beta)
                    adapter.synchronize(device)
                    got = host64(adapter, out.view)
                    cmp = compare(got, data, np.ones(got.shape, dtype=bool))
                    if not cmp.ok(data.tolerance):
                        errors.append(
                            f"thread {i} call {call}: relative error {cmp.rel_error:.3g}, "
                            f"{cmp.bad_elements} elements wrong"
                        )
            except Exception as exc:
                errors.append(f"thread {i}: {_exc(exc)}")

        workers = [threading.Thread(target=work, args=(i,), name=f"conformance-{i}") for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        close_runner(runner)
    if errors:
        return (
            FAILED,
            f"{len(errors)} of {threads * calls} concurrent calls went wrong: {_listing(errors, 2)}",
        )
    return PASSED, f"{threads} threads x {calls} calls on one runner, all correct"
