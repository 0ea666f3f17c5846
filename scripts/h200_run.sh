#!/usr/bin/env bash
# The H200 runs, through the device tool: every GPU number under data/results/nvidia-h200/ comes from
# here. Results land in $OUT/res.tgz (the device tool returns at most 8 files, two folders down), and
# are unpacked into data/results/ here. Each step has its own time limit, and the tarball is re-packed
# after each one, so a step that overruns still leaves what the others made.
#
#   bash scripts/h200_run.sh record      the reference set (python -m lfm2vl_lab record); call it
#                                        again until it says "complete": each call records what the
#                                        last one left, from the same code (RECORD_CHANGED=1: only the
#                                        roles whose own files changed); then, here, `python -m
#                                        lfm2vl_lab record --take <the unpacked res>`; with GPU_LIMIT
#                                        (seconds), the GPU test suite first (carry ".whl"); with
#                                        STARTUP_PROBE=1, scripts/startup_probe.py before either
#   bash scripts/h200_run.sh notebooks   every notebook executed against the reference set (NOTEBOOKS:
#                                        some of them), then the GPU test suite (GPU_TESTS: a subset);
#                                        carry the Jupyter wheels: `carry: [".whl"]`
#   bash scripts/h200_run.sh finish      what the reference set still lacks, then every notebook against
#                                        it and the GPU tests (GPU_TESTS) in the time left; carry ".whl"
#   bash scripts/h200_run.sh gpu-tests   the GPU test suite alone (GPU_TESTS: a subset)
#   bash scripts/h200_run.sh verify      the GPU test suite (GPU_LIMIT seconds), then the sanitize part
#   bash scripts/h200_run.sh compare     the GPU test suite (GPU_LIMIT seconds), then one bench run of the
#                                        reference set's bench-450m workloads 1x512, 16x512, tiled and
#                                        stream in hf-eager and lab-graph (bench-compare-*.json), a fused
#                                        graph with both cu_seqlens rules, and the fused body's host cost
#   bash scripts/h200_run.sh sanitize    scripts/sanitize_replay.py natively, then under compute-sanitizer's
#                                        memcheck (must end "ERROR SUMMARY: 0 errors") and initcheck
#                                        (reports explained in docs/design.md); logs sanitize-*.log
#   bash scripts/h200_run.sh boundary    scripts/boundary_probe.py: a kernel boundary inside a graph, the
#                                        copy bandwidth, and the 450M text model's decode GEMVs against it,
#                                        F.linear's and kernels/gemv.py's (Triton), and the RMSNorm before
#                                        a linear group as a compiled kernel or inside the GEMV (gemv_rmsnorm)
#   bash scripts/h200_run.sh engine-gemv scripts/engine_probe.py with ENGINE_MODES (default plain, fused and
#                                        fused-gemv: the decode linears through kernels/gemv.py; a mode ending
#                                        -pdl compiles with inductor's programmatic dependent launch) and ENGINE_ARGS
#                                        (e.g. "--max-len 448,1664 --full-span"), then the GPU tests GPU_TESTS
#                                        (default tests/test_gemv_gpu.py)
#   bash scripts/h200_run.sh decode-gap  scripts/decode_gap_probe.py: the TTFT grid's decode per token against the
#                                        engine role's, the same fused engine timed both ways, and a trace of the
#                                        grid's decode phase (its idle time and longest gaps)
#   bash scripts/h200_run.sh launch      scripts/launch_probe.py: a record step's command (LAUNCH_ROLE, default
#                                        ttft, on LAUNCH_PRESETS) forked and exec'd in turn, LAUNCH_RUNS times
#                                        (default 4), and whether the launch moves its spread and medians
#   bash scripts/h200_run.sh steps       where a record step's seconds go: scripts/startup_probe.py (each
#                                        phase of a step's start, three presets), then scripts/step_profile.py
#                                        on the steps STEP_ROLES names (default bench-450m, engine) under
#                                        cProfile (a probe: its result files are not the set's)
#   bash scripts/h200_run.sh startup     scripts/startup_probe.py on 450M twice (a cold process, then one that
#                                        finds the tree's bytecode and the page cache warm), then the
#                                        import times of bench's and ttft's modules (python -X importtime)
#   bash scripts/h200_run.sh vllm-stage  unpack the parts of the vLLM bundle this call carried into
#                                        /tmp/vllm-site, and say which parts are still missing
#   bash scripts/h200_run.sh vllm        the same; once the bundle is complete, vLLM's part of the reference
#                                        set (record --part vllm) on the unpacked vLLM, with the ENGINE_ENV
#                                        of lfm2vl_lab/measure/vllm_release.py; call it again (within 30 s,
#                                        carrying only .vllm/bundle.json) until the role is complete; with
#                                        NOTEBOOKS and NB_S, the last call then runs those notebooks
#
# vLLM (this machine has no network): `python3 scripts/vllm_bundle.py build` makes .vllm/ here, bundle.json
# and parts part-N.tar.xz, each sized to fit beside the tree; its last line says whether one call carries
# them all. If so: `carry: [".vllm"]` with `vllm`. If not, a part per call, bundle.json always with it:
# call 1 `carry: [".vllm/bundle.json", ".vllm/part-1.tar.xz"]` with `vllm-stage`, then within 30 s (the
# machine stays warm, /tmp with it, only that long) `carry: [".vllm/bundle.json", ".vllm/part-2.tar.xz"]`,
# the last part with `vllm`. A call that finds the machine cold finds /tmp empty: "missing parts: ...".
#
# The Jupyter wheels (the H200 image has no Jupyter), made once here; then delete the packaging,
# typing_extensions, pytest, pluggy and iniconfig wheels, which the image already has, and the debugpy,
# jedi and widgetsnbextension ones (12 MB), which executing a notebook never imports (a kernel without
# them ran a widget cell here): a call carries the tree and these together within 64 MiB:
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .whl \
#     nbval nbclient nbformat ipykernel ipywidgets
#   rm .whl/{packaging,typing_extensions,pytest,pluggy,iniconfig,debugpy,jedi,widgetsnbextension}-*.whl
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Every run measures the kit as a user who built its C++ pointer check (core/ptrcheck.py): unset, a
# stamp would use it only where an earlier process on the same machine had built it, so which check a
# step timed would depend on what ran before it. The first stamp of a machine builds it (a few seconds).
export LFM2VL_PTRCHECK=build
OUT=$(realpath -m "${OUT:-out}"); W=$OUT/w/x; R=$W/res; mkdir -p "$R"
T0=$(date +%s); DEADLINE=${DEADLINE:-585}  # seconds for the whole call: the device kills a call at 600 s
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
step() { local t=$1; shift; local l; l=$(left); [ "$t" -gt "$l" ] && t=$l
         [ "$t" -lt 5 ] && { echo "== skipped (no time left): $*"; return; }
         echo "== $* (limit ${t}s)"; local s; s=$(date +%s)
         timeout "$t" "$@" >"$W/$LOG.log" 2>&1; local rc=$?; tail -n "${TAILN:-4}" "$W/$LOG.log"
         echo "== rc=$rc in $(( $(date +%s) - s ))s"
         tar czf "$OUT/res.tgz" -C "$W" . 2>/dev/null; }
