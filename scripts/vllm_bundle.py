"""Carry the kit's vLLM release to the H200, which has no network: build a trimmed bundle here, unpack it there.

The H200 image has torch, transformers and the common packages, but not vLLM nor the wheels listed in
``lfm2vl_lab/measure/vllm_release.py`` (the pins: this script repeats none of them). A call to that machine
carries the working tree plus a few git-ignored paths, 64 MiB in all, so the bundle is trimmed to what a
dense bf16 LFM2-VL on Hopper (sm_90) loads, packed as xz tarballs, and split into parts that fit beside
the tree, each travelling in its own call when they do not all fit in one.

    python3 scripts/vllm_bundle.py build [--max-part-mib N]            here: .vllm/bundle.json + part-*.tar.xz
    python3 scripts/vllm_bundle.py install --bundle .vllm --target /tmp/vllm-site    on the H200

``install`` uses the standard library only (the image's python3.12) and exits 0 when every part is in,
3 when parts are still missing (one line names them), 2 when a part does not match its sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASE = ROOT / "lfm2vl_lab" / "measure" / "vllm_release.py"
MIB = 1 << 20
CARRY_LIMIT = 64 * MIB  # what one device call carries: the tree plus the named ignored paths
MARGIN = 3 * MIB  # the tree grows between a build and the call; bundle.json travels too
XZ_PRESET = 9 | lzma.PRESET_EXTREME
RECORD = ".lfm2vl-parts"  # in the target: one "name sha256" line per part already unpacked
PLATFORMS = ("manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64", "any")
# Removed after unpacking: each is imported by vLLM only behind try/except (or a has-module check), or
# serves what a dense bf16 LFM2-VL on Hopper never runs.
DROP = (
    ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "FlashAttention 2, imported behind try/except: Hopper runs FA3"),
    ("vllm/_moe_C_stable_libtorch.abi3.so", "mixture-of-experts kernels, imported behind suppress(ImportError)"),
    ("vllm/_flashmla_C.abi3.so", "FlashMLA (MLA models), imported behind try/except"),
    ("vllm/_flashmla_extension_C.abi3.so", "FlashMLA (MLA models), imported behind try/except"),
    ("vllm/_qutlass_C.abi3.so", "FP4 quantisation kernels, imported behind suppress(ImportError)"),
    ("vllm/vllm-rs", "the opt-in Rust frontend binary"),
    ("vllm/third_party/deep_gemm", "DeepGEMM (FP8 GEMMs), found through a has-module check"),
    ("vllm/third_party/fmha_sm100", "Blackwell sparse attention (MiniMax-M3)"),
    ("tvm_ffi/include", "tvm_ffi build-time only: C++ headers"),
    ("tvm_ffi/src", "tvm_ffi build-time only: C++ sources"),
    ("tvm_ffi/3rdparty", "tvm_ffi build-time only: vendored headers"),
    ("tvm_ffi/cython", "tvm_ffi build-time only: Cython sources"),
    ("tvm_ffi/stub", "tvm_ffi build-time only: the stub generator"),
    ("tvm_ffi/testing", "tvm_ffi's test helpers, not imported by tvm_ffi/__init__.py"),
    # (tvm_ffi/lib/libtvm_ffi_testing.so stays: tvm_ffi's core library links it, so `import tvm_ffi`,
    # which xgrammar does, fails without it; seen on the H200)
)


def release() -> dict:
    """The pins, read from vllm_release.py by path: importing lfm2vl_lab would import torch."""
    import runpy

    ns = runpy.run_path(str(RELEASE))
    return {"vllm": ns["VLLM_VERSION"], "wheels": dict(ns["WHEELS"])}


def wheel_key(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def find_wheel(cache_dir: Path, name: str, version: str) -> Path | None:
    for whl in sorted(cache_dir.glob("*.whl")):
        dist, ver = whl.name.split("-")[:2]
        if wheel_key(dist) == wheel_key(name) and ver == version:
            return whl
    return None


def download(cache_dir: Path) -> list[Path]:
    """The release's wheel and the pinned ones, for the H200's CPython 3.12 on x86_64 Linux. Wheels already
    in the cache are reused without asking the index, so a rebuild needs no network."""
    rel = release()
    pins = [("vllm", rel["vllm"]), *rel["wheels"].items()]
    cache_dir.mkdir(parents=True, exist_ok=True)
    todo = [f"{n}=={v}" for n, v in pins if find_wheel(cache_dir, n, v) is None]
    if todo:
        plats = [a for p in PLATFORMS for a in ("--platform", p)]
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", *plats, "-d", str(cache_dir), *todo],
                       check=True)
    found = [find_wheel(cache_dir, n, v) for n, v in pins]
    if None in found:
        raise SystemExit(f"not downloaded: {[f'{n}=={v}' for (n, v), w in zip(pins, found) if w is None]}")
    return found


def unpack_wheel(whl: Path, site_dir: Path) -> None:
    """Like ``pip install --target``: the wheel's files at the site root, ``*.data/purelib|platlib`` merged
    into it, its other ``.data`` folders (scripts, headers) left out; executable bits kept."""
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            if info.is_dir():
                continue
            parts = info.filename.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            dest = site_dir.joinpath(*parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(z.read(info))
            dest.chmod(0o755 if (info.external_attr >> 16) & 0o111 else 0o644)


def tree_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def stage(cache_dir: Path, site_dir: Path) -> list[dict]:
    """Every wheel unpacked into one fresh site folder, then trimmed; returns the trims (path, bytes before,
    what was done) for bundle.json, so what the H200 lacks is written down beside the bundle."""
    if site_dir.exists():
        shutil.rmtree(site_dir)
    site_dir.mkdir(parents=True)
    for whl in download(cache_dir):
        unpack_wheel(whl, site_dir)
    trims = []
    for rel, why in DROP:
        path = site_dir / rel
        if path.exists():
            trims.append({"path": rel, "bytes": tree_bytes(path), "done": f"dropped: {why}"})
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return trims + trim_fatbins(site_dir)


def trim_fatbins(site_dir: Path) -> list[dict]:
    """Every shared library with device code cut to what sm_90 loads (scripts/vllm_fatbin.py, imported
    here only: ``install`` runs without it); FlashAttention 3 also to the presets' head dims in bf16."""
    import vllm_fatbin as fb  # beside this file: scripts/ is on sys.path when this runs as a script

    dims, trims = sorted(fb.preset_head_dims()), []
    for path in sorted(site_dir.rglob("*.so")):
        data = bytearray(path.read_bytes())
        if not fb.elf_section(data, ".nv_fatbin"):
            continue
        fa3 = path.name == "_vllm_fa3_C.abi3.so"
        n, zeroed, nbytes = fb.strip_fatbin(data, fb.fa3_keep(set(dims)) if fa3 else fb.sm90_only)
        path.write_bytes(data)
        rule = f"bf16 head dims {dims} (the presets')" if fa3 else "the sm_90 cubin, else the highest PTX <= 90"
        trims.append({"path": path.relative_to(site_dir).as_posix(), "bytes": len(data),
                      "done": f"zeroed {zeroed} of {n} fatbin entries ({nbytes} bytes), kept {rule}"})
    return trims


