"""``pip install .`` (not editable) ships the configs inside the package: ``rlt-mono`` runs from any folder."""

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_carries_every_config_and_the_installed_command_runs_the_demo_from_another_folder(tmp_path):
    # Built from a copy of the checkout whose build/ folder holds a module and a config of an older layout: neither
    # ships.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                               ".*cache", "outputs", ".gpu-stack", ".parts", ".study",
                                                               ".snap", ".whl", "notebooks"))
    stale = source / "build" / "lib" / "rlt_mono"
    (stale / "cfgs" / "run_cfg").mkdir(parents=True)
    (stale / "teacher_rlt.py").write_text("# a module of an older layout\n")
    (stale / "cfgs" / "run_cfg" / "gone.yaml").write_text("stage: rl\n")
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source),
                    "-w", str(wheels)], check=True, capture_output=True, cwd=tmp_path)
    wheel = next(wheels.glob("rlt_mono-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    modules = {name for name in names if name.endswith(".py")}
    assert modules == {path.relative_to(REPO).as_posix() for path in (REPO / "rlt_mono").rglob("*.py")}
    shipped = {name for name in names if name.startswith("rlt_mono/cfgs/")}
    configs = REPO / "cfgs"
    expected = {f"rlt_mono/cfgs/{path.relative_to(configs).as_posix()}" for path in configs.rglob("*.yaml")}
    assert shipped == expected and "rlt_mono/cfgs/run_cfg/demo_tiny.yaml" in shipped

    # A venv of its own holds the installed package; the dependencies come from this interpreter's site-packages
    # (on PYTHONPATH, which skips its .pth files, so an editable install of the checkout cannot answer instead).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    target = next((venv / "lib").glob("python3*")) / "site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))},
           "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    run = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import sys, rlt_mono.cli, rlt_mono.config as c; print(c.CONFIG_DIR); "
                          "sys.argv = ['rlt-mono', 'demo_tiny', 'trainer.max_steps=2']; rlt_mono.cli.main()"],
                         cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.splitlines()[0] == str(target / "rlt_mono" / "cfgs")
    finals = list((elsewhere / "outputs" / "demo_tiny").glob("*/final/config.json"))
    assert len(finals) == 1
    # the run's README records the console command (its resume command is that command, not the checkout's launcher)
    readme = (finals[0].parent.parent / "README.md").read_text()
    assert "`rlt-mono demo_tiny trainer.max_steps=2`" in readme and "launch_mono.sh" not in readme

    # The source distribution carries every config too (MANIFEST.in), so a wheel built from it ships them.
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "sdist")], check=True,
                   capture_output=True, cwd=source)
    with tarfile.open(next((tmp_path / "sdist").glob("rlt_mono-*.tar.gz"))) as sdist:
        packed = {name.split("/", 1)[1] for name in sdist.getnames() if name.endswith(".yaml")}
    assert packed == {f"cfgs/{path.relative_to(configs).as_posix()}" for path in configs.rglob("*.yaml")}
