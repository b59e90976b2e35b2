"""Ctrl-C (issue 11, item 14): exit 130, one line naming what was stopped, no process left.

A terminal's Ctrl-C sends SIGINT to tdbg's whole foreground process group; tdbg's children run
in their own sessions and never see it, so tdbg itself must kill them (and what they started)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tdbg.cli.main import descendants

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# the script starts a process of its own (`sleep`), then waits: both must be gone afterwards
SPAWNS_AND_WAITS = """\
import subprocess, time
subprocess.Popen(["sleep", "1234"])
time.sleep(600)
"""


def _start(args, tmp_path):
    script = tmp_path / "spawns_and_waits.py"
    script.write_text(SPAWNS_AND_WAITS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TDBG_") or k == "TDBG_CACHE_DIR"}
    (tmp_path / "tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "tmp")     # tdbg's temporary folders: none may be left behind
    return subprocess.Popen([sys.executable, "-m", "tdbg.cli.main", *args(str(script))], cwd=ROOT, env=env,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ctrl_c_when(proc, ready, limit=120.0):
    """SIGINT tdbg's process group (as a terminal does) once `ready(processes below tdbg)`."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        below = descendants(proc.pid)
        if ready(below):
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    else:
        raise AssertionError(f"tdbg never got there: {descendants(proc.pid)}")
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    return below, out, err


def _alive(pids):
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            pass
    return alive


def _commands(pids):
    names = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                names.append(f.read().replace("\0", " ").strip())
        except OSError:
            pass
    return names


def test_ctrl_c_in_run_kills_the_child_and_what_it_started(tmp_path):
    proc = _start(lambda script: ["run", script, "--backend", "eager"], tmp_path)
    below, out, err = _ctrl_c_when(proc, lambda pids: "sleep 1234" in _commands(pids))
    assert proc.returncode == 130, err
    script = tmp_path / "spawns_and_waits.py"
    assert err == (f"interrupted (Ctrl-C): tdbg run {script} was stopped during the run of {script} with backend "
                   "eager; no child process is left running.\n")
    assert out == ""
    assert len(below) >= 2 and _alive(below) == []
    assert _tdbg_temporaries(tmp_path) == []


def test_ctrl_c_in_profile_names_the_step(tmp_path):
    trace = tmp_path / "t.json"
    proc = _start(lambda script: ["profile", script, "--backend", "eager", "--trace", str(trace)], tmp_path)
    below, out, err = _ctrl_c_when(proc, lambda pids: "sleep 1234" in _commands(pids))
    assert proc.returncode == 130, err
    script = tmp_path / "spawns_and_waits.py"
    assert err.splitlines()[-1] == (f"interrupted (Ctrl-C): tdbg profile {script} was stopped during the eager "
                                    f"run of {script}; no child process is left running.")
    assert _alive(below) == [] and not trace.exists()
    assert _tdbg_temporaries(tmp_path) == []


def _tdbg_temporaries(tmp_path):
    return [name for name in os.listdir(tmp_path / "tmp") if name.startswith("tdbg")]


@pytest.mark.parametrize("command", ["run", "bisect", "minify", "explain", "profile"])
def test_every_command_exits_130_on_ctrl_c(tmp_path, command):
    """Interrupted early (while its first child starts or torch imports): same answer everywhere."""
    extra = {"minify": ["--out", str(tmp_path / "out")], "profile": ["--trace", str(tmp_path / "t.json")]}
    proc = _start(lambda script: [command, script, *extra.get(command, [])], tmp_path)
    started = time.monotonic()
    below, out, err = _ctrl_c_when(proc, lambda pids: pids or time.monotonic() - started > 3)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.splitlines()[-1].startswith(f"interrupted (Ctrl-C): tdbg {command} ")
    assert err.splitlines()[-1].endswith("; no child process is left running.")
    assert _alive(below) == [] and _tdbg_temporaries(tmp_path) == []
    assert not (tmp_path / "out").exists() and not (tmp_path / "t.json").exists()
