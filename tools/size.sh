#!/usr/bin/env bash
# What the runtime adds to an app binary: examples/embed (open a bundle, run it, print the
# outputs) built as an app ships it, in the `app` profile (release with fat LTO and one
# codegen unit; Cargo.toml), stripped, beside an empty program built the same way
# (examples/embed/src/bin/baseline.rs), with the Vulkan backend and without. Target (issue 23):
# the runtime adds at most 2 MiB with Vulkan. Nothing is asserted: the last line, which CI
# prints, shows a regression.
#
# Usage: tools/size.sh [--profile app|release] [--symbols N]
# --profile release: the workspace's release profile instead (thin LTO, 4 codegen units).
# --symbols N: also the N largest contributors to the Vulkan build's code, symbol sizes
# summed by crate and module (generic instances together), from the unstripped binary.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
out="$target/size"
symbols=0 profile=app
while [[ $# -gt 0 ]]; do
    case "$1" in
        --profile) profile="$2"; shift 2 ;;
        --symbols) symbols="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "size: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"

# Each build's binaries stripped into $out before the next build replaces them.
built="$target/$profile"
cargo build --profile "$profile" --quiet -p embed --bins
strip -o "$out/baseline" "$built/baseline"
strip -o "$out/embed-vulkan" "$built/embed"
cp "$built/embed" "$out/embed-vulkan.unstripped"
cargo build --profile "$profile" --quiet -p embed --no-default-features --bin embed
strip -o "$out/embed-cpu" "$built/embed"

bytes() { stat -c %s "$1"; }
base=$(bytes "$out/baseline")
cpu=$(($(bytes "$out/embed-cpu") - base))
vulkan=$(($(bytes "$out/embed-vulkan") - base))
budget=$((2 * 1024 * 1024))
echo "$profile profile, stripped, $(rustc -vV | sed -n 's/^host: //p')"
printf '  %-32s %10d bytes\n' "empty program" "$base" \
    "embed, CPU backend only" "$(bytes "$out/embed-cpu")" \
    "embed, with Vulkan" "$(bytes "$out/embed-vulkan")"
echo "runtime adds $cpu bytes stripped (CPU backend only)"
if ((vulkan <= budget)); then verdict=met; else verdict="not met, $((vulkan - budget)) bytes over"; fi
echo "target: at most $budget bytes (2 MiB) with Vulkan: $verdict"
if ((symbols > 0)); then
    echo "largest contributors (symbol bytes by crate::module, generic instances summed):"
    nm --demangle --print-size --size-sort "$out/embed-vulkan.unstripped" | python3 -c '
import collections, re, sys
sizes, counts = collections.Counter(), collections.Counter()
for line in sys.stdin:
    parts = line.rstrip("\n").split(" ", 3)
    if len(parts) < 4:
        continue
    m = re.search(r"[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*", parts[3])
    key = m.group(0) if m else parts[3][:40]
    sizes[key] += int(parts[1], 16)
    counts[key] += 1
for key, size in sizes.most_common(int(sys.argv[1])):
    print(f"  {size:10d} bytes  {counts[key]:5d} symbols  {key}")
' "$symbols"
fi
echo "runtime adds $vulkan bytes stripped (vulkan)"
