"""The vLLM bundle for the H200 (scripts/vllm_bundle.py, scripts/vllm_fatbin.py), on synthetic files: the
fatbin rules zero exactly the payloads an sm_90 GPU never loads, the parts unpack to the site they were
packed from, and a damaged or missing part is named. No network, no vLLM."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    """A script as a module, registered under its name (vllm_bundle imports vllm_fatbin by name)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


fb = load("vllm_fatbin")
vb = load("vllm_bundle")
PTX, CUBIN = fb.PTX, fb.CUBIN


# ---- synthetic ELF files and fatbins ----------------------------------------------------------------


def elf(sections: list[tuple[str, int, bytes, int]]) -> bytearray:
    """A little-endian ELF64 file holding ``(name, type, data, link)`` sections after a null one, then the
    section-name table; ``link`` counts the null section (the first given section is 1)."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n, *_ in sections) + b".shstrtab\0"
    out, heads, at = bytearray(64), [(0, 0, 0, 0, 0)], 1
    for name, kind, data, link in [*sections, (".shstrtab", 3, names, 0)]:
        out += bytes(-len(out) % 8)
        heads.append((at, kind, len(out), len(data), link))
        out += data
        at += len(name) + 1
    out += bytes(-len(out) % 8)
    shoff = len(out)
    for name_off, kind, off, size, link in heads:
        out += struct.pack("<IIQQQQIIQQ", name_off, kind, 0, 0, off, size, link, 0, 8, 0)
    out[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", out, 0x28, shoff)
    struct.pack_into("<HHH", out, 0x3A, 64, len(heads), len(heads) - 1)
    return out


def entry(kind: int, arch: int, payload: bytes) -> bytes:
    head = bytearray(64)
    struct.pack_into("<HHIQ", head, 0, kind, 0x101, 64, len(payload))
    struct.pack_into("<I", head, 28, arch)
    return bytes(head) + payload


def blob(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", fb.FATBIN_MAGIC, 1, 16, len(body)) + body


def fat_so(*blobs: bytes) -> bytearray:
    """A shared library whose ``.nv_fatbin`` holds the blobs, 8 bytes of padding between them, after a
    ``.text`` section that must come through untouched."""
    return elf([(".text", 1, b"\x90" * 40, 0), (".nv_fatbin", 1, (bytes(8)).join(blobs), 0)])


def payload(i: int, n: int = 48) -> bytes:
    return bytes([i + 1]) * n  # never zero: a zeroed payload is unmistakable


def payloads(data: bytearray) -> list[bytes]:
    return [bytes(data[e.payload]) for b in fb.fatbin_blobs(data) for e in b]


def test_sm90_only_keeps_what_sm90_loads_and_zeroes_the_rest():
    a = blob(entry(CUBIN, 80, payload(0)), entry(CUBIN, 90, payload(1)), entry(CUBIN, 100, payload(2)),
             entry(PTX, 80, payload(3)), entry(PTX, 90, payload(4)))
    b = blob(entry(CUBIN, 80, payload(5)), entry(CUBIN, 86, payload(6)), entry(PTX, 75, payload(7)),
             entry(PTX, 89, payload(8)), entry(PTX, 100, payload(9)))
    c = blob(entry(CUBIN, 100, payload(10)), entry(PTX, 100, payload(11)))
    data = fat_so(a, b, c)
    before = bytes(data)
    assert fb.strip_fatbin(data, fb.sm90_only) == (12, 10, 10 * 48)
    assert len(data) == len(before)
    kept = {1, 8}  # the sm_90 cubin (its PTX is not needed); where none, the PTX of the highest arch <= 90
    assert payloads(data) == [payload(i) if i in kept else bytes(48) for i in range(12)]
    spans = [e.payload for bl in fb.fatbin_blobs(data) for e in bl]
    outside = bytearray(before)
    for s in spans:
        outside[s] = bytes(s.stop - s.start)
    for s in spans:
        data[s] = bytes(s.stop - s.start)
    assert data == outside  # headers, padding and every other section unchanged


def test_strip_fatbin_leaves_other_files_alone():
    plain = elf([(".text", 1, b"\x90" * 40, 0)])
    for data in (plain, bytearray(b"#!/bin/sh\n" * 10)):
        before = bytes(data)
        assert fb.strip_fatbin(data, fb.sm90_only) == (0, 0, 0) and data == before


def test_preset_head_dims_round_up_as_fa3_does(tmp_path):
    assert fb.preset_head_dims() == {64, 96}  # LFM2 text heads 64; vision 64 (450M) and 72 (1.6B, 3B)
    tower = {"hidden_size": 2048, "num_attention_heads": 16}
    (tmp_path / "lfm2-vl-x.json").write_text(json.dumps({"text": tower, "vision": tower}))
    (tmp_path / "tiny.json").write_text(json.dumps({"text": {"hidden_size": 4, "num_attention_heads": 1}}))
    assert fb.preset_head_dims(tmp_path) == {128}


def mainloop(hdim: int, hdim_v: int, element: str) -> str:
    """A FA3 forward kernel's name as c++filt prints it (shortened after the element type)."""
    return (f"void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
            f"flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, "
            f"cute::tuple<cute::C<128>, cute::C<96>, cute::C<{hdim}> >, {hdim_v}, cutlass::{element}, float, "
            f"cutlass::arch::Sm90, false> > > >(...)")


