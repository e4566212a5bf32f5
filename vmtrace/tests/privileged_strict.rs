//! The strict figures can fail, shown on a fresh recording of this kernel.
//!
//! One recording of two-thread random-size stress is perturbed four ways (issue 19): the
//! backlog of 1 % of frees shifted by one area's pages, 1 % of frees deleted, the addresses of
//! two allocations swapped in 1 % of pairs, and 1 % of purge events moved 100 µs later. Only
//! events the unperturbed causal replay agreed on are perturbed (its divergences name every
//! miss by line), so each perturbed event is one the strict figure had right; each perturbation
//! must then cost the strict figure at least its share: each perturbed event (for a moved purge,
//! it or a free it now follows) is a strict miss in the perturbed replay. The explained figures are printed
//! beside, to show how much of each perturbation their rules absorb. A recording the strict
//! replay is out of step with (under the floors below) is reported and taken once more, and
//! the test fails when the retake is out of step too. Without BPF privileges the
//! test skips loudly, unless `VMTRACE_REQUIRE_PRIVILEGED=1`, where it fails.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use common::privileged;
use serde_json::Value;

/// Every strict miss is listed, so that only agreed events are perturbed.
const ALL_DIVERGENCES: &str = "100000000";

fn replay(trace: &Path, extra: &[&str]) -> Value {
    let args: Vec<&str> = ["replay", "--json"].iter().chain(extra).copied().collect();
    let doc = common::vmtrace_json(&args, trace);
    doc.as_array().map_or(doc.clone(), |a| a[0].clone())
}

/// `(agreed, compared)` of a figure.
fn figure(v: &Value) -> (u64, u64) {
    (
        v["agreed"].as_u64().unwrap(),
        v["compared"].as_u64().unwrap(),
    )
}

