"""Flag and size parsing of python -m pycoll.bench (no processes)."""
import pytest

from pycoll.bench.options import (
    default_iterations,
    format_size,
    message_sizes,
    parse_args,
    parse_message_range,
    parse_size,
)

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("text,value", [
    ("8", 8), ("4K", 4096), ("4k", 4096), ("4KB", 4096), ("4KiB", 4096), ("512M", 512 << 20),
    ("1G", 1 << 30), ("16MiB", 16 << 20), (" 2 ", 2), ("0", 0), ("1T", 1 << 40), ("3B", 3),
])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "K", "1.5M", "-4", "4X", "M4", "4 M B"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_message_range_osu_forms():
    assert parse_message_range("512M", 1, 1 << 20) == (1, 512 << 20)
    assert parse_message_range("4K:1M", 1, 1 << 20) == (4096, 1 << 20)
    assert parse_message_range("2:", 1, 128) == (2, 128)
    assert parse_message_range(":64", 4, 128) == (4, 64)
    with pytest.raises(ValueError):
        parse_message_range("1M:4K", 1, 1 << 20)


def test_message_sizes_double():
    assert message_sizes(1, 16) == [1, 2, 4, 8, 16]
    assert message_sizes(0, 4) == [0, 1, 2, 4]
    assert message_sizes(8, 20) == [8, 16]
    assert message_sizes(8, 512 << 20)[-1] == 512 << 20
    assert len(message_sizes(8, 512 << 20)) == 27


def test_format_size():
    assert format_size(8) == "8B"
    assert format_size(4096) == "4KiB"
    assert format_size(512 << 20) == "512MiB"
    assert format_size(3000) == "3000B"


def test_osu_iteration_defaults():
    # OMB 7.4: LARGE_MESSAGE_SIZE 8192; collectives 1000/100 then 100/10
    assert default_iterations("allreduce", 8192) == (1000, 100)
    assert default_iterations("allreduce", 8193) == (100, 10)
    assert default_iterations("broadcast", 1) == (1000, 100)
    assert default_iterations("latency", 8) == (10000, 100)
    assert default_iterations("latency", 1 << 20) == (1000, 10)
    assert default_iterations("bw", 8) == (100, 10)
    assert default_iterations("bw", 1 << 20) == (20, 2)


def test_parse_args_defaults():
    o = parse_args(["allreduce"])
    assert (o.collective, o.min_size, o.max_size) == ("allreduce", 1, 1 << 20)
    assert o.dtypes == ["float32"] and o.ops == ["sum"] and o.nprocs == 2
    assert not o.validate and not o.full and o.fmt == "osu" and o.timing == "osu"
    assert o.iterations_for(4) == (1000, 100) and o.iterations_for(1 << 20) == (100, 10)
    o = parse_args(["latency"])
    assert (o.min_size, o.max_size) == (0, 4 << 20)


def test_parse_args_flags():
    o = parse_args(["bcast", "-m", "4K:512M", "-i", "7", "-x", "0", "-f", "-c", "-T", "mpi_int",
                    "-k", "fixed:1", "-n", "4", "--algo", "ring", "--transport", "tcp",
                    "-d", "cpu", "--json", "a.json", "--csv", "a.csv", "--plot", "a.png",
                    "--format", "nccl", "--timing", "nccl"])
    assert o.collective == "broadcast"
    assert (o.min_size, o.max_size) == (4096, 512 << 20)
    assert o.iterations_for(1) == (7, 0) and o.iterations_for(1 << 20) == (7, 0)
    assert o.full and o.validate and o.dtypes == ["int32"]
    assert (o.root_mode, o.root, o.nprocs, o.algo, o.transport) == ("fixed", 1, 4, "ring", "tcp")
    assert (o.json, o.csv, o.plot, o.fmt, o.timing) == ("a.json", "a.csv", "a.png", "nccl", "nccl")
    o = parse_args(["gather", "-k", "rotate", "-T", "all", "-o", "all"])
    assert o.root_mode == "rotate"
    assert o.dtypes == ["int8", "int32", "float32"]
    assert o.ops == ["sum", "prod", "min", "max", "avg"]
    o = parse_args(["allreduce", "-k", "3", "-o", "MAX", "-T", "double"])
    assert (o.root, o.ops, o.dtypes) == (3, ["max"], ["float64"])


@pytest.mark.parametrize("argv", [
    ["frobnicate"], ["allreduce", "-m", "12Q"], ["allreduce", "-m", "1M:4K"],
    ["allreduce", "-T", "complex128"], ["allreduce", "-o", "xor"], ["allreduce", "-k", "x"],
    ["allreduce", "-i", "0"], ["allreduce", "-n", "0"], ["allreduce", "--bogus"],
    ["allreduce", "-d", "tpu"], [],
])
def test_parse_args_errors_exit_2_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_corrupt_rank_from_env(monkeypatch):
    monkeypatch.setenv("PYCOLL_BENCH_CORRUPT_RANK", "1")
    assert parse_args(["allreduce"]).corrupt_rank == 1
    assert parse_args(["allreduce", "--corrupt-rank", "0"]).corrupt_rank == 0