# ---- parts ----------------------------------------------------------------------------------------


def site_files(site_dir: Path) -> list[str]:
    """Every file under the site, biggest first (then by name): the stable order parts are filled in."""
    files = [p for p in site_dir.rglob("*") if p.is_file()]
    files.sort(key=lambda p: (-p.stat().st_size, p.relative_to(site_dir).as_posix()))
    return [p.relative_to(site_dir).as_posix() for p in files]


def write_part(site_dir: Path, names: list[str], dest: Path) -> int:
    """A deterministic xz tarball of ``names``: sorted, mtime 0, owner 0:0 without user names, modes 644
    or 755, so the same site gives the same bytes (and sha256). Returns its size."""
    with lzma.open(dest, "wb", preset=XZ_PRESET) as xz, tarfile.open(fileobj=xz, mode="w",
                                                                      format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(names):
            path = site_dir / name
            info = tar.gettarinfo(str(path), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = 0o755 if info.mode & 0o111 else 0o644
            with path.open("rb") as f:
                tar.addfile(info, f)
    return dest.stat().st_size


def xz_size(path: Path) -> int:
    """One file's size compressed alone at the bundle's preset (the dictionary no larger than the file):
    an estimate, above what it adds to a solid tarball, that the parts are first filled by."""
    data = path.read_bytes()
    dict_size = min(64 * MIB, max(1 << 16, len(data)))
    filters = [{"id": lzma.FILTER_LZMA2, "preset": XZ_PRESET, "dict_size": dict_size}]
    return len(lzma.compress(data, format=lzma.FORMAT_XZ, filters=filters)) + 512


def first_fit(names: list[str], est: dict[str, int], limit: int) -> list[list[str]]:
    parts: list[list[str]] = []
    room: list[int] = []
    for name in names:
        i = next((i for i, r in enumerate(room) if est[name] <= r), None)
        if i is None:
            parts.append([])
            room.append(limit)
            i = len(parts) - 1
        parts[i].append(name)
        room[i] -= est[name]
    return parts


def split_parts(site_dir: Path, out_dir: Path, limit: int) -> list[list[str]]:
    """Whole files into parts of at most ``limit`` compressed bytes: first-fit by each file's own estimate,
    then each part compressed for real; a part still over has its last (smallest) files moved on to the
    next part until it fits. A file that alone is over the limit cannot travel, and stops the build."""
    names = site_files(site_dir)
    # lzma lets go of the GIL while it compresses; each compressor at this preset takes ~0.7 GB
    with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
        est = dict(zip(names, pool.map(xz_size, (site_dir / n for n in names))))
        parts = first_fit(names, est, limit)
        sizes = list(pool.map(lambda ip: write_part(site_dir, ip[1], out_dir / f"part-{ip[0] + 1}.tar.xz"),
                              enumerate(parts)))
    i = 0
    while i < len(parts):
        over = sizes[i] - limit
        if over <= 0:
            i += 1
            continue
        if len(parts[i]) == 1:
            raise SystemExit(f"{parts[i][0]}: {sizes[i]} bytes compressed, over the part limit of {limit}")
        if i + 1 == len(parts):
            parts.append([])
        moved = 0
        while moved < over and len(parts[i]) > 1:
            name = parts[i].pop()
            parts[i + 1].insert(0, name)
            moved += est[name]
        sizes[i] = write_part(site_dir, parts[i], out_dir / f"part-{i + 1}.tar.xz")
        sizes[i + 1:i + 2] = [write_part(site_dir, parts[i + 1], out_dir / f"part-{i + 2}.tar.xz")]
    return parts


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def pack(site_dir: Path, out_dir: Path, max_part_bytes: int, trims=(), pins: dict | None = None) -> dict:
    """The site as parts ``out_dir/part-N.tar.xz`` of at most ``max_part_bytes`` each, and
    ``out_dir/bundle.json``: the pins, each part's name, sha256, size and file count, the trims and the
    unpacked size. Older parts in ``out_dir`` are removed first, so none is carried by mistake."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in [*out_dir.glob("part-*.tar.xz"), out_dir / "bundle.json"]:
        old.unlink(missing_ok=True)
    parts = split_parts(site_dir, out_dir, max_part_bytes)
    pins = pins if pins is not None else release()
    bundle = {**pins, "parts": [], "trims": list(trims), "max_part_bytes": max_part_bytes,
              "unpacked_bytes": sum((site_dir / n).stat().st_size for p in parts for n in p)}
    for i, names in enumerate(parts, 1):
        path = out_dir / f"part-{i}.tar.xz"
        bundle["parts"].append({"name": path.name, "sha256": sha256(path), "bytes": path.stat().st_size,
                                "files": len(names)})
    (out_dir / "bundle.json").write_text(json.dumps(bundle, indent=1) + "\n")
    return bundle


# ---- on the H200 (standard library only) ----------------------------------------------------------


def install(bundle_dir: Path, target: Path) -> tuple[int, str]:
    """Unpack into ``target`` the parts that came with this call, each checked against bundle.json's
    sha256, and say which are still missing. ``target/.lfm2vl-parts`` lists the parts already unpacked,
    so parts carried by successive calls (within the 30 s a machine stays warm) add up; a target holding
    another bundle's parts is emptied first. Returns (exit code, one line): 0 complete, 3 parts missing,
    2 a part (or bundle.json) is damaged or absent."""
    manifest = bundle_dir / "bundle.json"
    try:
        parts = json.loads(manifest.read_text())["parts"]
    except (OSError, ValueError, KeyError) as e:
        return 2, f"{manifest}: no readable bundle ({e.__class__.__name__})"
    record = target / RECORD
    done = dict(line.split() for line in record.read_text().splitlines() if line.strip()) if record.exists() else {}
    if done.items() - {(p["name"], p["sha256"]) for p in parts}:  # another bundle's parts: start afresh
        shutil.rmtree(target)
        done = {}
    todo = [p for p in parts if p["name"] not in done and (bundle_dir / p["name"]).exists()]
    for p in todo:
        if sha256(bundle_dir / p["name"]) != p["sha256"]:
            return 2, f"{bundle_dir / p['name']}: sha256 mismatch (damaged, or from another build)"
    target.mkdir(parents=True, exist_ok=True)
    for p in todo:
        with tarfile.open(bundle_dir / p["name"], "r:xz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(target, filter="data")
            else:
                tar.extractall(target)
        with record.open("a") as f:
            f.write(f"{p['name']} {p['sha256']}\n")
        done[p["name"]] = p["sha256"]
    missing = [p["name"] for p in parts if p["name"] not in done]
    if missing:
        return 3, f"missing parts: {' '.join(missing)} ({len(done)} of {len(parts)} unpacked in {target})"
    return 0, f"complete: {len(parts)} parts unpacked in {target}"


# ---- the command line -----------------------------------------------------------------------------


def git_tree_bytes(root: Path = ROOT) -> int:
    """What a device call carries of the tree: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout
    paths = (root / n for n in out.decode().split("\0") if n)
    return sum(p.lstat().st_size for p in paths if p.is_file() and not p.is_symlink())


def summary(bundle: dict, tree: int) -> str:
    room = CARRY_LIMIT - tree - MARGIN
    lines = [f"{p['name']}: {p['bytes'] / MIB:.1f} MiB, {p['files']} files" for p in bundle["parts"]]
    total = sum(p["bytes"] for p in bundle["parts"])
    fits = "one call carries it" if total <= room else f"it needs {len(bundle['parts'])} calls, a part each"
    lines += [f"total {total / MIB:.1f} MiB ({bundle['unpacked_bytes'] / MIB:.0f} MiB unpacked), vLLM {bundle['vllm']}",
              f"the tree is {tree / MIB:.1f} MiB: beside it, less a {MARGIN // MIB} MiB margin, "
              f"{room / MIB:.1f} MiB are left; {fits}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download, trim and pack the bundle (here)")
    b.add_argument("--max-part-mib", type=float, help="largest part (default: what fits beside the tree)")
    b.add_argument("--cache", type=Path, default=ROOT / "build" / "vllm-wheels")
    b.add_argument("--site", type=Path, default=ROOT / "build" / "vllm-site")
    b.add_argument("--out", type=Path, default=ROOT / ".vllm")
    i = sub.add_parser("install", help="unpack the parts this call carried (on the H200)")
    i.add_argument("--bundle", type=Path, default=Path(".vllm"))
    i.add_argument("--target", type=Path, default=Path("/tmp/vllm-site"))
    args = ap.parse_args(argv)
    if args.cmd == "install":
        rc, line = install(args.bundle, args.target)
        print(line)
        return rc
    tree = git_tree_bytes()
    limit = int(args.max_part_mib * MIB) if args.max_part_mib else CARRY_LIMIT - tree - MARGIN
    if limit <= 0:
        raise SystemExit(f"no room beside the tree ({tree / MIB:.1f} MiB); pass --max-part-mib")
    trims = stage(args.cache, args.site)
    for t in trims:
        print(f"trim {t['path']} ({t['bytes'] / MIB:.1f} MiB): {t['done']}")
    print(summary(pack(args.site, args.out, limit, trims), tree))
    return 0


if __name__ == "__main__":
    sys.exit(main())
