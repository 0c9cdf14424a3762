//! The prompts a bench run sends: block-hash sequences drawn from a prefix
//! tree with Zipf choices, or read from a trace file.
//!
//! Prompt `i` depends only on the seed and `i`, never on timing, so two runs
//! with one seed send the same keys in the same order of arrival.
//!
//! The tree: `--tree-depth` levels of `--tree-fanout` children each; a
//! prompt walks down from the root, picking a child by Zipf at every level,
//! and takes each node's blocks (its share of the prompt's shared blocks);
//! then come blocks unique to the prompt. A node's keys depend on the whole
//! path to it, as a chained block hash depends on every token before it.

use super::args::{BenchArgs, BenchDialect};
use std::path::Path;

/// SplitMix64: a small, seedable generator whose output never changes with
/// a dependency's version (the workload must be reproducible).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// A uniform float in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// SplitMix64's finalizer: a bijective 64-bit mix.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A Zipf distribution over `0..n`: P(k) ∝ 1 / (k + 1)^s.
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// The distribution over `n ≥ 1` items with exponent `s` (0: uniform).
    pub fn new(n: u32, s: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n.max(1))
            .map(|k| {
                acc += 1.0 / f64::from(k).powf(s);
                acc
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= acc);
        Zipf { cdf }
    }

    /// One draw.
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c <= u).min(self.cdf.len() - 1) as u32
    }
}

/// Where prompts come from.
#[derive(Debug)]
enum Source {
    Tree { zipf: Zipf, depth: u32, shared: usize, unique: usize },
    Trace(Vec<Vec<String>>),
}

/// The prompt generator of one run.
#[derive(Debug)]
pub struct Workload {
    source: Source,
    seed: u64,
    dialect: BenchDialect,
}

impl Workload {
    /// The workload the flags describe; reads `--trace` if given.
    pub fn new(args: &BenchArgs) -> Result<Self, String> {
        let source = match &args.trace {
            Some(path) => Source::Trace(read_trace(path)?),
            None => {
                let blocks = args.prompt_blocks();
                let shared = ((blocks as f64) * args.shared).round() as usize;
                let zipf = Zipf::new(args.tree_fanout, args.zipf);
                Source::Tree { zipf, depth: args.tree_depth, shared, unique: blocks - shared }
            }
        };
        Ok(Workload { source, seed: args.seed, dialect: args.dialect })
    }

    /// The keys of prompt `i`, in order.
    pub fn prompt(&self, i: u64) -> Vec<String> {
        match &self.source {
            Source::Trace(lines) => lines[(i % lines.len() as u64) as usize].clone(),
            Source::Tree { zipf, depth, shared, unique } => {
                let mut rng = Rng::new(mix(self.seed ^ mix(i.wrapping_add(1))));
                let mut keys = Vec::with_capacity(shared + unique);
                let mut node = mix(self.seed.wrapping_add(0x7265_6574)); // the root: "tree"
                for level in 0..*depth {
                    node = mix(node ^ u64::from(zipf.sample(&mut rng)).wrapping_add(1));
                    let n = level_blocks(*shared, *depth, level);
                    keys.extend((0..n).map(|j| self.key(node, j as u64)));
                }
                let own = mix(self.seed ^ 0x756E_6971 ^ mix(i)); // "uniq"
                keys.extend((0..*unique).map(|j| self.key(own, j as u64)));
                keys
            }
        }
    }

    /// A key in the dialect's shape: 32 hex digits (vLLM's MD5 chain) or 64
    /// (SGLang's SHA-256 chain).
    fn key(&self, node: u64, j: u64) -> String {
        let a = mix(node ^ mix(j));
        let b = mix(a ^ 0xA5A5_A5A5);
        match self.dialect {
            BenchDialect::Vllm => format!("{a:016x}{b:016x}"),
            BenchDialect::Sglang => format!("{a:016x}{b:016x}{:016x}{:016x}", mix(b), mix(mix(b))),
        }
    }

