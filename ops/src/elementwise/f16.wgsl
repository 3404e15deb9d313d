// f16 bits to f32 (exact), and f32 to f16 bits rounding to nearest even (as the `half`
// crate); WGSL's pack2x16float needs a capability not every device has. A library.

fn h2f(h: u32) -> f32 {
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    let s = (h & 0x8000u) << 16u;
    if (e == 0u) {
        let v = f32(m) * 5.9604645e-8;
        return select(v, -v, s != 0u);
    }
    if (e == 31u) { return bitcast<f32>(s | 0x7f800000u | (m << 13u)); }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}

fn f2h(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    let s = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) { return s | 0x7e00u; }
    if (a >= 0x477ff000u) { return s | 0x7c00u; }
    if (a >= 0x38800000u) {
        let r = a - 0x38000000u;
        return s | ((r + 0xfffu + ((r >> 13u) & 1u)) >> 13u);
    }
    return s | u32(round(bitcast<f32>(a) * 16777216.0));
}
