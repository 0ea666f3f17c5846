"""``python -m lfm2vl_lab engine`` on the CPU with the tiny preset: every peer of the text model gives
``generate``'s tokens and float32's logits, a mode that fails is a recorded row (not a crash), the
targets are judged from the file's numbers, the bandwidth floor is its formula, and the file, its
table, its figure and its record step have the shape readers rely on."""

import inspect
import json

import pytest
import torch
from torch import nn

import lfm2vl_lab.serving.engine as engine_module
from lfm2vl_lab import build_model
from lfm2vl_lab.cli.cli import build_parser, main
from lfm2vl_lab.measure import engine_peers as peers
from lfm2vl_lab.measure.engine_measure import PROFILE_KEYS, TARGETS, judge_engine, measure_preset, summary_lines
from lfm2vl_lab.measure.record import STEPS
from lfm2vl_lab.measure.workloads import default_device
from lfm2vl_lab.serving.engine import TextEngine

FUSED = "fuse" in inspect.signature(TextEngine).parameters
MODES = peers.MODES if FUSED else tuple(m for m in peers.MODES if m != "engine-fused")


@pytest.fixture(scope="module")
def model():
    """The tiny preset with an LM head of its own (untied from the embeddings): its greedy tokens
    then change from step to step, so matching 16 of them says something."""
    m = build_model("tiny", text_layers="full")
    w = m.lm_head.weight
    m.lm_head.weight = nn.Parameter(torch.randn(w.shape, generator=torch.Generator().manual_seed(1)) * w.std().item())
    return m


@pytest.fixture(scope="module")
def measured(model):
    return measure_preset(model, MODES, repeats=2, decode_tokens=3, profile=True)


def test_every_mode_gives_generates_tokens_and_float32s_logits(measured):
    want = measured["setup"]["generate_tokens"]
    assert len(want) == peers.TOKENS_COMPARED and len(set(want)) > 1
    rows = {r["mode"]: r for r in measured["rows"] if r["requests"] == 1}
    assert list(rows) == list(MODES)
    for mode, r in rows.items():
        assert "error" not in r, (mode, r.get("traceback"))
        assert r["tokens"] == want and r["matching_tokens"] == peers.TOKENS_COMPARED, mode
        assert r["first_token"] == want[0] and r["first_token_as_fp32"], mode
        assert r["rel_err_vs_fp32"] < 1e-5 and r["logits_ok"] and r["finite"], mode
        assert r["prefill_sample_ms"] > 0 and r["decode_ms_per_token"] is not None, mode
        assert len(r["prefill_sample_samples_ms"]) == len(r["decode_samples_ms"]) == 2
        assert r["first_call"]["first_call_s"] > 0
    assert rows["compile-ro"]["decode_timing"] == "direct" and rows["engine"]["decode_timing"] == "difference"
    assert rows["engine"]["prefill_len"] == 320 and rows["generate"]["prefill_len"] == 280  # the engine pads
    if FUSED:  # off CUDA the fused engine traces without inductor's C++ build, and leaves the setting as it was
        assert rows["engine-fused"]["first_call"]["compile_backend"] == peers.CPU_COMPILE_BACKEND
        assert engine_module.FUSE_COMPILE["backend"] == "inductor"


def test_the_engines_decode_eight_requests(measured):
    batch = [r for r in measured["rows"] if r["requests"] == peers.BATCH]
    assert [r["mode"] for r in batch] == [m for m in MODES if m in peers.ENGINE_MODES]
    for r in batch:  # a step of no measurable time (CPU noise in a difference of two calls) has no rate
        step = r["decode_ms_per_step"]
        assert r["tokens_per_s"] == (pytest.approx(peers.BATCH * 1e3 / step) if step > 0 else None)


def test_profile_has_a_prefill_and_a_decode_step_per_mode(measured):
    assert list(measured["profile"]) == list(MODES)
    for mode, p in measured["profile"].items():
        for part in ("prefill", "decode_step"):
            assert set(PROFILE_KEYS) <= set(p[part]) and isinstance(p[part]["classes"], dict), (mode, part)
        assert p["decode_step"]["method"] == ("one step" if mode == "compile-ro" else "2-token call less 1-token call")