jupyter_wheels() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD; }
vllm_install() {  # the parts this call carried, added to those earlier calls left; exit code 0, 3 or 2
  python3 scripts/vllm_bundle.py install --bundle .vllm --target /tmp/vllm-site; }
vllm_env() {  # the unpacked vLLM first on the path, and the engine's environment from vllm_release.py
  export PYTHONPATH=/tmp/vllm-site:$PWD LFM2VL_VLLM_BUNDLE=$PWD/.vllm/bundle.json
  eval "$(python3 -c 'import runpy, shlex
env = runpy.run_path("lfm2vl_lab/measure/vllm_release.py")["ENGINE_ENV"]
print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items()))')"; }
record_args() {  # record's options from RECORD_PART, RECORD_CHANGED, RECORD_AGAIN and RECORD_ROLES (roles)
  echo ${RECORD_PART:+--part "$RECORD_PART"} ${RECORD_CHANGED:+--changed} ${RECORD_AGAIN:+--again} \
    $(for r in ${RECORD_ROLES:-}; do echo --role "$r"; done); }
sanitize_steps() {
  # The allocator's cache cannot be bypassed (PYTORCH_NO_CUDA_MEMORY_CACHING breaks graph capture), so
  # memcheck sees the allocator's segments, not each tensor; API return codes (cudaErrorNotReady from
  # event queries) are left out: the subject is device memory accesses.
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
  [ -n "$SAN" ] || { echo "no compute-sanitizer on this image"; exit 2; }
  "$SAN" --version | tail -n 1
  SAN_ARGS=(--print-limit 50 --report-api-errors no)
  LOG=sanitize-native    TAILN=2 step 90  python3 scripts/sanitize_replay.py
  LOG=sanitize-probe     TAILN=8 step 90  "$SAN" --tool initcheck "${SAN_ARGS[@]}" python3 scripts/sanitize_replay.py --probe
  LOG=sanitize-memcheck  TAILN=3 step 240 "$SAN" --tool memcheck --error-exitcode 1 "${SAN_ARGS[@]}" \
                                            python3 scripts/sanitize_replay.py
  LOG=sanitize-initcheck TAILN=3 step "$(left)" "$SAN" --tool initcheck "${SAN_ARGS[@]}" \
                                            python3 scripts/sanitize_replay.py
  # where initcheck's reports came from: per phase (the "== [...]" line printed before them), per kernel
  for f in sanitize-probe sanitize-initcheck; do
    echo "== $f: reports per phase, then per kernel"
    awk '/^== \[/{p=$0} /^========= [A-Z]/ && !/SUMMARY|COMPUTE-SANITIZER/{n[p]++} END{for(k in n) print n[k], k}' \
      "$W/$f.log" | sort -rn | head -n 20
    grep -A1 '^========= Uninitialized' "$W/$f.log" | grep '^=========     at ' \
      | sed 's/+0x[0-9a-f]*$//' | sort | uniq -c | sort -rn | head -n 12 | cut -c1-220
  done
}
PART=${1:-record}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
# the host's speed (scripts/host_probe.py, a few seconds): machines that report the same CPU launch at
# different rates, and eager and launch-bound numbers move with it; HOST_PROBE=0 leaves it out
[ "${HOST_PROBE:-1}" = 0 ] || python3 scripts/host_probe.py || echo "host probe failed (exit $?)"
case "$PART" in
record)
  # STARTUP_PROBE=1: first, where a step's fixed seconds go (scripts/startup_probe.py, about a minute)
  [ -n "${STARTUP_PROBE:-}" ] && LOG=startup TAILN=20 step 120 python3 scripts/startup_probe.py \
    --presets lfm2-vl-450m lfm2-vl-1.6b
  # GPU_LIMIT: the GPU test suite next, for at most that many seconds (carry ".whl"), so one machine
  # start serves both: a cold start costs about two minutes of device time
  if [ -n "${GPU_LIMIT:-}" ]; then
    jupyter_wheels
    LOG=pytest TAILN=8 step "$GPU_LIMIT" python3 -m pytest -q -rs -m gpu -p no:cacheprovider ${GPU_TESTS:-tests}
  fi
  # A warm machine keeps /tmp: this call goes on from what the last one recorded there (a cold one from
  # the tree's set, where the last call's res was copied), so a set in several calls needs no copy
  # back in between.
  [ -d /tmp/h200-res ] && cp -r /tmp/h200-res/. "$R"/
  # record stops starting steps 15 s before this step's end, so none is ever cut off (RECORD_PART: one
  # part of the steps, encoder or engine; RECORD_CHANGED=1: only the roles whose own files changed,
  # which needs the recorded versions of files changed in comments alone: carry .blobs; RECORD_AGAIN=1:
  # the roles again, though this code recorded them; RECORD_ROLES="ttft e2e": those roles alone, again)
  [ -n "${RECORD_CHANGED:-}" ] && { python3 scripts/carry_blobs.py --check || exit 1; }
  LOG=record TAILN=40 step "$(left)" python3 -m lfm2vl_lab record --out "$R" --deadline $(( $(left) - 15 )) \
    $(record_args)
  rm -rf /tmp/h200-res && cp -r "$R" /tmp/h200-res ;;
