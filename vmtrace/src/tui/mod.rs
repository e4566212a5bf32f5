//! `vmtrace top`: a live view of the vmalloc allocator, or a replay of a trace through the same
//! screen; `docs/tui.md` describes the panels.
//!
//! Shape (bpftop/bottom habits): a source thread (probes or trace file) and an input thread
//! feed one [`app::Event`] channel; the UI loop applies events to the [`app::App`] and redraws
//! at most 10 times a second through [`render::draw`], which is generic over the ratatui
//! backend. A [`term::TerminalGuard`] restores the screen on exit, panic and SIGTERM. When
//! stdout is not a terminal the same screen is printed as text every `--interval` (`top -b`).

pub mod app;
mod model;
pub mod render;
pub mod source;
pub mod term;

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use ratatui::backend::TestBackend;
use ratatui::Terminal;

use app::{App, Control, Event};
use source::{ReplayInput, ReplaySpec};

/// The screen is redrawn at most this often (10 Hz).
pub const FRAME_EVERY: Duration = Duration::from_millis(100);
/// Size of the text screen printed in batch mode.
const BATCH_WIDTH: u16 = 120;
const BATCH_HEIGHT: u16 = 44;

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Play a trace recorded by `vmtrace record` instead of attaching probes (`-` for stdin).
    #[arg(long, value_name = "TRACE")]
    pub replay: Option<PathBuf>,

    /// Replay speed: trace seconds per wall second, e.g. `10x`, `0.5x` or `2`.
    #[arg(long, default_value = "1x", value_parser = parse_speed)]
    pub speed: f64,

    /// Start a replay again from the beginning when it ends.
    #[arg(long = "loop")]
    pub looped: bool,

    /// Optional probes to attach live, as for `vmtrace record --probes`.
    #[arg(long, value_delimiter = ',', default_value = crate::probe::selection::DEFAULT_PROBES)]
    pub probes: Vec<String>,

    /// Total size of the BPF ring buffers in MiB (a power of two), one ring per CPU up to eight.
    #[arg(long, default_value_t = 64)]
    pub ring_mib: u32,

    /// Print the screen as text every --interval instead of drawing it (the default when
    /// stdout is not a terminal), like `top -b`.
    #[arg(short, long)]
    pub batch: bool,

    /// Batch mode: stop after this many screens (default: until interrupted).
    #[arg(short = 'n', long, value_name = "N")]
    pub iterations: Option<u64>,

    /// Batch mode: time between screens.
    #[arg(short = 'd', long, default_value = "2s", value_parser = crate::value_parsers::parse_duration)]
    pub interval: Duration,
}

/// Parses `10x`, `10` or `0.5x`.
pub fn parse_speed(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let t = t.strip_suffix(['x', 'X']).unwrap_or(t);
    match t.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not a replay speed: expected a positive number, optionally followed by `x` \
             (e.g. `10x`, `0.5x`)"
        )),
    }
}

/// Set from the signal handler; the UI loop polls it at least every frame.
static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    SIGNALLED.store(true, Ordering::Relaxed);
}

/// SIGINT, SIGTERM and SIGHUP end the loop normally, so the terminal guard runs.
fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

pub fn run(args: &TopArgs) -> anyhow::Result<ExitCode> {
    let batch = args.batch || !std::io::stdout().is_terminal();
    let (tx, rx) = std::sync::mpsc::channel::<Event>();
    let stop = Arc::new(AtomicBool::new(false));
    let mut control = None;
    install_signal_handlers();

    match &args.replay {
        Some(path) => {
            let spec = ReplaySpec {
                input: ReplayInput::File(path.clone()),
                speed: args.speed,
                looped: args.looped,
                banner: None,
            };
            source::check_replay(&spec).map_err(anyhow::Error::msg)?;
            source::spawn_replay(spec, tx.clone(), stop.clone());
        }
        None => {
            let wanted = crate::probe::selection::resolve_probes(&args.probes)
                .map_err(anyhow::Error::msg)?;
            let ring_bytes = u64::from(args.ring_mib) << 20;
            match source::spawn_live(wanted, ring_bytes, tx.clone(), stop.clone()) {
                Ok((_, c)) => control = Some(c),
                Err(why) => {
                    let banner = format!(
                        "live capture unavailable ({}): replaying the bundled trace",
                        first_sentence(&why)
                    );
                    if !batch {
                        // The reason in full, for the scrollback once the screen is restored.
                        eprintln!("vmtrace top: {why}");
                    }
                    let spec = ReplaySpec {
                        input: ReplayInput::Bundled,
                        speed: args.speed,
                        looped: true,
                        banner: Some(banner),
                    };
                    source::spawn_replay(spec, tx.clone(), stop.clone());
                }
            }
        }
    }

    // Requests from the screen (`t`) go to the live source; a replay has none to take them.
    let send = |c: Control| {
        if let Some(tx) = &control {
            let _ = tx.send(c);
        }
    };
    let result = if batch {
        run_batch(&rx, args)
    } else {
        run_tui(&rx, tx, send)
    };
    stop.store(true, Ordering::Relaxed);
    result.map(|()| ExitCode::SUCCESS)
}

