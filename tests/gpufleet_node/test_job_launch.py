"""The launcher every rank runs: a job's traceback is the job's, not gpufleet's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the folder that holds gpufleet_node/


def launch(script: Path) -> subprocess.CompletedProcess[str]:
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from gpufleet_node import job_launch; "
    code += f"job_launch.run_script({str(script)!r})"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_failing_script_s_traceback_shows_its_frames_only(tmp_path: Path) -> None:
    # Issue 24: the traceback began with job_launch.py and runpy's frames.
    script = tmp_path / "train.py"
    script.write_text("def step():\n    raise ValueError('loss is nan')\n\nstep()\n")
    done = launch(script)
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):\n")
    assert f'File "{script}", line 4, in <module>' in done.stderr
    assert "ValueError: loss is nan" in done.stderr
    assert "job_launch.py" not in done.stderr and "runpy" not in done.stderr


def test_an_exit_code_the_script_chose_is_kept(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\nsys.exit(3)\n")
    done = launch(script)
    assert (done.returncode, done.stderr) == (3, "")


def test_a_process_group_the_script_left_open_is_destroyed_after_it_ends_well(
    tmp_path: Path,
) -> None:
    # run_clm.py (a transformers Trainer) leaves its gloo group to the interpreter's exit,
    # where a rank once aborted ("terminate called without an active exception").
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
        "import builtins\nbuiltins.GROUP_OPEN = dist.is_initialized()\n"
    )
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from gpufleet_node import job_launch; "
    code += f"job_launch.run_script({str(script)!r}); import builtins, torch.distributed as d; "
    code += "print(builtins.GROUP_OPEN, d.is_initialized())"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"], done.stdout
