//! A runtime-only program, as an app would embed Ingot: open a bundle (from a path, or from
//! bytes already in memory), make a session on a device list, run it on seeded inputs of the
//! declared shapes, and print where each submodel ran and what came out (shape, first values
//! and a digest of the bytes).
//!
//! `cargo run -p embed -- BUNDLE [--from-memory] [--devices vulkan,cpu]`
//!
//! The default list, `vulkan,cpu`, takes a Vulkan GPU, else the CPU; a CPU-type Vulkan device
//! such as lavapipe runs only where named (`--devices vulkan:cpu,cpu`).

use ingot_runtime::{Bundle, DType, Session, SessionOptions, Tensor};
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("embed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut path, mut from_memory, mut devices) = (None, false, "vulkan,cpu".to_string());
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--from-memory" => from_memory = true,
            "--devices" => devices = args.next().ok_or("--devices needs a list")?,
            _ => path = Some(arg),
        }
    }
    let path = path.ok_or("usage: embed BUNDLE [--from-memory] [--devices vulkan,cpu]")?;
    let bundle = if from_memory {
        // E.g. bytes from an asset pack or `include_bytes!`; they are copied once, aligned.
        Bundle::from_bytes(&std::fs::read(&path)?)?
    } else {
        // Mapped: weights are read in place.
        Bundle::open(&path)?
    };
    let mut session = Session::new(Arc::new(bundle), SessionOptions::on(&devices)?)?;
    print!("{}", session.placement());
    let inputs: Vec<Tensor> = session
        .inputs()
        .iter()
        .map(|info| {
            let n: usize = info.desc.shape.iter().product();
            let values: Vec<f32> = (0..n).map(|i| (i % 17) as f32 / 17.0).collect();
            match info.desc.dtype {
                DType::F32 => Tensor::from_vec(info.desc.shape.clone(), &values),
                _ => Ok(Tensor::zeros(info.desc.clone())),
            }
        })
        .collect::<Result<_, _>>()?;
    let outputs = session.run(&inputs)?;
    for (info, t) in session.outputs().iter().zip(&outputs) {
        let head: Vec<f32> = match t.dtype() {
            DType::F32 => t.as_slice::<f32>()?.iter().take(4).copied().collect(),
            _ => Vec::new(),
        };
        let digest = fnv1a(t.bytes());
        println!("{} {} {:?} {head:?} fnv1a {digest:016x}", info.name, t.dtype(), t.shape());
    }
    Ok(())
}

/// A digest of an output's bytes: two builds or devices that print the same one computed the
/// same bits (tools/test.sh compares the CPU-only build with the default one this way).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}
