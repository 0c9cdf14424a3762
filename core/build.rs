//! Turns the `loom` feature into `cfg(loom)` for every target of this
//! crate (the library and `tests/loom`), so the code keeps the `cfg(loom)`
//! of crossbeam and tokio while the loom build is one of the workspace's
//! features: `cargo test --workspace --profile ci --features
//! hf3fs-meta-core/loom --test loom` reuses every crate that `cargo test
//! --workspace --profile ci` compiled and rebuilds this one alone
//! (docs/verification.md). A `--cfg loom` in RUSTFLAGS instead would
//! change every crate's hash and rebuild the whole graph, so it is refused
//! here with the command to use.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    // The workspace's `[workspace.lints.rust] unexpected_cfgs` declares
    // it too; this keeps the crate's lint right wherever it is built.
    println!("cargo::rustc-check-cfg=cfg(loom)");
    let feature = std::env::var_os("CARGO_FEATURE_LOOM").is_some();
    if std::env::var_os("CARGO_CFG_LOOM").is_some() && !feature {
        panic!(
            "hf3fs-meta-core: `--cfg loom` came from RUSTFLAGS; the loom models build with the crate's \
             feature instead: cargo test --workspace --profile ci --features hf3fs-meta-core/loom --test loom"
        );
    }
    if feature {
        println!("cargo::rustc-cfg=loom");
    }
}
