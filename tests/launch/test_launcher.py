"""``python -m pycoll.run`` and ``pycoll.launch.launch``: real processes on 127.0.0.1.

Every test reaps what it starts: the launcher runs in its own session and is SIGKILLed (its
ranks die with it through PR_SET_PDEATHSIG) if a test fails before it exits. The only time
limits are generous "did not hang" deadlines.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

try:
    import rendezvous

    HAVE_STORE = hasattr(rendezvous, "StoreServer") and hasattr(rendezvous, "TCPStore")
except ImportError:  # pragma: no cover
    HAVE_STORE = False

from pycoll.launch.cli import _parse_args, _UsageError

pytestmark = pytest.mark.timeout(120)
needs_store = pytest.mark.skipif(not HAVE_STORE, reason="rendezvous.StoreServer not available yet")

DEADLINE = 60.0  # "did not hang"

REPO = Path(__file__).resolve().parents[2]

# A rank program: records its pid (so tests can check it is gone), prints its environment as
# JSON, optionally touches the store, then behaves as argv says.
RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    rank = int(os.environ["PYCOLL_RANK"])
    outdir = sys.argv[1]
    actions = sys.argv[2:]

    def on_term(signum, frame):
        open(os.path.join(outdir, f"term.{rank}"), "w").write(str(signum))
        sys.exit(0)

    if "catch-term" in actions:
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
    if "ignore-term" in actions:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    keys = [k for k in os.environ if k.startswith("PYCOLL_") or k in (
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")]
    record = {k: os.environ[k] for k in keys}
    record["argv"] = sys.argv[1:]

    from pycoll.launch import detect_launch
    info = detect_launch()
    record["info"] = [info.rank, info.world_size, info.launcher, info.master_addr,
                      info.master_port, info.store_is_external, info.token]

    if "store" in actions:
        import rendezvous
        store = rendezvous.TCPStore(os.environ["PYCOLL_MASTER_ADDR"],
                                    int(os.environ["PYCOLL_MASTER_PORT"]),
                                    token=os.environ["PYCOLL_TOKEN"], timeout=30.0)
        record["added"] = store.add("ranks_seen", 1)
        store.close()

    # one write() per line, so that each record is one line whatever forwards it
    os.write(1, ("RECORD " + json.dumps(record) + "\\n").encode())
    os.write(2, f"stderr line from rank {rank}\\n".encode())
    # written last: the rank is fully up (a test may now signal the launcher)
    open(os.path.join(outdir, f"pid.{rank}"), "w").write(str(os.getpid()))

    for a in actions:
        if a.startswith("exit@"):
            r, code = a[5:].split(":")
            if int(r) == rank:
                time.sleep(0.5)
                sys.exit(int(code))
        if a.startswith("sig@"):
            r, sig = a[4:].split(":")
            if int(r) == rank:
                time.sleep(0.5)
                os.kill(os.getpid(), int(sig))
    if "sleep" in actions:
        time.sleep(600)
    """
)


@pytest.fixture
def job(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    outdir = tmp_path / "out"
    outdir.mkdir()
    return script, outdir


def _env():
    env = dict(os.environ)
    # ranks must import pycoll / rendezvous from this checkout whatever the install state
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(REPO)) if p)
    env.pop("PYCOLL_RANK", None)
    return env


class Launcher:
    """``python -m pycoll.run`` in its own session; killed (with its ranks) if left running."""

    def __init__(self, args, cwd):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pycoll.run", *map(str, args)],
            cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, text=True,
        )

    def wait(self, timeout=DEADLINE):
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"launcher did not exit within {timeout} s\nstdout:{out}\nstderr:{err}")
        return self.proc.returncode, out, err

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture
def run_launcher(tmp_path):
    started = []

    def start(*args):
        lau = Launcher(args, tmp_path)
        started.append(lau)
        return lau

    def run(*args, timeout=DEADLINE):
        return start(*args).wait(timeout)

    run.start = start
    yield run
    for lau in started:
        lau.kill()
        lau.proc.wait()


def records(out):
    recs = {}
    for line in out.splitlines():
        _, sep, payload = line.partition("RECORD ")
        if sep:
            rec = json.loads(payload)
            recs[int(rec["PYCOLL_RANK"])] = rec
    return recs


def _alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # pragma: no cover - not Linux
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def pids(outdir, n):
    return [int((outdir / f"pid.{r}").read_text()) for r in range(n)
            if (outdir / f"pid.{r}").exists()]


