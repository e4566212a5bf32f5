//! Which optional probes a `--probes` list asks for (shared by `record`, `top` and `serve`).

/// The optional probes `record` attaches unless told otherwise: the ones whose cost stays small
/// next to the vmalloc tracepoints (measured in docs/probes.md).
pub const DEFAULT_PROBES: &str = "lock_waits,purge_work,alloc_latency";

/// A `--probes` list resolved to logical probe names (shared by `record` and `top`), refusing
/// unknown ones with the list of valid names.
pub fn resolve_probes(names: &[String]) -> Result<Vec<&'static str>, String> {
    let known = super::ladder::logical_names();
    let mut wanted = Vec::new();
    for name in names {
        match name.trim() {
            "all" => wanted.extend(known.iter().copied()),
            "none" | "" => {}
            other => match known.iter().find(|k| **k == other) {
                Some(k) => wanted.push(*k),
                None => {
                    return Err(format!(
                        "unknown probe `{other}` in --probes; valid: {}, all, none",
                        known.join(", ")
                    ))
                }
            },
        }
    }
    // The hold probe times only locks the wait probe has classified (`KNOWN_LOCKS`).
    if wanted.contains(&"lock_holds") && !wanted.contains(&"lock_waits") {
        wanted.push("lock_waits");
    }
    wanted.sort_unstable();
    wanted.dedup();
    Ok(wanted)
}