COMBINE = "void cutlass::device_kernel<flash::FlashAttnFwdCombine<cute::tuple<cute::C<8>, cute::C<128> >, 8> >()"


@pytest.mark.parametrize("kernels,kept", [
    ([mainloop(64, 64, "bfloat16_t")], True),
    ([mainloop(96, 96, "bfloat16_t")], True),
    ([mainloop(128, 128, "bfloat16_t")], False),
    ([mainloop(64, 64, "half_t")], False),
    ([mainloop(96, 96, "float_e4m3_t")], False),
    ([mainloop(64, 512, "bfloat16_t")], False),  # V heads wider than the kit's
    ([mainloop(128, 128, "bfloat16_t"), mainloop(64, 64, "bfloat16_t")], True),
    ([COMBINE], True),  # no mainloop: kept
    ([mainloop(128, 128, "half_t"), "some_kernel_we_do_not_know"], True),  # unsure: kept
    ([], True),
])
def test_fa3_rule_on_kernel_names(kernels, kept):
    assert fb.needed_kernels(kernels, {64, 96}) is kept


def cubin(*kernels: str) -> bytes:
    """An ELF64 cubin whose symbol table names ``kernels`` as FUNC symbols (and one OBJECT symbol)."""
    names = [*kernels, "a_global_variable"]
    strings, offsets = b"\0", []
    for n in names:
        offsets.append(len(strings))
        strings += n.encode() + b"\0"
    syms = bytes(24) + b"".join(struct.pack("<IBBHQQ", off, 0x12 if n in kernels else 0x11, 0, 1, 0, 0)
                                for off, n in zip(offsets, names))
    return bytes(elf([(".text", 1, b"\0" * 16, 0), (".symtab", 2, syms, 3), (".strtab", 3, strings, 0)]))


def test_func_symbols_reads_a_cubins_kernels():
    assert fb.func_symbols(cubin("k1", "k2")) == ["k1", "k2"]


def test_fa3_keep_zeroes_the_cubins_of_other_head_dims():
    blobs = [blob(entry(CUBIN, 90, cubin(mainloop(64, 64, "bfloat16_t"))), entry(PTX, 90, payload(0))),
             blob(entry(CUBIN, 90, cubin(mainloop(128, 128, "bfloat16_t")))),
             blob(entry(CUBIN, 90, cubin(COMBINE))),
             blob(entry(CUBIN, 90, payload(1, 200))),  # not an ELF (compressed?): kept
             blob(entry(CUBIN, 80, cubin(mainloop(64, 64, "bfloat16_t"))))]  # another arch: zeroed
    data = fat_so(*blobs)
    before = payloads(data)
    n, zeroed, _ = fb.strip_fatbin(data, fb.fa3_keep({64, 96}, names=list))
    assert (n, zeroed) == (6, 3)
    assert [p == b for p, b in zip(payloads(data), before)] == [True, False, False, True, True, False]
    assert all(not any(p) for p, b in zip(payloads(data), before) if p != b)


# Real names from vLLM 0.25.1's _vllm_fa3_C.abi3.so: substitutions (S8_, SA_) hide the head dim from any
# reading of the mangled form, and a clone is two names joined by '$'.
MANGLED_64_BF16 = (
    "_ZN7cutlass13device_kernelIN5flash20enable_sm90_or_laterINS1_16FlashAttnFwdSm90INS1_25CollectiveMainloopFwdSm90"
    "ILi2EN4cute5tupleIJNS5_1CILi1EEES8_S8_EEENS6_IJNS7_ILi192EEESA_NS7_ILi64EEEEEELi64ENS_10bfloat16_tEfNS_4arch4S"
    "m90ELb0ELb0ELb0ELb1ELb0ELb0ELb0ELb0ELb1ELb1ELb0ELb0ESD_Li4EEENS1_21CollectiveEpilogueFwdINS6_IJSA_SB_SA_EEES9_"
    "SD_SF_Li384ELb1ELb1ELb0ELb0ELi4EEENS1_36VarlenDynamicPersistentTileSchedulerILi192ELi192ELi384ELi32ELb0ELb1ELb1"
    "ELb0ELb0ELb1EEEEEEEEEvNT_6ParamsE")
