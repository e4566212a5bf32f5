//! State and render tests for `vmtrace top`, with fixed data and no terminal.

use ratatui::backend::TestBackend;
use ratatui::Terminal;

use super::app::*;
use super::render;
use crate::trace::{
    Alloc, AreaKind, Contention, Ctx, Free, KAddr, LockClass, ProbeInfo, PtLevel, PtPage, Purge,
    Record, VmallocArea, VmallocSnapshot,
};

const SEC: u64 = 1_000_000_000;
const BASE: u64 = 0xffff_c900_0000_0000;

fn ctx(ts: u64) -> Ctx {
    Ctx {
        ts_ns: ts,
        cpu: 0,
        tgid: 1,
        pid: 1,
        comm: "t".into(),
    }
}

fn alloc(ts: u64, addr: u64, pages: u64) -> Record {
    Record::Alloc(Alloc {
        ctx: ctx(ts),
        addr: KAddr(addr),
        size: pages * 4096,
        align: 1,
        vstart: KAddr(BASE),
        vend: KAddr(0xffff_e8ff_ffff_ffff),
        failed: 0,
    })
}

fn free(ts: u64, addr: u64, nr_lazy: u64) -> Record {
    Record::Free(Free {
        ctx: ctx(ts),
        va_start: KAddr(addr),
        nr_lazy,
        nr_lazy_max: 16384,
    })
}

fn probe(name: &str, logical: Option<&str>, rung: &str) -> ProbeInfo {
    ProbeInfo {
        probe: name.into(),
        rung: rung.into(),
        program: String::new(),
        fields: vec![],
        missing_fields: vec![],
        logical: logical.map(str::to_string),
        refused: vec![],
        note: None,
        attach: None,
        attach_fallback: None,
    }
}

fn info() -> SourceInfo {
    SourceInfo {
        mode: Mode::Replay {
            name: "fixed.jsonl".into(),
            speed: 10.0,
        },
        kernel: "6.18.0-test".into(),
        cpus: 2,
        nodes: 2,
        zone_size: 65536,
        page_size: 4096,
        lazy_max_pages: 16384,
        probes: vec![
            probe("vmalloc:alloc_vmap_area", None, "tracepoint"),
            probe("lock:contention_begin", Some("lock_waits"), "tracepoint"),
            probe("kmem:mm_page_alloc", Some("page_tables"), "off"),
        ],
        banner: None,
    }
}

/// An app fed three seconds of fixed traffic: allocations on both nodes, frees, one purge,
/// lock waits, page-table pages, a snapshot and a model view.
fn fixed_app() -> App {
    let mut app = App::new();
    app.handle(Event::Start(Box::new(info())));
    let snap = VmallocSnapshot {
        ts_start_ns: 0,
        ts_end_ns: 0,
        real_addresses: true,
        pools_drained: false,
        areas: vec![
            VmallocArea {
                start: KAddr(BASE + 0x100_0000),
                end: KAddr(BASE + 0x100_2000),
                size: 8192,
                kind: AreaKind::Busy,
                caller: Some("alloc_thread_stack_node+0x1/0x2".into()),
                pages: Some(1),
                phys: None,
                flags: vec![],
            },
            VmallocArea {
                start: KAddr(BASE + 0x200_0000),
                end: KAddr(BASE + 0x200_4000),
                size: 16384,
                kind: AreaKind::Unpurged,
                caller: None,
                pages: None,
                phys: None,
                flags: vec![],
            },
        ],
    };
    app.handle(Event::Callers(Ok(top_callers(&snap, 10))));
    let mut records = vec![Record::Vmallocinfo(Box::new(snap))];
    for i in 0..3u64 {
        let t = i * SEC + 10;
        for k in 0..(i + 2) {
            // Alternate zones: node = (addr / 64 KiB) % 2.
            records.push(alloc(t + k, BASE + (i * 8 + k) * 0x1_0000, 1 << k));
        }
        records.push(free(t + 100, BASE + i * 8 * 0x1_0000, 4000 * (i + 1)));
    }
    records.push(Record::Purge(Purge {
        ctx: ctx(2 * SEC + 500),
        start: KAddr(BASE),
        end: KAddr(BASE + 0x10_0000),
        npurged: 3,
    }));
    records.push(Record::Contention(Box::new(Contention {
        ctx: ctx(2 * SEC + 600),
        lock: KAddr(0),
        flags: 1,
        wait_ns: 1_500_000,
        ret: 0,
        class: LockClass::FreeAreaLock,
        node: None,
        stack_id: -1,
        stack: vec![],
        probe_ns: None,
    })));
    records.push(Record::PtPage(PtPage {
        ctx: ctx(2 * SEC + 700),
        level: PtLevel::Pte,
        pfn: 1,
        order: 0,
    }));
    app.handle(Event::Data(Batch {
        records,
        now_ns: 3 * SEC + 10,
        lost_total: 2,
    }));
    app.handle(Event::Model(Box::new(Ok(ModelView {
        scope: "whole trace, nodes variant".into(),
        strict_placement_pct: 91.5,
        strict_nr_lazy_pct: 80.0,
        strict_npurged_pct: 25.0,
        warm_strict_pct: 93.5,
        warm_pct: 98.5,
        warm_compared: 150,
        warmup_line: Some(40),
        placement_pct: 97.5,
        placement_compared: 200,
        nr_lazy_pct: 100.0,
        npurged_pct: 50.0,
        pooled_objects: 12,
        predicted_high_water: "0xffffc90000100000".into(),
        observed_high_water: "0xffffc90000100000".into(),
        predicted_slots: crate::model::SlotCounts {
            pte_tables: 3,
            pmd_tables: 1,
            pud_tables: 1,
        },
        observed_slots: crate::model::SlotCounts {
            pte_tables: 3,
            pmd_tables: 1,
            pud_tables: 1,
        },
        recent: vec!["line 9 alloc kernel-lower-than-model cpu 1: kernel 0xffffc90000010000 model 0xffffc90000020000".into()],
    }))));
    app
}

