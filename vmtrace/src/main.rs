fn main() {
    let _ = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/vmtrace"));
}
