"""The XPU recipe table (docker/xpu-releases.toml) against upstream's own files, release by release.

No Intel GPU and no container registry exist on CI machines, so the XPU image's correctness rests
on agreeing with upstream vLLM's recipe. For every release in the table:
- drift: the release's PyPI sdist (downloaded by scripts/vllm-sdist.sh, checked against sdist_sha256)
  is read, and each field of the table must equal what upstream's docker/Dockerfile.xpu,
  requirements/xpu.txt and release-publishing script say; a mismatch names the upstream line;
- build: vLLM's XPU wheel is built from that sdist (VLLM_TARGET_DEVICE=xpu, CPU torch standing in
  at build time, as XPU has no compiled extensions of vLLM's own) and its metadata must pin the
  table's torch and vllm_xpu_kernels;
- the Dockerfile's ARG defaults and the build script's arguments come from the table.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor

import pytest
import tomllib
from dockerfile_parse import DockerfileParser

from tests.harness import ROOT

from . import upstream

sys.path.insert(0, str(ROOT / "scripts"))
import xpu_recipe  # noqa: E402

CAPTURE = {"capture_output": True, "text": True, "timeout": 900}
TABLE = xpu_recipe.load()
VERSIONS = xpu_recipe.versions(TABLE)
# Compared field by field (the remaining fields are ours: sdist_sha256, skipped_debs, umd is
# compared below together with skipped_debs).
SAME = (
    "base_image",
    "python",
    "torch",
    "torch_index",
    "xpu_kernels",
    "xpu_kernels_index",
    "triton",
    "triton_reinstall",
    "level_zero_dev",
    "gpu_apt_key",
    "gpu_apt_repo",
    "gpu_apt_packages",
    "oneapi_apt",
    "oneapi_apt_pin",
    "oneccl_installer",
    "oneapi_pip",
    "ld_library_path",
    "multiproc_method",
    "upstream_image",
)


@functools.cache
def sdist(version: str) -> str:
    """Path of the release's sdist (cached, checked against the table's sha256)."""
    script = ROOT / "scripts" / "vllm-sdist.sh"
    out = subprocess.run(["bash", str(script), version], check=True, **CAPTURE)
    return out.stdout.strip().splitlines()[-1]


def drift(version: str, table: dict, sdist_path: str) -> list[str]:
    """Every disagreement between the table entry and upstream's sdist, as readable lines."""
    ours, theirs = table["release"][version], upstream.recipe(sdist_path, version)
    bad = []
    for field in SAME:
        if ours[field] != theirs[field].value:
            bad.append(
                f"{version} {field}: table has {ours[field]!r}, upstream has "
                f"{theirs[field].value!r} ({theirs[field].where})"
            )
    skipped = [url for url, _why in ours["skipped_debs"]]
    installed = [u for u in theirs["debs"].value if u not in skipped]
    if ours["umd"] != installed or not set(skipped) <= set(theirs["debs"].value):
        bad.append(
            f"{version} umd: table has {ours['umd']} (skipping {skipped}), upstream "
            f"installs {theirs['debs'].value} ({theirs['debs'].where})"
        )
    return bad


@pytest.mark.parametrize("version", VERSIONS)
def test_table_matches_upstream_sdist(version):
    bad = drift(version, TABLE, sdist(version))
    assert not bad, "docker/xpu-releases.toml disagrees with upstream:\n" + "\n".join(bad)


@pytest.mark.parametrize("version", [TABLE["default"], "0.32.0"])
def test_a_wrong_entry_is_caught_with_the_upstream_line(version):
    """The drift check itself can fail: a wrong torch pin, kernels index and GPU driver (a .deb
    left out; another apt suite) are reported, each with upstream's line."""
    wrong = {"default": version, "release": {version: dict(TABLE["release"][version])}}
    rel = wrong["release"][version]
    rel["torch"] = "2.99.0"
    rel["xpu_kernels_index"] = "https://example.invalid/whl"
    if rel["umd"]:
        rel["umd"] = rel["umd"][1:]
    else:
        rel["gpu_apt_repo"] = rel["gpu_apt_repo"].replace("intel-omix/", "intel-omix/9")
    bad = drift(version, wrong, sdist(version))
    assert any(
        "torch: table has '2.99.0'" in b and "requirements/xpu.txt:" in b and "torch==" in b
        for b in bad
    ), bad
    assert any(
        b.startswith(f"{version} xpu_kernels_index:") and "requirements/xpu.txt" in b for b in bad
    ), bad
    if TABLE["release"][version]["umd"]:
        assert any(b.startswith(f"{version} umd:") for b in bad), bad
    else:
        assert any(
            b.startswith(f"{version} gpu_apt_repo:") and "Dockerfile.xpu:" in b and "echo" in b
            for b in bad
        ), bad


def _without_row(text: str, version: str) -> str:
    """The table's text without the [release."VERSION"] table."""
    start = text.index(f'[release."{version}"]')
    end = text.find("\n[release.", start + 1)
    return text[:start] + (text[end + 1 :] if end != -1 else "")


