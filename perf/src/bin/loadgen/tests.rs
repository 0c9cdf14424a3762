use super::*;
use std::collections::HashSet;

fn args(extra: &[&str]) -> Args {
    Args::parse_from(["loadgen"].iter().chain(extra))
}

/// The 32-hex-digit keys quoted in a request body.
fn keys_in(body: &[u8]) -> Vec<HexKey> {
    body.split(|&b| b == b'"').filter(|s| s.len() == 32).map(|s| s.try_into().unwrap()).collect()
}

#[test]
fn pool_bodies_is_the_number_of_distinct_bodies_and_one_means_the_same_keys_every_time() {
    let hot = build_pool(&args(&["--scenario", "exists", "--stored", "1000", "--pool-bodies", "1"]));
    assert_eq!(hot.len(), 1);
    assert_eq!(keys_in(&hot[0]).len(), 128);
    let random = build_pool(&args(&["--scenario", "locations", "--stored", "100000", "--pool-bodies", "782"]));
    assert_eq!(random.len(), 782);
    assert_eq!(random.iter().collect::<HashSet<_>>().len(), 782, "every body differs");
    assert_eq!(build_pool(&args(&["--scenario", "exists"])).len(), 256, "the default is unchanged");
}

#[test]
fn pooled_keys_are_stored_keys_spread_over_the_stored_set() {
    let stored: HashSet<HexKey> = (0..1000).map(stored_key).collect();
    let pool = build_pool(&args(&["--scenario", "exists", "--stored", "1000", "--pool-bodies", "64"]));
    let drawn: Vec<HexKey> = pool.iter().flat_map(|b| keys_in(b)).collect();
    assert_eq!(drawn.len(), 64 * 128);
    assert!(drawn.iter().all(|k| stored.contains(k)), "a pooled key is not a stored one");
    // 8,192 draws among 1,000 keys leave almost none undrawn.
    assert!(drawn.iter().collect::<HashSet<_>>().len() > 990);
}

#[test]
fn pool_bodies_out_of_range_is_a_usage_error() {
    for n in ["0", "65537"] {
        let err = run(args(&["--pool-bodies", n, "--no-setup"])).unwrap_err();
        assert!(err.contains("--pool-bodies"), "{err}");
    }
}
