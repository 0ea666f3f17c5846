export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 LFM2VL_PTRCHECK=build
R=$OUT/res; mkdir -p $R
A="ttft --preset lfm2-vl-450m --image 1x512,tiled --requests 1,2,4,8 --repeats 7 --decode-tokens 16 --fuse on --no-progress"
python3 scripts/host_probe.py
TORCHINDUCTOR_CACHE_DIR=/tmp/c1 TRITON_CACHE_DIR=/tmp/t1 timeout 160 python3 -m lfm2vl_lab $A --name probe-exec --out $R > $OUT/exec.log 2>&1; echo exec rc=$?
python3 scripts/host_probe.py
timeout 170 python3 - $R $A <<'PY' > $OUT/fork.log 2>&1; echo fork rc=$?
import sys
from lfm2vl_lab.measure.launch import Launcher
out, argv = sys.argv[1], sys.argv[2:]
with Launcher() as L:
    rc = L.run([*argv, "--name", "probe-fork", "--out", out], sys.stdout, 160,
               {"TORCHINDUCTOR_CACHE_DIR": "/tmp/c2", "TRITON_CACHE_DIR": "/tmp/t2"})
print("rc", rc)
PY
python3 scripts/host_probe.py
grep -h "TTFT" $OUT/exec.log $OUT/fork.log | cut -c1-110
tar czf $OUT/res.tgz -C $OUT res