def test_a_mode_that_fails_is_recorded_not_raised(model, monkeypatch):
    setup = peers.GeneratePeer.setup

    def unsupported(self, device):
        if self.static:
            raise RuntimeError("the hybrid cache has no static form\n(a second line the row leaves out)")
        return setup(self, device)

    monkeypatch.setattr(peers.GeneratePeer, "setup", unsupported)
    got = measure_preset(model, ["generate", "hf-static-compile"], repeats=1, decode_tokens=2)
    ok, bad = got["rows"]
    assert bad["error"] == "RuntimeError: the hybrid cache has no static form"
    assert not {"prefill_sample_ms", "decode_ms_per_token", "tokens"} & set(bad)
    assert ok["matching_tokens"] == peers.TOKENS_COMPARED
    lines = summary_lines({"setup": [got["setup"]], "rows": got["rows"]})
    assert any("hf-static-compile" in line and "not run: RuntimeError" in line for line in lines)


def _row(preset, mode, prefill, decode, capture):
    return {"preset": preset, "mode": mode, "requests": 1, "prefill_sample_ms": prefill, "decode_ms_per_token": decode,
            "first_call": {"capture_s": capture}}


def test_targets_are_judged_from_the_numbers():
    small, big = "lfm2-vl-450m", "lfm2-vl-1.6b"
    pre, dec, cap = TARGETS["prefill_sample_ms"][small], TARGETS["decode_ms_per_token"], TARGETS["capture_s"]

    def judge(prefill=0.9 * pre, decode=0.9 * dec[small], capture=0.9 * cap, ro=2 * pre):
        rows = [_row(small, "engine", prefill, decode, capture), _row(small, "compile-ro", ro, 1.0, None)]
        return {t["target"]: t["ok"] for t in judge_engine(rows)}

    assert all(judge().values()) and len(judge()) == 4
    for over, name in ((dict(prefill=1.1 * pre), "prefill+sample ms"), (dict(decode=1.1 * dec[small]), "decode"),
                       (dict(capture=1.1 * cap), "capture"), (dict(ro=0.8 * pre), "below compile-ro")):
        failed = [k for k, ok in judge(**over).items() if not ok]
        assert len(failed) == 1 and name in failed[0], (over, failed)
    targets = judge_engine([_row(big, "engine-fused", 5.0, 0.9 * dec[big], 1.0)])
    assert [t["limit"] for t in targets] == [dec[big], cap] and all(t["ok"] for t in targets)  # no prefill target
    alone = judge_engine([_row(small, "engine", 0.5, 0.1, 1.0)])
    assert [t["detail"] for t in alone if not t["ok"]] == ["no compile-ro prefill in this file"]
    failed = judge_engine([{"preset": small, "mode": "engine-fused", "requests": 1, "error": "TypeError: x"}])
    assert [(t["ok"], t["detail"]) for t in failed] == [(False, "TypeError: x")]


def test_the_bandwidth_floor_is_weight_bytes_over_bandwidth(model):
    tied = build_model("tiny", text_layers="full")
    lm, head = tied.model.language_model, tied.lm_head
    f = peers.bandwidth_floor(tied)
    assert f["tied_lm_head"] and f["param_bytes"] == sum(p.numel() * p.element_size() for p in lm.parameters())
    assert f["floor_ms"] == pytest.approx(f["param_bytes"] / 4.8e12 * 1e3)
    assert peers.bandwidth_floor(tied, 2.4e12)["floor_ms"] == pytest.approx(2 * f["floor_ms"])
    untied = peers.bandwidth_floor(model)  # the embedding table is read one row a step, its own head whole
    emb = model.model.language_model.embed_tokens.weight
    assert not untied["tied_lm_head"] and untied["embedding_row_bytes"] == emb.shape[1] * emb.element_size()
    assert untied["param_bytes"] == f["param_bytes"] - emb.nbytes + head.weight.nbytes + untied["embedding_row_bytes"]