MANGLED_128_BF16 = (
    "_ZN7cutlass13device_kernelIN5flash20enable_sm90_or_laterINS1_16FlashAttnFwdSm90INS1_25CollectiveMainloopFwdSm90"
    "ILi2EN4cute5tupleIJNS5_1CILi1EEES8_S8_EEENS6_IJNS7_ILi128EEESA_SA_EEELi128ENS_10bfloat16_tEfNS_4arch4Sm90ELb0E"
    "Lb1ELb0ELb1ELb0ELb0ELb0ELb1ELb1ELb1ELb0ELb0ESC_Li4EEENS1_21CollectiveEpilogueFwdISB_S9_SC_SE_Li256ELb1ELb1ELb0E"
    "Lb0ELi4EEENS1_36VarlenDynamicPersistentTileSchedulerILi128ELi128ELi256ELi32ELb0ELb1ELb1ELb1ELb0ELb1EEEEEEEEEvN"
    "T_6ParamsE")
MANGLED_COMBINE = ("_ZN7cutlass13device_kernelIN5flash19FlashAttnFwdCombineIN4cute5tupleIJNS3_1CILi8EEENS5_ILi128EEE"
                   "EEELi8ELi256ELi1ELb0ELb0EffNS_4arch4Sm90EEEEEvNT_6ParamsE")
CLONE = "$" + MANGLED_128_BF16 + "$" + MANGLED_COMBINE


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="c++filt (binutils) is not installed")
def test_demangled_real_names_meet_the_rule():
    names = fb.demangle([MANGLED_64_BF16, MANGLED_128_BF16, MANGLED_COMBINE, CLONE])
    assert [fb.needed_kernels([n], {64, 96}) for n in names[:3]] == [True, False, True]
    assert names[3].startswith("$void cutlass::device_kernel<flash::enable_sm90_or_later") and names[3].count("$") == 2
    assert fb.MAINLOOP.search(names[3])[1] == "128"  # a clone is read as the kernel it clones


# ---- parts: pack and install --------------------------------------------------------------------------

PINS = {"vllm": "0.0.0", "wheels": {"fake": "1.0"}}


def fake_site(root: Path) -> Path:
    """Incompressible files of several sizes in nested folders, an executable, and some text."""
    site = root / "site"
    rng = __import__("random").Random(0)
    for i, size in enumerate([90_000, 60_000, 40_000, 30_000, 20_000, 5_000, 0]):
        path = site / f"pkg{i % 3}" / "sub" / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
    (site / "pkg0" / "tool").write_bytes(b"#!/bin/sh\necho hi\n")
    (site / "pkg0" / "tool").chmod(0o755)
    (site / "pkg1" / "mod.py").write_text("print('hello')\n" * 500)
    return site


def contents(root: Path) -> dict[str, tuple[bytes, bool]]:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), os.access(p, os.X_OK))
            for p in root.rglob("*") if p.is_file() and p.name != vb.RECORD}


def test_pack_then_install_gives_the_site_back(tmp_path):
    site, out, limit = fake_site(tmp_path), tmp_path / "out", 110_000
    bundle = vb.pack(site, out, limit, trims=[{"path": "x", "bytes": 1, "done": "dropped"}], pins=PINS)
    assert len(bundle["parts"]) >= 2 and all(p["bytes"] <= limit for p in bundle["parts"])
    assert json.loads((out / "bundle.json").read_text()) == bundle
    assert bundle["vllm"] == "0.0.0" and bundle["trims"][0]["path"] == "x"
    assert sum(p["files"] for p in bundle["parts"]) == len(contents(site))
    assert bundle["unpacked_bytes"] == sum(len(b) for b, _ in contents(site).values())
    rc, line = vb.install(out, tmp_path / "target")
    assert (rc, line.startswith("complete")) == (0, True)
    assert contents(tmp_path / "target") == contents(site)
    for path in site.rglob("*"):
        os.utime(path, (1e9, 1e9))  # another day, the same files: the same bytes
    again = vb.pack(site, tmp_path / "out2", limit, pins=PINS)
    assert [p["sha256"] for p in again["parts"]] == [p["sha256"] for p in bundle["parts"]]


