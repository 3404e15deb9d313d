#!/usr/bin/env bash
# Benchmarks ingot against its peers on the three PP-OCR models and prints one table:
#   ingot on Vulkan vs ncnn (Vulkan, fp32) vs IREE (Vulkan), and ingot on the CPU vs ONNX
#   Runtime on one thread, with ingot's device-memory ledger peak beside its planned peak.
#
# Usage: tools/bench.sh [--iterations N] [--rounds R] [--models det,rec,cls,yolov8n] [--json]
#                       [--iree-budget SEC] [--no-build] [--cold]
#   --iterations  timed runs per measurement (default 20; IREE stops after --iree-budget
#                 seconds, default 60, with at least 3: its lavapipe runs take seconds each)
#   --rounds      repeat every measurement R times, alternating the order of the
#                 contenders, and report the median of the per-round medians (default 1)
#   --json        print a machine-readable summary instead of the table
#   --cold        measure cold start instead (lavapipe, load + first run, each its own
#                 process): ingot with Mesa's shader cache off and no pipeline cache, then with
#                 our pipeline cache file warm (Mesa's still off), then with Mesa's own disk
#                 cache warm; ncnn-vk with Mesa's cache off beside it
#
# Each measurement is its own process (so load, first run and peak RSS are its own), every
# one on a seeded random input. Everything lands under target/bench/: the bench venv beside
# it (target/bench-venv, pinned by tools/bench-requirements.txt), the bundles, the peers'
# cached conversions (ncnn/, iree/) and the raw JSON of every run (results/).
# Speed is reported, never asserted. A contender that cannot run at all stops the script
# with the reason; a peer whose output disagrees with ONNX Runtime is marked in the table.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
out="$target/bench"
venv="$target/bench-venv"
py="$venv/bin/python"

iterations=20 rounds=1 models=det,rec,cls json=false iree_budget=60 build=true cold=false
while [[ $# -gt 0 ]]; do
    case "$1" in
        --iterations) iterations="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --models) models="$2"; shift 2 ;;
        --iree-budget) iree_budget="$2"; shift 2 ;;
        --json) json=true; shift ;;
        --no-build) build=false; shift ;;
        --cold) cold=true; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

log() { echo "bench: $*" >&2; }
die() { echo "bench: FAILED: $*" >&2; exit 1; }

# model key, file, input name and shape (the PP-OCR shapes tests/tests/ppocr.rs uses; the
# YOLOv8n-class detector is NudeNet's, fetched with them, tuned on by nobody)
declare -A file=(
    [det]=ch_PP-OCRv4_det_infer.onnx
    [rec]=ch_PP-OCRv4_rec_infer.onnx
    [cls]=ch_ppocr_mobile_v2.0_cls_infer.onnx
    [yolov8n]=320n.onnx
)
declare -A input=([det]=x [rec]=x [cls]=x [yolov8n]=images)
declare -A shape=([det]=1x3x224x224 [rec]=1x3x48x320 [cls]=1x3x48x192 [yolov8n]=1x3x320x320)
IFS=, read -r -a model_keys <<<"$models"
for m in "${model_keys[@]}"; do
    [[ -n "${file[$m]:-}" ]] || die "unknown model '$m' (det, rec, cls, yolov8n)"
done

# --- the bench venv (tools/bench_venv.sh) and the models -----------------------------------
source tools/bench_venv.sh

bash tools/fetch_models.sh "$target/models" || die "could not fetch the PP-OCR models"

# --- ingot: build, then one bundle per model ------------------------------------------------
ingot="$target/release/ingot"
if $build; then
    log "cargo build --release -p ingot-cli"
    cargo build --release --quiet -p ingot-cli || die "cargo build failed"
