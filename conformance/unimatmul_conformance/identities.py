"""Candidate lists from a fresh process, to check that identities are stable.

``python -m unimatmul_conformance.identities`` reads a request on stdin (JSON: the
backend's specs to try, the device, and ``[problem key, array kind]`` pairs) and
writes, for each pair, the candidate identities, or the "unsupported" answer, or
the error, as JSON to the request's ``output`` file (stdout is the backend's to use).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from unimatmul.backend import Backend, Target
from unimatmul.core.arrays import Device, adapter_for_kind
from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.problem import Problem
from unimatmul_conformance.loading import BackendNotFound, load_backend


def list_candidates(backend: Backend, device: Device, pairs: list[list[str]]) -> dict[str, Any]:
    """``{key@kind: {"ok": [identity, ...]} | {"unsupported": why} | {"error": why}}``."""
    out: dict[str, Any] = {}
    targets: dict[str, Target] = {}
    for key, kind in pairs:
        label = f"{key}@{kind}"
        try:
            target = targets.get(kind) or targets.setdefault(kind, Target(adapter_for_kind(kind), device))
            found = backend.candidates(Problem.from_key(key), target)
            out[label] = {"ok": [c.identity for c in found]}
        except UnsupportedProblem as exc:
            out[label] = {"unsupported": str(exc)}
        except Exception as exc:
            out[label] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def main() -> int:
    request = json.load(sys.stdin)
    errors = []
    backend = None
    for spec in request["specs"]:
        try:
            backend = load_backend(spec)
            break
        except BackendNotFound as exc:
            errors.append(str(exc))
    if backend is None:
        answer: dict[str, Any] = {"error": "; ".join(errors) or "no way to find the backend"}
    else:
        device = Device(request["device"]["kind"], int(request["device"]["index"]))
        answer = {"backend": backend.name, "lists": list_candidates(backend, device, request["pairs"])}
    with open(request["output"], "w", encoding="utf-8") as fh:
        json.dump(answer, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
