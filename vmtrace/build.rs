//! Builds the eBPF probes with aya-build (nightly, `bpfel-unknown-none`, bpf-linker) so the
//! user-space binary can embed the object. `cargo xtask setup` installs what this needs.
use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("vmtrace crate has no parent directory")?
        .join("vmtrace-ebpf");
    let root = root.to_str().context("non-UTF-8 workspace path")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "vmtrace-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context("building the eBPF probes failed; run `cargo xtask setup` to install rust-src and bpf-linker")
}