fn first_sentence(s: &str) -> &str {
    s.split(": run as root").next().unwrap_or(s)
}

/// The interactive loop: owns the terminal until `q`, Ctrl-C or a signal.
fn run_tui(
    rx: &Receiver<Event>,
    tx: std::sync::mpsc::Sender<Event>,
    send: impl FnMut(Control),
) -> anyhow::Result<()> {
    // Nothing may write to the screen the TUI owns: logs are dropped while it runs.
    log::set_max_level(log::LevelFilter::Off);
    let guard = term::TerminalGuard::enter().context("taking over the terminal")?;
    let mut terminal = guard.terminal().context("opening the terminal")?;
    let input_stop = Arc::new(AtomicBool::new(false));
    term::spawn_input(tx, input_stop.clone());
    let mut app = App::new();
    let result = ui_loop(
        &mut terminal,
        &mut app,
        rx,
        || SIGNALLED.load(Ordering::Relaxed),
        send,
    );
    input_stop.store(true, Ordering::Relaxed);
    drop(terminal);
    drop(guard);
    result
}

/// Applies events and redraws at most every [`FRAME_EVERY`], until the app quits, `stop()`
/// says so or every sender is gone; the app's requests for the source go to `send`. Generic
/// over the backend so tests can drive it.
pub fn ui_loop<B: ratatui::backend::Backend>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    rx: &Receiver<Event>,
    stop: impl Fn() -> bool,
    mut send: impl FnMut(Control),
) -> anyhow::Result<()>
where
    B::Error: Send + Sync + 'static,
{
    let mut next_draw = Instant::now();
    loop {
        let now = Instant::now();
        let wait = if app.dirty {
            next_draw.saturating_duration_since(now)
        } else {
            FRAME_EVERY
        };
        match rx.recv_timeout(wait) {
            Ok(ev) => {
                app.handle(ev);
                // Take what is already queued, but never so much that drawing starves.
                for ev in rx.try_iter().take(256) {
                    app.handle(ev);
                }
            }
            Err(RecvTimeoutError::Timeout) => app.handle(Event::Tick),
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        }
        for c in app.controls.drain(..) {
            send(c);
        }
        if app.quit || stop() {
            return Ok(());
        }
        if app.dirty && Instant::now() >= next_draw {
            render::draw(terminal, app).context("drawing")?;
            app.dirty = false;
            next_draw = Instant::now() + FRAME_EVERY;
        }
    }
}

/// `top -b`: the same screen as text, every `--interval`, `--iterations` times.
fn run_batch(rx: &Receiver<Event>, args: &TopArgs) -> anyhow::Result<()> {
    let mut app = App::new();
    let mut shown = 0u64;
    let mut next = Instant::now() + args.interval;
    loop {
        let wait = next.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(ev) => app.handle(ev),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => next = Instant::now(),
        }
        if SIGNALLED.load(Ordering::Relaxed) {
            return Ok(());
        }
        if Instant::now() >= next {
            shown += 1;
            println!("{}", screen_text(&app, BATCH_WIDTH, BATCH_HEIGHT));
            next = Instant::now() + args.interval;
            if args.iterations.is_some_and(|n| shown >= n) {
                return Ok(());
            }
        }
    }
}

/// Renders the app off-screen and returns it as text, trailing blanks trimmed.
pub fn screen_text(app: &App, width: u16, height: u16) -> String {
    let mut t = match Terminal::new(TestBackend::new(width, height)) {
        Ok(t) => t,
        Err(e) => match e {},
    };
    if let Err(e) = render::draw(&mut t, app) {
        match e {}
    }
    buffer_text(t.backend().buffer())
}

/// A buffer as lines of text.
pub fn buffer_text(buf: &ratatui::buffer::Buffer) -> String {
    let w = buf.area.width as usize;
    let mut out = String::new();
    for row in buf.content().chunks(w.max(1)) {
        let line: String = row.iter().map(|c| c.symbol()).collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
