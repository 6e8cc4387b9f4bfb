#!/usr/bin/env bash
# Run verify-gpu's node-side checks directly on this machine's NVIDIA GPU(s), no SSH, with the
# system Python and its torch: the real GEMM, HBM copy, all-reduce (several GPUs) and the
# DDP + AMP + checkpointing training step, plus nvidia-smi health. Prints GEMM TFLOP/s, HBM
# GB/s, tokens/s, MFU and the total wall time; writes the raw JSON (and the verdict, when the
# project's dependencies are importable) to $OUT if it is set.
#
#   scripts/device_verify.sh                  # PYTHON=python3, scratch in a temp dir
#   PYTHON=/opt/gpufleet/venv/bin/python SCRATCH=/scratch scripts/device_verify.sh
#
# Bounded: the node script kills torchrun after 240 s, this script gives up after 280 s.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
work=$(mktemp -d /tmp/gpufleet-device-verify.XXXXXX)
trap 'rm -rf "$work"' EXIT
scratch=${SCRATCH:-$work}
started=$(date +%s.%N)

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "device_verify: no nvidia-smi on this machine; this script needs an NVIDIA GPU" >&2
  exit 2
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader

# The catalog's dense peak for the GPU found (MFU's denominator). infra.catalog is stdlib-only
# (tomllib, Python >= 3.11); on an older Python MFU is left out rather than guessed.
peak=$("$PY" - <<'EOF' 2>/dev/null || echo 0
import subprocess
from infra.catalog import gpu_by_nvml_name, load_catalog
name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                      capture_output=True, text=True, check=True).stdout.splitlines()[0]
gpu = gpu_by_nvml_name(load_catalog(), name)
print(gpu.peak_tflops if gpu else 0)
EOF
)
echo "catalog peak: ${peak} TFLOP/s per GPU (0: GPU not in the catalog, MFU not computed)"

timeout 280 "$PY" -m gpufleet_node.verify_node \
  --mode gpu --timeout 240 --scratch "$scratch" --scratch-mb 2048 \
  --peak-tflops "$peak" --out "$work/verify_node.json" --workdir "$work/run"

ended=$(date +%s.%N)
"$PY" - "$work/verify_node.json" "$started" "$ended" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
wall = float(sys.argv[3]) - float(sys.argv[2])
run = report.get("torchrun") or {}
for err in (run.get("errors") or []) + ([report["fatal"]] if report.get("fatal") else []):
    print(f"ERROR: {err}")
if run.get("log_tail"):
    print(run["log_tail"])
for g in run.get("gemm") or []:
    print(f"GEMM   GPU{g['local_rank']}: {g['tflops']:.1f} TFLOP/s ({g['n']}^3 {g['dtype']}, {g['iters']} iters)")
for h in run.get("hbm") or []:
    print(f"HBM    GPU{h['local_rank']}: {h['gbs']:.0f} GB/s (device copy of {h['bytes'] / 2**30:.1f} GiB)")
ar = run.get("allreduce")
if ar:
    print(f"NCCL   all-reduce busbw {ar['busbw_gbs']:.1f} GB/s over {ar['world']} GPUs, correct={ar['correct']}")
t = run.get("train")
if t:
    losses = t["losses"]
    print(f"TRAIN  {t['world']} rank(s), {t['amp']}, checkpointing={t['checkpointing']}: "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {t['steps']} steps")
    print(f"TRAIN  {t['tokens_per_s']:,.0f} tokens/s, "
          + (f"MFU {t['mfu']:.1%} ({t['achieved_tflops'] / t['world']:.0f} TFLOP/s per GPU)"
             if "mfu" in t else "MFU n/a"))
s = report.get("scratch") or {}
if s.get("read_gbs"):
    print(f"DISK   {s['path']}: read {s['read_gbs']:.2f} GB/s, write {s['write_gbs']:.2f} GB/s "
          f"({'O_DIRECT' if s['direct'] else 'buffered'})")
print(f"TIMES  {json.dumps(report.get('timings', {}))}")
print(f"WALL   node script {report['wall_s']:.1f} s, whole verification {wall:.1f} s")
EOF

# The verdict, when the laptop-side dependencies (fabric, rich) happen to be installed here:
# without them it is skipped with the reason (exit 3); any other failure of the judge fails
# this script instead of passing unnoticed.
verdict_rc=0
"$PY" - "$work/verify_node.json" >"$work/verdict.txt" <<'EOF' || verdict_rc=$?
import json, sys
try:
    from bootstrap.verify.judge import expected_from, judge
    from infra.catalog import gpu_by_nvml_name, load_catalog
except ImportError as exc:
    print(f"verdict skipped: {exc} (the judge needs the project's requirements)")
    sys.exit(3)
report = json.load(open(sys.argv[1]))
cat = load_catalog()
gpus = (report.get("nvidia") or {}).get("gpus") or []
gpu = gpu_by_nvml_name(cat, gpus[0]["name"]) if gpus else None
tier = next((k for k, t in cat.tiers.items() if gpu and t.gpu == gpu.key and t.gpus == len(gpus)), None)
verdict = judge(report, expected_from(None, cat, tier=tier))
for c in verdict.checks:
    print(f"{c.status:8} {c.name:16} {c.measured:38} {c.detail[:90]}")
print(f"VERDICT {verdict.status} (tier {tier or 'none: judged against the GPU found'})")
EOF
cat "$work/verdict.txt"
if [ "$verdict_rc" -ne 0 ] && [ "$verdict_rc" -ne 3 ]; then
  echo "device_verify: the judge failed (exit $verdict_rc) on $work/verify_node.json" >&2
  if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp "$work/verify_node.json" "$OUT/"; fi
  exit 1
fi

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp "$work/verify_node.json" "$OUT/verify_node.json"
  [ -s "$work/verdict.txt" ] && cp "$work/verdict.txt" "$OUT/verdict.txt"
  echo "wrote $OUT/verify_node.json"
fi