finish)
  # what the reference set still lacks (steps of RECORD_LIMIT seconds at most; the same RECORD_* choices
  # as record, going on from what a warm machine's last call recorded), then every notebook against it,
  # then the GPU tests (GPU_TESTS) in the time left; carry the Jupyter wheels
  jupyter_wheels
  [ -d /tmp/h200-res ] && cp -r /tmp/h200-res/. "$R"/
  LOG=record TAILN=30 step "${RECORD_LIMIT:-280}" python3 -m lfm2vl_lab record --out "$R" \
    --deadline $(( ${RECORD_LIMIT:-280} - 10 )) $(record_args)
  rm -rf /tmp/h200-res && cp -r "$R" /tmp/h200-res
  python3 - "$R" <<'PY' || exit 1
import json, sys, pathlib
man = next(pathlib.Path(sys.argv[1]).glob("*/reference.json"), None)
ok = man is not None and json.loads(man.read_text()).get("complete")
print("== reference set", "complete" if ok else "INCOMPLETE: the notebooks are not run")
sys.exit(0 if ok else 1)
PY
  cp -r "$R"/. data/results/  # the notebooks read the set from the tree (this copy of it, not the repo)
  LOG=nb     TAILN=12 step 330 python3 scripts/run_notebooks.py ${NOTEBOOKS:-notebooks/*.ipynb} --out "$W/nb"
  LOG=pytest TAILN=8  step "$(left)" python3 -m pytest -q -rs -m gpu -p no:cacheprovider ${GPU_TESTS:-tests} ;;
notebooks)
  jupyter_wheels
  LOG=nb     TAILN=12 step 380 python3 scripts/run_notebooks.py ${NOTEBOOKS:-notebooks/*.ipynb} --out "$W/nb"
  # GPU_TESTS: a subset of the suite where the call has less time left than the whole suite needs
  LOG=pytest TAILN=8  step "$(left)" python3 -m pytest -q -rs -m gpu -p no:cacheprovider ${GPU_TESTS:-tests} ;;
gpu-tests)
  jupyter_wheels  # nbformat, nbclient: some test modules import them
  LOG=pytest TAILN=8  step "$(left)" python3 -m pytest -q -rs -m gpu -p no:cacheprovider ${GPU_TESTS:-tests} ;;
vllm-stage)
  vllm_install; rc=$?; [ "$rc" -eq 3 ] && rc=0; exit "$rc" ;;  # a part still missing is what staging expects
vllm)
  # the partial file resumes only if its role's files are the recorded ones (comments and docstrings
  # aside): that needs the recorded versions, which a tree without git reads from .blobs (carry it)
  python3 scripts/carry_blobs.py --check || exit 1
  vllm_install || exit $?
  vllm_env
  out=$(python3 -c 'import vllm; print("== vllm", vllm.__version__, "from", vllm.__file__)' 2>&1) \
    || { echo "$out" | tail -n 20; exit 1; }
  echo "$out" | tail -n 1
  # A warm machine keeps /tmp: the next call resumes what this one recorded from there, so nothing has
  # to be carried back in between (a cold one resumes from the repo's copy, if that was carried).
  [ -d /tmp/h200-res ] && cp -r /tmp/h200-res/. "$R"/
  LOG=record-vllm TAILN=40 step $(( $(left) - ${NB_S:-0} )) python3 -m lfm2vl_lab record --part vllm \
    --out "$R" --deadline $(( $(left) - ${NB_S:-0} - 15 ))
  rm -rf /tmp/h200-res && cp -r "$R" /tmp/h200-res
  # NB_S seconds kept for NOTEBOOKS (carry ".whl"), run once the role is complete, against this call's set
  [ -n "${NOTEBOOKS:-}" ] || exit 0
  python3 - "$R" <<'PY' || exit 1
import json, sys, pathlib
man = json.loads(next(pathlib.Path(sys.argv[1]).glob("*/reference.json")).read_text())
ok = "vllm" in man["files"] and "vllm" not in man.get("partial", {})
print("== vllm role", "complete" if ok else "INCOMPLETE: the notebooks are not run")
sys.exit(0 if ok else 1)
PY
  jupyter_wheels && cp -r "$R"/. data/results/
  LOG=nb TAILN=12 step "$(left)" python3 scripts/run_notebooks.py $NOTEBOOKS --out "$W/nb" ;;
sanitize) sanitize_steps ;;
verify)
  # the GPU suite, then the sanitizer runs, in one call (one machine start)
  jupyter_wheels
  LOG=pytest TAILN=8  step "${GPU_LIMIT:-240}" python3 -m pytest -q -rs -m gpu -p no:cacheprovider ${GPU_TESTS:-tests}
  sanitize_steps ;;
