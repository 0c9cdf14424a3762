//! `hf3fs-meta inspect --data-dir DIR`: what a data directory holds, as a
//! compact table or (`--json`) one JSON object.
//!
//! For each of the two durable stores (vLLM's, SGLang's): the generation,
//! the keyspace in use, the checkpointed chunks read and the log tail
//! replayed over them (entry numbers and records), a torn journal tail
//! dropped, and the bindings, reservations and held pages recovery
//! restored. Then vLLM's ranks and SGLang's spaces (id, rank, namespace
//! from the catalog), each with its pages by state (free, reserved, bound
//! to a key, held back for a reader's lease: they add up to its size), and
//! the keys and complete keys. First, the directory's format and the
//! release that last wrote it (its `FORMAT` marker).

use super::open::{open_copy, Failure, OpenedCopy};
use super::{DirArgs, EXIT_CANNOT, EXIT_VIOLATION};
use crate::core::{RankStats, Store};
use crate::durable::{format, Recovered};
use serde_json::{json, Value};
use std::process::ExitCode;

/// Runs `inspect`: 0 with the report on stdout; 1 when recovery refuses the
/// directory, 2 when it cannot be looked at (the reason on stderr).
pub fn main(args: DirArgs) -> ExitCode {
    match open_copy(&args.data_dir, args.scratch.as_deref()) {
        Ok(opened) => {
            let mut report = report(&args, &opened);
            drop(opened);
            // Each tenant's directory, as a data directory of its own.
            let mut tenants = serde_json::Map::new();
            for (name, dir) in super::tenant_dirs(&args.data_dir) {
                let one = DirArgs { data_dir: dir, ..args.clone() };
                match open_copy(&one.data_dir, one.scratch.as_deref()) {
                    Ok(o) => tenants.insert(name, self::report(&one, &o)),
                    Err(e) => {
                        eprintln!("hf3fs-meta inspect: tenant '{name}': {e}");
                        return ExitCode::from(if matches!(e, Failure::Refused(_)) {
                            EXIT_VIOLATION
                        } else {
                            EXIT_CANNOT
                        });
                    }
                };
            }
            if args.json {
                report["tenants"] = Value::Object(tenants);
                println!("{report}");
            } else {
                print!("{}", text(&report));
                for (name, r) in &tenants {
                    println!("\ntenant {name} ({}):", r["data_dir"].as_str().unwrap_or_default());
                    print!("{}", text(r));
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hf3fs-meta inspect: {e}");
            ExitCode::from(if matches!(e, Failure::Refused(_)) { EXIT_VIOLATION } else { EXIT_CANNOT })
        }
    }
}

/// The pages of one rank by state: `[free, reserved, bound, held]`.
pub fn pages(r: &RankStats) -> [u64; 4] {
    let c = r.counts;
    [c.free, c.reserved + c.busy, c.bound - r.quarantined.min(c.bound), r.quarantined]
}

fn rank_json(r: &RankStats) -> Value {
    let [free, reserved, bound, held] = pages(r);
    json!({"rank": r.rank, "num_pages": r.num_pages, "free": free, "reserved": reserved, "bound": bound, "held": held})
}

fn durable_json(r: &Recovered) -> Value {
    json!({
        "generation": r.generation,
        "keyspace": r.report.keyspace,
        "checkpoint_chunks": r.chunks,
        "log_entries": r.log_entries,
        "log_records": r.log_records,
        "log_first": r.log_range.start,
        "log_next": r.log_range.end,
        "dropped_tail_bytes": r.report.dropped_tail_bytes,
        "bindings": r.bindings,
        "reservations": r.reservations,
        "held": r.held,
    })
}

/// The report of a recovered copy, as JSON (the text is rendered from it).
pub fn report(args: &DirArgs, o: &OpenedCopy) -> Value {
    let stats = o.vllm.stats();
    let ranks: Vec<Value> = stats.ranks.iter().map(rank_json).collect();
    let mut spaces = Vec::new();
    let (mut keys, mut complete) = (0, 0);
    for (e, store) in space_stores(o) {
        let s = store.as_ref().map(|s| s.stats());
        let (k, c) = s.as_ref().map_or((0, 0), |s| (s.keys, s.complete_keys));
        keys += k;
        complete += c;
        let mut v = s.as_ref().and_then(|s| s.ranks.first()).map_or_else(
            || json!({"free": 0, "reserved": 0, "bound": 0, "held": 0, "num_pages": e.num_pages}),
            rank_json,
        );
        v["id"] = json!(e.id);
        v["rank"] = json!(e.rank);
        v["namespace"] = json!(e.namespace);
        v["keys"] = json!(k);
        v["complete_keys"] = json!(c);
        spaces.push(v);
    }
    json!({
        "data_dir": args.data_dir.display().to_string(),
        "format": format_json(&args.data_dir),
        "vllm": {
            "durable": durable_json(&o.vllm_recovered),
            "ranks": ranks,
            "keys": stats.keys,
            "complete_keys": stats.complete_keys,
        },
        "sglang": {
            "durable": durable_json(&o.sglang_recovered),
            "spaces": spaces,
            "keys": keys,
            "complete_keys": complete,
        },
    })
}

/// Every catalog entry with its space's store (`None`: a catalog entry
/// recovery did not rebuild, which recovery refuses, so never in practice).
pub fn space_stores(o: &OpenedCopy) -> Vec<(&crate::durable::spaces::CatalogEntry, Option<std::sync::Arc<Store>>)> {
    let list = o.spaces.list();
    o.catalog
        .iter()
        .map(|e| {
            let s = list.iter().find(|(n, _)| n.rank == e.rank && *n.namespace == *e.namespace).map(|(_, s)| s.clone());
            (e, s)
        })
        .collect()
}

/// The directory's format marker ([`crate::durable::format`]): its format
/// and the release that last wrote it; `null`s for a directory written
/// before the marker (0.1.0 or earlier).
fn format_json(dir: &std::path::Path) -> Value {
    match format::read(dir) {
        Ok(Some(m)) => json!({
            "format": m.format,
            "written_by": m.written_by.map(|(version, commit)| json!({"version": version, "commit": commit})),
        }),
        Ok(None) => json!({"format": null, "written_by": null}),
        Err(e) => json!({"format": null, "written_by": null, "error": e.to_string()}),
    }
}

fn format_line(f: &Value) -> String {
    match (f["format"].as_u64(), &f["written_by"]) {
        (Some(n), Value::Object(w)) => format!(
            "format {n}, last written by hf3fs-meta {} (commit {})\n",
            w["version"].as_str().unwrap_or("?"),
            w["commit"].as_str().unwrap_or("?")
        ),
        (Some(n), _) => format!("format {n}\n"),
        (None, _) => format!(
            "format unmarked: last written by a release before the format marker (0.1.0 or earlier; format 1 or 2){}\n",
            f["error"].as_str().map_or(String::new(), |e| format!(" ({e})"))
        ),
    }
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn durable_line(name: &str, d: &Value) -> String {
    let torn = match n(&d["dropped_tail_bytes"]) {
        0 => String::new(),
        b => format!("; a torn journal tail of {b} bytes dropped"),
    };
    format!(
        "{name}: generation {}, in {}/, checkpoint {} chunks, log {} entries [{}, {}) of {} records{torn}\n  \
         restored {} bindings, {} reservations, {} held pages\n",
        n(&d["generation"]),
        d["keyspace"].as_str().unwrap_or("?"),
        n(&d["checkpoint_chunks"]),
        n(&d["log_entries"]),
        n(&d["log_first"]),
        n(&d["log_next"]),
        n(&d["log_records"]),
        n(&d["bindings"]),
        n(&d["reservations"]),
        n(&d["held"]),
    )
}

fn page_cells(v: &Value) -> String {
    format!(
        "{:>11} {:>11} {:>11} {:>11} {:>11}",
        n(&v["num_pages"]),
        n(&v["free"]),
        n(&v["reserved"]),
        n(&v["bound"]),
        n(&v["held"])
    )
}

/// The report as text: one block per store, a table of its ranks or spaces.
pub fn text(r: &Value) -> String {
    let mut out = format!("data directory {} (a copy opened)\n", r["data_dir"].as_str().unwrap_or("?"));
    out += &format_line(&r["format"]);
    out += "\n";
    let v = &r["vllm"];
    out += &durable_line("vLLM store", &v["durable"]);
    out += &format!("  {} keys, {} complete\n", n(&v["keys"]), n(&v["complete_keys"]));
    out +=
        &format!("  {:>6} {:>11} {:>11} {:>11} {:>11} {:>11}\n", "rank", "pages", "free", "reserved", "bound", "held");
    for rank in v["ranks"].as_array().into_iter().flatten() {
        out += &format!("  {:>6} {}\n", n(&rank["rank"]), page_cells(rank));
    }
    let s = &r["sglang"];
    out += "\n";
    out += &durable_line("SGLang spaces", &s["durable"]);
    out += &format!("  {} keys, {} complete\n", n(&s["keys"]), n(&s["complete_keys"]));
    out += &format!(
        "  {:>4} {:>6} {:<12} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9}\n",
        "id", "rank", "namespace", "pages", "free", "reserved", "bound", "held", "keys"
    );
    for sp in s["spaces"].as_array().into_iter().flatten() {
        out += &format!(
            "  {:>4} {:>6} {:<12} {} {:>9}\n",
            n(&sp["id"]),
            n(&sp["rank"]),
            sp["namespace"].as_str().unwrap_or("?"),
            page_cells(sp),
            n(&sp["keys"])
        );
    }
    out
}
