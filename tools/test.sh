#!/usr/bin/env bash
# The project's full check, as CI runs it (.ci/run calls this): system packages, test data,
# format, lints, build, then every test. Run from anywhere: bash tools/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests need, installed when missing (CI machines start bare):
# the Vulkan loader, Mesa's lavapipe (a Vulkan device on the CPU, where there is no GPU) and
# the Khronos validation layer (a validation message fails a test); librsvg2-bin's
# rsvg-convert renders the plan's SVG in tests/tests/plan_svg.rs; spirv-tools' spirv-val checks
# every kernel module the op-family tests compile (INGOT_SPIRV_VAL below).
apt_packages=(libvulkan1 mesa-vulkan-drivers vulkan-validationlayers librsvg2-bin spirv-tools)
missing=()
for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "test.sh: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

start=$SECONDS
step() { echo "==> [$((SECONDS - start)) s] $*"; }

# A full check builds each crate once per profile and feature set: incremental caches would only
# double the target dir (CI machines have little disk) without speeding anything up.
export CARGO_INCREMENTAL=0

# Every Vulkan test runs under the validation layer; the runtime refuses to start without it
# when this is set, and the tests fail (never skip) when no Vulkan device appears.
export INGOT_VULKAN_VALIDATION=1
# The op-family tests run Khronos' spirv-val on every module they compile (naga validates the
# WGSL, not the SPIR-V it writes); they fail if spirv-val is missing when this is set.
export INGOT_SPIRV_VAL=1

step "test data (tools/setup.sh)"
bash tools/setup.sh

step "cargo fmt --all --check"
cargo fmt --all --check

# One build serves every step: the dev and test profiles have equal settings (Cargo.toml),
# so `cargo test` and the examples reuse what this compiles, the `ingot` binary the CLI tests
# run included. Clippy lints each workspace crate as it is compiled (clippy-driver as the
# workspace's compiler, every warning denied: what `cargo clippy --workspace --all-targets --
# -D warnings` checks); a `cargo clippy` of its own type-checked every dependency once more,
# the longest step of the run. Every cargo command below inherits both, so the fingerprints
# stay equal and nothing is compiled twice.
RUSTC_WORKSPACE_WRAPPER="$(command -v clippy-driver)" || {
    echo "test.sh: clippy-driver is missing (rustup component add clippy)" >&2
    exit 1
}
export RUSTC_WORKSPACE_WRAPPER RUSTFLAGS="-D warnings"
step "cargo build --workspace --all-targets, linted by clippy (-D warnings)"
cargo build --workspace --all-targets

# --no-fail-fast runs every test binary even after a failure. --show-output prints what passing
# tests printed: the conformance summaries ("node tests: N passed, M expected failures,
# K failed") and the PP-OCR worst errors.
step "cargo test --workspace --no-fail-fast"
cargo test --workspace --no-fail-fast -- --show-output

# The GPU-class kernels (tiles in workgroup memory, barriers) on lavapipe, which on its own
# runs the CPU-class ones: the PP-OCR models, the Vulkan specifics, and the node tests of the
# families whose kernels differ by class, under the validation layer's synchronisation checks.
# (`--workspace --test X`: the test binaries of the build above; `-p ingot-tests` would
# resolve features for that package alone and compile the crates again.)
step "GPU-class kernels on lavapipe (INGOT_KERNEL_CLASS=gpu)"
INGOT_KERNEL_CLASS=gpu INGOT_VULKAN_VALIDATION=sync cargo test --workspace --test ppocr -- vulkan
INGOT_KERNEL_CLASS=gpu INGOT_VULKAN_VALIDATION=sync cargo test --workspace --test vulkan
INGOT_KERNEL_CLASS=gpu INGOT_VULKAN_VALIDATION=sync INGOT_TEST_FILTER=conv,pool,matmul,gemm,attention \
    cargo test --workspace --test conformance -- vulkan --show-output

# The examples an app developer starts from, and the runtime without its Vulkan backend: its
# unit tests, and the embed example built CPU-only running a bundle (the default device list
# then skips Vulkan with a notice).
step "examples and the CPU-only runtime"
target="${CARGO_TARGET_DIR:-target}"
out="$target/examples"
mkdir -p "$out"
# The workspace build made the examples' binaries: run them as built (`cargo run -p` would
# resolve features for that package alone and compile the runtime again).
bin="$target/debug"
"$bin/quickstart"
"$bin/build-step"
"$bin/ingot" compile examples/plan-snapshot/model.onnx --input-shape x=1x3x32x32 \
    -o "$out/cnn.ingot"
"$bin/ingot" compile "$target/models/ch_PP-OCRv4_rec_infer.onnx" \
    --input-shape x=1x3x48x320 -o "$out/rec.ingot"
"$bin/embed" "$out/cnn.ingot" --from-memory --devices vulkan:cpu,cpu
cargo test --quiet -p ingot-runtime --no-default-features --lib
# The default device list in a CPU-only build: Vulkan skipped with a notice.
cargo run --quiet -p embed --no-default-features -- "$out/cnn.ingot"
# The CPU-only build computes the same bytes (embed prints a digest per output) as the
# default build on the CPU, which the test suites compare with ONNX Runtime.
for b in cnn rec; do
    "$bin/embed" "$out/$b.ingot" --devices cpu >"$out/$b.cpu.txt"
    cargo run --quiet -p embed --no-default-features -- "$out/$b.ingot" --devices cpu |
        diff -u "$out/$b.cpu.txt" -
done

# What the runtime adds to an app binary (examples/embed, release, stripped); the last line is
# the figure to watch: `runtime adds N bytes stripped (vulkan)`. Built by rustc alone, as an
# app builds it.
step "runtime size (tools/size.sh)"
env -u RUSTC_WORKSPACE_WRAPPER -u RUSTFLAGS bash tools/size.sh

# The C API: libingot built, capi/examples/run_bundle.c compiled against capi/include/ingot.h
# and the static library, run on the PP-OCR classifier (Vulkan on lavapipe, named since
# `vulkan` picks GPUs only, then the CPU).
step "C API example (capi/run_example.sh)"
bash capi/run_example.sh vulkan:cpu,cpu "$target/capi/out"
cargo build --quiet -p ingot-capi --no-default-features

# The CPU kernels' NEON paths, the runtime and the C API built for aarch64 with Debian's
# rustc (which clippy-driver cannot stand in for) and run under qemu-user against ONNX
# Runtime's references.
step "aarch64 under qemu-user (tools/test_aarch64.sh)"
env -u RUSTC_WORKSPACE_WRAPPER -u RUSTFLAGS bash tools/test_aarch64.sh

# The Python package: the wheel built by maturin (dev profile, reusing the build above),
# installed into the test venv, tested with pytest against ONNX Runtime.
step "Python package (python/test.sh)"
bash python/test.sh
step "done"