@pytest.mark.parametrize("version", VERSIONS)
def test_a_release_row_is_rendered_from_its_sdist_alone(version):
    """upstream.render_row() writes the release's table from its sdist (`make upstream-release`
    will): the table without that row, plus the rendered row, parses to the same table."""
    text = (ROOT / "docker" / "xpu-releases.toml").read_text()
    rest = _without_row(text, version)
    assert f'[release."{version}"]' not in rest
    rendered = upstream.render_row(sdist(version), version)
    assert rendered.startswith(f'[release."{version}"]\n')
    got = tomllib.loads(rest + "\n" + rendered)
    assert got["release"][version] == TABLE["release"][version]
    assert list(got["release"][version]) == list(xpu_recipe.FIELDS)  # the file's field order
    assert got == tomllib.loads(text)


def build_xpu_wheel(version: str) -> tuple[subprocess.CompletedProcess, list[str], str]:
    """The release's XPU wheel built as docker/install-vllm-xpu.sh builds it (the sdist unpacked
    by tar, pip on that tree, VLLM_TARGET_DEVICE=xpu): pip's result, the wheels' names and the
    METADATA ("" unless one wheel). The tree goes to /dev/shm where it has room: the build
    writes thousands of small files, slow on a VM's disk."""
    venv_bin = pathlib.Path(sys.executable).parent  # cmake/ninja of requirements-test.txt
    room = os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > 1 << 30
    work = pathlib.Path(tempfile.mkdtemp(prefix="xpu-wheel-", dir="/dev/shm" if room else None))
    env = dict(
        os.environ,
        VLLM_TARGET_DEVICE="xpu",
        PATH=f"{venv_bin}:{os.environ['PATH']}",
        MAX_JOBS="2",
        TMPDIR=str(work),
    )
    try:
        src, out = work / "src", work / "out"
        src.mkdir()
        subprocess.run(
            ["tar", "-xzf", sdist(version), "-C", str(src), "--strip-components=1"], check=True
        )
        pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps"]
        r = subprocess.run([*pip, str(src), "-w", str(out)], env=env, cwd=work, **CAPTURE)
        wheels = sorted(w.name for w in out.glob("vllm-*.whl"))
        if len(wheels) != 1:
            return r, wheels, ""
        with zipfile.ZipFile(out / wheels[0]) as zf:
            meta = zf.read(f"vllm-{version}+xpu.dist-info/METADATA").decode()
        return r, wheels, meta
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def xpu_wheels():
    """{version: future of build_xpu_wheel(version)}, two builds at a time (one core each)."""
    with ThreadPoolExecutor(2) as pool:
        yield {v: pool.submit(build_xpu_wheel, v) for v in VERSIONS}


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_xpu_wheel_builds_from_sdist_and_pins_the_tables_torch(version, xpu_wheels):
    rel = TABLE["release"][version]
    r, wheels, meta = xpu_wheels[version].result()
    assert r.returncode == 0, r.stderr[-4000:]
    (wheel,) = wheels
    assert wheel.startswith(f"vllm-{version}+xpu-") and wheel.endswith(".whl"), wheel
    requires = re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
    assert f"torch=={rel['torch']}" in requires, [r for r in requires if r.startswith("torch")]
    kernels = [r for r in requires if r.startswith("vllm_xpu_kernels")]
    assert kernels and (
        kernels[0].endswith(f"=={rel['xpu_kernels']}")
        or f"/vllm_xpu_kernels-{rel['xpu_kernels']}-" in kernels[0]
    ), kernels


def _dockerfile_args() -> dict[str, str]:
    with open(ROOT / "docker" / "Dockerfile.xpu", "rb") as f:
        instrs = DockerfileParser(fileobj=f).structure
    return dict(
        i["value"].split("=", 1) for i in instrs if i["instruction"] == "ARG" and "=" in i["value"]
    )


def test_dockerfile_defaults_are_the_default_release():
    """`docker build -f docker/Dockerfile.xpu .` alone builds the default release's default
    route: every ARG default that names a recipe value equals the table's."""
    args = _dockerfile_args()
    expected = dict(a.split("=", 1) for a in xpu_recipe.build_args(TABLE["default"], data=TABLE))
    checked = {k: v for k, v in args.items() if k in expected}
    assert {"VLLM_VERSION", "XPU_ROUTE", "UPSTREAM_IMAGE", "BASE_IMAGE"} <= checked.keys()
    assert checked == {k: expected[k] for k in checked}


def test_build_script_takes_its_xpu_arguments_from_the_table():
    text = (ROOT / "scripts" / "build-image.sh").read_text()
    assert "xpu_recipe.py" in text and "build-args" in text
    every = {a.split("=", 1)[0] for a in xpu_recipe.build_args("0.24.0", "source", TABLE)}
    args = _dockerfile_args() | {
        a.split()[0]: ""
        for a in re.findall(r"^ARG (\w+)$", (ROOT / "docker" / "Dockerfile.xpu").read_text(), re.M)
    }
    assert every <= args.keys(), (
        f"build args the Dockerfile does not declare: {every - args.keys()}"
    )