fn panel_text(app: &App, p: Panel, w: u16, h: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| render::panel(f, f.area(), app, p)).unwrap();
    super::buffer_text(t.backend().buffer())
}

#[test]
fn counters_follow_the_events() {
    let app = fixed_app();
    assert_eq!((app.c.alloc, app.c.free, app.c.purge), (9, 3, 1));
    assert_eq!(app.c.alloc_rate.last(4), [2, 3, 4, 0]);
    assert_eq!(app.c.alloc_rate.rate(), 4, "the newest complete second");
    assert_eq!(app.now_sec, 3);
    assert_eq!(app.lazy_pages, 0, "a purge empties the lazy lists");
    assert_eq!(app.c.node_allocs.iter().sum::<u64>(), 9);
    assert!(
        app.c.node_allocs.iter().all(|&n| n > 0),
        "{:?}",
        app.c.node_allocs
    );
    assert_eq!(app.lost(), 2);
    assert_eq!(app.c.locks[&LockClass::FreeAreaLock], (1, 1_500_000));
}

#[test]
fn size_buckets_are_powers_of_two_in_pages() {
    assert_eq!(size_bucket(1), 0);
    assert_eq!(size_bucket(2), 1);
    assert_eq!(size_bucket(3), 2);
    assert_eq!(size_bucket(4), 2);
    assert_eq!(size_bucket(5), 3);
    assert_eq!(size_bucket(1 << 20), SIZE_BUCKETS - 1);
    assert_eq!(size_label(2), "3-4");
    assert_eq!(size_label(SIZE_BUCKETS - 1), ">512");
}

#[test]
fn size_rows_start_at_the_first_used_bucket_and_merge_the_tail() {
    let mut sizes = [0u64; SIZE_BUCKETS];
    assert!(render::size_rows(&sizes, 5).is_empty());
    sizes[5] = 7;
    let rows = render::size_rows(&sizes, 5);
    assert_eq!(
        rows,
        vec![render::SizeRow {
            label: "17-32".into(),
            count: 7,
            merged: 1
        }],
        "an 18-page workload alone shows its own row, not the empty small sizes"
    );
    // fix-size at 16 data pages: a few small areas and hundreds of thousands of 18 pages.
    sizes = [3, 5, 10, 20, 195, 486_000, 0, 0, 0, 0, 0];
    let rows = render::size_rows(&sizes, 5);
    let labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(labels, ["1", "2", "3-4", "5-8", "9+"]);
    assert_eq!((rows[4].count, rows[4].merged), (486_195, 2));
    assert_eq!(rows.iter().map(|r| r.count).sum::<u64>(), 486_233);
    // Enough rows: every bucket from the first to the last used one, empty ones between kept.
    sizes = [0, 4, 0, 0, 9, 0, 0, 0, 0, 0, 0];
    let labels: Vec<String> = render::size_rows(&sizes, 10)
        .into_iter()
        .map(|r| r.label)
        .collect();
    assert_eq!(labels, ["2", "3-4", "5-8", "9-16"]);
    assert!(render::size_rows(&sizes, 0).is_empty());
}

/// A tall workload in a short panel: the 18-page areas stay on screen, in a merged row.
#[test]
fn render_sizes_tall_workload_in_five_rows() {
    let mut app = App::new();
    app.handle(Event::Start(Box::new(info())));
    let mut ts = SEC;
    let mut addr = BASE;
    let mut records = Vec::new();
    for (pages, n) in [(1, 3), (2, 5), (4, 10), (8, 20), (16, 2), (18, 400)] {
        for _ in 0..n {
            ts += 1000;
            addr += (pages + 1) * 4096;
            records.push(alloc(ts, addr, pages));
        }
    }
    app.handle(Event::Data(Batch {
        records,
        now_ns: 2 * SEC,
        lost_total: 0,
    }));
    insta::assert_snapshot!(panel_text(&app, Panel::Sizes, 60, 7));
}

