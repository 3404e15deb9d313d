//! An app whose model was compiled by its build script (see build.rs): the bundle is part of
//! the binary, and the binary links only the runtime. `cargo run -p build-step`

use ingot_runtime::{Bundle, Session, SessionOptions, Tensor};
use std::sync::Arc;

static BUNDLE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/model.ingot"));

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Validated before use like any bundle; the bytes are copied once, aligned.
    let bundle = Arc::new(Bundle::from_bytes(BUNDLE)?);
    let mut session = Session::new(bundle, SessionOptions::default())?;
    print!("{}", session.placement());
    let x: Vec<f32> = (0..3 * 32 * 32).map(|i| (i % 13) as f32 / 13.0).collect();
    let outputs = session.run(&[Tensor::from_vec(vec![1, 3, 32, 32], &x)?])?;
    let [logits] = outputs.as_slice() else {
        return Err("the model has one output".into());
    };
    println!("logits {:?}: {:?}", logits.shape(), logits.as_slice::<f32>()?);
    Ok(())
}
