"""Input files (a TunableOp CSV, a record file) are regular files within a size limit, read
line by line: /dev/zero, a FIFO, a folder and a huge file are refused with exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from unimatmul.cli import main
from unimatmul.cli.output import EXIT_USAGE
from unimatmul.core.text_input import MAX_INPUT_BYTES, InputFileError, text_lines
from unimatmul.interop.tunableop import parse

COMMANDS = [
    ["cache", "import", "tunableop", "{file}", "--namespace", "test/ns", "--cache", "{cache}"],
    ["tune", "--from", "{file}", "--cache", "{cache}"],
]


def _run(command: list[str], file: Path | str, cache: Path) -> list[str]:
    return [part.format(file=file, cache=cache) for part in command]


def _million_row_csv(path: Path) -> None:
    with path.open("w") as fh:
        fh.write("Validator,PT_VERSION,2.6.0\n")
        for i in range(1_000_000):
            m, n = 1 + i % 997, 1 + i // 997
            fh.write(
                f"GemmTunableOp_float_NN,nn_{m}_{n}_64_ld_{m}_64_{m},Gemm_Cublaslt_{i % 50},0.0{i % 9 + 1}\n"
            )


@pytest.mark.parametrize("command", COMMANDS, ids=["import", "tune-from"])
def test_dev_zero_is_refused_not_read(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if command[0] == "tune":
        monkeypatch.setenv("UNIMATMUL_CACHE", str(tmp_path / "c.msgpack"))
        command = command[:3]
    assert main(_run(command, "/dev/zero", tmp_path / "c.msgpack")) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "/dev/zero: a device, not a regular file" in err and "Traceback" not in err
    assert not (tmp_path / "c.msgpack").exists()


@pytest.mark.parametrize("command", COMMANDS, ids=["import", "tune-from"])
def test_a_fifo_is_refused_without_waiting_for_a_writer(command: list[str], tmp_path: Path) -> None:
    fifo = tmp_path / "results.csv"
    os.mkfifo(fifo)
    args = _run(command[:3] if command[0] == "tune" else command, fifo, tmp_path / "c.msgpack")
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    env["UNIMATMUL_CACHE"] = str(tmp_path / "c.msgpack")
    done = subprocess.run(
        [sys.executable, "-m", "unimatmul", *args],
        capture_output=True,
        text=True,
        timeout=120,  # opening a FIFO for reading blocks until a writer comes: never here
        env=env,
        check=False,
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "a FIFO, not a regular file" in done.stderr and "Traceback" not in done.stderr


def test_a_million_row_csv_is_refused_by_its_size_before_it_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "tunableop_results0.csv"
    _million_row_csv(big)
    size = big.stat().st_size
    assert size > MAX_INPUT_BYTES
    command = COMMANDS[0]
    assert main(_run(command, big, tmp_path / "c.msgpack")) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{size} bytes, over the {MAX_INPUT_BYTES} byte limit of a TunableOp file" in err
    assert not (tmp_path / "c.msgpack").exists()


def test_a_folder_and_a_file_that_grows_past_the_limit_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="a folder, not a regular file"):
        parse(tmp_path)
    path = tmp_path / "rows.csv"
    path.write_text("Validator,PT_VERSION,2.6.0\n" * 10)
    lines = text_lines(path, "a TunableOp file", limit=400)
    assert next(lines) == "Validator,PT_VERSION,2.6.0"
    with path.open("a") as fh:  # written to while it is read
        fh.write("Validator,PT_VERSION,2.6.0\n" * 100)
    with pytest.raises(InputFileError, match="grew past the 400 byte limit"):
        list(lines)


def test_lines_are_read_as_they_are_parsed(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    rows = [f"GemmTunableOp_float_NN,nn_{m}_8_8_ld_{m}_8_{m},Default,0.01" for m in range(1, 2001)]
    path.write_text("Validator,PT_VERSION,2.6.0\r\n" + "\n".join(rows) + "\n")
    parsed = parse(path)
    assert parsed.validators["PT_VERSION"] == "2.6.0" and len(parsed.gemms) == 2000
    assert [g.line_no for g in parsed.gemms[:2]] == [2, 3]
    with pytest.raises(InputFileError, match="a line longer than"):
        path.write_bytes(b"x" * (2 << 20))
        list(text_lines(path, "a TunableOp file"))