#[test]
fn keys_move_focus_zoom_and_quit() {
    let mut app = fixed_app();
    assert_eq!(app.focus, Panel::Rates);
    app.key(Key::Tab);
    assert_eq!(app.focus, Panel::Sizes);
    app.key(Key::Left);
    app.key(Key::Up);
    assert_eq!(app.focus, Panel::Model, "focus wraps backwards");
    app.key(Key::Enter);
    assert!(app.zoomed);
    app.key(Key::Esc);
    assert!(!app.zoomed && !app.quit, "Esc unzooms first");
    app.key(Key::Char('+'));
    assert_eq!(app.window_secs, 120);
    for _ in 0..10 {
        app.key(Key::Char('-'));
    }
    assert_eq!(app.window_secs, MIN_WINDOW_SECS);
    app.key(Key::Char('?'));
    assert!(app.help);
    app.key(Key::Tab);
    assert!(!app.help, "any key closes the help");
    app.key(Key::Char('q'));
    assert!(app.quit);
    let mut app = App::new();
    app.key(Key::CtrlC);
    assert!(app.quit);
}

#[test]
fn pause_holds_data_and_resume_applies_it() {
    let mut app = fixed_app();
    app.key(Key::Char('p'));
    assert!(app.paused);
    app.handle(Event::Data(Batch {
        records: vec![alloc(3 * SEC + 20, BASE + 0x90_0000, 1)],
        now_ns: 3 * SEC + 30,
        lost_total: 2,
    }));
    assert_eq!(app.c.alloc, 9, "nothing changes on screen while paused");
    assert_eq!(app.pending_records(), 1);
    app.key(Key::Char('p'));
    assert!(!app.paused);
    assert_eq!(app.c.alloc, 10);
    assert_eq!(app.pending_records(), 0);
}

#[test]
fn reset_clears_counters_but_keeps_the_footprint() {
    let mut app = fixed_app();
    let busy = app.busy_bytes;
    app.key(Key::Char('r'));
    assert_eq!((app.c.alloc, app.c.free, app.c.purge), (0, 0, 0));
    assert_eq!(app.c.sizes.iter().sum::<u64>(), 0);
    assert!(app.c.locks.is_empty());
    assert_eq!(app.lost(), 0);
    assert_eq!(app.busy_bytes, busy);
    assert_eq!(app.c.high_water, app.busy_bytes + app.lazy_bytes);
    assert_eq!(app.c.node_allocs, [0, 0]);
}

#[test]
fn series_keeps_at_most_the_longest_window() {
    let mut s = Series::default();
    s.add(0, 1);
    s.add(MAX_WINDOW_SECS as u64 + 5, 7);
    assert_eq!(s.last(usize::MAX).len(), MAX_WINDOW_SECS);
    s.add(0, 1); // older than the window: ignored
    assert_eq!(s.last(1), [7]);
}

#[test]
fn unavailable_views_say_why() {
    let mut app = App::new();
    let mut i = info();
    i.probes.retain(|p| p.logical.is_none());
    app.handle(Event::Start(Box::new(i)));
    app.handle(Event::Model(Box::new(Err(
        "waiting for the start snapshot".into(),
    ))));
    assert!(panel_text(&app, Panel::Locks, 60, 4).contains("n/a: lock_waits probe not in"));
    assert!(panel_text(&app, Panel::PageTables, 60, 6).contains("n/a: page_tables probe"));
    assert!(panel_text(&app, Panel::Model, 60, 4).contains("n/a: waiting for the start snapshot"));
    assert!(panel_text(&app, Panel::Callers, 60, 4).contains("n/a: waiting for"));
}

