#!/usr/bin/env bash
# A/B of a kernel change on one Vulkan device: the `ingot` of a base revision against the
# working tree's, each compiling its own bundles and running them, on the PP-OCR models and
# models they were not tuned on (NudeNet's YOLOv8n detector at 320, ShuffleNet from the onnx
# wheel). Prints per model the whole-run median of each side, and per kernel family (the
# module name without its shape: conv_pointwise, conv_depthwise, ...) the sum of its steps'
# median device times, each with its ratio head/base, and the kernel bytes of both sides.
#
# Usage: tools/bench_ab.sh BASE_REV [--models det,rec,cls,nudenet,shufflenet] [--rounds 6]
#                          [--iterations 5] [--devices vulkan:cpu] [--kernel-class cpu]
#                          [--whole-runs] [--report-only]
# --report-only: print the table from the last run's files without building or running.
# --whole-runs: time whole runs only (`ingot bench` without --profile; no kernel table, no
# validation run), for a base older than those options: issue 20's comparison with the build
# before it, 3ac1ef5. Each side's medians then come from the text `ingot bench` prints.
# --kernel-class: the kernels that run (cpu: lavapipe's own; gpu: the GPU class, forced on
# lavapipe or a GPU's own).
# The sides alternate over the rounds (one process each, `ingot bench --profile --json`), and
# each figure is the median over rounds: a machine busy with a build gives wrong figures. The
# step sums (device timestamps) are the steady figures; on 2 cores lavapipe's whole runs
# come in two modes a third apart whatever the bundle, hence the best round beside the median.
# Before timing, every bundle runs once under the Khronos validation layer
# (INGOT_VULKAN_VALIDATION=1): a module the layer rejects stops the script, as lavapipe would
# otherwise run it. Speed is reported, never asserted. Everything lands under target/ab/.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
out="$target/ab"

[[ $# -ge 1 && "$1" != -* ]] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
base_rev="$1"
shift
models=det,rec,cls,nudenet,shufflenet rounds=6 iterations=5 devices=vulkan:cpu class=cpu report_only=false
whole_runs=false
while [[ $# -gt 0 ]]; do
    case "$1" in
        --models) models="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --iterations) iterations="$2"; shift 2 ;;
        --devices) devices="$2"; shift 2 ;;
        --kernel-class) class="$2"; shift 2 ;;
        --report-only) report_only=true; shift ;;
        --whole-runs) whole_runs=true; shift ;;
        *) echo "bench_ab: unknown argument $1 (see the header)" >&2; exit 2 ;;
    esac
done
log() { echo "bench_ab: $*" >&2; }
die() { echo "bench_ab: FAILED: $*" >&2; exit 1; }

py="$target/venv/bin/python"
IFS=, read -r -a keys <<<"$models"
sha=$(git rev-parse --verify "$base_rev^{commit}") || die "no revision $base_rev"
# The binary of each side: the base's is built once per commit.
bin_of() { if [[ $1 == base ]]; then echo "$out/ingot-${sha:0:12}"; else echo "$out/ingot-head"; fi; }

# The base in a worktree with a target dir of its own: cargo names a workspace crate's build
# by its path relative to the workspace, so in a shared target dir the base's build could
# pass for the working tree's, and the head binary would be the base's. Then the working
# tree.
build_binaries() {
    if [[ ! -x "$(bin_of base)" ]]; then
        log "building ingot at ${sha:0:12}"
        rm -rf "$out/src" && git worktree prune
        git worktree add --detach --quiet "$out/src" "$sha"
        cargo build --quiet --bin ingot --manifest-path "$out/src/Cargo.toml" \
            --target-dir "$out/base-target"
        cp "$out/base-target/debug/ingot" "$(bin_of base)"
        git worktree remove --force "$out/src"
    fi
    log "building ingot from the working tree"
    cargo build --quiet --bin ingot
    cp "$target/debug/ingot" "$(bin_of head)"
}

# A model's file and input shape (none where the model fixes it), fetched where needed.
nudenet_wheel=nudenet-3.4.2-py3-none-any.whl
nudenet_sha=5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331
model_file() {
    local light
    case "$1" in
        det) echo "$target/models/ch_PP-OCRv4_det_infer.onnx x=1x3x224x224" ;;
        rec) echo "$target/models/ch_PP-OCRv4_rec_infer.onnx x=1x3x48x320" ;;
        cls) echo "$target/models/ch_ppocr_mobile_v2.0_cls_infer.onnx x=1x3x48x192" ;;
        shufflenet)
            light="$("$py" -c 'import onnx, os; print(os.path.dirname(onnx.__file__))')"
            echo "$light/backend/test/data/light/light_shufflenet.onnx" ;;
        nudenet)
            local f="$target/models/nudenet-320n.onnx" w="$target/models/$nudenet_wheel"
            if [[ ! -f "$f" ]]; then
                [[ "$(sha256sum "$w" 2>/dev/null | cut -d' ' -f1)" == "$nudenet_sha" ]] ||
                    "$py" -m pip download --quiet --disable-pip-version-check --no-deps \
                        -d "$target/models" nudenet==3.4.2 >&2
                [[ "$(sha256sum "$w" | cut -d' ' -f1)" == "$nudenet_sha" ]] ||
                    die "$nudenet_wheel does not have the expected sha256"
                "$py" -c 'import sys, zipfile