def assert_all_gone(pid_list, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pid_list):
            return
        time.sleep(0.05)
    alive = [p for p in pid_list if _alive(p)]
    for p in alive:  # do not leave them behind even when failing
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pytest.fail(f"ranks still alive: {alive}")


def wait_for_files(paths, within=DEADLINE):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(p.exists() for p in paths):
            return
        time.sleep(0.05)
    pytest.fail(f"ranks did not start: missing {[str(p) for p in paths if not p.exists()]}")


# ---------------------------------------------------------------------------------------------
# argument parsing (no processes)


def test_parse_script_and_its_options():
    p = _parse_args(["-n", "4", "--prefix-output", "train.py", "-n", "5", "--timeout", "x"])
    assert p["command"] == ["train.py", "-n", "5", "--timeout", "x"]
    assert p["nprocs"] == 4 and p["prefix_output"] and p["timeout"] is None
    assert _parse_args(["-n", "2", "--tag-output", "train.py"])["prefix_output"]


def test_parse_module_form_and_option_spellings():
    p = _parse_args(["--nproc=2", "--timeout", "3.5", "--master-addr", "0.0.0.0",
                     "--master-port=1234", "-m", "pkg.mod", "-x", "--", "y"])
    assert p["command"] == ["-m", "pkg.mod", "-x", "--", "y"]
    assert (p["nprocs"], p["timeout"], p["master_addr"], p["master_port"]) == \
        (2, 3.5, "0.0.0.0", 1234)
    assert _parse_args(["-n3", "-mpkg", "a"])["command"] == ["-m", "pkg", "a"]
    assert _parse_args(["-n", "1", "--", "-weird.py"])["command"] == ["-weird.py"]


@pytest.mark.parametrize("argv", [
    [], ["script.py"], ["-n", "0", "s.py"], ["-n", "two", "s.py"], ["-n", "2"], ["-n", "2", "-m"],
    ["-n", "2", "--bogus", "s.py"], ["-n", "2", "--timeout", "0", "s.py"],
    ["-n", "2", "--master-port", "70000", "s.py"], ["-n"],
])
def test_parse_errors(argv):
    with pytest.raises(_UsageError):
        _parse_args(argv)


