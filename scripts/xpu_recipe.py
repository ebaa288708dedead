#!/usr/bin/env python3
"""Read docker/xpu-releases.toml, the XPU image's recipe per vLLM release (the one source).

  xpu_recipe.py versions                      the supported releases, default first
  xpu_recipe.py default                       the default release
  xpu_recipe.py route VERSION                 the route a user should take: upstream | source
  xpu_recipe.py build-args VERSION [ROUTE]    `docker build` arguments, one per line
  xpu_recipe.py show VERSION                  the release's table as JSON
  xpu_recipe.py field VERSION NAME            one field of it (a list: one item per line)

Exit 64 with one line on stderr for an unknown release, an impossible route or a malformed table.
Only the standard library (tomllib: Python >= 3.11), so the build script can run it anywhere.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys

import tomllib

# XPU_RECIPE_TABLE: another table (the tests' altered copies).
TABLE = pathlib.Path(
    os.environ.get("XPU_RECIPE_TABLE")
    or pathlib.Path(__file__).resolve().parent.parent / "docker" / "xpu-releases.toml"
)
ROUTES = ("upstream", "source")
# field -> type; every release must have exactly these (a typo is an error, not a silent default).
FIELDS = {
    "sdist_sha256": str,
    "upstream_image": str,
    "base_image": str,
    "python": str,
    "torch": str,
    "torch_index": str,
    "xpu_kernels": str,
    "xpu_kernels_index": str,
    "triton": str,
    "triton_reinstall": bool,
    "umd": list,
    "level_zero_dev": str,
    "gpu_apt_key": str,
    "gpu_apt_repo": str,
    "gpu_apt_packages": list,
    "oneapi_apt": list,
    "oneapi_apt_pin": str,
    "oneccl_installer": str,
    "oneapi_pip": list,
    "ld_library_path": str,
    "multiproc_method": str,
    "skipped_debs": list,
}
LD_SELF = "$LD_LIBRARY_PATH"


class RecipeError(Exception):
    """A malformed table or a request it cannot satisfy: one line, exit 64."""


def load(path: pathlib.Path = TABLE) -> dict:
    """The table, checked: {"default": V, "release": {V: {field: value}}}."""
    data = tomllib.loads(path.read_text())
    releases = data.get("release", {})
    if data.get("default") not in releases:
        raise RecipeError(f"{path.name}: default {data.get('default')!r} is not a release")
    for version, rel in releases.items():
        missing, extra = FIELDS.keys() - rel.keys(), rel.keys() - FIELDS.keys()
        if missing or extra:
            raise RecipeError(
                f"{path.name} [{version}]: missing {sorted(missing)}, unknown {sorted(extra)}"
            )
        for name, kind in FIELDS.items():
            if not isinstance(rel[name], kind):
                raise RecipeError(f"{path.name} [{version}]: {name} must be {kind.__name__}")
        if rel["level_zero_dev"] and not any(
            u.endswith("/" + rel["level_zero_dev"]) for u in rel["umd"]
        ):
            raise RecipeError(f"{path.name} [{version}]: level_zero_dev is not one of umd")
        gpu_apt = (rel["gpu_apt_key"], rel["gpu_apt_repo"], rel["gpu_apt_packages"])
        if bool(rel["umd"]) == bool(any(gpu_apt)):
            raise RecipeError(
                f"{path.name} [{version}]: exactly one GPU driver source: umd (.debs) or "
                "gpu_apt_key + gpu_apt_repo + gpu_apt_packages (an apt repository)"
            )
        if any(gpu_apt) and not all(gpu_apt):
            raise RecipeError(
                f"{path.name} [{version}]: gpu_apt_key, gpu_apt_repo and gpu_apt_packages "
                "go together"
            )
        if rel["gpu_apt_repo"] and not re.match(
            r"deb \[[^]]*\bsigned-by=/\S+[^]]*\] https://\S+ \S+", rel["gpu_apt_repo"]
        ):
            raise RecipeError(
                f"{path.name} [{version}]: gpu_apt_repo must be a deb line "
                "'deb [signed-by=KEYRING ...] URL SUITE COMPONENTS...'"
            )
        if rel["oneapi_apt"] and not rel["oneapi_apt_pin"]:
            raise RecipeError(f"{path.name} [{version}]: oneapi_apt needs oneapi_apt_pin")
    return data


def release(version: str, data: dict | None = None) -> dict:
    data = data or load()
    if version not in data["release"]:
        raise RecipeError(
            f"vLLM {version} has no XPU recipe; supported: "
            f"{', '.join(versions(data))} (docker/xpu-releases.toml)"
        )
    return data["release"][version]


def versions(data: dict | None = None) -> list[str]:
    data = data or load()
    return [data["default"]] + [v for v in data["release"] if v != data["default"]]


def default_route(rel: dict) -> str:
    return "upstream" if rel["upstream_image"] else "source"


def split_ld_path(value: str) -> tuple[str, str]:
    """Upstream's LD_LIBRARY_PATH as prefix + (the base image's value) + suffix: Docker expands a
    variable only where the Dockerfile names it, so "$LD_LIBRARY_PATH:/x" becomes ("", ":/x")."""
    if LD_SELF not in value:
        return value, ""
    prefix, _, suffix = value.partition(LD_SELF)
    return prefix, suffix


def build_args(version: str, route: str | None = None, data: dict | None = None) -> list[str]:
    rel = release(version, data)
    route = route or default_route(rel)
    if route not in ROUTES:
        raise RecipeError(f"XPU_ROUTE must be one of {', '.join(ROUTES)}, not {route!r}")
    if route == "upstream" and not rel["upstream_image"]:
        raise RecipeError(f"vLLM {version} has no published XPU image: use XPU_ROUTE=source")
    ld_prefix, ld_suffix = split_ld_path(rel["ld_library_path"])
    args = {
        "VLLM_VERSION": version,
        "XPU_ROUTE": route,
        "UPSTREAM_IMAGE": rel["upstream_image"] or "scratch",
        "BASE_IMAGE": rel["base_image"],
        "PYTHON_VERSION": rel["python"],
        # As torch reports itself and the image label records it: PyTorch's XPU builds are +xpu.
        "TORCH_VERSION": rel["torch"] + "+xpu",
        "TORCH_INDEX_URL": rel["torch_index"],
        "XPU_KERNELS_VERSION": rel["xpu_kernels"],
        "XPU_KERNELS_INDEX_URL": rel["xpu_kernels_index"],
        "XPU_TRITON": rel["triton"],
        "XPU_TRITON_REINSTALL": "1" if rel["triton_reinstall"] else "0",
        "XPU_UMD_DEBS": " ".join(rel["umd"]),
        "XPU_GPU_APT_KEY": rel["gpu_apt_key"],
        "XPU_GPU_APT_REPO": rel["gpu_apt_repo"],
        "XPU_GPU_APT_PACKAGES": " ".join(rel["gpu_apt_packages"]),
        "XPU_ONEAPI_APT": " ".join(rel["oneapi_apt"]),
        "XPU_ONEAPI_APT_PIN": rel["oneapi_apt_pin"],
        "XPU_ONECCL_INSTALLER": rel["oneccl_installer"],
        "XPU_ONEAPI_PIP": " ".join(rel["oneapi_pip"]),
        "XPU_LD_PREFIX": ld_prefix,
        "XPU_LD_SUFFIX": ld_suffix,
        "XPU_MULTIPROC_METHOD": rel["multiproc_method"],
        "VLLM_SDIST_SHA256": rel["sdist_sha256"],
    }
    return [f"{k}={v}" for k, v in args.items()]


def main(argv: list[str]) -> int:
    try:
        cmd, rest = (argv[0], argv[1:]) if argv else ("", [])
        if cmd == "versions" and not rest:
            print("\n".join(versions()))
        elif cmd == "default" and not rest:
            print(load()["default"])
        elif cmd == "route" and len(rest) == 1:
            print(default_route(release(rest[0])))
        elif cmd == "build-args" and len(rest) in (1, 2):
            print("\n".join(build_args(*rest)))
        elif cmd == "show" and len(rest) == 1:
            print(json.dumps(release(rest[0]), indent=2))
        elif cmd == "field" and len(rest) == 2:
            value = release(rest[0]).get(rest[1])
            if value is None:
                raise RecipeError(f"no field {rest[1]!r}; fields: {', '.join(FIELDS)}")
            print("\n".join(value) if isinstance(value, list) else value)
        else:
            raise RecipeError(
                "usage: xpu_recipe.py versions|default|route V|build-args V [ROUTE]|show V|field V NAME"
            )
    except (RecipeError, tomllib.TOMLDecodeError) as e:
        print(f"xpu_recipe: {e}", file=sys.stderr)
        return 64
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