open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("nudenet/320n.onnx"))' "$w" "$f"
            fi
            echo "$f images=1x3x320x320" ;;
        *) die "unknown model '$1' (det, rec, cls, nudenet, shufflenet)" ;;
    esac
}

# Compiles, validates and times one model on both sides.
measure() {
    local m=$1 file shape side bundle r order
    read -r file shape <<<"$(model_file "$m")"
    for side in base head; do
        bundle="$out/$m-$side.ingot"
        "$(bin_of $side)" compile "$file" ${shape:+--input-shape "$shape"} -o "$bundle" \
            >/dev/null || die "$side could not compile $m"
        $whole_runs && continue
        "$(bin_of $side)" inspect "$bundle" --kernels --json -o "$out/$m-$side.kernels.json"
        INGOT_VULKAN_VALIDATION=1 "$(bin_of $side)" run "$bundle" --random-inputs \
            --devices "$devices" --kernel-class "$class" >/dev/null ||
            die "$side: $m under the validation layer"
    done
    for ((r = 0; r < rounds; r++)); do
        order=(base head)
        ((r % 2)) && order=(head base)
        for side in "${order[@]}"; do
            if $whole_runs; then
                "$(bin_of $side)" bench "$out/$m-$side.ingot" --devices "$devices" \
                    --iterations "$iterations" >"$out/$m-$side-$r.txt"
                continue
            fi
            "$(bin_of $side)" bench "$out/$m-$side.ingot" --devices "$devices" \
                --kernel-class "$class" --iterations "$iterations" --profile --json \
                -o "$out/$m-$side-$r.json"
        done
    done
    log "$m: $rounds rounds done"
}

if ! $report_only; then
    bash tools/setup.sh >/dev/null || die "tools/setup.sh (the venv and the PP-OCR models)"
    mkdir -p "$out"
    build_binaries
    for m in "${keys[@]}"; do
        measure "$m"
    done
fi

"$py" - "$out" "$rounds" "$class" "$whole_runs" "${keys[@]}" <<'PY'
import json, re, statistics, sys
out, rounds, kernel_class, whole_runs, keys = (
    sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "true", sys.argv[5:])

def whole(model, s):
    """Each round's whole-run median of one side, from `ingot bench`'s text."""
    runs = [open(f"{out}/{model}-{s}-{r}.txt").read() for r in range(rounds)]
    return [float(re.search(r"^run\s+median ([0-9.]+) ms", t, re.M).group(1)) for t in runs]

if whole_runs:
    print(f"{'model':<11} {'base ms':>9} {'head ms':>9} {'head/base':>9} {'best base':>9} "
          f"{'best head':>9} {'ratio':>6} {'rounds: median head/base':>25}")
    for m in keys:
        b, h = whole(m, "base"), whole(m, "head")
        paired = statistics.median(x / y for x, y in zip(h, b))
        mb, mh = statistics.median(b), statistics.median(h)
        print(f"{m:<11} {mb:9.2f} {mh:9.2f} {mh / mb:9.3f} {min(b):9.2f} {min(h):9.2f} "
              f"{min(h) / min(b):6.3f} {paired:25.3f}")
    sys.exit(0)

def family(name):
    return re.sub(r"(_\d+(x\d+)*)+$", "", name)

def side(model, s):
    kernels = json.load(open(f"{out}/{model}-{s}.kernels.json"))
    fam = {}
    for mod in kernels["modules"]:
        for step in mod["steps"]:  # "variant:index op (class)", class cpu, gpu or any
            if step.endswith(f"({kernel_class})") or step.endswith("(any)"):
                fam[int(step.split(":")[1].split()[0])] = family(mod["name"])
    runs = [json.load(open(f"{out}/{model}-{s}-{r}.json")) for r in range(rounds)]
    whole = (statistics.median(r["median_ms"] for r in runs), min(r["median_ms"] for r in runs))
    per = {}
    for r in runs:
        sums = {}
        for st in r["profile"]["steps"]:
            f = fam.get(st["index"], "(cpu or view)")
            sums[f] = sums.get(f, 0) + st["median_ns"]
        for f, ns in sums.items():
            per.setdefault(f, []).append(ns)
    per = {f: statistics.median(v) / 1e6 for f, v in per.items()}
    return whole, per, kernels["kernel_bytes"], kernels["weight_bytes"]

print(f"{'model':<11} {'what':<28} {'base ms':>9} {'head ms':>9} {'head/base':>9}")
for m in keys:
    bw, bp, bk, weights = side(m, "base")
    hw, hp, hk, _ = side(m, "head")
    print(f"{m:<11} {'whole run (median)':<28} {bw[0]:9.2f} {hw[0]:9.2f} {hw[0] / bw[0]:9.3f}")
    print(f"{'':<11} {'whole run (best round)':<28} {bw[1]:9.2f} {hw[1]:9.2f} {hw[1] / bw[1]:9.3f}")
    for f in sorted(set(bp) | set(hp), key=lambda f: -hp.get(f, 0)):
        b, h = bp.get(f), hp.get(f)
        ratio = f"{h / b:9.3f}" if b and h else f"{'-':>9}"
        print(f"{'':<11} {f:<28} {b or 0:9.2f} {h or 0:9.2f} {ratio}")
    print(f"{'':<11} {'kernel bytes':<28} {bk:9d} {hk:9d} {hk / bk:9.3f}")
    print(f"{'':<11} {'kernel bytes / weight bytes':<28} {bk / weights:9.1%} {hk / weights:9.1%}")
PY
