//! A tenant's `rate_limit_rps` and `rate_limit_burst` through the real
//! server (docs/tenants.md, Request rate): a data request of either dialect
//! beyond the bucket is a 429 `tenant_rate_limited` with `Retry-After`,
//! counted, and changes nothing; the bucket refills on the lease clock
//! (manual here: `--test-clock`, set by hand, no sleep); operational routes
//! and other tenants are not limited; a reload applies new values at once
//! and a bad value changes nothing. Every answer is checked against
//! docs/openapi.json.

use super::tenant_quotas::sample;
use super::tenants::{code, post};
use hf3fs_meta::core::TICKS_PER_SECOND;
use serde_json::json;

#[test]
fn an_empty_bucket_refuses_with_a_typed_429_and_retry_after_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = "[tenants.a]\nrate_limit_rps = 0.5\nrate_limit_burst = 3\n[tenants.b]\n";
    let s = super::tenants::server(dir.path(), file, &["--test-clock"]);
    let a = s.app().tenants.as_ref().unwrap().tenants.current().get("a").cloned().unwrap();
    let clock = a.registry.as_ref().unwrap().vllm().clock();
    let vllm_init =
        |rank: i64| post(&s, &format!("/t/a/rank/{rank}/initialize"), json!({"num_pages": 8, "role": "worker"}));
    // The burst: three data requests, one of each dialect among them.
    assert_eq!(vllm_init(0).status, 200);
    assert_eq!(post(&s, "/t/a/0/initialize", json!({"num_pages": 8, "namespace": "kv"})).status, 204);
    assert_eq!(post(&s, "/t/a/keys/batch_exists", json!({"keys": []})).status, 200);
    // The fourth, of either dialect: refused, with the wait for one token
    // (one every 2 s).
    for r in [vllm_init(1), post(&s, "/t/a/1/initialize", json!({"num_pages": 8, "namespace": "kv"}))] {
        assert_eq!((r.status, code(&r).as_str()), (429, "tenant_rate_limited"), "{r:?}");
        assert_eq!(r.header("retry-after"), Some("2"), "{r:?}");
        assert!(r.json()["detail"].as_str().unwrap().contains("rate_limit_rps"), "{r:?}");
    }
    // Nothing changed: rank 1 and space 1:kv were not made.
    let stats = s.get("/t/a/stats").json();
    assert_eq!(stats["ranks"].as_array().unwrap().len(), 1, "{stats}");
    assert_eq!(sample(&s, "hf3fs_meta_tenant_rate_limited_total"), "2");
    // Operational routes and another tenant are not limited.
    for path in ["/health", "/ready", "/metrics", "/t/a/stats"] {
        assert_eq!(s.get(path).status, 200, "{path}");
    }
    assert_eq!(post(&s, "/t/b/rank/0/initialize", json!({"num_pages": 8, "role": "worker"})).status, 200);
    // 1.5 s later: still no token, and the wait says 1 s.
    clock.set(3 * TICKS_PER_SECOND / 2);
    assert_eq!(vllm_init(1).header("retry-after"), Some("1"));
    // 2 s after the burst: one token, one request.
    clock.set(2 * TICKS_PER_SECOND);
    assert_eq!(vllm_init(1).status, 200);
    assert_eq!(code(&vllm_init(2)), "tenant_rate_limited");
    assert_eq!(sample(&s, "hf3fs_meta_tenant_rate_limited_total"), "4");
    // A reload that leaves the values keeps the bucket (still empty); one
    // that changes them applies them at once, on a full bucket.
    let reload = |text: &str| {
        std::fs::write(dir.path().join("tenants.toml"), text).unwrap();
        s.app().tenants.as_ref().unwrap().reload()
    };
    reload(file).unwrap();
    assert_eq!(code(&vllm_init(2)), "tenant_rate_limited");
    reload("[tenants.a]\nrate_limit_rps = 5\nrate_limit_burst = 10\n").unwrap();
    assert!((2..12).all(|r| vllm_init(r).status == 200));
    assert_eq!(code(&vllm_init(12)), "tenant_rate_limited");
    // A bad value refuses the file and changes nothing; removing the rate
    // lifts the limit.
    let e = reload("[tenants.a]\nrate_limit_rps = 0\n").unwrap_err();
    assert!(e.contains("[tenants.a]: rate_limit_rps = 0"), "{e}");
    assert_eq!(code(&vllm_init(30)), "tenant_rate_limited");
    reload("[tenants.a]\n").unwrap();
    assert!((30..40).all(|r| vllm_init(r).status == 200));
}
