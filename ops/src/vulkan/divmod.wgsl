// (n / d, n % d) for n < 2^31 and 0 < d < 2^24: an f32 estimate of the quotient, corrected
// twice. Integer division by a value known only at run time is a scalar loop per lane on
// CPU-type devices; this is a few vector instructions.
//
// Not a module of its own: a kernel declares `divmod` with the exact body `(n / d, n % d)` and
// `Spec::divmod` puts this one in its place where the kernel's values stay inside the bounds.
fn divmod(n: u32, d: u32) -> vec2<u32> {
    let inv = 1.0 / f32(d);
    // Within 3 * 2^-24 * n / d + 1 of the quotient, so the remainder is within 2^8 + d of 0.
    let q = u32(f32(n) * inv);
    let r = bitcast<i32>(n - q * d);
    // Within one of the quotient.
    let c = i32(floor(f32(r) * inv));
    var qi = bitcast<i32>(q) + c;
    var ri = r - c * bitcast<i32>(d);
    if (ri < 0i) {
        qi -= 1i;
        ri += bitcast<i32>(d);
    } else if (ri >= bitcast<i32>(d)) {
        qi += 1i;
        ri -= bitcast<i32>(d);
    }
    return vec2<u32>(u32(qi), u32(ri));
}
