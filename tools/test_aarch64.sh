#!/usr/bin/env bash
# The runtime on ARM, for real: builds the CPU kernels (ingot-ops, whose NEON paths an x86
# machine never runs), ingot-runtime and the C API for aarch64-unknown-linux-gnu, runs the
# kernels' unit tests under qemu-user, then runs the C example under qemu on bundles this
# machine compiled (PP-OCR cls, rec and det, and the decoder fixture's prefill graph, a
# transformer) and compares every output with ONNX Runtime's reference, as the x86 tests do.
#
# The rustup toolchain here cannot fetch other targets, so the compiler is Debian's
# (bookworm-security's rustc-web, with its arm64 standard library through multiarch); cargo
# stays rustup's, and the build has a target directory of its own (target/aarch64), so the
# two compilers' artifacts never mix. Needs the test data (bash tools/setup.sh) and the
# host's `ingot` (cargo build -p ingot-cli); installs its apt packages itself.
#
#   bash tools/test_aarch64.sh
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
triple=aarch64-unknown-linux-gnu
host_ingot="$target/debug/ingot"
py="$target/venv/bin/python"
for f in "$host_ingot" "$py" "$target/references/manifest.txt" "$target/decoder/prefill.onnx"; do
    [[ -e $f ]] || { echo "test_aarch64.sh: $f is missing: run bash tools/setup.sh and cargo build -p ingot-cli" >&2; exit 1; }
done

# The programs run on the arm64 multiarch C library (libc6:arm64), not on the cross
# toolchain's copy under /usr/aarch64-linux-gnu: that one is an older build, and mixing its
# loader with the multiarch libc made every thread start hang under qemu.
packages=(rustc-web libstd-rust-web-dev:arm64 libc6:arm64 libgcc-s1:arm64 gcc-aarch64-linux-gnu
    libc6-dev-arm64-cross qemu-user-static)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "test_aarch64.sh: installing ${missing[*]}"
    dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

export RUSTC=/usr/bin/rustc CARGO_INCREMENTAL=0
export CARGO_TARGET_DIR="$target/aarch64"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
qemu=(qemu-aarch64-static)
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="${qemu[*]}"
"$RUSTC" --version

echo "== unit tests of ingot-ops under qemu"
# The kernels' tests, on the NEON paths: what an x86 machine never runs. The runtime's own
# unit tests (bundle validation, ledger, device list) do not depend on the architecture and
# run on x86; building their harness here would compile the kernels a third time. The
# runtime and the C API's library are checked below through the C example, and the C API's
# own tests compile models, which would build the compiler for ARM too.
cargo test --target "$triple" -p ingot-ops --lib

echo "== the C example under qemu, against ONNX Runtime's references"
# The test profile, so that the library shares the build above.
cargo build --profile test --target "$triple" -p ingot-capi
out="$target/aarch64/check"
mkdir -p "$out"
aarch64-linux-gnu-gcc -std=c11 -Wall -Wextra -Werror -O2 -I capi/include \
    capi/examples/run_bundle.c "$target/aarch64/$triple/debug/libingot.a" \
    -ldl -lgcc_s -lutil -lrt -lpthread -lm -lc -o "$out/run_bundle"

# name, model, input shape, input file, then the reference of each output in order.
refs="$target/references"
cases=(
    "cls|$target/models/ch_ppocr_mobile_v2.0_cls_infer.onnx|x=1x3x48x192|$refs/ch_ppocr_mobile_v2.0_cls_infer/1x3x48x192/input_0.npy|$refs/ch_ppocr_mobile_v2.0_cls_infer/1x3x48x192/output_0.npy"
    "rec|$target/models/ch_PP-OCRv4_rec_infer.onnx|x=1x3x48x320|$refs/ch_PP-OCRv4_rec_infer/1x3x48x320/input_0.npy|$refs/ch_PP-OCRv4_rec_infer/1x3x48x320/output_0.npy"
    "det|$target/models/ch_PP-OCRv4_det_infer.onnx|x=1x3x160x256|$refs/ch_PP-OCRv4_det_infer/1x3x160x256/input_0.npy|$refs/ch_PP-OCRv4_det_infer/1x3x160x256/output_0.npy"
    "prefill|$target/decoder/prefill.onnx||$target/decoder/prefill_input_ids.npy|$target/decoder/prefill_logits.npy"
)
for case in "${cases[@]}"; do
    IFS='|' read -r name model shape input reference <<<"$case"
    shape_arg=()
    [[ -n $shape ]] && shape_arg=(--input-shape "$shape")
    "$host_ingot" compile "$model" "${shape_arg[@]}" -o "$out/$name.ingot" >/dev/null
    mkdir -p "$out/$name"
    # The default device list: no arm64 Vulkan loader here, so Vulkan is skipped for the CPU.
    "${qemu[@]}" "$out/run_bundle" --devices vulkan,cpu "$out/$name.ingot" "$out/$name" "$input" \
        >"$out/$name.log"
    grep -q "runs on cpu" "$out/$name.log"
    "$py" - "$out/$name/output_0.npy" "$reference" "$name" <<'EOF'
import sys
import numpy as np
got, want, name = np.load(sys.argv[1]), np.load(sys.argv[2]), sys.argv[3]
assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape)
worst = float(np.max(np.abs(got.astype(np.float64) - want)))
# The x86 tests' tolerance against ONNX Runtime (tests/tests/ppocr.rs, variants.rs).
ok = np.allclose(got, want, rtol=1e-4, atol=1e-5)
print(f"{name}: aarch64 output {got.shape} against ONNX Runtime: max |diff| {worst:.3g}", "ok" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
EOF
done
echo "== aarch64: all checks passed"
