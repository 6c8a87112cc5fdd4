"""unimatmul.grouped_matmul: torch._grouped_mm's semantics for each form, its errors, real tuning."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from grouped_cases import close, offs_of, operands, reference  # noqa: E402

import unimatmul  # noqa: E402
from unimatmul.cache.record import OK, PRUNED  # noqa: E402
from unimatmul.core._backend import DEFAULT, Target  # noqa: E402
from unimatmul.core.arrays import CPU, adapter_for_kind  # noqa: E402
from unimatmul.core.grouped import grouped_problem_of  # noqa: E402
from unimatmul.core.problem import Problem  # noqa: E402
from unimatmul.tuning.selector import get_selector  # noqa: E402

ADAPTER = adapter_for_kind("torch")
# Group sizes along the jagged dimension: skewed with an empty group, one group holding
# every row, all empty but one at the end, and odd group starts.
SIZES = {
    "skewed": [13, 0, 7, 4],
    "one": [0, 24, 0, 0],
    "last": [0, 0, 0, 24],
    "odd": [1, 3, 5, 15],
}
FORMS = ["m", "k", "n", "none"]


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("sizes", list(SIZES), ids=list(SIZES))
@pytest.mark.parametrize("jagged", FORMS)
def test_each_form_computes_what_torch_grouped_mm_computes(
    isolated: Any, jagged: str, sizes: str, dtype: str
) -> None:
    a, b, offs = operands(jagged, SIZES[sizes], dtype)
    out = unimatmul.grouped_matmul(a, b, offs)
    want = torch._grouped_mm(a, b, offs)
    assert out.shape == want.shape and out.dtype == want.dtype
    ref = reference(jagged, a, b, offs)
    assert close(out, ref, dtype)
    covered = ~torch.isnan(ref)
    assert torch.equal(out[covered], want[covered])  # Default is torch's own kernel


def test_rows_past_the_last_offset_are_left_as_torch_leaves_them(isolated: Any) -> None:
    a, b, _ = operands("m", [8, 8, 8, 8], extent=40)
    offs = offs_of([8, 0, 20, 4])  # offs[-1] = 32 < 40 rows
    out = unimatmul.grouped_matmul(a, b, offs)
    assert out.shape == (40, 32)
    assert close(out, reference("m", a, b, offs), "bf16")


def test_out_is_written_in_place_and_an_overlapping_out_gets_torchs_result(isolated: Any) -> None:
    a, b, offs = operands("m", SIZES["skewed"])
    out = torch.full((24, 32), float("nan"), dtype=torch.bfloat16)
    assert unimatmul.grouped_matmul(a, b, offs, out=out) is out
    assert close(out, reference("m", a, b, offs), "bf16")
    # 3-D x 3-D with out = a (square groups): torch computes, then writes into a
    x = torch.randn(3, 16, 16).to(torch.bfloat16)
    y = torch.randn(3, 16, 16).to(torch.bfloat16)
    want = torch._grouped_mm(x, y)
    assert unimatmul.grouped_matmul(x, y, out=x) is x
    assert torch.equal(x, want)


def test_f_grouped_mm_and_the_door_agree(isolated: Any) -> None:
    a, b, offs = operands("m", SIZES["odd"])
    assert torch.equal(unimatmul.grouped_matmul(a, b, offs), torch.nn.functional.grouped_mm(a, b, offs=offs))


def _bf(*shape: int) -> Any:
    return torch.randn(*shape).to(torch.bfloat16)


BAD = [
    ("int64 offs", lambda: (_bf(16, 16), _bf(2, 16, 16), torch.tensor([8, 16])), {}, "int32"),
    ("no offs", lambda: (_bf(16, 16), _bf(2, 16, 16), None), {}, "offset"),
    ("offs for 3d x 3d", lambda: (_bf(2, 16, 16), _bf(2, 16, 16), offs_of([8, 8])), {}, "offset"),
    ("2-D offs", lambda: (_bf(16, 16), _bf(2, 16, 16), offs_of([8, 8]).view(1, 2)), {}, "1D"),
    ("group count", lambda: (_bf(16, 16), _bf(3, 16, 16), offs_of([8, 8])), {}, "batch sizes"),
    ("contraction", lambda: (_bf(16, 16), _bf(2, 24, 16), offs_of([8, 8])), {}, "contraction"),
    ("1-D a", lambda: (_bf(16), _bf(2, 16, 16), offs_of([8, 8])), {}, "2 or 3d"),
    (
        "f64",
        lambda: (_bf(16, 16).double(), _bf(2, 16, 16).double(), offs_of([8, 8])),
        {},
        "float32, bfloat16",
    ),
    ("mixed dtypes", lambda: (_bf(16, 16), _bf(2, 16, 16).float(), offs_of([8, 8])), {}, "same dtype"),
    ("unaligned stride", lambda: (_bf(16, 12), _bf(2, 12, 16), offs_of([8, 8])), {}, "16 bytes"),
    ("no unit stride", lambda: (_bf(16, 32)[:, ::2], _bf(2, 16, 16), offs_of([8, 8])), {}, "strides"),
    ("bias", lambda: (_bf(16, 16), _bf(2, 16, 16), offs_of([8, 8])), {"bias": _bf(2, 16)}, "bias"),
    (
        "out_dtype",
        lambda: (_bf(16, 16), _bf(2, 16, 16), offs_of([8, 8])),
        {"out_dtype": torch.float32},
        "dtype",
    ),
    ("batch", lambda: (_bf(3, 16, 16), _bf(2, 16, 16), None), {}, "batched dimension"),
]


@pytest.mark.parametrize(("make", "kwargs", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_fails_as_torch_fails_it(
    isolated: Any, make: Any, kwargs: dict[str, Any], message: str
) -> None:
    a, b, offs = make()
    with pytest.raises(RuntimeError):  # torch's own refusal of the same call
        torch._grouped_mm(a, b, offs, **kwargs)
    with pytest.raises(RuntimeError, match=message) as caught:
        unimatmul.grouped_matmul(a, b, offs, **kwargs)
    assert "grouped_matmul" in str(caught.value)


def test_numpy_arrays_are_refused_by_name(isolated: Any) -> None:
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match="torch tensors"):
        unimatmul.grouped_matmul(np.ones((4, 4), np.float32), np.ones((1, 4, 4), np.float32), None)


def test_empty_operands_give_torchs_empty_result(isolated: Any) -> None:
    a, b = _bf(0, 16), _bf(2, 16, 16)
    offs = offs_of([0, 0])
    out = unimatmul.grouped_matmul(a, b, offs)
    assert out.shape == torch._grouped_mm(a, b, offs).shape == (0, 16)


@pytest.mark.parametrize("jagged", FORMS)
def test_tune_mode_measures_default_and_the_loop_and_stores_one_grouped_record(
    isolated: Any, jagged: str
) -> None:
    a, b, offs = operands(jagged, SIZES["skewed"])
    with unimatmul.mode("tune"):
        out = unimatmul.grouped_matmul(a, b, offs)
    assert close(out, reference(jagged, a, b, offs), "bf16")
    records = [r for _, _, r in isolated.selector.store.items(None)]
    assert len(records) == 1
    problem = Problem.from_key(records[0].problem)
    assert problem.op == "grouped_gemm" and problem.jagged == jagged and problem.batch == 4
    by_id = {r.identity: r for r in records[0].results}
    assert {DEFAULT.identity, "grouped_loop/dense"} <= set(by_id)
    for result in by_id.values():  # both passed the check on every distribution of offs
        assert result.status in (OK, PRUNED), result
        assert result.error is not None and result.error < 2e-2


def test_a_tuned_choice_serves_every_offs_and_every_row_count_of_its_bucket(isolated: Any) -> None:
    a, b, offs = operands("m", [30, 0, 20, 10])  # 60 rows: the bucket of 33..64 rows
    with unimatmul.mode("tune"):
        unimatmul.grouped_matmul(a, b, offs)
    assert isolated.store_count() == 1
    target = Target(ADAPTER, CPU)
    with unimatmul.mode("cached"):
        for sizes in ([15, 15, 15, 15], [0, 60, 0, 0], [1, 2, 3, 34]):
            for rows in (40, 64):
                a2, b2, offs2 = operands("m", sizes, extent=rows, seed=rows)
                problem = grouped_problem_of(ADAPTER, a2, b2, offs2)
                decision = get_selector().decide(problem, target, "cached")
                assert decision.source == "cache", (sizes, rows, decision.source)
                assert close(unimatmul.grouped_matmul(a2, b2, offs2), reference("m", a2, b2, offs2), "bf16")
    assert isolated.store_count() == 1  # nothing tuned again


def test_record_mode_then_tune_from_then_tunableop_export_carry_grouped_problems(
    isolated: Any, tmp_path: Any, monkeypatch: Any
) -> None:
    import io

    from unimatmul.cli import main
    from unimatmul.tuning.record_mode import read_problems

    record_file = tmp_path / "recorded.jsonl"
    monkeypatch.setenv("UNIMATMUL_RECORD_FILE", str(record_file))
    a, b, offs = operands("m", SIZES["skewed"])
    x, w, offs_k = operands("k", SIZES["odd"])
    with unimatmul.mode("record"):
        out = unimatmul.grouped_matmul(a, b, offs)
        unimatmul.grouped_matmul(x, w, offs_k)
    assert close(out, reference("m", a, b, offs), "bf16")  # a recorded call still computes
    recorded = read_problems(record_file).problems
    assert sorted(item.problem.jagged for item in recorded) == ["k", "m"]
    assert {item.problem for item in recorded} == {
        grouped_problem_of(ADAPTER, a, b, offs),
        grouped_problem_of(ADAPTER, x, w, offs_k),
    }
    assert isolated.store_count() == 0

    said = io.StringIO()
    assert main(["tune", "--from", str(record_file), "--device", "cpu"], out=said) == 0, said.getvalue()
    keys = {key for _, key, _ in isolated.selector.store.items(None)}
    assert keys == {item.problem.key for item in recorded}

    said = io.StringIO()
    csv = tmp_path / "tunableop.csv"
    assert main(["cache", "export", "--format", "tunableop", "-o", str(csv)], out=said) == 0
    assert "2 x grouped GEMMs (torch._grouped_mm) have no TunableOp op" in said.getvalue()
    assert "GroupedGemm" not in csv.read_text() and "grouped" not in csv.read_text()


@pytest.mark.parametrize("behaviour", ["skips_empty", "correct"])
def test_a_grouped_entry_from_elsewhere_is_checked_on_its_first_call(
    isolated: Any, registered: Any, behaviour: str
) -> None:
    import warnings

    from grouped_cases import GroupedFake

    from unimatmul.cache.record import TuningRecord, mark_from_elsewhere
    from unimatmul.tuning import confirm

    fake = GroupedFake(behaviour)
    a, b, offs = operands("m", SIZES["skewed"])
    problem = grouped_problem_of(ADAPTER, a, b, offs)
    target = Target(ADAPTER, CPU)
    platform = isolated.selector.platform(target)
    winner = f"{fake.name}/kernel"
    verdict = {"verdict": "confirmed", "kernel": winner, "kernel_s": 1e-6, "default_s": 2e-6}
    record = TuningRecord(
        problem.key, winner, 1e-6, 2e-6, versions=dict(platform.versions), settings={confirm.KEY: verdict}
    )
    with registered(isolated.plugins, fake):
        isolated.selector.store.put(platform.namespace, problem.key, mark_from_elsewhere(record, "merge"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = unimatmul.grouped_matmul(a, b, offs)
            again = unimatmul.grouped_matmul(a, b, offs)
    assert close(out, reference("m", a, b, offs), "bf16") and close(again, reference("m", a, b, offs), "bf16")
    wrong = [w for w in caught if "wrong result" in str(w.message)]
    if behaviour == "correct":
        assert not wrong and fake.calls == 2  # checked once, then served as it is
    else:
        assert len(wrong) == 1 and fake.calls == 1  # caught on the first call; Default after


def test_defaults_turns_in_a_window_return_torchs_own_output_not_a_copy(
    isolated: Any, registered: Any, monkeypatch: Any
) -> None:
    """A tie (a kernel the harness found no slower than Default) runs in a confirmation
    window, whose calls take turns of it and Default. Default's turns return the output
    torch._grouped_mm made, not a copy of it into a buffer the door allocated (a copy of
    the whole output that a plain torch call does not pay), and every call is right."""
    from grouped_cases import GroupedFake, check_window_turns, tie_record

    from unimatmul.tuning.confirm import tie_of

    made: list[Any] = []
    real = torch._grouped_mm

    def spied(*args: Any, **kwargs: Any) -> Any:  # torch's own call, its outputs remembered
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(torch, "_grouped_mm", spied)
    fake = GroupedFake("correct")
    a, b, offs = operands("m", SIZES["skewed"])
    problem = grouped_problem_of(ADAPTER, a, b, offs)
    platform = isolated.selector.platform(Target(ADAPTER, CPU))
    kernel = f"{fake.name}/kernel"
    record = tie_record(problem, kernel, platform.versions)
    assert tie_of(record) == kernel
    isolated.selector.confirm_calls = 8
    with registered(isolated.plugins, fake):
        isolated.selector.store.put(platform.namespace, problem.key, record)
        check_window_turns(
            lambda: unimatmul.grouped_matmul(a, b, offs), fake, made, reference("m", a, b, offs)
        )
