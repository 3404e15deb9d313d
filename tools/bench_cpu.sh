#!/usr/bin/env bash
# The CPU backend beside ONNX Runtime: `ingot bench --devices cpu --threads T` and ORT's CPU
# provider with intra_op_num_threads=T, for T = 1 and T = every core, on the three PP-OCR models
# and two of the onnx wheel's light_* models (resnet50: large GEMMs; shufflenet: grouped and
# depthwise convs). Prints per model and thread count the median run times, their ratio, and
# the memory each process added while loading and running the model (peak RSS minus the RSS
# before it: the ingot CLI and Python start from different bases), with that ratio too.
# Target (issue 7): time ratio <= 1.5 and memory ratio < 1 on every row; the last column says
# which rows meet it. Nothing is asserted: this is a benchmark, not a test.
#
# Oversubscription and contention (issue 22): `--threads 2,4,8` past the cores, and `--busy N`
# keeps N busy-looping processes running beside both peers the whole time (`--busy 2 --threads
# 2` on 2 cores: is ingot/ORT at 2 threads any worse than without them?). `--no-spin` passes
# ingot's option of that name (idle threads sleep at once instead of spinning a while).
#
# Models beyond PP-OCR (issue 22): the onnx wheel's ResNet-50 and ShuffleNet, nudenet's
# YOLOv8n detector at 320 (`yolov8n`) and its quantized forms from tools/make_detector_models.py
# (`yolov8n_w8`: int8 conv weights dequantized in the graph; `yolov8n_qdq`: ONNX Runtime's
# static QDQ quantization, which ORT runs with int8 kernels and Ingot in float;
# `yolov8n_dynamic`: ORT's `quantize_dynamic`, ConvInteger per conv), the decoder fixture's prefill graph (`decoder`, float)
# and its quantized forms from tools/make_quantized_models.py: `decoder_dynamic` (int8 weights,
# DynamicQuantizeLinear + MatMulInteger), `decoder_qdq` (QuantizeLinear/DequantizeLinear
# around every op) and `decoder_w8` (weight-only int8, dequantized in the graph), and
# `decoder_exported` from tools/make_exported_models.py (norms as ReduceMean chains, GELU in
# pieces, as older exporters write them); their token ids are drawn from the fixture's vocabulary.
# `yolov8n_f16` and `decoder_f16`: the detector and the decoder converted to float16 by
# tools/make_half_models.py (onnxruntime.transformers.float16, as apps ship them).
#
# Bundles are compiled for the CPU alone (`ingot compile --devices cpu`), as an app that runs
# on the CPU ships them. `--fallback` compiles the default bundle instead (Vulkan steps too)
# and measures its CPU fallback.
#
# Usage: tools/bench_cpu.sh [--iterations N] [--models det,rec,cls,resnet50,shufflenet]
#                           [--threads 1,2] [--busy N] [--no-spin] [--fallback] [--no-build]
# Each measurement is its own process, on a seeded random input; raw JSON lands in
# target/bench/cpu/.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
out="$target/bench/cpu"
venv="$target/bench-venv"
py="$venv/bin/python"
cores=$(nproc)

iterations=30 models=det,rec,cls,resnet50,shufflenet threads="1,$cores" build=true busy=0
spin=() compile_devices=(--devices cpu)
while [[ $# -gt 0 ]]; do
    case "$1" in
        --iterations) iterations="$2"; shift 2 ;;
        --models) models="$2"; shift 2 ;;
        --threads) threads="$2"; shift 2 ;;
        --no-build) build=false; shift ;;
        --busy) busy="$2"; shift 2 ;;
        --no-spin) spin=(--no-spin); shift ;;
        --fallback) compile_devices=(); shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench_cpu: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
log() { echo "bench_cpu: $*" >&2; }
die() { echo "bench_cpu: FAILED: $*" >&2; exit 1; }

source tools/bench_venv.sh
bash tools/fetch_models.sh "$target/models" || die "could not fetch the PP-OCR models"
light="$("$py" -c 'import onnx, os; print(os.path.dirname(onnx.__file__))')/backend/test/data/light"

