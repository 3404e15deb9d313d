//! Compiles `bundle.proto` with protox (pure Rust): no `protoc` needed on the machine.

fn main() {
    println!("cargo:rerun-if-changed=bundle.proto");
    let descriptors = protox::compile(["bundle.proto"], ["."]).expect("bundle.proto must compile");
    prost_build::Config::new().compile_fds(descriptors).expect("prost code generation");
}
