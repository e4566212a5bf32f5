//! Rebuild the probes when bpf-linker changes: a linker built against another LLVM produces
//! objects the verifier may reject, so a swapped linker must not reuse a stale object.
use which::which;

fn main() {
    match which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => {
            println!("cargo:warning=bpf-linker not found on PATH ({err}); run `cargo xtask setup`")
        }
    }
}
