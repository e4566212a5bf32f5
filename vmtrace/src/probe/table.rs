//! `vmtrace probes`: the strategy ladder as this kernel resolves it, like `bpftool feature` for
//! vmtrace's own probes. It runs the same detection and attach as `record` (so it needs the same
//! privileges), prints what was chosen, and detaches.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::trace::ProbeInfo;

use super::LoadedProbes;

#[derive(Debug, Args)]
pub struct ProbesArgs {
    /// Print the table as JSON (the trace header's `probes` array).
    #[arg(long)]
    pub json: bool,
}

/// The smallest ring buffer the loader accepts on 4 KiB pages is one page; 1 MiB is plenty for
/// the moment the probes are attached here.
const RING_BYTES: u64 = 1 << 20;

pub fn run(args: &ProbesArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let infos = rt.block_on(async {
        let mut probes =
            LoadedProbes::load_and_attach(RING_BYTES, &super::ladder::logical_names())?;
        probes.detach();
        anyhow::Ok(probes.infos.clone())
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&infos)?);
    } else {
        print!("{}", render(&infos));
    }
    Ok(ExitCode::SUCCESS)
}

/// One row per probe: logical name, chosen rung (with how a tracepoint attached), attach
/// point, and the refused rungs.
pub fn render(infos: &[ProbeInfo]) -> String {
    let rows: Vec<[String; 4]> = infos
        .iter()
        .map(|i| {
            let mut why: Vec<String> = i
                .refused
                .iter()
                .map(|r| format!("{}: {}", r.rung, r.reason))
                .collect();
            if let Some(note) = &i.note {
                why.push(note.clone());
            }
            if let Some(fallback) = &i.attach_fallback {
                why.push(format!("perf tracepoint because {fallback}"));
            }
            let rung = match &i.attach {
                Some(how) => format!("{} ({how})", i.rung),
                None => i.rung.clone(),
            };
            [
                i.logical.clone().unwrap_or_else(|| "vmalloc_events".into()),
                rung,
                i.probe.clone(),
                why.join(" | "),
            ]
        })
        .collect();
    let head = ["PROBE", "RUNG", "ATTACHED TO", "REFUSED RUNGS / NOTE"];
    let mut width = head.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r.iter()).take(3) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    let line = |cells: [&str; 4], out: &mut String| {
        out.push_str(&format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {}\n",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            w0 = width[0],
            w1 = width[1],
            w2 = width[2]
        ));
    };
    line(head, &mut out);
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3]], &mut out);
    }
    out
}
