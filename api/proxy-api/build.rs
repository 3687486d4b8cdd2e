//! Compiles the inference discovery API and the engine-signals API with `protox` (pure Rust; no
//! `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/inference.proto", "proto/signals.proto"];
    let includes = ["proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(protos, includes)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