fi
[[ -x "$ingot" ]] || die "$ingot not found (drop --no-build)"
mkdir -p "$out/results"
rm -f "$out"/results/*
for m in "${model_keys[@]}"; do
    "$ingot" compile "$target/models/${file[$m]}" --input-shape "${input[$m]}=${shape[$m]}" \
        -o "$out/$m.ingot" >/dev/null || die "ingot compile of ${file[$m]} failed"
done
has_bench=true
if ! "$ingot" bench --help >/dev/null 2>&1; then
    has_bench=false
    log "NOTE: $ingot has no 'bench' subcommand yet: the ingot columns will read n/a"
fi

# --- cold start -----------------------------------------------------------------------------
# Each figure is one process: load (bundle to a ready session) + first run, in ms.
if $cold; then
    $has_bench || die "$ingot has no 'bench' subcommand"
    # One JSON report on stdin -> "load + first".
    load_first='import json, sys
r = json.load(sys.stdin)
print("%.0f + %.0f" % (r["load_ms"], r["first_run_ms"]))'
    cold_ingot() { # model, one environment assignment, extra ingot arguments
        local m=$1 setting=$2 res
        shift 2
        res=$(env "$setting" "$ingot" bench "$out/$m.ingot" --devices vulkan:cpu \
            --iterations 1 --json "$@") || die "ingot bench of $m failed"
        "$py" -c "$load_first" <<<"$res"
    }
    printf '%-8s %22s %22s %22s %22s\n' model "ingot, no cache" "ingot, our cache warm" \
        "ingot, Mesa cache warm" "ncnn-vk, no cache"
    for m in "${model_keys[@]}"; do
        log "cold start: $m"
        pc="$out/$m.pipeline-cache" mesa="$out/mesa-cache-$m"
        rm -rf "$pc" "$mesa"
        none=$(cold_ingot "$m" MESA_SHADER_CACHE_DISABLE=true)
        cold_ingot "$m" MESA_SHADER_CACHE_DISABLE=true --pipeline-cache "$pc" >/dev/null
        ours=$(cold_ingot "$m" MESA_SHADER_CACHE_DISABLE=true --pipeline-cache "$pc")
        cold_ingot "$m" MESA_SHADER_CACHE_DIR="$mesa" >/dev/null
        mesa_warm=$(cold_ingot "$m" MESA_SHADER_CACHE_DIR="$mesa")
        ncnn=$(MESA_SHADER_CACHE_DISABLE=true "$py" tools/bench_peers.py \
            "$target/models/${file[$m]}" --input-shape "${input[$m]}=${shape[$m]}" \
            --peer ncnn-vulkan --iterations 1 --warmup 0 --json 2>/dev/null | head -n 1 |
            "$py" -c "$load_first") || ncnn="n/a"
        printf '%-8s %22s %22s %22s %22s\n' "$m" "$none" "$ours" "$mesa_warm" "$ncnn"
    done
    echo "(load + first run, ms, lavapipe; Mesa 22's lavapipe compiles a pipeline at its first"
    echo " dispatch and keeps nothing in a VkPipelineCache, so only its own disk cache helps there)"
    exit 0
fi

# --- measurements ---------------------------------------------------------------------------
# Each writes results/<model>.<contender>.<round>.json. ingot on a device it cannot open yet
# is reported as n/a (with the reason), not as a failure: the Vulkan backend is in progress.
run_ingot() { # model device round
    local m=$1 dev=$2 r=$3 res="$out/results/$1.ingot-$2.$3.json" err devices=$2
    # On Vulkan, ingot runs where the peers do: lavapipe (IREE targets llvmpipe), named,
    # since `vulkan` picks GPUs only and never a CPU-type device.
    [[ $dev == vulkan ]] && devices=vulkan:cpu
    $has_bench || return 0
    err=$(mktemp)
    if "$ingot" bench "$out/$m.ingot" --devices "$devices" --iterations "$iterations" --json \
        >"$res.part" 2>"$err"; then
        mv "$res.part" "$res"
    else
        rm -f "$res.part"
        log "NOTE: ingot bench on $dev could not run $m: $(tail -n 3 "$err" | tr '\n' ' ')"
    fi
    rm -f "$err"
}
run_peer() { # model peer round
    local m=$1 peer=$2 r=$3 res="$out/results/$1.$2.$3.json" rc=0 extra=()
    [[ $peer == iree-vulkan ]] && extra=(--warmup 1 --time-budget "$iree_budget")
    "$py" tools/bench_peers.py "$target/models/${file[$m]}" \
        --input-shape "${input[$m]}=${shape[$m]}" \
        --peer "$peer" --iterations "$iterations" "${extra[@]}" --json \
        >"$res.part" 2>"$out/results/$m.$peer.$r.log" || rc=$?
    # 3 = ran but disagrees with ORT: kept, and marked in the table.
    if [[ $rc -ne 0 && $rc -ne 3 ]]; then
        sed 's/^/    /' "$out/results/$m.$peer.$r.log" >&2
        die "$peer cannot run ${file[$m]} (exit $rc; log $out/results/$m.$peer.$r.log)"
    fi
    mv "$res.part" "$res"
}

contenders=(ingot:vulkan ingot:cpu peer:ort peer:ncnn-vulkan peer:iree-vulkan)
for ((r = 0; r < rounds; r++)); do
    order=("${contenders[@]}")
    if ((r % 2 == 1)); then # odd rounds run in reverse order
        order=()
        for ((i = ${#contenders[@]} - 1; i >= 0; i--)); do order+=("${contenders[i]}"); done
    fi
    for m in "${model_keys[@]}"; do
        for c in "${order[@]}"; do
            log "round $((r + 1))/$rounds: $m ${c#*:}"
            case $c in
                ingot:*) run_ingot "$m" "${c#ingot:}" "$r" ;;
                peer:*) run_peer "$m" "${c#peer:}" "$r" ;;
            esac
        done
    done
done

# --- summary --------------------------------------------------------------------------------
"$py" - "$out/results" "$json" "${model_keys[@]}" <<'PY'
import glob, json, statistics, sys
from pathlib import Path

results, as_json, models = Path(sys.argv[1]), sys.argv[2] == "true", sys.argv[3:]
CONTENDERS = ["ingot-vulkan", "ingot-cpu", "ort", "ncnn-vulkan", "iree-vulkan"]

def load(model, who):
    """The rounds of one contender on one model: medians of their figures, or None."""
    files = sorted(glob.glob(f"{results}/{model}.{who}.*.json"))
    runs = [json.loads(Path(f).read_text()) for f in files]
    if not runs:
        return None

    def med(k):
        values = [r.get(k) for r in runs]
        return None if None in values else statistics.median(values)

    s = {k: med(k) for k in ("load_ms", "first_run_ms", "median_ms", "p90_ms", "peak_rss_bytes")}
    if s["peak_rss_bytes"] is not None:
        s["peak_rss_bytes"] = int(s["peak_rss_bytes"])
    s["rounds"] = len(runs)
    s["device"] = runs[-1]["device"]
    for k in ("ledger_peak_bytes", "planned_peak_bytes"):  # ingot's
        if k in runs[-1]:
            s[k] = max(r[k] for r in runs)
    if "max_abs_diff_vs_ort" in runs[-1] and who != "ort":  # the peers'
        diffs = [r["max_abs_diff_vs_ort"] for r in runs]
        s["max_abs_diff_vs_ort"] = None if None in diffs else max(diffs)
        s["agrees_with_ort"] = all(r["agrees_with_ort"] for r in runs)
        s["notes"] = runs[-1]["notes"]
    return s

def ratio(a, b):
    if a is None or b is None or not b["median_ms"]:
        return None
    return round(a["median_ms"] / b["median_ms"], 3)

summary = {m: {c: load(m, c) for c in CONTENDERS} for m in models}
if as_json:
    for m, s in summary.items():
        s["ratios"] = {"ingot_vulkan_over_ncnn": ratio(s["ingot-vulkan"], s["ncnn-vulkan"]),
                       "ingot_vulkan_over_iree": ratio(s["ingot-vulkan"], s["iree-vulkan"]),
                       "ingot_cpu_over_ort": ratio(s["ingot-cpu"], s["ort"])}
    print(json.dumps(summary, indent=2))
    sys.exit(0)

def med(s):
    if s is None:
        return "n/a"
    mark = "" if s.get("agrees_with_ort", True) else " (!)"
    return f"{s['median_ms']:.1f}{mark}"

def ratio_text(a, b):
    r = ratio(a, b)
    return "n/a" if r is None else f"{r:.2f}"

def mib(b):
    return "n/a" if b is None else f"{b / 2**20:.2f}"

def ledger(s):
    if s is None or "ledger_peak_bytes" not in s:
        return "n/a"
    return f"{mib(s['ledger_peak_bytes'])} / {mib(s['planned_peak_bytes'])}"

head = ["model", "ingot-vk", "ncnn-vk", "iree-vk", "ingot/ncnn", "ingot-cpu", "ort-1t",
        "ingot-cpu/ort", "ledger/plan MiB (vk)", "ledger/plan MiB (cpu)"]
rows = []
for m in models:
    s = summary[m]
    iv, ic = s["ingot-vulkan"], s["ingot-cpu"]
    nv, ort = s["ncnn-vulkan"], s["ort"]
    rows.append([m, med(iv), med(nv), med(s["iree-vulkan"]), ratio_text(iv, nv),
                 med(ic), med(ort), ratio_text(ic, ort), ledger(iv), ledger(ic)])
widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
print("median run time, ms (each from host input to host output)")
for r in [head, *rows]:
    print("  ".join(str(v).rjust(w) for v, w in zip(r, widths)))
wrong = [(m, c, summary[m][c]) for m in models for c in CONTENDERS
         if summary[m][c] and not summary[m][c].get("agrees_with_ort", True)]
for m, c, s in wrong:
    d = s["max_abs_diff_vs_ort"]
    print(f"(!) {c} on {m}: output disagrees with ONNX Runtime "
          f"(max |diff| {'non-finite' if d is None else f'{d:.3g}'})")
print()
print("load / first run, ms")
for m in models:
    parts = []
    for c in CONTENDERS:
        s = summary[m][c]
        if s is not None:
            parts.append(f"{c} {s['load_ms']:.0f} / {s['first_run_ms']:.0f}")
    print(f"  {m}: " + (", ".join(parts) or "n/a"))
PY
