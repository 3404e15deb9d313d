// DequantizeLinear and QuantizeLinear (quantize/vulkan.rs, on the CPU's terms: quantize/cpu.rs).
// Invocation w writes output word w: the 32 / bits elements packed in it, so that no two
// invocations write one word; the last word keeps the bytes past the tensor's end.
//
// The quantized side (x of DequantizeLinear, y of QuantizeLinear, and the zero point) is
// 8-, 16- or 32-bit integers packed in u32 words (2- and 4-bit integers and minifloats are one
// per byte; minifloats through the hooks `level_value` and `quantized`); the float side (y, or x) f32 or, through
// the hooks, f16. Element e takes scale s(e) (quantize/scales.rs): one for the tensor, one per
// index along the axis ((e / inner) % dim), or one per block of `block` indices along it.
//
//   dequantize: y = (x - zero) * scale        (exact difference, one rounded product)
//   quantize:   y = saturate(round_half_even(ratio(x, scale)) + zero)   (minifloats: encoded)
//   round trip: y = (quantize(x) - zero) * scale     (QuantizeDequantize)

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read> scale: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<u32>;
// Bound and read only with ZERO.
@group(0) @binding(3) var<storage, read> zero: array<u32>;

struct Params {
    x: u32,
    scale: u32,
    y: u32,
    zero: u32,
    count: u32,
    inner: u32,
    dim: u32,
    // Blocks: the indices per block and the blocks along the axis.
    block: u32,
    blocks: u32,
}
var<immediate> p: Params;

override WG: u32 = 64u;
override QUANTIZE: bool = false;
// QuantizeDequantize: quantize, then give the level's value back as a float (y is the float
// side too).
override ROUND_TRIP: bool = false;
// The quantized values: bits (8, 16 or 32) and sign.
override Q_BITS: u32 = 8u;
override Q_SIGNED: bool = true;
// The levels' bits where fewer than Q_BITS (2- and 4-bit integers); 0: Q_BITS.
override LEVEL_BITS: u32 = 0u;
// The float side's bits: 32, or 16 (f16: the hooks below read and write it).
override F_BITS: u32 = 32u;
// Scales and zero points: 0 one for the tensor, 1 per axis index, 2 per block.
override PER: u32 = 0u;
override ZERO: bool = false;

fn divmod(n: u32, d: u32) -> vec2<u32> {
    return vec2<u32>(n / d, n % d);
}

// The low `bits` bits set.
fn mask(bits: u32) -> u32 {
    return select(0xffffffffu, (1u << bits) - 1u, bits < 32u);
}

// Element e of an array of `bits`-bit elements packed little-endian in words, from the word
// holding it: its bits, the high ones clear.
fn field(word: u32, e: u32, bits: u32) -> u32 {
    return (word >> ((e * bits) % 32u)) & mask(bits);
}

// Hooks for float16, which quantize/vulkan.rs writes with elementwise/f16.wgsl's `h2f` and
// `f2h`; the bodies here are float32's.

// The float side's element e (QuantizeLinear's x).
fn real_at(e: u32) -> f32 {
    return bitcast<f32>(x[p.x + e]);
}

// The float side's bits of a value (DequantizeLinear's y).
fn real_bits(v: f32) -> u32 {
    return bitcast<u32>(v);
}

fn scale_at(s: u32) -> f32 {
    return bitcast<f32>(scale[p.scale + s]);
}

// x / scale in the step's precision.
fn ratio(v: f32, s: f32) -> f32 {
    return v / s;
}

// A quantized element's bits as an integer.
fn level_of(raw: u32) -> i32 {
    if (!Q_SIGNED || Q_BITS == 32u) {
        return bitcast<i32>(raw);
    }
    return bitcast<i32>(raw << (32u - Q_BITS)) >> (32u - Q_BITS);
}

// The value of a quantized element's bits.
fn level_value(raw: u32) -> f32 {
    return f32(level_of(raw));
}

// The quantized bits of ratio r with zero point z: r rounded half to even (WGSL's round, as
// ONNX's), plus z, saturated to the levels.
fn quantized(r: f32, z: f32) -> u32 {
    let top = f32(mask(select(Q_BITS, LEVEL_BITS, LEVEL_BITS != 0u) - 1u));
    let lo = select(0.0, -top - 1.0, Q_SIGNED);
    let hi = select(2.0 * top + 1.0, top, Q_SIGNED);
    return bitcast<u32>(i32(clamp(round(r) + z, lo, hi))) & mask(Q_BITS);
}

fn zero_at(s: u32) -> f32 {
    if (!ZERO) {
        return 0.0;
    }
    return level_value(field(zero[p.zero + s * Q_BITS / 32u], s, Q_BITS));
}

// The scale index of element e.
fn scale_index(e: u32) -> u32 {
    if (PER == 0u) {
        return 0u;
    }
    let row = divmod(e, p.inner);
    let od = divmod(row.x, p.dim);
    if (PER == 1u) {
        return od.y;
    }
    return (od.x * p.blocks + divmod(od.y, p.block).x) * p.inner + row.y;
}

// Element e's output bits (the high ones clear).
fn convert(e: u32) -> u32 {
    let s = scale_index(e);
    if (QUANTIZE) {
        let q = quantized(ratio(real_at(e), scale_at(s)), zero_at(s));
        if (ROUND_TRIP) {
            return real_bits((level_value(q) - zero_at(s)) * scale_at(s)) & mask(F_BITS);
        }
        return q;
    }
    // The difference of 16-bit values is exact; one rounding, the product's.
    let d = level_value(field(x[p.x + e * Q_BITS / 32u], e, Q_BITS)) - zero_at(s);
    return real_bits(d * scale_at(s)) & mask(F_BITS);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = gid.x + gid.y * groups.x * WG;
    let bits = select(F_BITS, Q_BITS, QUANTIZE && !ROUND_TRIP);
    let per_word = 32u / bits;
    let first = w * per_word;
    if (first >= p.count) {
        return;
    }
    let n = min(per_word, p.count - first);
    var word = 0u;
    if (n < per_word) {
        // The bytes past the tensor's end stay as they are.
        word = y[p.y + w] & ~mask(n * bits);
    }
    for (var j = 0u; j < n; j++) {
        word = word | (convert(first + j) << (j * bits));
    }
    y[p.y + w] = word;
}