# model key -> file and input (name=shape)
declare -A file=(
    [det]="$target/models/ch_PP-OCRv4_det_infer.onnx"
    [rec]="$target/models/ch_PP-OCRv4_rec_infer.onnx"
    [cls]="$target/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
    [resnet50]="$light/light_resnet50.onnx"
    [shufflenet]="$light/light_shufflenet.onnx"
    [yolov8n]="$target/models/320n.onnx"
    [yolov8n_w8]="$target/models/320n_weights_int8.onnx"
    [yolov8n_qdq]="$target/models/320n_qdq.onnx"
    [yolov8n_dynamic]="$target/models/320n_dynamic.onnx"
    [yolov8n_f16]="$target/models/320n_f16.onnx"
    [decoder]="$target/decoder/prefill.onnx"
    [decoder_dynamic]="$target/models/prefill_dynamic.onnx"
    [decoder_qdq]="$target/models/prefill_qdq.onnx"
    [decoder_w8]="$target/models/prefill_weights_int8.onnx"
    [decoder_exported]="$target/models/prefill_exported.onnx"
    [decoder_f16]="$target/models/prefill_f16.onnx"
)
declare -A input=(
    [det]=x=1x3x224x224 [rec]=x=1x3x48x320 [cls]=x=1x3x48x192
    [resnet50]=gpu_0/data_0=1x3x224x224 [shufflenet]=gpu_0/data_0=1x3x224x224
    [yolov8n]=images=1x3x320x320 [yolov8n_w8]=images=1x3x320x320
    [yolov8n_qdq]=images=1x3x320x320 [yolov8n_dynamic]=images=1x3x320x320
    [yolov8n_f16]=images=1x3x320x320 [decoder_f16]=input_ids=1x16
    [decoder]=input_ids=1x16 [decoder_dynamic]=input_ids=1x16
    [decoder_qdq]=input_ids=1x16 [decoder_w8]=input_ids=1x16 [decoder_exported]=input_ids=1x16
)
IFS=, read -r -a model_keys <<<"$models"
IFS=, read -r -a thread_counts <<<"$threads"
for m in "${model_keys[@]}"; do
    [[ -n "${file[$m]:-}" ]] || die "unknown model '$m' (${!file[*]})"
    [[ -f "${file[$m]}" ]] || die "${file[$m]} is missing: run bash tools/setup.sh"
done
# Token ids of the decoder fixture's vocabulary; the image models have no integer inputs.
ints=(--int-range 0,255)

ingot="$target/release/ingot"
if $build; then
    log "cargo build --release -p ingot-cli"
    cargo build --release --quiet -p ingot-cli || die "cargo build failed"
fi
mkdir -p "$out"
for m in "${model_keys[@]}"; do
    "$ingot" compile "${file[$m]}" --input-shape "${input[$m]}" ${compile_devices[@]+"${compile_devices[@]}"} \
        -o "$out/$m.ingot" >/dev/null \
        || die "ingot compile of ${file[$m]} failed"
done

busy_pids=()
stop_busy() { [[ ${#busy_pids[@]} -eq 0 ]] || kill "${busy_pids[@]}" 2>/dev/null || true; }
trap stop_busy EXIT
for ((i = 0; i < busy; i++)); do
    (while :; do :; done) &
    busy_pids+=($!)
done
((busy == 0)) || log "$busy busy processes beside every measurement"
for m in "${model_keys[@]}"; do
    for t in "${thread_counts[@]}"; do
        log "$m, $t thread(s)"
        "$ingot" bench "$out/$m.ingot" --devices cpu --threads "$t" ${spin[@]+"${spin[@]}"} \
            --iterations "$iterations" "${ints[@]}" --json >"$out/$m.ingot.$t.json" \
            || die "ingot bench failed on $m"
        "$py" tools/bench_peers.py "${file[$m]}" --input-shape "${input[$m]}" --peer ort \
            --ort-threads "$t" --iterations "$iterations" "${ints[@]}" --json \
            >"$out/$m.ort.$t.json" 2>"$out/$m.ort.$t.log" \
            || die "ONNX Runtime failed on $m (log $out/$m.ort.$t.log)"
    done
done
stop_busy
((busy == 0)) || echo "with $busy busy processes beside each measurement${spin[*]:+, ingot ${spin[*]}}"

"$py" - "$out" "$models" "$threads" <<'PY'
import json, sys
from pathlib import Path

out, models, threads = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3].split(",")
mib = lambda b: b / 2**20
head = ["model", "threads", "ingot ms", "ort ms", "time ratio", "ingot MiB", "ort MiB",
        "memory ratio", "target"]
rows, met = [], 0
for m in models:
    for t in threads:
        i = json.loads((out / f"{m}.ingot.{t}.json").read_text())
        o = json.loads((out / f"{m}.ort.{t}.json").read_text())
        im = i["peak_rss_bytes"] - i["baseline_rss_bytes"]
        om = o["peak_rss_bytes"] - o["baseline_rss_bytes"]
        time_ratio, mem_ratio = i["median_ms"] / o["median_ms"], im / om
        ok = time_ratio <= 1.5 and mem_ratio < 1
        met += ok
        rows.append([m, t, f"{i['median_ms']:.2f}", f"{o['median_ms']:.2f}", f"{time_ratio:.2f}",
                     f"{mib(im):.1f}", f"{mib(om):.1f}", f"{mem_ratio:.2f}",
                     "met" if ok else "MISSED"])
widths = [max(len(str(r[k])) for r in [head, *rows]) for k in range(len(head))]
print("ingot CPU vs ONNX Runtime CPU (median run; memory = peak RSS - RSS before the model)")
for r in [head, *rows]:
    print("  ".join(str(v).rjust(w) for v, w in zip(r, widths)))
print(f"target (time <= 1.5x, memory < 1x) met on {met} of {len(rows)} rows")
PY