def test_cli_usage_errors_and_help(tmp_path):
    env = _env()
    r = subprocess.run([sys.executable, "-m", "pycoll.run", "script.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=DEADLINE)
    assert r.returncode == 2 and "-n N is required" in r.stderr
    r = subprocess.run([sys.executable, "-m", "pycoll.run", "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=DEADLINE)
    assert r.returncode == 0 and "usage: python -m pycoll.run" in r.stdout


def test_launch_rejects_bad_arguments():
    from pycoll.launch import launch

    with pytest.raises(ValueError):
        launch([], 2)
    with pytest.raises(ValueError):
        launch(["x.py"], 0)
    with pytest.raises(ValueError):
        launch(["x.py"], 1, timeout=0)


# ---------------------------------------------------------------------------------------------
# whole jobs


@needs_store
def test_all_ranks_succeed_with_environment_and_store(job, run_launcher):
    script, outdir = job
    n = 3
    rc, out, err = run_launcher("-n", n, script, outdir, "store", "--flag", "-n", "7")
    assert rc == 0, err
    recs = records(out)
    assert sorted(recs) == list(range(n))
    tokens = {rec["PYCOLL_TOKEN"] for rec in recs.values()}
    assert len(tokens) == 1 and len(tokens.pop()) == 32
    store_ports = {rec["PYCOLL_MASTER_PORT"] for rec in recs.values()}
    torch_ports = {rec["MASTER_PORT"] for rec in recs.values()}
    assert len(store_ports) == 1 and len(torch_ports) == 1 and store_ports != torch_ports
    for r, rec in recs.items():
        assert rec["argv"] == [str(outdir), "store", "--flag", "-n", "7"]
        for k, v in {"PYCOLL_RANK": r, "PYCOLL_WORLD_SIZE": n, "PYCOLL_LOCAL_RANK": r,
                     "PYCOLL_LOCAL_WORLD_SIZE": n, "RANK": r, "WORLD_SIZE": n, "LOCAL_RANK": r,
                     "LOCAL_WORLD_SIZE": n}.items():
            assert rec[k] == str(v), k
        assert rec["PYCOLL_MASTER_ADDR"] == rec["MASTER_ADDR"] == "127.0.0.1"
        assert rec["PYCOLL_STORE_EXTERNAL"] == "1"
        assert rec["info"] == [r, n, "pycoll", "127.0.0.1", int(rec["PYCOLL_MASTER_PORT"]), True,
                               rec["PYCOLL_TOKEN"]]
    # every rank reached the launcher's store and incremented the same counter
    assert sorted(rec["added"] for rec in recs.values()) == [1, 2, 3]
    assert err.count("stderr line from rank") == n
    assert_all_gone(pids(outdir, n), within=1.0)


@needs_store
def test_store_rejects_wrong_token(tmp_path, run_launcher):
    # the job token actually guards the store: a client with another token gets nowhere
    script = tmp_path / "bad_token.py"
    script.write_text(textwrap.dedent("""
        import os, sys, rendezvous
        try:
            s = rendezvous.TCPStore(os.environ["PYCOLL_MASTER_ADDR"],
                                    int(os.environ["PYCOLL_MASTER_PORT"]),
                                    token="0" * 32, timeout=5.0)
            s.add("k", 1)
        except Exception as e:
            print("refused:", type(e).__name__)
            sys.exit(0)
        sys.exit(1)
    """))
    rc, out, err = run_launcher("-n", 1, script)
    assert rc == 0, (out, err)
    assert "refused" in out


@needs_store
def test_module_form(tmp_path, run_launcher):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "hello.py").write_text(
        "import os, sys\n"
        "os.write(1, f\"hello {os.environ['PYCOLL_RANK']} {sys.argv[1:]}\\n\".encode())\n"
    )
    rc, out, err = run_launcher("-n", 2, "-m", "mypkg.hello", "a", "-n", "b")
    assert rc == 0, err
    lines = sorted(line for line in out.splitlines() if line.startswith("hello"))
    assert lines == ["hello 0 ['a', '-n', 'b']", "hello 1 ['a', '-n', 'b']"]


@needs_store
def test_prefix_output(tmp_path, run_launcher):
    script = tmp_path / "talk.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        r = os.environ["PYCOLL_RANK"]
        for i in range(3):
            print(f"out {r} {i}")
        sys.stderr.write(f"err {r}\\npartial {r}")
    """))
    rc, out, err = run_launcher("-n", 2, "--prefix-output", script)
    assert rc == 0, err
    out_lines = out.splitlines()
    assert sorted(out_lines) == sorted(f"[rank {r}] out {r} {i}"
                                       for r in range(2) for i in range(3))
    # per rank, the order of its lines is kept
    for r in range(2):
        assert [x for x in out_lines if x.startswith(f"[rank {r}]")] == [
            f"[rank {r}] out {r} {i}" for i in range(3)]
    err_lines = [x for x in err.splitlines() if x.startswith("[rank")]
    assert sorted(err_lines) == sorted(
        [f"[rank {r}] err {r}" for r in range(2)] + [f"[rank {r}] partial {r}" for r in range(2)])
    assert "out" not in err


# A progress bar as tqdm draws it: "\r" and the new text, the line ended only when it is done.
PROGRESS_RANK = textwrap.dedent("""
    import os, sys, time
    r = os.environ["PYCOLL_RANK"]
    for i in range(3):
        sys.stdout.write(f"\\rstep {r} {i}")
        sys.stdout.flush()
    deadline = time.monotonic() + 60
    while not os.path.exists("go") and time.monotonic() < deadline:
        time.sleep(0.05)
    print(" done")
""")


@needs_store
@pytest.mark.parametrize("prefix", [[], ["--prefix-output"]], ids=["plain", "prefixed"])
def test_a_line_redrawn_after_cr_is_forwarded_before_its_newline(tmp_path, run_launcher, prefix):
    """A progress bar's redraws (``\\r``) reach the launcher's output while the rank still runs,
    not only when the line ends: both ranks' "step R 1" shows before the test lets them
    finish; every redraw keeps its ``\\r`` and its rank prefix."""
    (tmp_path / "progress.py").write_text(PROGRESS_RANK)
    lau = run_launcher.start("-n", 2, *prefix, "progress.py")
    got = bytearray()

    def read():
        fd = lau.proc.stdout.fileno()
        while chunk := os.read(fd, 4096):
            got.extend(chunk)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    tag = (lambda r: f"[rank {r}] ") if prefix else (lambda r: "")
    deadline = time.monotonic() + 30
    while not all(f"{tag(r)}step {r} 1\r".encode() in got for r in range(2)):
        assert lau.proc.poll() is None and time.monotonic() < deadline, \
            f"the redrawn lines did not come out while the ranks ran: {bytes(got)!r}"
        time.sleep(0.05)
    (tmp_path / "go").touch()
    assert lau.proc.wait(DEADLINE) == 0, lau.proc.stderr.read()
    reader.join(DEADLINE)
    for r in range(2):
        assert f"{tag(r)}step {r} 2 done\n".encode() in got, bytes(got)


# Each rank prints its lines in pieces, as fast as it can (a progress line built with
# print(..., end=""), a line longer than a pipe's atomic write), and ends both streams with a
# line without newline.
CHATTY_RANK = textwrap.dedent("""
    import os, sys
    r = os.environ["PYCOLL_RANK"]
    for i in range(400):
        print(f"line {r} {i}", end=" ", flush=True)
        print("x" * (7 * i if i % 50 else 9000), end=" ", flush=True)
        print(f"end {r}")
    print(f"tail {r}", end="")
    print(f"err {r}", end=" ", file=sys.stderr, flush=True)
    print(f"tail {r}", end="", file=sys.stderr)
""")


@needs_store
@pytest.mark.parametrize("prefix", [[], ["--prefix-output"]], ids=["plain", "prefixed"])
def test_lines_of_ranks_stay_whole(tmp_path, run_launcher, prefix):
    """Four ranks printing at once: every line the launcher writes is one rank's whole line
    (never two ranks' text on one line), each rank's lines in order, and the line a rank
    left without newline at exit comes out as a line of its own."""
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY_RANK)
    rc, out, err = run_launcher("-n", 4, *prefix, script)
    assert rc == 0, err
    def tag(r):
        return f"[rank {r}] " if prefix else ""

    by_rank = {r: [] for r in range(4)}
    for line in out.splitlines():
        r = int(line.split(" ")[1].rstrip("]"))         # "[rank R] ..." or "line R ..."
        text = line.removeprefix(tag(r))
        words = text.split(" ")
        assert len(words) in (2, 6) and words[1] == str(r) and words[-1] == str(r), \
            f"not one rank's whole line: {line[:200]!r}"
        by_rank[r].append(text)
    for r in range(4):
        assert by_rank[r] == [
            f"line {r} {i} {'x' * (7 * i if i % 50 else 9000)} end {r}" for i in range(400)
        ] + [f"tail {r}"]
    err_lines = sorted(x for x in err.splitlines() if "err" in x)
    assert err_lines == sorted(f"{tag(r)}err {r} tail {r}" for r in range(4))


@needs_store
def test_failing_rank_tears_down_the_others(job, run_launcher):
    script, outdir = job
    start = time.monotonic()
    rc, out, err = run_launcher("-n", 3, script, outdir, "exit@1:3", "sleep")
    elapsed = time.monotonic() - start
    assert rc == 3, err
    assert "rank 1" in err and "exited with code 3" in err
    assert elapsed < DEADLINE  # sleeping ranks (600 s) were killed, not waited for
    assert_all_gone(pids(outdir, 3), within=1.0)


@needs_store
def test_rank_ignoring_sigterm_is_killed_after_grace_period(job, run_launcher):
    script, outdir = job
    rc, out, err = run_launcher("-n", 2, script, outdir, "ignore-term", "exit@0:7", "sleep")
    assert rc == 7, err
    assert "rank 0" in err
    assert_all_gone(pids(outdir, 2), within=1.0)


@needs_store
def test_rank_killed_by_signal(job, run_launcher):
    script, outdir = job
    rc, out, err = run_launcher("-n", 3, script, outdir, f"sig@2:{int(signal.SIGKILL)}", "sleep")
    assert rc == 128 + signal.SIGKILL, err
    assert "rank 2" in err and "SIGKILL" in err
    assert_all_gone(pids(outdir, 3), within=1.0)


@needs_store
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_is_forwarded_and_tears_down(job, run_launcher, sig):
    script, outdir = job
    n = 3
    lau = run_launcher.start("-n", n, script, outdir, "catch-term", "sleep")
    wait_for_files([outdir / f"pid.{r}" for r in range(n)])
    lau.proc.send_signal(sig)
    rc, out, err = lau.wait()
    assert rc == 128 + sig, err
    assert sig.name in err
    assert_all_gone(pids(outdir, n), within=1.0)
    # the ranks saw the signal itself (forwarded), not just a SIGKILL
    for r in range(n):
        assert (outdir / f"term.{r}").read_text() == str(int(sig))


@needs_store
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_ranks_die_when_launcher_is_sigkilled(job, run_launcher):
    script, outdir = job
    lau = run_launcher.start("-n", 2, script, outdir, "sleep")
    wait_for_files([outdir / f"pid.{r}" for r in range(2)])
    os.kill(lau.proc.pid, signal.SIGKILL)  # the launcher only, not its ranks' sessions
    lau.wait()
    assert_all_gone(pids(outdir, 2))


@needs_store
def test_timeout(job, run_launcher):
    script, outdir = job
    rc, out, err = run_launcher("-n", 2, "--timeout", "2", script, outdir, "sleep")
    assert rc == 124
    assert "timed out after 2 s" in err
    assert_all_gone(pids(outdir, 2), within=1.0)


@needs_store
def test_fixed_master_port(job, run_launcher):
    script, outdir = job
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, out, err = run_launcher("-n", 2, "--master-port", port, script, outdir, "store")
    assert rc == 0, err
    recs = records(out)
    assert {rec["PYCOLL_MASTER_PORT"] for rec in recs.values()} == {str(port)}
    assert sorted(rec["added"] for rec in recs.values()) == [1, 2]


@needs_store
def test_missing_script_fails_cleanly(tmp_path, run_launcher):
    rc, out, err = run_launcher("-n", 2, tmp_path / "does_not_exist.py")
    assert rc == 2  # python's own exit code for "can't open file"
    assert "rank " in err


# ---------------------------------------------------------------------------------------------
# the Python API


@needs_store
def test_launch_api(job, capfd):
    from pycoll.launch import launch

    script, outdir = job
    old = signal.getsignal(signal.SIGTERM)
    assert launch([str(script), str(outdir), "store"], 2, env=_env(), timeout=DEADLINE) == 0
    assert signal.getsignal(signal.SIGTERM) is old  # handlers restored
    out, err = capfd.readouterr()
    assert sorted(records(out)) == [0, 1]
    rc = launch([str(script), str(outdir), "exit@0:5", "sleep"], 2, env=_env(), prefix_output=True,
                timeout=DEADLINE)
    assert rc == 5
    out, err = capfd.readouterr()
    assert "rank 0" in err
    assert any(line.startswith("[rank 1] RECORD ") for line in out.splitlines())
    assert_all_gone(pids(outdir, 2), within=1.0)


@needs_store
def test_launch_api_from_a_thread(job, capfd):
    # no signal handlers can be installed off the main thread; the job still runs and is reaped
    from pycoll.launch import launch

    script, outdir = job
    result = []
    t = threading.Thread(target=lambda: result.append(
        launch(["-c",
                "import os; os.write(1, ('rank ' + os.environ['PYCOLL_RANK'] + '\\n').encode())"],
               2, env=_env(), timeout=DEADLINE)))
    t.start()
    t.join(DEADLINE + 10)
    assert result == [0]
    out, _ = capfd.readouterr()
    assert sorted(line for line in out.splitlines() if line.startswith("rank")) == \
        ["rank 0", "rank 1"]


# ---------------------------------------------------------------------------------------------
# torch.distributed under pycoll.run (env://): torch's store must not collide with ours


@needs_store
def test_torch_env_init_under_pycoll_run(tmp_path, run_launcher):
    pytest.importorskip("torch")
    script = tmp_path / "torch_job.py"
    script.write_text(textwrap.dedent("""
        import os, torch, torch.distributed as dist, rendezvous
        dist.init_process_group("gloo", init_method="env://")
        t = torch.ones(4) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        s = rendezvous.TCPStore(os.environ["PYCOLL_MASTER_ADDR"],
                                int(os.environ["PYCOLL_MASTER_PORT"]),
                                token=os.environ["PYCOLL_TOKEN"], timeout=30.0)
        s.add("n", 1)
        os.write(1, f"SUM {dist.get_rank()} {t.tolist()}\\n".encode())
        dist.destroy_process_group()
    """))
    rc, out, err = run_launcher("-n", 2, script, timeout=110)
    assert rc == 0, err
    sums = sorted(line for line in out.splitlines() if line.startswith("SUM"))
    assert sums == ["SUM 0 [3.0, 3.0, 3.0, 3.0]", "SUM 1 [3.0, 3.0, 3.0, 3.0]"]
