// DynamicQuantizeLinear's first dispatch (quantize/vulkan.rs; the CPU's terms: quantize/cpu.rs):
// one workgroup finds the least and greatest of x and 0, then writes the scale, (max - min) /
// 255 (1 / 255 where they are equal), and the zero point that maps 0 exactly,
// round_half_even(clamp(-min / scale, 0, 255)), into the byte of its word that holds it (the
// other bytes kept). The second dispatch is linear.wgsl's QuantizeLinear reading both.

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> scale: array<u32>;
@group(0) @binding(2) var<storage, read_write> zero: array<u32>;

struct Params {
    x: u32,
    scale: u32,
    zero: u32,
    count: u32,
}
var<immediate> p: Params;

const WG: u32 = 256u;

var<workgroup> least: array<f32, WG>;
var<workgroup> greatest: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) i: u32) {
    var lo = 0.0;
    var hi = 0.0;
    for (var e = i; e < p.count; e += WG) {
        let v = bitcast<f32>(x[p.x + e]);
        lo = min(lo, v);
        hi = max(hi, v);
    }
    least[i] = lo;
    greatest[i] = hi;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half >>= 1u) {
        if (i < half) {
            least[i] = min(least[i], least[i + half]);
            greatest[i] = max(greatest[i], greatest[i + half]);
        }
        workgroupBarrier();
    }
    if (i == 0u) {
        let lo = least[0];
        let hi = greatest[0];
        let s = select(hi - lo, 1.0, hi == lo) / 255.0;
        scale[p.scale] = bitcast<u32>(s);
        let z = u32(round(clamp(0.0 - lo / s, 0.0, 255.0)));
        zero[p.zero] = (zero[p.zero] & 0xffffff00u) | z;
    }
}
