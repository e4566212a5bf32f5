//! The terminal: a guard that puts it back however `vmtrace top` ends, and the input thread.

use std::io::Stdout;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use crossterm::event::{self, Event as CEvent, KeyCode, KeyEventKind, KeyModifiers};
use crossterm::{cursor, execute, terminal};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;

use super::app::{Event, Key};

/// Raw mode, alternate screen and hidden cursor while alive; dropping it (or a panic) leaves
/// the terminal as it was, so a crash never strands the user in raw mode.
pub struct TerminalGuard {
    _private: (),
}

/// Undoes everything [`TerminalGuard::enter`] did; safe to call twice.
fn restore() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(
        std::io::stdout(),
        terminal::LeaveAlternateScreen,
        cursor::Show
    );
}

impl TerminalGuard {
    pub fn enter() -> std::io::Result<Self> {
        // The panic hook restores first, so the panic message lands on a sane screen.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
        terminal::enable_raw_mode()?;
        let guard = Self { _private: () };
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide
        )?;
        Ok(guard)
    }

    pub fn terminal(&self) -> std::io::Result<Terminal<CrosstermBackend<Stdout>>> {
        let mut t = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
        t.clear()?;
        Ok(t)
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// Maps a crossterm key to ours; `None` for keys `top` ignores.
pub fn map_key(code: KeyCode, mods: KeyModifiers) -> Option<Key> {
    Some(match code {
        KeyCode::Char('c') if mods.contains(KeyModifiers::CONTROL) => Key::CtrlC,
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Tab => Key::Tab,
        KeyCode::BackTab => Key::BackTab,
        KeyCode::Left => Key::Left,
        KeyCode::Right => Key::Right,
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        _ => return None,
    })
}

/// Reads keys on its own thread (polling, so it notices `stop`) and sends them as events.
pub fn spawn_input(tx: Sender<Event>, stop: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match event::poll(Duration::from_millis(100)) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(_) => return,
            }
            let Ok(ev) = event::read() else { return };
            if let CEvent::Key(k) = ev {
                if k.kind == KeyEventKind::Release {
                    continue;
                }
                if let Some(key) = map_key(k.code, k.modifiers) {
                    if tx.send(Event::Input(key)).is_err() {
                        return;
                    }
                }
            } else if let CEvent::Resize(..) = ev {
                if tx.send(Event::Resize).is_err() {
                    return;
                }
            }
        }
    });
}