#[test]
fn t_toggles_the_live_page_probes_and_the_panel_shows_their_cost() {
    // A replay has no probes to toggle: `t` asks nothing.
    let mut app = fixed_app();
    app.key(Key::Char('t'));
    assert!(app.controls.is_empty());

    let off = PageProbes {
        on: false,
        rung: "tracepoint".into(),
        error: None,
        runs: 0,
        run_ns: 0,
        secs: 0.0,
    };
    app.handle(Event::PageProbes(off.clone()));
    assert_eq!(
        app.info.as_ref().unwrap().probe_attached("page_tables"),
        Err(format!("page_tables probe {PAGE_PROBES_OFF}"))
    );
    assert!(panel_text(&app, Panel::PageTables, 70, 8).contains("page probes off, t attaches"));
    app.key(Key::Char('t'));
    assert_eq!(app.controls, [Control::PageProbes(true)]);
    app.controls.clear();

    // Attached: the probe's pages count from here, beside the model's tables from here.
    app.c.pt_pages.insert("pte", 9);
    let on = PageProbes {
        on: true,
        runs: 20_000,
        run_ns: 4_000_000,
        secs: 2.0,
        ..off
    };
    app.handle(Event::PageProbes(on));
    assert!(app.c.pt_pages.is_empty());
    assert!(app
        .info
        .as_ref()
        .unwrap()
        .probe_attached("page_tables")
        .is_ok());
    app.handle(Event::Data(Batch {
        records: vec![Record::PtPage(PtPage {
            ctx: ctx(4 * SEC),
            level: PtLevel::Pte,
            pfn: 2,
            order: 0,
        })],
        now_ns: 4 * SEC + 10,
        lost_total: 2,
    }));
    let text = panel_text(&app, Panel::PageTables, 70, 8);
    assert!(
        text.contains("cost 200 ns/event, 10000/s, 0.20 % of one CPU"),
        "{text}"
    );
    let pte = text
        .lines()
        .find(|l| l.contains("pte table pages"))
        .unwrap();
    let cells: Vec<&str> = pte.trim_matches('│').split_whitespace().collect();
    assert_eq!(cells[3..], ["1", "0", "0"], "{text}");
    app.key(Key::Char('t'));
    assert_eq!(app.controls, [Control::PageProbes(false)]);
}

macro_rules! panel_snapshot {
    ($name:ident, $panel:expr, $w:expr, $h:expr) => {
        #[test]
        fn $name() {
            insta::assert_snapshot!(panel_text(&fixed_app(), $panel, $w, $h));
        }
    };
}

panel_snapshot!(render_rates, Panel::Rates, 50, 8);
panel_snapshot!(render_sizes, Panel::Sizes, 50, 7);
panel_snapshot!(render_lazy, Panel::Lazy, 50, 6);
panel_snapshot!(render_nodes, Panel::Nodes, 50, 5);
panel_snapshot!(render_footprint, Panel::Footprint, 50, 7);
panel_snapshot!(render_page_tables, Panel::PageTables, 50, 6);
panel_snapshot!(render_locks, Panel::Locks, 50, 4);
panel_snapshot!(render_callers, Panel::Callers, 50, 4);
panel_snapshot!(render_model, Panel::Model, 50, 8);

#[test]
fn render_whole_screen_header_and_banner() {
    let mut app = fixed_app();
    if let Some(i) = app.info.as_mut() {
        i.banner = Some("live capture unavailable (no privileges): replaying".into());
    }
    let text = super::screen_text(&app, 120, 44);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "vmtrace top | replay fixed.jsonl at 10x | window 60s | lost 2"
    );
    assert!(lines[1].starts_with("kernel 6.18.0-test | 2 CPUs | 2 vmap nodes (zone 64.0 KiB)"));
    assert!(lines[2].contains("lock_waits=tracepoint") && lines[2].contains("page_tables=off"));
    assert!(
        lines[3].contains("live capture unavailable"),
        "{}",
        lines[3]
    );
    for p in Panel::ALL {
        assert!(text.contains(p.title()), "{} missing:\n{text}", p.title());
    }
    insta::assert_snapshot!(text);
}

#[test]
fn zoom_and_help_render() {
    let mut app = fixed_app();
    app.key(Key::Tab);
    app.key(Key::Enter);
    let text = super::screen_text(&app, 80, 30);
    assert!(text.contains("allocation size (pages)"));
    assert!(
        !text.contains("lazy backlog"),
        "only the zoomed panel is drawn"
    );
    app.key(Key::Char('?'));
    assert!(super::screen_text(&app, 80, 30).contains("zoom the focused panel"));
    app.key(Key::Char('p'));
    app.key(Key::Char('p'));
    assert!(super::screen_text(&app, 80, 30).contains("PAUSED"));
}

#[test]
fn speeds_parse() {
    assert_eq!(super::parse_speed("10x"), Ok(10.0));
    assert_eq!(super::parse_speed("0.5"), Ok(0.5));
    let e = super::parse_speed("fast").unwrap_err();
    assert!(e.contains("`fast`") && e.contains("10x"), "{e}");
    assert!(super::parse_speed("0x").is_err());
}

#[test]
fn the_model_panel_lists_the_newest_divergences_when_it_has_room() {
    let app = fixed_app();
    let tall = panel_text(&app, Panel::Model, 120, 12);
    assert!(
        tall.contains("line 9 alloc kernel-lower-than-model"),
        "{tall}"
    );
    // The figures come first: a short panel keeps them and drops the divergences.
    let short = panel_text(&app, Panel::Model, 120, 6);
    assert!(short.contains("placement strict 91.5%"), "{short}");
    assert!(!short.contains("line 9 alloc"), "{short}");
}
