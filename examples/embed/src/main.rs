//! A runtime-only program, as an app would embed Ingot: open a bundle (from a path, or from
//! bytes already in memory), make a session on a device list, run it on seeded inputs of the
//! declared shapes, and print where each submodel ran and what came out.
//!
//! `cargo run -p embed -- BUNDLE [--from-memory] [--devices vulkan,cpu]`

use ingot_runtime::{Bundle, Session, SessionOptions, Tensor};
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
                ingot_runtime::DType::F32 => Tensor::from_vec(info.desc.shape.clone(), &values),
                _ => Ok(Tensor::zeros(info.desc.clone())),
            }
        })
        .collect::<Result<_, _>>()?;
    let outputs = session.run(&inputs)?;
    for (info, t) in session.outputs().iter().zip(&outputs) {
        println!("{} {} {:?}", info.name, t.dtype(), t.shape());
    }
    Ok(())
}
