#!/usr/bin/env bash
# Builds the C API (libingot.a), compiles the C example against capi/include/ingot.h and it,
# and runs it on the PP-OCR direction classifier with the reference input, writing
# OUT_DIR/output_0.npy. Needs the model and references (bash tools/setup.sh) and a C compiler.
#
#   bash capi/run_example.sh [DEVICES [OUT_DIR [RUN_BUNDLE_OPTIONS...]]]
#
# RUN_BUNDLE_OPTIONS go to the example: --from-memory or --from-fd, --threads N.
#
# DEVICES defaults to vulkan,cpu (a Vulkan GPU, else the CPU; vulkan:cpu,cpu runs on lavapipe,
# which `vulkan` passes over); OUT_DIR to target/capi/out. Run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
devices="${1:-vulkan,cpu}"
out="${2:-$target/capi/out}"
model=$target/models/ch_ppocr_mobile_v2.0_cls_infer.onnx
input=$target/references/ch_ppocr_mobile_v2.0_cls_infer/1x3x48x192/input_0.npy
for f in "$model" "$input"; do
    [[ -f $f ]] || { echo "run_example.sh: $f is missing: run bash tools/setup.sh" >&2; exit 1; }
done

# The workspace build tools/test.sh makes (libingot.a and the ingot CLI among it), so that
# there the script compiles nothing: building the two packages alone resolves their features
# apart from the workspace's and compiles the runtime and the kernels again.
cargo build --quiet --workspace --all-targets
mkdir -p "$target/capi" "$out"
"$target/debug/ingot" compile "$model" --input-shape x=1x3x48x192 -o "$target/capi/cls.ingot" >/dev/null

# The static library needs the system libraries Rust's std uses
# (`cargo rustc -p ingot-capi --lib --crate-type staticlib -- --print native-static-libs`).
cc -std=c11 -Wall -Wextra -Werror -O2 -I capi/include capi/examples/run_bundle.c \
    "$target/debug/libingot.a" -ldl -lgcc_s -lutil -lrt -lpthread -lm -lc \
    -o "$target/capi/run_bundle"
"$target/capi/run_bundle" --devices "$devices" "${@:3}" "$target/capi/cls.ingot" "$out" "$input"
