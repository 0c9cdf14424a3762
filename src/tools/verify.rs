//! `hf3fs-meta verify --data-dir DIR`: checks every invariant of the
//! recovered state of a data directory, and exits 1 on a violation.
//!
//! The checks, each named in the output:
//! - recovery accepts the directory: the files decode, and no page is bound
//!   twice nor a key twice on one rank (recovery refuses both);
//! - the audit of vLLM's store and of every SGLang space
//!   ([`Store::audit`]): every BOUND page names a key bound to it, every
//!   binding is a BOUND page naming its key, bindings plus held pages equal
//!   BOUND pages, every key's count of bound ranks (what makes it complete)
//!   is the bindings it holds, the key and complete-key counts agree;
//! - what recovery counted (bindings, reservations, held pages) is what
//!   the pages say, in each store.

use super::inspect::{pages, space_stores};
use super::open::{open_copy, Failure, OpenedCopy};
use super::{DirArgs, EXIT_CANNOT, EXIT_VIOLATION};
use crate::core::{RankStats, Store};
use crate::durable::Recovered;
use serde_json::json;
use std::process::ExitCode;

/// One check: its name and, when it failed, why.
struct Check {
    name: String,
    violation: Option<String>,
}

/// Runs `verify`: 0 when every check holds, 1 on a violation (recovery
/// refusing the directory included), 2 when it cannot look.
pub fn main(args: DirArgs) -> ExitCode {
    let mut checks = match directory(&args.data_dir, args.scratch.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hf3fs-meta verify: {e}");
            return ExitCode::from(EXIT_CANNOT);
        }
    };
    // Each tenant's directory, its checks named after it.
    for (name, dir) in super::tenant_dirs(&args.data_dir) {
        match directory(&dir, args.scratch.as_deref()) {
            Ok(c) => checks.extend(c.into_iter().map(|c| Check { name: format!("tenant {name}: {}", c.name), ..c })),
            Err(e) => {
                eprintln!("hf3fs-meta verify: tenant '{name}': {e}");
                return ExitCode::from(EXIT_CANNOT);
            }
        }
    }
    let violations = checks.iter().filter(|c| c.violation.is_some()).count();
    if args.json {
        let list: Vec<_> = checks
            .iter()
            .map(|c| json!({"check": c.name, "ok": c.violation.is_none(), "violation": c.violation}))
            .collect();
        let out = json!({"data_dir": args.data_dir.display().to_string(), "sound": violations == 0, "checks": list});
        println!("{out}");
    } else {
        for c in &checks {
            match &c.violation {
                None => println!("ok         {}", c.name),
                Some(v) => println!("VIOLATION  {}: {v}", c.name),
            }
        }
        match violations {
            0 => println!("{}: sound ({} checks)", args.data_dir.display(), checks.len()),
            n => println!("{}: {n} violation(s) in {} checks", args.data_dir.display(), checks.len()),
        }
    }
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VIOLATION)
    }
}

/// The checks of one data directory (recovery's refusal is a failed
/// check); `Err` when it cannot be looked at.
fn directory(dir: &std::path::Path, scratch: Option<&std::path::Path>) -> Result<Vec<Check>, Failure> {
    match open_copy(dir, scratch) {
        Ok(opened) => {
            let mut c = vec![Check { name: "recovery".into(), violation: None }];
            c.extend(checks(&opened));
            Ok(c)
        }
        Err(Failure::Refused(e)) => {
            Ok(vec![Check { name: "recovery".into(), violation: Some(Failure::Refused(e).to_string()) }])
        }
        Err(e) => Err(e),
    }
}

/// Every check after a successful recovery.
fn checks(o: &OpenedCopy) -> Vec<Check> {
    let mut out = Vec::new();
    let audit = |name: String, s: &Store| Check { name, violation: s.audit().err() };
    out.push(audit("vLLM store: audit".into(), &o.vllm));
    out.push(counts("vLLM store: recovery's counts", &o.vllm_recovered, &o.vllm.stats().ranks));
    let mut ranks = Vec::new();
    for (e, store) in space_stores(o) {
        let name = format!("SGLang space {} (rank {}, namespace {:?}): audit", e.id, e.rank, e.namespace);
        match store {
            Some(s) => {
                out.push(audit(name, &s));
                ranks.extend(s.stats().ranks);
            }
            None => {
                out.push(Check { name, violation: Some("the catalog names it, recovery did not rebuild it".into()) })
            }
        }
    }
    out.push(counts("SGLang spaces: recovery's counts", &o.sglang_recovered, &ranks));
    out
}

/// Whether the bindings, reservations and held pages recovery counted are
/// those the pages of `ranks` hold.
fn counts(name: &str, r: &Recovered, ranks: &[RankStats]) -> Check {
    let sum = |i: usize| ranks.iter().map(|r| pages(r)[i]).sum::<u64>();
    let (reserved, bound, held) = (sum(1), sum(2), sum(3));
    let violation = ((r.bindings, r.reservations, r.held) != (bound, reserved, held)).then(|| {
        format!(
            "recovery restored {} bindings, {} reservations, {} held pages; the pages hold {bound}, {reserved}, {held}",
            r.bindings, r.reservations, r.held
        )
    });
    Check { name: name.into(), violation }
}