def test_the_command_parses_and_refuses_a_bad_mode(capsys):
    args = build_parser().parse_args(["engine"])
    assert (args.modes, args.repeats, args.decode_tokens, args.name) == (list(peers.MODES), 30, 16, "engine")
    assert not args.profile and args.preset is None
    args = build_parser().parse_args(["engine", "--preset", "tiny", "--preset", "lfm2-vl-450m", "--modes",
                                      "engine,compile-ro", "--profile", "--no-progress"])
    assert args.preset == ["tiny", "lfm2-vl-450m"] and args.modes == ["engine", "compile-ro"] and args.profile
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["engine", "--modes", "engine,nope"])
    assert exc.value.code == 2 and "nope" in capsys.readouterr().err


def test_the_command_writes_one_file_with_every_section(tmp_path, capsys):
    assert main(["engine", "--preset", "tiny", "--modes", "generate,engine", "--repeats", "1", "--decode-tokens", "2",
                 "--out", str(tmp_path), "--no-progress"]) == 0
    (path,) = tmp_path.glob("*/engine-*.json")  # cpu/ here, the GPU's folder on one
    res = json.loads(path.read_text())
    assert res["name"] == "engine" and res["provenance"]["device"] == default_device().type
    assert res["provenance"]["modes"] == ["generate", "engine"] and res["prompt"] == peers.PROMPT_SOURCE
    assert [s["preset"] for s in res["setup"]] == ["tiny"] and res["setup"][0]["floor"]["floor_ms"] > 0
    assert [(r["mode"], r["requests"]) for r in res["rows"]] == [("generate", 1), ("engine", 1), ("engine", 8)]
    assert res["targets"] == judge_engine(res["rows"]) and res["errors"] == []
    out = capsys.readouterr().out
    assert "bandwidth floor" in out and f"results: {path}" in out


def test_every_record_step_parses_as_its_command():
    """Each step of the reference run is a command line the kit's own parser accepts (a renamed
    option would otherwise surface only on the GPU, as a failed step)."""
    from lfm2vl_lab.cli.cli import build_parser

    parser = build_parser()
    for step in STEPS:
        args = parser.parse_args(list(step.argv))
        assert args.command == step.argv[0], step.role
    engine = next(s for s in STEPS if s.role == "engine")
    assert parser.parse_args(list(engine.argv)).profile


def test_small_helpers():
    assert peers.one_line(ValueError("first\nsecond")) == "ValueError: first"
    assert peers.matching([1, 2, 3], [1, 2, 4]) == 2 and peers.matching([1], [1]) == 1
    with pytest.raises(AttributeError, match="_decode_body"):
        peers.decode_body(object())


@torch.no_grad()
def test_compile_ro_decode_starts_from_the_prompts_state_every_call(model):
    """compile-ro's decode steps run alone, many times, from one prefill: each call must start from
    the state right after the prompt, the conv layers' last inputs included (a call that inherits
    the last call's conv state decodes other tokens after the first)."""
    H = model.config.text_config.hidden_size
    peer = peers.CompileRoPeer(model, torch.randn(1, 40, H, generator=torch.Generator().manual_seed(2)), 3)
    e = peer.eng
    e.prompt(1, 40).copy_(peer.embeds)
    e.prefill([40])
    e.sample()
    after_prompt = {i: s.clone() for i, s in e.cache.conv.items()}
    peer.setup(torch.device("cpu"))  # prefills again, then times first calls (decodes)
    seen, step = [], peer.step

    def watched(n, span):
        seen.append({i: s.clone() for i, s in e.cache.conv.items()})
        return step(n, span)

    peer.step = watched
    peer._decode(4)
    peer._decode(4)
    for first in (seen[0], seen[4]):  # what each call's first step reads
        assert all(torch.equal(first[i], after_prompt[i]) for i in after_prompt)
    assert not all(torch.equal(seen[3][i], after_prompt[i]) for i in after_prompt)  # the steps do move it