@pytest.mark.parametrize(
    "route, version, error",
    [
        ("upstream", "0.24.0", "has no published XPU image"),
        ("gpu", "0.32.0", "XPU_ROUTE must be one of"),
        (None, "0.9.0", "has no XPU recipe"),
    ],
)
def test_recipe_errors_are_one_line_exit_64(route, version, error):
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "xpu_recipe.py"), "build-args", version]
        + ([route] if route else []),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 64 and r.stdout == ""
    assert error in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_malformed_table_is_rejected(tmp_path):
    text = (ROOT / "docker" / "xpu-releases.toml").read_text()
    bad = tmp_path / "t.toml"
    bad.write_text(text.replace("triton_reinstall = false", "triton_reinstal = false", 1))
    with pytest.raises(xpu_recipe.RecipeError, match=r"missing \['triton_reinstall'\]"):
        xpu_recipe.load(bad)
    bad.write_text(
        text.replace(
            'level_zero_dev = "libze-dev_1.32.0+u24.04_amd64.deb"',
            'level_zero_dev = "libze-dev_9.deb"',
        )
    )
    with pytest.raises(xpu_recipe.RecipeError, match="level_zero_dev is not one of umd"):
        xpu_recipe.load(bad)


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def test_default_release_is_upstreams_newest_published_image():
    """The XPU default is the newest release upstream publishes an XPU image of (the route a user
    should take), independent of the CPU image's release (VLLM_VERSION)."""
    published = [v for v in VERSIONS if TABLE["release"][v]["upstream_image"]]
    assert TABLE["default"] == max(published, key=_key)
    assert TABLE["release"][TABLE["default"]]["upstream_image"].endswith(f":v{TABLE['default']}")
    # `scripts/build-image.sh xpu` without VLLM_VERSION builds it (and tags it vllm-intel:xpu).
    text = (ROOT / "scripts" / "build-image.sh").read_text()
    assert re.search(r"xpu\|xpu-stand-in\) default_version=.*xpu_recipe\.py\" default", text)


@pytest.mark.parametrize(
    "edit, error",
    [
        # both driver sources
        (
            lambda r: r.update(gpu_apt_packages=["x"], gpu_apt_key="https://k", gpu_apt_repo="d"),
            "exactly one GPU driver source",
        ),
        # neither
        (lambda r: r.update(umd=[], level_zero_dev=""), "exactly one GPU driver source"),
        # an apt repository without its key
        (
            lambda r: r.update(
                umd=[],
                level_zero_dev="",
                gpu_apt_packages=["intel-gpu-compute"],
                gpu_apt_repo="deb [signed-by=/k.gpg] https://r noble main",
            ),
            "go together",
        ),
        # not a deb line with its keyring
        (
            lambda r: r.update(
                umd=[],
                level_zero_dev="",
                gpu_apt_packages=["intel-gpu-compute"],
                gpu_apt_key="https://k",
                gpu_apt_repo="https://r noble main",
            ),
            "gpu_apt_repo must be a deb line",
        ),
    ],
)
def test_driver_source_errors_are_one_line_exit_64(tmp_path, edit, error):
    rel = dict(TABLE["release"]["0.32.0"])
    edit(rel)
    bad = tmp_path / "t.toml"
    bad.write_text(
        'default = "0.32.0"\n[release."0.32.0"]\n'
        + "\n".join(f"{k} = {upstream._toml(v)}" for k, v in rel.items())
        + "\n"
    )
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "xpu_recipe.py"), "build-args", "0.32.0"],
        env=dict(os.environ, XPU_RECIPE_TABLE=str(bad)),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 64 and r.stdout == "", r.stdout
    assert error in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_sdist_fetch_needs_no_pip_and_checks_the_tables_hash(tmp_path):
    """scripts/vllm-sdist.sh needs only curl, sha256sum and python3's standard library: with pip
    unable to install anything and no cached venv (a bare Buildkite agent), it still fetches the
    sdist; a table hash the index does not confirm stops it before any download, in one line."""
    version = TABLE["default"]
    bare = dict(
        os.environ,
        VLLM_INTEL_CACHE=str(tmp_path / "cache"),
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS="",
        PIP_CONFIG_FILE="/dev/null",
        PATH="/usr/bin:/bin",
    )
    script = str(ROOT / "scripts" / "vllm-sdist.sh")
    r = subprocess.run(["bash", script, version], env=bare, **CAPTURE)
    assert r.returncode == 0, r.stderr
    got = pathlib.Path(r.stdout.strip())
    assert got.name == f"vllm-{version}.tar.gz" and got.stat().st_size > 10_000_000
    wrong = tmp_path / "table.toml"
    text = (ROOT / "docker" / "xpu-releases.toml").read_text()
    wrong.write_text(text.replace(TABLE["release"][version]["sdist_sha256"], "0" * 64, 1))
    r = subprocess.run(
        ["bash", script, version],
        env=dict(bare, VLLM_INTEL_CACHE=str(tmp_path / "c2"), XPU_RECIPE_TABLE=str(wrong)),
        **CAPTURE,
    )
    assert r.returncode == 1 and "the index says" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not list((tmp_path / "c2").rglob("*.tar.gz"))
