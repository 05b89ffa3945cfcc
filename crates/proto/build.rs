//! Compile the proto with protox (pure Rust), so no `protoc` is needed on any machine.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/latchkey.proto");
    let fds = protox::compile(["proto/latchkey.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
