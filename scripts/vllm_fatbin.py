"""vLLM's fat binaries trimmed to what an sm_90 GPU (the H200) loads: ``scripts/vllm_bundle.py`` builds on it.

A CUDA extension keeps its device code in the ELF section ``.nv_fatbin``: blobs, one per compilation unit,
each holding the same kernels as cubins for several archs and as PTX. An sm_90 GPU loads one entry per
blob; zeroing the payloads of the others keeps every size and offset (the file loads as before) while
xz packs the zeros to nothing. FlashAttention 3 is trimmed further, to the head dims the kit's presets
need. Zeroing an entry that was needed shows as CUDA's "no kernel image is available" when its kernel is
first launched, never as wrong numbers. (CUDA loads modules lazily on Linux by default since 12.2, so a
zeroed cubin is read only if one of its kernels is launched; ``CUDA_MODULE_LOADING=EAGER`` would read
them all at start.)
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PRESETS = Path(__file__).resolve().parents[1] / "data" / "presets"
FATBIN_MAGIC, PTX, CUBIN, SM = 0xBA55ED50, 1, 2, 90
FA3_HEAD_DIMS = (64, 96, 128, 192, 256)  # FlashAttention 3 rounds a head dim up to one of these
# FA3's forward mainloop as c++filt prints it: <stages, cluster shape, tile shape (M, N, head dim),
# head dim of V, element type, ...>; groups: head dim, head dim of V, element type.
MAINLOOP = re.compile(r"flash::CollectiveMainloopFwdSm90<\d+, cute::tuple<(?:cute::C<\d+>,? ?){3}>, "
                      r"cute::tuple<cute::C<\d+>, cute::C<\d+>, cute::C<(\d+)> ?>, (\d+), ([\w:]+),")


@dataclass(frozen=True)
class Entry:
    """One entry of a fatbin blob: a cubin (compiled for one arch) or PTX (JIT-compiled by the driver)."""

    offset: int  # of the entry header, in the file
    kind: int  # PTX or CUBIN
    arch: int  # 90 for sm_90
    header_size: int
    size: int  # payload bytes, after the header

    @property
    def payload(self) -> slice:
        start = self.offset + self.header_size
        return slice(start, start + self.size)


def cstr(data, offset: int) -> str:
    return bytes(data[offset:data.index(b"\0", offset)]).decode("utf-8", "replace")


def elf_sections(data) -> list[tuple[str, int, int, int, int]]:
    """(name, type, offset, size, link) of each section of a little-endian ELF64 file, from its section
    header table (e_shoff at 0x28; e_shentsize, e_shnum, e_shstrndx at 0x3A)."""
    if bytes(data[:6]) != b"\x7fELF\x02\x01":
        raise ValueError("not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = heads[shstrndx][4]
    return [(cstr(data, names + h[0]), h[1], h[4], h[5], h[6]) for h in heads]


def elf_section(data, name: str) -> tuple[int, int] | None:
    try:
        found = [(off, size) for n, _, off, size, _ in elf_sections(data) if n == name]
    except (ValueError, struct.error):
        return None
    return found[0] if found else None


def fatbin_blobs(data) -> list[list[Entry]]:
    """The entries of each blob in ``.nv_fatbin`` (blob header ``<IHHQ``: magic, version, header size,
    entries' size; entry header ``<HHIQ``: kind, -, header size, payload size; arch at +28). Bytes
    between blobs that do not start with the magic are padding, stepped over 8 at a time."""
    sec = elf_section(data, ".nv_fatbin")
    if sec is None:
        return []
    blobs, p, end = [], sec[0], sec[0] + sec[1]
    while p + 16 <= end:
        magic, _, hsize, fsize = struct.unpack_from("<IHHQ", data, p)
        if magic != FATBIN_MAGIC:
            p += 8
            continue
        q, stop, entries = p + hsize, p + hsize + fsize, []
        while q < stop:
            kind, _, ehsize, esize = struct.unpack_from("<HHIQ", data, q)
            (arch,) = struct.unpack_from("<I", data, q + 28)
            entries.append(Entry(q, kind, arch, ehsize, esize))
            q += ehsize + esize
        blobs.append(entries)
        p = stop
    return blobs


Keep = Callable[[bytearray, Entry, list[Entry]], bool]


def strip_fatbin(data: bytearray, keep: Keep) -> tuple[int, int, int]:
    """Zero, in place, the payload of every fatbin entry ``keep(data, entry, blob)`` refuses. Headers and
    sizes stay, so every offset in the file holds; xz packs the zeros to almost nothing. Returns (entries,
    entries zeroed, bytes zeroed)."""
    n = zeroed = nbytes = 0
    for blob in fatbin_blobs(data):
        for e in blob:
            n += 1
            if not keep(data, e, blob):
                data[e.payload] = bytes(e.size)
                zeroed, nbytes = zeroed + 1, nbytes + e.size
    return n, zeroed, nbytes


def sm90_only(data: bytearray, entry: Entry, blob: list[Entry]) -> bool:
    """What an sm_90 GPU loads from a blob: its sm_90 cubin when there is one (cubins of other archs never
    run there, and the PTX is only a fallback); else the PTX of the highest arch <= 90, which the driver
    compiles at load time. A blob with neither is of no use on sm_90 and is zeroed whole."""
    if any(e.kind == CUBIN and e.arch == SM for e in blob):
        return entry.kind == CUBIN and entry.arch == SM
    ptx = [e.arch for e in blob if e.kind == PTX and e.arch <= SM]
    return entry.kind == PTX and bool(ptx) and entry.arch == max(ptx)


def preset_head_dims(presets: Path = PRESETS) -> set[int]:
    """The FA3 head dims LFM2-VL's presets need: text and vision, hidden size over heads, rounded up the
    way FlashAttention 3 does (72, the 1.6B and 3B vision heads, runs in its 96 kernels)."""
    dims = set()
    for path in sorted(presets.glob("lfm2*-vl-*.json")):
        cfg = json.loads(path.read_text())
        for tower in ("text", "vision"):
            head = cfg[tower]["hidden_size"] // cfg[tower]["num_attention_heads"]
            dims.add(next(d for d in FA3_HEAD_DIMS if d >= head))
    return dims


def func_symbols(elf) -> list[str]:
    """The names of the FUNC symbols in an ELF64 file's symbol tables: a cubin's kernels."""
    sections, names = elf_sections(elf), []
    for _, kind, off, size, link in sections:
        if kind == 2:  # SHT_SYMTAB; its names are in section `link`
            strings = sections[link][2]
            for i in range(off, off + size, 24):
                st_name, st_info = struct.unpack_from("<IB", elf, i)
                if st_info & 0xF == 2:  # STT_FUNC
                    names.append(cstr(elf, strings + st_name))
    return names


def demangle(names: list[str]) -> list[str]:
    """c++filt's reading of mangled C++ names, each ``$``-joined piece on its own (the compiler's clones of
    a kernel are named ``$<kernel>$<local>``); the names unchanged where c++filt is missing, which the FA3
    rule then treats as unrecognised kernels, and keeps."""
    exe = shutil.which("c++filt")
    pieces = [p for n in names for p in n.split("$")]
    if exe is None or not pieces:
        return list(names)
    out = subprocess.run([exe], input="\n".join(pieces) + "\n", capture_output=True, text=True, check=True)
    lines, done = iter(out.stdout.split("\n")), []
    for n in names:
        done.append("$".join(next(lines) for _ in n.split("$")))
    return done


def needed_kernels(kernels: list[str], head_dims: set[int]) -> bool:
    """Whether a FA3 cubin serves the kit: one of its (demangled) kernels has a forward mainloop in bf16
    whose head dims, of Q/K and of V, are both needed (LFM2-VL's attention has V heads as wide as Q/K
    heads; FA3 runs head dim 64 with V 64 in its 64x64 kernels, not its 64x256 or 64x512 ones), or carries
    no mainloop at all (the combine kernel, anything unrecognised: kept when unsure). A cubin with no
    kernel names is kept too."""
    if not kernels:
        return True
    for name in kernels:
        m = MAINLOOP.search(name)
        if m is None or (int(m[1]) in head_dims and int(m[2]) in head_dims and m[3] == "cutlass::bfloat16_t"):
            return True
    return False


def fa3_keep(head_dims: set[int], names: Callable[[list[str]], list[str]] = demangle) -> Keep:
    """FlashAttention 3's rule: ``sm90_only``, then of its sm_90 cubins (one per compilation unit) only
    those whose kernels serve ``head_dims`` in bf16. Zeroing a kernel the kit does need shows up as CUDA's
    "no kernel image is available" at its first launch, never as wrong numbers."""

    def keep(data: bytearray, entry: Entry, blob: list[Entry]) -> bool:
        if not sm90_only(data, entry, blob):
            return False
        if entry.kind != CUBIN:
            return True
        cubin = bytes(data[entry.payload])
        try:
            kernels = names(func_symbols(cubin))
        except (ValueError, struct.error, IndexError):
            return True  # not a readable ELF (compressed?): keep
        return needed_kernels(kernels, head_dims)

    return keep
