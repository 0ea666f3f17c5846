"""The fatbin rules of scripts/vllm_fatbin.py, on synthetic files: they zero exactly the payloads an sm_90 GPU
never loads. No network, no vLLM."""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    """A script as a module, registered under its name."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


fb = load("vllm_fatbin")
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