def test_parts_over_the_limit_pass_files_on(tmp_path, monkeypatch):
    """Estimates too low put everything in one part; measuring it moves files on until each part fits."""
    site = fake_site(tmp_path)
    monkeypatch.setattr(vb, "xz_size", lambda path: 1)
    bundle = vb.pack(site, tmp_path / "out", 110_000, pins=PINS)
    assert len(bundle["parts"]) >= 2 and all(p["bytes"] <= 110_000 for p in bundle["parts"])
    vb.install(tmp_path / "out", tmp_path / "target")
    assert contents(tmp_path / "target") == contents(site)
    with pytest.raises(SystemExit, match="f0.bin"):
        vb.pack(site, tmp_path / "out3", 50_000, pins=PINS)  # a file alone over the limit cannot travel


def test_parts_carried_in_successive_calls_add_up(tmp_path, capsys):
    site, out = fake_site(tmp_path), tmp_path / "out"
    bundle = vb.pack(site, out, 110_000, pins=PINS)
    first, *rest = [p["name"] for p in bundle["parts"]]
    call = tmp_path / "call"
    call.mkdir()
    shutil.copy(out / "bundle.json", call)
    shutil.copy(out / first, call)
    target = tmp_path / "target"
    assert vb.main(["install", "--bundle", str(call), "--target", str(target)]) == 3
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and all(name in line for name in rest) and first not in line.split("(")[0]
    (call / first).unlink()  # the next call carries only what is left
    for name in rest:
        shutil.copy(out / name, call)
    assert vb.main(["install", "--bundle", str(call), "--target", str(target)]) == 0
    assert contents(target) == contents(site)


def test_a_damaged_part_is_named_and_refused(tmp_path, capsys):
    out = tmp_path / "out"
    bundle = vb.pack(fake_site(tmp_path), out, 110_000, pins=PINS)
    name = bundle["parts"][-1]["name"]
    data = bytearray((out / name).read_bytes())
    data[len(data) // 2] ^= 1
    (out / name).write_bytes(data)
    assert vb.main(["install", "--bundle", str(out), "--target", str(tmp_path / "t")]) == 2
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and name in line and "sha256" in line
    assert not (tmp_path / "t").exists()  # nothing unpacked from a bundle with a bad part
    assert vb.install(tmp_path / "nowhere", tmp_path / "t")[0] == 2


def test_install_imports_nothing_beyond_the_standard_library(tmp_path):
    """The H200 runs it before vLLM is there, with its own python3: no torch, no lfm2vl_lab."""
    out = tmp_path / "out"
    vb.pack(fake_site(tmp_path), out, 110_000, pins=PINS)
    code = ("import runpy, sys; m = runpy.run_path(sys.argv[1]); rc = m['main'](['install', '--bundle', sys.argv[2],"
            " '--target', sys.argv[3]]); print(sorted({n.split('.')[0] for n in sys.modules}"
            " - set(sys.stdlib_module_names) - {'__main__', '__mp_main__'}), rc)")
    res = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(ROOT / "scripts" / "vllm_bundle.py"), str(out),
                          str(tmp_path / "target")], capture_output=True, text=True, check=True)
    assert res.stdout.strip().splitlines()[-1] == "[] 0"


# ---- wheels and pins ------------------------------------------------------------------------------


def test_unpack_wheel_is_pip_install_target(tmp_path):
    whl = tmp_path / "fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("fake/__init__.py", "x = 1\n")
        exe = zipfile.ZipInfo("fake/bin/tool")
        exe.external_attr = 0o755 << 16
        z.writestr(exe, "#!/bin/sh\n")
        z.writestr("fake-1.0.data/purelib/fake_extra.py", "y = 2\n")
        z.writestr("fake-1.0.data/scripts/fake-cli", "#!python\n")
    vb.unpack_wheel(whl, tmp_path / "site")
    assert contents(tmp_path / "site") == {"fake/__init__.py": (b"x = 1\n", False),
                                           "fake/bin/tool": (b"#!/bin/sh\n", True),
                                           "fake_extra.py": (b"y = 2\n", False)}


def test_download_reuses_the_cache_without_the_network(tmp_path, monkeypatch):
    rel = vb.release()
    for name, ver in [("vllm", rel["vllm"]), *rel["wheels"].items()]:
        (tmp_path / f"{name.replace('-', '_')}-{ver}-py3-none-any.whl").touch()
    monkeypatch.setattr(vb.subprocess, "run", lambda *a, **k: pytest.fail("pip was called"))
    assert len(vb.download(tmp_path)) == 1 + len(rel["wheels"])


def test_pins_live_in_vllm_release_only():
    tomllib = pytest.importorskip("tomllib")
    rel = vb.release()
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    assert extra == [f"vllm=={rel['vllm']}"]
    for script in ("vllm_bundle.py", "vllm_fatbin.py", "vllm_venv.sh", "h200_run.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert rel["vllm"] not in text and rel["wheels"]["xgrammar"] not in text, f"scripts/{script} repeats a pin"
