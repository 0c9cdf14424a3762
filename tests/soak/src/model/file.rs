//! The model file: every acknowledged binding and what is uncertain, written
//! at the end of a run (`--model-out`) and read back by `--reaudit` after the
//! server restarted on its data directory.

use std::fmt::Write as _;

use super::Tracker;
use crate::universe::key_str;
use crate::NR;
use hf3fs_perf::keys::HexKey;

const MAGIC: &str = "hf3fs-soak-model 1";

impl Tracker {
    /// Writes every binding, and what is uncertain, for a re-audit.
    pub(crate) fn dump(&self, pages: u32) -> String {
        let m = self.m.lock().unwrap();
        let mut o = format!("{MAGIC}\npages {pages}\n");
        for (r, rm) in m.ranks.iter().enumerate() {
            for (p, (k, _)) in &rm.owner {
                let _ = writeln!(o, "b {r} {p} {}", key_str(k));
            }
            for p in &rm.uncertain {
                let _ = writeln!(o, "up {r} {p}");
            }
        }
        for (k, s) in &m.keys {
            if s.uncertain {
                let _ = writeln!(o, "uk {}", key_str(k));
            }
        }
        o
    }

    /// Rebuilds the model from [`dump`](Self::dump)'s text; returns `pages`.
    pub(crate) fn load(&self, text: &str) -> Result<u32, String> {
        let mut m = self.m.lock().unwrap();
        let m = &mut *m;
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err("not a soak model file".into());
        }
        let mut pages = None;
        let key = |s: &str| -> Result<HexKey, String> { s.as_bytes().try_into().map_err(|_| format!("bad key {s}")) };
        let num = |s: Option<&str>| -> Result<u32, String> {
            s.and_then(|s| s.parse().ok()).ok_or_else(|| "bad number in the model file".to_string())
        };
        let rank = |s: Option<&str>| -> Result<usize, String> {
            let r = num(s)? as usize;
            if r < NR {
                Ok(r)
            } else {
                Err(format!("bad rank {r}"))
            }
        };
        for line in lines {
            let mut f = line.split(' ');
            match f.next() {
                Some("pages") => pages = Some(num(f.next())?),
                Some("b") => {
                    let (r, p) = (rank(f.next())?, num(f.next())?);
                    let k = key(f.next().unwrap_or(""))?;
                    let s = m.keys.entry(k).or_default();
                    s.pages[r] = p;
                    s.nbound += 1;
                    m.ranks[r].owner.insert(p, (k, 0));
                }
                Some("up") => {
                    let (r, p) = (rank(f.next())?, num(f.next())?);
                    m.ranks[r].uncertain.insert(p);
                }
                Some("uk") => {
                    let s = m.keys.entry(key(f.next().unwrap_or(""))?).or_default();
                    s.uncertain = true;
                    s.inflight = 1;
                }
                _ => return Err(format!("bad line in the model file: {line}")),
            }
        }
        pages.ok_or_else(|| "no pages line in the model file".into())
    }
}

#[cfg(test)]
mod tests {
    use crate::model::Tracker;
    use crate::universe::hex_key;
    use crate::WORLD;

    #[test]
    fn model_file_round_trips() {
        let t = Tracker::new();
        let (a, b) = (hex_key(0, 1), hex_key(0, 2));
        for r in 0..WORLD {
            t.apply(r, &[(a, r as u32 + 10)], &[]);
        }
        t.apply(3, &[(b, 99)], &[]);
        drop(t.try_lock(3, &[b], &[], true)); // b: uncertain
        let text = t.dump(1234);
        let u = Tracker::new();
        assert_eq!(u.load(&text), Ok(1234));
        let m = u.m.lock().unwrap();
        assert!(m.keys[&a].complete() && m.keys[&a].pages[7] == 17);
        assert!(m.keys[&b].uncertain && m.ranks[3].uncertain.contains(&99));
        assert_eq!(m.ranks[3].owner[&13].0, a);
        drop(m);
        assert!(Tracker::new().load("hf3fs-soak-model 1\npages 8\nb 99 1 x").is_err());
    }
}