compare)
  # after a change that must move no number: is it still the recorded kit?
  jupyter_wheels
  LOG=pytest TAILN=8  step "${GPU_LIMIT:-240}" python3 -m pytest -q -rs -m gpu -p no:cacheprovider ${GPU_TESTS:-tests}
  LOG=bench  TAILN=12 step 150 python3 -m lfm2vl_lab bench --preset lfm2-vl-450m --mode hf-eager,lab-graph \
                                 --workload 1x512,16x512,tiled,stream --stream-n 24 --repeats 30 --no-progress \
                                 --figure none --name bench-compare --out "$R"
  LOG=fused  TAILN=8  step 120 python3 -m lfm2vl_lab bench --preset lfm2-vl-450m --mode lab-graph,lab-graph-fused \
                                 --workload 1x512 --repeats 5 --cu-rule safe,repeat_last --no-progress \
                                 --figure none --name fused-rules --out "$R"
  LOG=probe  TAILN=8  step 60  python3 scripts/fused_host_probe.py ;;
boundary)
  LOG=boundary TAILN=30 step 180 python3 scripts/boundary_probe.py --out "$R" ;;
engine-gemv)
  # the fused text engine with its decode linears through the Triton GEMV, beside the plain and fused ones
  LOG=engine-gemv TAILN=70 step "${ENGINE_LIMIT:-300}" python3 scripts/engine_probe.py --modes "${ENGINE_MODES:-plain,fused,fused-gemv}" \
    ${ENGINE_ARGS:-} --json "$R/engine-gemv.json"
  LOG=pytest TAILN=8 step "$(left)" python3 -m pytest -q -rs -m gpu -p no:cacheprovider ${GPU_TESTS:-tests/test_gemv_gpu.py} ;;