    /// Distinct shared blocks the tree can produce (None for a trace): with
    /// `--pages-per-rank`, tells whether the working set fits.
    pub fn tree_blocks(&self, fanout: u32) -> Option<u128> {
        let Source::Tree { depth, shared, .. } = &self.source else { return None };
        let mut total = 0u128;
        let mut nodes = 1u128;
        for level in 0..*depth {
            nodes = nodes.saturating_mul(u128::from(fanout));
            total = total.saturating_add(nodes.saturating_mul(level_blocks(*shared, *depth, level) as u128));
        }
        Some(total)
    }
}

/// Blocks of tree level `level` when `shared` blocks are spread over
/// `depth` levels (the first levels take the remainder).
fn level_blocks(shared: usize, depth: u32, level: u32) -> usize {
    let depth = depth as usize;
    shared / depth + usize::from((level as usize) < shared % depth)
}

/// Reads a trace: one prompt per line, keys separated by spaces or commas;
/// empty lines and lines starting with `#` are skipped.
fn read_trace(path: &Path) -> Result<Vec<Vec<String>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read --trace {}: {e}", path.display()))?;
    let prompts: Vec<Vec<String>> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split([' ', ',', '\t']).filter(|k| !k.is_empty()).map(str::to_owned).collect())
        .collect();
    if prompts.is_empty() {
        return Err(format!("--trace {} holds no prompt", path.display()));
    }
    Ok(prompts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn workload(args: &[&str]) -> Workload {
        let argv = std::iter::once("bench").chain(args.iter().copied());
        Workload::new(&Cli::parse_from(argv).bench).unwrap()
    }

    #[test]
    fn zipf_prefers_the_first_items_and_zero_is_uniform() {
        let mut rng = Rng::new(7);
        let z = Zipf::new(8, 1.5);
        let mut counts = [0u32; 8];
        (0..20_000).for_each(|_| counts[z.sample(&mut rng) as usize] += 1);
        assert!(counts[0] > 2 * counts[1] && counts[1] > counts[7], "{counts:?}");
        let u = Zipf::new(4, 0.0);
        let mut counts = [0u32; 4];
        (0..20_000).for_each(|_| counts[u.sample(&mut rng) as usize] += 1);
        assert!(counts.iter().all(|&c| (4_500..5_500).contains(&c)), "{counts:?}");
    }

    #[test]
    fn prompts_are_reproducible_and_share_prefixes() {
        let w = workload(&["--prompt-tokens", "1024", "--block-tokens", "64", "--tree-fanout", "2"]);
        let (a, b) = (w.prompt(3), w.prompt(3));
        assert_eq!(a, b);
        assert_eq!(a.len(), 16);
        assert!(a.iter().all(|k| k.len() == 32 && k.bytes().all(|c| c.is_ascii_hexdigit())));
        // With two children per level, some pair of prompts shares its first
        // level; no two share their unique tail.
        let p: Vec<_> = (0..8).map(|i| w.prompt(i)).collect();
        assert!(p.iter().skip(1).any(|q| q[0] == p[0][0]));
        assert!(p.iter().skip(1).all(|q| q[15] != p[0][15]));
        let other = workload(&["--prompt-tokens", "1024", "--block-tokens", "64", "--seed", "2"]);
        assert_ne!(other.prompt(3), a, "the seed changes the keys");
        assert_eq!(w.tree_blocks(2), Some(2 * 4 + 4 * 4 + 8 * 4));
    }

    #[test]
    fn sglang_keys_are_64_hex_digits() {
        let w = workload(&["--dialect", "sglang"]);
        assert!(w.prompt(0).iter().all(|k| k.len() == 64));
    }

    #[test]
    fn traces_are_replayed_in_order() {
        let dir = std::env::temp_dir().join(format!("bench-trace-{}", std::process::id()));
        std::fs::write(&dir, "# a comment\na b,c\n\nd\n").unwrap();
        let w = workload(&["--trace", dir.to_str().unwrap()]);
        assert_eq!(
            (w.prompt(0), w.prompt(1), w.prompt(2)),
            (vec!["a".into(), "b".into(), "c".into()], vec!["d".into()], w.prompt(0))
        );
        std::fs::write(&dir, "# nothing\n").unwrap();
        let argv = ["bench", "--trace", dir.to_str().unwrap()];
        assert!(Workload::new(&Cli::parse_from(argv).bench).unwrap_err().contains("holds no prompt"));
        std::fs::remove_file(&dir).unwrap();
    }
}