/// The 0-based lines of a trace where the strict (causal) replay missed.
fn strict_misses(trace: &Path) -> BTreeSet<usize> {
    replay(trace, &["--causal", "--divergences", ALL_DIVERGENCES])["first_divergences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["line"].as_u64().unwrap() as usize - 1)
        .collect()
}

/// Events a figure compared and did not agree on.
fn misses((agreed, compared): (u64, u64)) -> u64 {
    compared - agreed
}

fn percent((agreed, compared): (u64, u64)) -> f64 {
    100.0 * agreed as f64 / compared.max(1) as f64
}

/// A deterministic pick of about `share` of `n` candidates (at least `min`).
fn pick(candidates: &[usize], share: f64, min: usize, seed: u64) -> Vec<usize> {
    let want = ((candidates.len() as f64 * share).round() as usize).max(min);
    assert!(
        candidates.len() >= want,
        "only {} candidates for {want} perturbations",
        candidates.len()
    );
    let mut state = seed;
    let mut chosen = BTreeSet::new();
    while chosen.len() < want {
        // SplitMix64.
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        chosen.insert(candidates[(z % candidates.len() as u64) as usize]);
    }
    chosen.into_iter().collect()
}

fn hex(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

fn write(path: &Path, lines: &[Value]) {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, text).unwrap();
}

struct Strict {
    placement: (u64, u64),
    nr_lazy: (u64, u64),
    npurged: (u64, u64),
}

fn strict(r: &Value) -> Strict {
    Strict {
        placement: figure(&r["strict"]["placement"]),
        nr_lazy: figure(&r["strict"]["nr_lazy"]),
        npurged: figure(&r["strict"]["npurged"]),
    }
}

/// Prints the strict and explained drops of one perturbation and returns the strict figures.
fn judge(name: &str, base: &Value, path: &Path) -> (Strict, Value) {
    let r = replay(path, &[]);
    for key in ["placement", "nr_lazy", "npurged"] {
        let (b, p) = (
            percent(figure(&base["strict"][key])),
            percent(figure(&r["strict"][key])),
        );
        let (be, pe) = (percent(figure(&base[key])), percent(figure(&r[key])));
        eprintln!(
            "{name:<22} {key:<9} strict {b:7.3} -> {p:7.3} (drop {:6.3} pt)   explained {be:7.3} -> {pe:7.3} (drop {:6.3} pt)",
            b - p,
            be - pe
        );
    }
    (strict(&r), r)
}

/// Strict floors under which the replay has lost step with the recording: every perturbation
/// below assumes the events around it were agreed, which a replay out of step does not give.
/// Measured here: placement 99.4-99.5 %, `nr_lazy` 99.9 %. A CI run once recorded 93.5 % and
/// 20.5 %, a lasting backlog offset whose cause is not known (docs/model.md, "The strict
/// figures can fail").
const PLACEMENT_FLOOR: f64 = 98.0;
const NR_LAZY_FLOOR: f64 = 95.0;

/// Records 8 s of two-thread random-size stress and replays it causally, listing every strict
/// miss. A recording the strict replay is out of step with is an error that says how far out
/// and where it set in, so that the caller retakes it once and a CI log keeps the reason.
fn recording_in_step(dir: &Path, name: &str) -> Result<(PathBuf, Vec<Value>, Value), String> {
    let trace = dir.join(name);
    common::record_stress(&trace, "random-size --threads 2 --duration 8s");
    let text = std::fs::read_to_string(&trace).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Divergences name the file's 1-based line.
    let causal = replay(&trace, &["--causal", "--divergences", ALL_DIVERGENCES]);
    let s = strict(&causal);
    let (placement, nr_lazy) = (percent(s.placement), percent(s.nr_lazy));
    if placement >= PLACEMENT_FLOOR && nr_lazy >= NR_LAZY_FLOOR {
        return Ok((trace, lines, causal));
    }
    let lost: u64 = lines.iter().filter_map(|l| l["lost_total"].as_u64()).sum();
    let divergences = causal["first_divergences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // The first two misses of each kind and class, ten at most.
    let mut per_class: HashMap<String, usize> = HashMap::new();
    let mut first_of_kind: Vec<String> = Vec::new();
    for d in &divergences {
        let kind = format!(
            "{}/{}",
            d["kind"].as_str().unwrap_or("?"),
            d["class"].as_str().unwrap_or("?")
        );
        let seen = per_class.entry(kind.clone()).or_default();
        if *seen < 2 {
            *seen += 1;
            first_of_kind.push(format!("{kind} at line {}", d["line"]));
        }
        if first_of_kind.len() == 10 {
            break;
        }
    }
    // Where a lasting backlog offset set in: the kernel's backlog less the model's at twenty
    // points through the backlog misses.
    let backlog: Vec<(u64, i64)> = divergences
        .iter()
        .filter(|d| {
            d["class"]
                .as_str()
                .is_some_and(|c| c.starts_with("nr-lazy"))
        })
        .filter_map(|d| {
            let n = |k: &str| d[k].as_str()?.parse::<i64>().ok();
            Some((d["line"].as_u64()?, n("observed")? - n("predicted")?))
        })
        .collect();
    let offsets: Vec<String> = (0..20)
        .filter_map(|k| backlog.get(k * backlog.len() / 20))
        .map(|(line, diff)| format!("{line}:{diff:+}"))
        .collect();
    Err(format!(
        "{name}: strict placement {placement:.3} % (floor {PLACEMENT_FLOOR}), nr_lazy \
         {nr_lazy:.3} % (floor {NR_LAZY_FLOOR}) over {} lines, {lost} events lost; \
         {} strict misses, the first of each kind: {}; backlog kernel - model at line: {}",
        lines.len(),
        divergences.len(),
        first_of_kind.join(", "),
        offsets.join(" ")
    ))
}

#[test]
fn each_perturbation_costs_the_strict_figures_at_least_its_share() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (trace, lines, causal) = match recording_in_step(dir.path(), "random-size.jsonl") {
        Ok(r) => r,
        Err(why) => {
            eprintln!("{why}; recording once more");
            recording_in_step(dir.path(), "random-size-retake.jsonl")
                .unwrap_or_else(|retake| panic!("{why}; the retake too: {retake}"))
        }
    };
    let missed: BTreeSet<usize> = causal["first_divergences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["line"].as_u64().unwrap() as usize - 1)
        .collect();
    let base = replay(&trace, &[]);
    let b = strict(&base);
    assert_eq!(strict(&causal).placement, b.placement, "one causal replay");
    eprintln!(
        "unperturbed: strict placement {:.3} %, nr_lazy {:.3} %, npurged {:.3} % ({} purges); {} strict misses listed",
        percent(b.placement),
        percent(b.nr_lazy),
        percent(b.npurged),
        b.npurged.1,
        missed.len()
    );
    let kind = |i: usize| lines[i]["type"].as_str().unwrap_or("");

    // Every drain item's start was written when it happened: one `work_start` of the same
    // worker inside each `drain_vmap_area_work` item's span, before the item's `work` record.
    let drain = |i: usize, k: &str| kind(i) == k && lines[i]["function"] == "drain_vmap_area_work";
    let starts: Vec<usize> = (0..lines.len())
        .filter(|&i| drain(i, "work_start"))
        .collect();
    let items: Vec<usize> = (0..lines.len()).filter(|&i| drain(i, "work")).collect();
    assert!(items.len() > 20, "only {} drain items", items.len());
    for &i in &items {
        let (pid, from) = (&lines[i]["pid"], lines[i]["start_ns"].as_u64().unwrap());
        let to = from + lines[i]["duration_ns"].as_u64().unwrap();
        let inside: Vec<usize> = starts
            .iter()
            .copied()
            .filter(|&k| {
                let t = lines[k]["ts_ns"].as_u64().unwrap();
                &lines[k]["pid"] == pid && (from..=to).contains(&t)
            })
            .collect();
        assert!(
            inside.len() == 1 && inside[0] < i,
            "line {}: drain item has work_start lines {inside:?}",
            i + 1
        );
    }
    // The strict replay predicts a drain's batch from its start: without the `work_start`
    // lines it can only count at the purge event, which the frees after the detach inflate.
    let stripped = dir.path().join("no-work-start.jsonl");
    let kept: Vec<Value> = lines
        .iter()
        .filter(|l| l["type"] != "work_start")
        .cloned()
        .collect();
    write(&stripped, &kept);
    let without = strict(&replay(&stripped, &[]));
    eprintln!(
        "strict npurged {:.3} % with work_start, {:.3} % without; {} drain items",
        percent(b.npurged),
        percent(without.npurged),
        items.len()
    );
    assert!(
        b.npurged.0 > without.npurged.0,
        "work_start did not help strict npurged: {:?} against {:?}",
        b.npurged,
        without.npurged
    );
    // Events in the snapshot's window or before it are not scored (the snapshot may already
    // show them), so only later ones count as agreed.
    let snapshot_end = lines
        .iter()
        .find(|l| l["type"] == "vmallocinfo")
        .and_then(|l| l["ts_end_ns"].as_u64())
        .expect("a snapshot");
    let agreed = |i: usize| {
        !missed.contains(&i) && lines[i]["ts_ns"].as_u64().is_some_and(|t| t > snapshot_end)
    };
    // Areas by address as the trace allocated them, for a free's pages.
    let mut size_at = HashMap::new();
    let mut free_pages = HashMap::new();
    for (i, l) in lines.iter().enumerate() {
        match kind(i) {
            "alloc" if l["failed"] == 0 => {
                size_at.insert(hex(&l["addr"]), l["size"].as_u64().unwrap());
            }
            "free" => {
                if let Some(&s) = size_at.get(&hex(&l["va_start"])) {
                    free_pages.insert(i, s / 4096);
                }
            }
            _ => {}
        }
    }
    let frees: Vec<usize> = (0..lines.len()).filter(|&i| kind(i) == "free").collect();
    let next_free = |i: usize| frees.iter().copied().find(|&j| j > i);
    let purge_between = |a: usize, b: usize| (a + 1..b).any(|k| kind(k) == "purge");

    // 1. nr_lazy of 1 % of frees shifted by one area's pages: each was exact, so each misses.
    let cands: Vec<usize> = frees
        .iter()
        .copied()
        .filter(|&i| agreed(i) && free_pages.contains_key(&i))
        .collect();
    let chosen = pick(&cands, 0.01, 1, 1);
    let mut p = lines.clone();
    for &i in &chosen {
        let nr = p[i]["nr_lazy"].as_u64().unwrap();
        p[i]["nr_lazy"] = (nr + free_pages[&i]).into();
    }
    let path = dir.path().join("shifted.jsonl");
    write(&path, &p);
    let (s, _) = judge("nr_lazy shifted", &base, &path);
    // Each shifted free is a strict miss now (lines keep their places). The net count may
    // differ by a few: a perturbed backlog can make another free agree by chance.
    let now = strict_misses(&path);
    let kept: Vec<usize> = chosen
        .iter()
        .copied()
        .filter(|i| !now.contains(i))
        .collect();
    // The perturbations of one file interact (a thousand of them change the state between
    // them), so 1 % may escape: measured 0 of about 2,000–3,000 per run.
    eprintln!(
        "nr_lazy shifted: {} of {} still agree",
        kept.len(),
        chosen.len()
    );
    assert!(
        kept.len() * 100 <= chosen.len(),
        "{} of {} shifted frees still agree, e.g. line {:?}",
        kept.len(),
        chosen.len(),
        kept.first().map(|i| i + 1)
    );
    assert!(misses(s.nr_lazy) + 10 >= misses(b.nr_lazy) + chosen.len() as u64);

    // 2. 1 % of frees deleted, each followed by an agreed free before the next purge: that
    //    free's backlog holds the deleted area's pages, which the model never saw.
    let cands: Vec<usize> = frees
        .iter()
        .copied()
        .filter(|&i| agreed(i) && next_free(i).is_some_and(|j| agreed(j) && !purge_between(i, j)))
        .collect();
    let chosen: BTreeSet<usize> = pick(&cands, 0.01, 1, 2).into_iter().collect();
    let p: Vec<Value> = lines
        .iter()
        .enumerate()
        .filter(|(i, _)| !chosen.contains(i))
        .map(|(_, l)| l.clone())
        .collect();
    let path = dir.path().join("deleted.jsonl");
    write(&path, &p);
    let (s, _) = judge("frees deleted", &base, &path);
    // The deleted frees, all agreed, leave the comparison: the drop is the misses added.
    assert!(
        misses(s.nr_lazy) >= misses(b.nr_lazy) + chosen.len() as u64,
        "deleting {} frees added {} strict nr_lazy misses",
        chosen.len(),
        misses(s.nr_lazy).saturating_sub(misses(b.nr_lazy))
    );

    // 3. Addresses swapped between an agreed allocation and the next agreed one of the same
    //    size, neither freed in between, in pairs covering 1 % of allocations: the first of
    //    each pair is then a miss.
    let allocs: Vec<usize> = (0..lines.len())
        .filter(|&i| kind(i) == "alloc" && lines[i]["failed"] == 0)
        .collect();
    let mut last_of_size: HashMap<(u64, String), usize> = HashMap::new();
    let mut freed_since: HashMap<u64, usize> = HashMap::new();
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        match kind(i) {
            "free" => {
                freed_since.insert(hex(&l["va_start"]), i);
            }
            "alloc" if l["failed"] == 0 => {
                let key = (l["size"].as_u64().unwrap(), l["vstart"].to_string());
                if let Some(&a) = last_of_size.get(&key) {
                    let untouched = |addr: u64| freed_since.get(&addr).is_none_or(|&f| f < a);
                    if agreed(a)
                        && agreed(i)
                        && lines[a]["addr"] != l["addr"]
                        && untouched(hex(&lines[a]["addr"]))
                        && untouched(hex(&l["addr"]))
                    {
                        pairs.push((a, i));
                    }
                }
                last_of_size.insert(key, i);
            }
            _ => {}
        }
    }
    let indices: Vec<usize> = (0..pairs.len()).collect();
    let want = 0.005 * allocs.len() as f64 / pairs.len().max(1) as f64;
    let chosen = pick(&indices, want, 1, 3);
    let mut p = lines.clone();
    let mut used = BTreeSet::new();
    let mut done: Vec<(usize, usize)> = Vec::new();
    for &k in &chosen {
        let (i, j) = pairs[k];
        if used.contains(&i) || used.contains(&j) {
            continue;
        }
        used.extend([i, j]);
        let a = p[i]["addr"].clone();
        p[i]["addr"] = p[j]["addr"].clone();
        p[j]["addr"] = a;
        done.push((i, j));
    }
    let swapped = done.len();
    let path = dir.path().join("swapped.jsonl");
    write(&path, &p);
    let (s, _) = judge("addresses swapped", &base, &path);
    // Each swapped pair holds a strict miss: the first allocation of it at least.
    let now = strict_misses(&path);
    let unseen: Vec<usize> = done
        .iter()
        .filter(|&&(a, j)| !now.contains(&a) && !now.contains(&j))
        .map(|&(a, _)| a)
        .collect();
    // As above, 1 % may escape: measured 0–2 of about 1,000–1,400 pairs per run.
    eprintln!(
        "addresses swapped: {} of {swapped} pairs show no strict miss",
        unseen.len()
    );
    assert!(
        unseen.len() * 100 <= swapped,
        "{} of {swapped} swapped pairs show no strict miss, e.g. line {:?}",
        unseen.len(),
        unseen.first().map(|i| i + 1)
    );
    assert!(misses(s.placement) + 10 >= misses(b.placement) + swapped as u64);

    // 4. 1 % of purge events (at least two) moved 100 µs later, past at least one free and no
    //    other purge. Each costs a strict miss: its npurged, when the model counts the frees
    //    now ahead of it, or the first of those frees' backlog, when that free's lower
    //    nr_lazy shows the purge and causal resync starts it there.
    const MOVE_NS: u64 = 100_000;
    let ts = |i: usize| lines[i]["ts_ns"].as_u64().unwrap_or(0);
    let purges: Vec<usize> = (0..lines.len()).filter(|&i| kind(i) == "purge").collect();
    let cands: Vec<usize> = purges
        .iter()
        .copied()
        .filter(|&i| {
            let until = ts(i) + MOVE_NS;
            let later: Vec<usize> = (i + 1..lines.len())
                .take_while(|&k| ts(k) <= until)
                .collect();
            agreed(i)
                && later.iter().any(|&k| kind(k) == "free")
                && later.iter().all(|&k| kind(k) != "purge" && agreed(k))
        })
        .collect();
    let chosen: BTreeSet<usize> = pick(
        &cands,
        0.01 * purges.len() as f64 / cands.len().max(1) as f64,
        2,
        4,
    )
    .into_iter()
    .collect();
    // Each goes after the records up to its new time, as the kernel would have emitted it
    // then; nothing else moves.
    let mut order: Vec<usize> = Vec::with_capacity(lines.len());
    let mut held: Vec<(u64, usize)> = Vec::new();
    for i in 0..lines.len() {
        if chosen.contains(&i) {
            held.push((ts(i) + MOVE_NS, i));
            continue;
        }
        // Release the moved purges whose new time this record passes (an untimed record,
        // such as the footer, passes them all).
        while let Some(pos) = held
            .iter()
            .position(|&(until, _)| ts(i) > until || ts(i) == 0)
        {
            order.push(held.remove(pos).1);
        }
        order.push(i);
    }
    order.extend(held.iter().map(|&(_, k)| k));
    let p: Vec<Value> = order
        .iter()
        .map(|&i| {
            let mut l = lines[i].clone();
            if chosen.contains(&i) {
                l["ts_ns"] = (ts(i) + MOVE_NS).into();
            }
            l
        })
        .collect();
    let path = dir.path().join("moved.jsonl");
    write(&path, &p);
    let (s, _) = judge("purges moved", &base, &path);
    // Each moved purge shows a strict miss: itself, or a free now ahead of it.
    let now: BTreeSet<usize> = strict_misses(&path).into_iter().map(|k| order[k]).collect();
    let unseen: Vec<usize> = chosen
        .iter()
        .copied()
        .filter(|&i| {
            let until = ts(i) + MOVE_NS;
            let ahead = (i + 1..lines.len()).take_while(|&k| ts(k) <= until);
            !now.contains(&i) && !ahead.into_iter().any(|k| now.contains(&k))
        })
        .collect();
    // A moved purge can go unseen: its batch comes from the item's start, which the move
    // leaves in place, and when the model has already taken the purge's pages out (an earlier
    // event showed the purge) the frees now ahead of it agree too. Seen on 0 or 1 of 8–10
    // moved purges per run; half is the floor.
    eprintln!(
        "purges moved: {} of {} show no strict miss",
        unseen.len(),
        chosen.len()
    );
    assert!(
        unseen.len() * 2 <= chosen.len(),
        "{} of {} moved purges show no strict miss, e.g. line {:?}",
        unseen.len(),
        chosen.len(),
        unseen.first().map(|i| i + 1)
    );
    let both = |s: &Strict| misses(s.npurged) + misses(s.nr_lazy);
    let more = both(&s) as i64 - both(&b) as i64;
    let share = 100.0 * chosen.len() as f64 / b.npurged.1 as f64;
    eprintln!(
        "purges moved: {} of {} ({share:.2} % of purges); {more} more strict npurged and nr_lazy misses",
        chosen.len(),
        b.npurged.1
    );
}