decode-gap)
  # the TTFT grid's decode per token against the engine role's, one engine timed both ways
  LOG=decode-gap TAILN=45 step 300 python3 scripts/decode_gap_probe.py --json "$R/decode-gap.json" ;;
launch)
  # does record's forked launch move a step's numbers? LAUNCH_ROLE's command (default ttft) on
  # LAUNCH_PRESETS (default lfm2-vl-450m, so that four runs fit one call), forked and exec'd in turn
  LOG=launch TAILN=30 step "$(left)" python3 scripts/launch_probe.py --role "${LAUNCH_ROLE:-ttft}" \
    --runs "${LAUNCH_RUNS:-4}" $(for p in ${LAUNCH_PRESETS:-lfm2-vl-450m}; do echo --preset "$p"; done) --out "$R/launch" ;;
startup)
  LOG=startup-cold TAILN=12 step 60 python3 scripts/startup_probe.py --presets lfm2-vl-450m
  LOG=startup-warm TAILN=12 step 60 python3 scripts/startup_probe.py --presets lfm2-vl-450m
  LOG=importtime TAILN=0 step 40 python3 -X importtime -c "import lfm2vl_lab.measure.bench, lfm2vl_lab.measure.ttft"
  sort -t'|' -k2 -n -r "$W/importtime.log" | head -n 25 ;;
steps)
  LOG=startup TAILN=16 step 150 python3 scripts/startup_probe.py --presets lfm2-vl-450m lfm2-vl-1.6b lfm2-vl-3b
  for role in ${STEP_ROLES:-bench-450m engine}; do
    l=$(( $(left) - 75 )); [ "$l" -gt 200 ] && l=200  # the step stops at l, then cProfile saves its profile
    LOG=profile-$role TAILN=16 step $(( l + 70 )) python3 scripts/step_profile.py --role "$role" --limit "$l" \
      --out "$W/profile"
  done ;;
*) echo "unknown part $PART (record, notebooks, finish, gpu-tests, sanitize, verify, compare, boundary, engine-gemv, launch, steps,"\
        "startup, vllm)"
   exit 2 ;;
esac
ls -la "$OUT"
