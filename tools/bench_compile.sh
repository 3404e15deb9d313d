#!/usr/bin/env bash
# Compile-time figures for the weight bank (issue 6): bundle bytes / unique weight bytes,
# compile peak RSS / weight bytes (target: under W/2 + 256 MiB for W >= 1 GiB), compile time.
# Models: the two-variant decoder fixture (tools/make_decoder.py) and a synthetic model of
# about 1 GiB of weights in external data (tools/make_large_model.py, deleted afterwards).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
py="$target/venv/bin/python"
[[ -x "$py" ]] || bash tools/setup.sh
cargo build --release --quiet -p ingot-cli
ingot="$target/release/ingot"
work="$target/bench/compile"
mkdir -p "$work"

# Runs `ingot compile ARGS...`; prints "peak_rss_bytes seconds" (peak RSS from the kernel's
# own accounting of the child, via Python's resource module).
measure() {
    "$py" - "$ingot" "$@" <<'PY'
import resource, subprocess, sys, time
t = time.perf_counter()
subprocess.run([sys.argv[1], "compile", *sys.argv[2:]], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, time.perf_counter() - t)
PY
}

report() { # name bundle weight_bytes rss seconds
    local unique
    unique=$("$ingot" inspect "$2" --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)["unique_weight_bytes"])')
    local bytes
    bytes=$(stat -c %s "$2")
    "$py" - "$1" "$bytes" "$unique" "$3" "$4" "$5" <<'PY'
import sys
name, bundle, unique, w, rss, secs = sys.argv[1], *map(float, sys.argv[2:])
bound = w / 2 + 256 * 2**20
print(f"{name}: bundle {bundle/2**20:.1f} MiB, unique weights {unique/2**20:.1f} MiB "
      f"(bundle/unique {bundle/unique:.3f}); weights W {w/2**20:.1f} MiB; compile peak RSS "
      f"{rss/2**20:.1f} MiB (RSS/W {rss/w:.3f}; bound W/2+256 MiB = {bound/2**20:.0f} MiB: "
      f"{'PASS' if rss <= bound else 'FAIL'}); compile {secs:.2f} s")
PY
}

dec="$target/decoder"
if [[ -f "$dec/prefill.onnx" ]]; then
    read -r rss secs < <(measure --variant "prefill=$dec/prefill.onnx" --variant "decode=$dec/decode.onnx" -o "$work/decoder.ingot")
    w=$("$py" -c 'import onnx,sys; m=onnx.load(sys.argv[1]); print(sum(len(t.raw_data) for t in m.graph.initializer))' "$dec/prefill.onnx")
    report decoder "$work/decoder.ingot" "$w" "$rss" "$secs"
fi

"$py" tools/make_large_model.py --out "$work/large" --gib "${GIB:-1}"
w=$(stat -c %s "$work/large/large.onnx.data")
read -r rss secs < <(measure "$work/large/large.onnx" -o "$work/large.ingot")
report large "$work/large.ingot" "$w" "$rss" "$secs"
rm -rf "$work/large" "$work/large.ingot"
